"""Our TensorRT-LLM preprocessing/postprocessing models in a real tritonserver.

The repository is what `llmlaunch` renders for engine=trtllm (launcher.render.repository_files).
The `tensorrt_llm` model itself needs a GPU and a built engine, so for the end-to-end
ensemble checks its config is kept and only its backend is swapped for a python stand-in
(tests/standins/triton_models/tensorrt_llm) that echoes the prompt's tokens in the C++
backend's response format. Tokenization is compared with the tokenizer itself.
"""

from __future__ import annotations

import json
import queue
import shutil

import numpy as np
import pytest

pytestmark = pytest.mark.triton

MULTIBYTE = "Grüße aus 東京 🙂 — naïve café"


@pytest.fixture(scope="module")
def tiny_dir():
    from launcher.tiny import ensure_tiny_model

    return ensure_tiny_model()


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    from launcher import pbtxt
    from launcher.cli import plan
    from launcher.render import repository_files
    from tests.standins.server import STANDINS, serve, write_repository

    _, spec = plan(
        [
            "engine=trtllm",
            "engine.layout=ensemble",
            f"model.path={tiny_dir}",
            "engine.engine_dir=/engines/standin",
            "engine.max_num_seqs=8",
            "engine.bls=true",
            "engine.preprocessing_instances=1",
            "engine.postprocessing_instances=1",
        ]
    )
    tmp = tmp_path_factory.mktemp("trtllm")
    repo = write_repository(repository_files(spec), tmp / "repo")
    # Keep the rendered tensorrt_llm config (inputs, outputs, batching); swap only its backend.
    cfg = pbtxt.parse((repo / "tensorrt_llm" / "config.pbtxt").read_text())
    cfg.backend = "python"
    (repo / "tensorrt_llm" / "config.pbtxt").write_text(pbtxt.to_text(cfg))
    shutil.copy(
        STANDINS / "triton_models" / "tensorrt_llm" / "1" / "model.py", repo / "tensorrt_llm" / "1" / "model.py"
    )
    log = tmp / "standin_calls.jsonl"
    with serve(
        repo,
        ["preprocessing", "postprocessing", "tensorrt_llm", "ensemble", "tensorrt_llm_bls"],
        tmp / "server.log",
        "ensemble",
        extra_env={"LLMLAUNCH_STANDIN_LOG": str(log)},
    ) as s:
        s.calls = log
        yield s


def test_rendered_ensemble_loads_as_rendered(tiny_dir, tmp_path):
    from launcher.cli import plan
    from launcher.render import repository_files
    from launcher.triton import ServerDied
    from tests.standins.server import serve, write_repository

    _, spec = plan(
        [
            "engine=trtllm",
            "engine.layout=ensemble",
            f"model.path={tiny_dir}",
            "engine.engine_dir=/engines/standin",
            "engine.max_num_seqs=8",
            "engine.preprocessing_instances=1",
            "engine.postprocessing_instances=1",
        ]
    )
    files = {k: v for k, v in repository_files(spec).items() if not k.startswith("tensorrt_llm/")}
    repo = write_repository(files, tmp_path / "repo")
    # a model with tensorrt_llm's config but nothing to run: enough for Triton to validate the ensemble
    (repo / "tensorrt_llm" / "1").mkdir(parents=True)
    (repo / "tensorrt_llm" / "config.pbtxt").write_text(
        repository_files(spec)["tensorrt_llm/config.pbtxt"].replace('backend: "tensorrtllm"', 'backend: "python"')
    )
    idle = "class TritonPythonModel:\n    def execute(self, requests):\n        return None\n"
    for model in ("tensorrt_llm", "preprocessing", "postprocessing"):  # only the configs matter here
        (repo / model / "1" / "model.py").write_text(idle)
    try:
        with serve(repo, ["ensemble"], tmp_path / "server.log", "ensemble", ready_timeout_s=60):
            pass
    except ServerDied as e:  # the failure this test guards against: Triton's ensemble validation
        pytest.fail(f"the rendered ensemble does not load: {e}")


def _client(server):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(server.grpc_url)


def _input(name, array, dtype):
    import tritonclient.grpc as grpcclient

    t = grpcclient.InferInput(name, list(array.shape), dtype)
    t.set_data_from_numpy(array)
    return t


def _text(s):
    return np.array([[s.encode()]], dtype=object)


def preprocess(server, query, max_tokens=8, **extra):
    inputs = [
        _input("QUERY", _text(query), "BYTES"),
        _input("REQUEST_OUTPUT_LEN", np.array([[max_tokens]], np.int32), "INT32"),
    ]
    kinds = {
        "BAD_WORDS_DICT": "BYTES",
        "STOP_WORDS_DICT": "BYTES",
        "END_ID": "INT32",
        "PAD_ID": "INT32",
        "IGNORE_EOS": "BOOL",
        "RANDOM_SEED": "UINT64",
        "SEED": "UINT64",
        "EXCLUDE_INPUT_IN_OUTPUT": "BOOL",
    }
    for name, value in extra.items():
        inputs.append(_input(name, value, kinds[name]))
    c = _client(server)
    try:
        return c.infer("preprocessing", inputs)
    finally:
        c.close()


def postprocess(server, ids, stream=False, max_tokens=None, input_len=3):
    ids = list(ids)
    inputs = [
        _input("TOKENS_BATCH", np.array(ids, np.int32).reshape(1, 1, -1), "INT32"),
        _input("SEQUENCE_LENGTH", np.array([[len(ids)]], np.int32), "INT32"),
        _input("REQUEST_INPUT_LEN", np.array([[input_len]], np.int32), "INT32"),
        _input("STREAM", np.array([[stream]], bool), "BOOL"),
    ]
    if max_tokens is not None:
        inputs.append(_input("REQUEST_OUTPUT_LEN", np.array([[max_tokens]], np.int32), "INT32"))
    c = _client(server)
    try:
        r = c.infer("postprocessing", inputs)
    finally:
        c.close()
    return (
        r.as_numpy("OUTPUT")[0, 0],
        int(r.as_numpy("OUTPUT_TOKENS")[0, 0]),
        r.as_numpy("FINISH_REASON")[0, 0].decode(),
        int(r.as_numpy("INPUT_TOKENS")[0, 0]),
    )


# ----------------------------------------------------------------------------- preprocessing
def test_preprocessing_tokenizes_like_the_tokenizer(server, tokenizer):
    r = preprocess(server, MULTIBYTE, max_tokens=5)
    expected = tokenizer.encode(MULTIBYTE)  # add_special_tokens=True: BOS first
    assert expected[0] == tokenizer.bos_token_id
    assert r.as_numpy("INPUT_ID").tolist() == [expected]
    assert r.as_numpy("REQUEST_INPUT_LEN").tolist() == [[len(expected)]]
    assert r.as_numpy("REQUEST_OUTPUT_LEN").tolist() == [[5]]
    assert r.as_numpy("OUT_END_ID").tolist() == [[tokenizer.eos_token_id]]
    assert r.as_numpy("OUT_PAD_ID").tolist() == [[tokenizer.pad_token_id]]
    assert r.as_numpy("OUT_RANDOM_SEED").tolist() == [[0]]
    assert r.as_numpy("STOP_WORDS_IDS").shape == (1, 2, 0)
    assert r.as_numpy("BAD_WORDS_IDS").shape == (1, 2, 0)


def test_word_lists_use_tensorrt_llm_ids_and_offsets_format(server, tokenizer):
    stop = ["the end", "東京", "x"]
    bad = ["ugly"]
    r = preprocess(
        server,
        "hello",
        STOP_WORDS_DICT=np.array([[w.encode() for w in stop]], dtype=object),
        BAD_WORDS_DICT=np.array([[w.encode() for w in bad]], dtype=object),
    )
    enc = [tokenizer.encode(w, add_special_tokens=False) for w in stop]
    flat = [t for e in enc for t in e]
    offsets = list(np.cumsum([len(e) for e in enc]))
    got = r.as_numpy("STOP_WORDS_IDS")
    assert got.shape == (1, 2, len(flat))
    assert got[0, 0].tolist() == flat
    assert got[0, 1].tolist() == offsets + [-1] * (len(flat) - len(offsets))
    b = r.as_numpy("BAD_WORDS_IDS")
    ugly = tokenizer.encode("ugly", add_special_tokens=False)
    assert b[0, 0].tolist() == ugly and b[0, 1].tolist() == [len(ugly)] + [-1] * (len(ugly) - 1)


def test_ignore_eos_end_id_and_seed(server):
    r = preprocess(
        server,
        "hi",
        IGNORE_EOS=np.array([[True]]),
        END_ID=np.array([[7]], np.int32),
        PAD_ID=np.array([[9]], np.int32),
        SEED=np.array([[1234]], np.uint64),
        EXCLUDE_INPUT_IN_OUTPUT=np.array([[True]]),
    )
    assert r.as_numpy("OUT_END_ID").tolist() == [[-1]]  # never sampled: exactly max_tokens tokens
    assert r.as_numpy("OUT_PAD_ID").tolist() == [[9]]
    assert r.as_numpy("OUT_RANDOM_SEED").tolist() == [[1234]]
    r = preprocess(
        server,
        "hi",
        END_ID=np.array([[7]], np.int32),
        RANDOM_SEED=np.array([[5]], np.uint64),
        SEED=np.array([[5]], np.uint64),
    )
    assert r.as_numpy("OUT_END_ID").tolist() == [[7]] and r.as_numpy("OUT_RANDOM_SEED").tolist() == [[5]]


def test_preprocessing_rejects_bad_requests_with_clear_errors(server):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException, match="max_tokens must be >= 1"):
        preprocess(server, "hi", max_tokens=0)
    with pytest.raises(InferenceServerException, match="disagree"):
        preprocess(server, "hi", RANDOM_SEED=np.array([[1]], np.uint64), SEED=np.array([[2]], np.uint64))
    with pytest.raises(InferenceServerException, match="empty"):
        preprocess(server, "")


# ----------------------------------------------------------------------------- postprocessing
def test_postprocessing_decodes_like_the_tokenizer(server, tokenizer):
    ids = tokenizer.encode(MULTIBYTE, add_special_tokens=False) + [tokenizer.eos_token_id]
    text, n, reason, n_in = postprocess(server, ids, max_tokens=100, input_len=4)
    assert text.decode() == tokenizer.decode(ids, skip_special_tokens=True) == MULTIBYTE
    assert (n, reason, n_in) == (len(ids), "stop", 4)
    _, _, reason, _ = postprocess(server, ids, max_tokens=len(ids))
    assert reason == "length"


def test_streamed_tokens_never_split_multibyte_characters(server, tokenizer):
    ids = tokenizer.encode(MULTIBYTE, add_special_tokens=False)
    pieces = [postprocess(server, [t], stream=True) for t in ids]
    chunks = [p[0] for p in pieces]
    # This tokenizer splits some characters over several tokens: a lone decode would give U+FFFD.
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    assert b"".join(chunks).decode("utf-8") == MULTIBYTE
    assert all(p[1] == 1 and p[2] == "" for p in pieces)  # per-response count; no finish reason mid-stream
    eos_chunk = postprocess(server, [tokenizer.eos_token_id], stream=True)[0]
    assert eos_chunk == b""  # special tokens are skipped


def test_postprocessing_without_optional_inputs_sends_exact_bytes(server, tokenizer):
    """What a decoupled ensemble sends: tokens and lengths only."""
    ids = tokenizer.encode(MULTIBYTE, add_special_tokens=False)
    c = _client(server)
    try:
        chunks = []
        for t in ids:
            r = c.infer(
                "postprocessing",
                [
                    _input("TOKENS_BATCH", np.array([[[t]]], np.int32), "INT32"),
                    _input("SEQUENCE_LENGTH", np.array([[1]], np.int32), "INT32"),
                ],
            )
            chunks.append(r.as_numpy("OUTPUT")[0, 0])
            assert r.as_numpy("FINISH_REASON")[0, 0] == b"" and int(r.as_numpy("INPUT_TOKENS")[0, 0]) == 0
    finally:
        c.close()
    assert b"".join(chunks).decode() == MULTIBYTE


# ----------------------------------------------------------------------------- the ensemble (stand-in engine)
def generate(server, prompt, max_tokens, stream, model="ensemble", parameters=None, **extra):
    """One request to `model` over a gRPC stream: (joined text bytes, responses: each a dict of the outputs it
    has besides text_output)."""
    import tritonclient.grpc as grpcclient

    inputs = [
        _input("text_input", _text(prompt), "BYTES"),
        _input("max_tokens", np.array([[max_tokens]], np.int32), "INT32"),
        _input("stream", np.array([[stream]], bool), "BOOL"),
    ]
    kinds = {"ignore_eos": "BOOL", "stop_words": "BYTES", "random_seed": "UINT64", "min_length": "INT32"}
    for name, value in extra.items():
        inputs.append(_input(name, value, kinds[name]))
    results: "queue.Queue" = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result=None, error=None: results.put((result, error)))
    try:
        c.async_stream_infer(model, inputs, enable_empty_final_response=True, parameters=parameters)
        chunks, responses = [], []
        while True:
            result, error = results.get(timeout=60)
            assert error is None, error
            resp = result.get_response()
            out = result.as_numpy("text_output")
            if out is not None:
                chunks.append(b"".join(out.reshape(-1)))
                responses.append(
                    {o.name: result.as_numpy(o.name).reshape(-1)[0] for o in resp.outputs if o.name != "text_output"}
                )
            if resp.parameters.get("triton_final_response") and resp.parameters["triton_final_response"].bool_param:
                return b"".join(chunks), responses
    finally:
        c.stop_stream()
        c.close()


def _calls(server):
    return [json.loads(line) for line in server.calls.read_text().splitlines()]


def test_ensemble_non_streaming(server, tokenizer):
    prompt = "the quick brown fox"
    text, responses = generate(server, prompt, max_tokens=50, stream=False)
    assert text.decode() == prompt  # the stand-in echoes the prompt after BOS
    n = len(tokenizer.encode(prompt, add_special_tokens=False))
    assert len(responses) == 1
    r = responses[0]
    # a decoupled ensemble cannot pass the prompt length or max_tokens to postprocessing (see its docstring)
    assert (int(r["input_tokens"]), int(r["output_tokens"]), r["finish_reason"]) == (0, n, b"")
    call = _calls(server)[-1]
    assert (
        call["input_ids"] == tokenizer.encode(prompt)
        and call["end_id"] == tokenizer.eos_token_id
        and not call["streaming"]
    )


def test_ensemble_streaming_multibyte(server):
    text, responses = generate(server, MULTIBYTE, max_tokens=200, stream=True)
    assert text.decode("utf-8") == MULTIBYTE
    assert len(responses) > 5 and all(int(r["output_tokens"]) == 1 for r in responses)


def test_ensemble_ignore_eos_gives_exactly_max_tokens(server, tokenizer):
    text, responses = generate(server, "ab cd", max_tokens=13, stream=False, ignore_eos=np.array([[True]]))
    assert int(responses[0]["output_tokens"]) == 13
    assert _calls(server)[-1]["end_id"] == -1


def test_ensemble_stop_words_reach_the_engine(server, tokenizer):
    prompt = "one two three four five"
    generate(server, prompt, max_tokens=50, stream=False, stop_words=np.array([[b" three", b"zzz"]], dtype=object))
    call = _calls(server)[-1]
    assert call["stop_words"] == [
        tokenizer.encode(" three", add_special_tokens=False),
        tokenizer.encode("zzz", add_special_tokens=False),
    ]


# ----------------------------------------------------------------------------- the BLS model (engine.bls=true)
def test_bls_streams_whole_characters_with_cumulative_counts(server, tokenizer):
    text, responses = generate(server, MULTIBYTE, max_tokens=200, stream=True, model="tensorrt_llm_bls")
    assert text.decode() == MULTIBYTE
    n = len(tokenizer.encode(MULTIBYTE, add_special_tokens=False))
    counts = [int(r["output_tokens"]) for r in responses]
    assert counts == sorted(counts) and counts[-1] == n
    assert all(int(r["input_tokens"]) == n + 1 for r in responses)
    assert [r["finish_reason"] for r in responses][-1] == b"stop" and all(
        r["finish_reason"] == b"" for r in responses[:-1]
    )


def test_final_counts_only_bls_honours_it_and_the_ensemble_ignores_it(server, tokenizer):
    """Request parameter final_counts_only: the BLS model sends text_output alone until its final response; the
    ensemble's steps are fixed by config.pbtxt, so it sends its counts on every response (as the contract says)."""
    n = len(tokenizer.encode(MULTIBYTE, add_special_tokens=False))
    text, responses = generate(
        server, MULTIBYTE, max_tokens=200, stream=True, model="tensorrt_llm_bls", parameters={"final_counts_only": True}
    )
    assert text.decode() == MULTIBYTE and len(responses) > 1
    assert all(r == {} for r in responses[:-1]), responses
    last = responses[-1]
    assert (int(last["input_tokens"]), int(last["output_tokens"]), last["finish_reason"]) == (n + 1, n, b"stop")
    text, responses = generate(server, MULTIBYTE, max_tokens=200, stream=True, parameters={"final_counts_only": True})
    assert text.decode() == MULTIBYTE and len(responses) > 1
    assert all(sorted(r) == ["finish_reason", "input_tokens", "output_tokens"] for r in responses), responses


def test_bls_chunks_are_valid_utf8(server):
    import tritonclient.grpc as grpcclient

    chunks = []
    q: "queue.Queue" = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result=None, error=None: q.put((result, error)))
    try:
        c.async_stream_infer(
            "tensorrt_llm_bls",
            [
                _input("text_input", _text(MULTIBYTE), "BYTES"),
                _input("max_tokens", np.array([[200]], np.int32), "INT32"),
                _input("stream", np.array([[True]], bool), "BOOL"),
            ],
            enable_empty_final_response=True,
        )
        while True:
            result, error = q.get(timeout=60)
            assert error is None
            out = result.as_numpy("text_output")
            if out is not None:
                chunks.append(out.reshape(-1)[0].decode("utf-8"))  # each piece decodes on its own
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        c.stop_stream()
        c.close()
    assert "".join(chunks) == MULTIBYTE


def test_bls_non_streaming_stop_words_and_ignore_eos(server, tokenizer):
    prompt = "one two three four five"
    text, responses = generate(server, prompt, max_tokens=50, stream=False, model="tensorrt_llm_bls")
    assert text.decode() == prompt and responses[-1]["finish_reason"] == b"stop"
    text, responses = generate(
        server,
        prompt,
        max_tokens=50,
        stream=False,
        model="tensorrt_llm_bls",
        stop_words=np.array([[b" three"]], dtype=object),
    )
    assert (
        text.decode() == "one two" and responses[-1]["finish_reason"] == b"stop"
    )  # the engine returned " three"; removed
    text, responses = generate(
        server, prompt, max_tokens=12, stream=True, model="tensorrt_llm_bls", ignore_eos=np.array([[True]])
    )
    assert int(responses[-1]["output_tokens"]) == 12 and responses[-1]["finish_reason"] == b"length"
