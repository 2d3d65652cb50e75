"""The vLLM / SGLang / LMDeploy / TensorRT-LLM (LLM API) python models in a real tritonserver, each engine replaced
by a stand-in.

The engines need GPUs and cannot be installed here, so `tests/standins/{vllm,sglang,lmdeploy,tensorrt_llm}`
(on the server's PYTHONPATH) are stand-ins at the API boundary: the same import paths, classes, methods and
async-generator shapes as the real packages' public APIs (LMDeploy's as in its 0.18.0 source: preprocess/generate,
GenOut deltas, RequestError, the greedy normalization), and they play a deterministic script
(tests/standins/_standin.py), recording every call. The repository is what `llmlaunch` renders for each engine. Checked: streaming order
and counts, non-streaming text, the contract's sampling inputs reaching the engine's own
parameter names, cancellation aborting the engine's request, an engine exception answered as an
error while the next request succeeds, and `finalize` shutting the engine down. TensorRT-LLM's model is API-tested
only: its stand-in has the real `LLM` / `SamplingParams` / `generate_async` signatures, never the engine.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.contract_client import Stream, generate

pytestmark = pytest.mark.triton

ENGINES = ("vllm", "sglang", "lmdeploy", "trtllm")
# A stub started by srun has the task's MPI identity in its environment; the TensorRT-LLM model must leave it
# before TensorRT-LLM loads (it would join the job's world), keeping MPI's configuration variables.
MPI_RANK_ENV = {"PMIX_RANK": "3", "OMPI_COMM_WORLD_RANK": "3", "PMI_SIZE": "8", "PMIX_MCA_gds": "hash"}


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, tmp_path_factory):
    from launcher.cli import plan
    from tests.standins.server import serve_standin

    name = request.param
    # vLLM and SGLang with one front end here; several: tests/integration/test_shared_engine.py
    one = ["engine.frontends=1"] if name in ("vllm", "sglang") else []
    # SGLang uses a request's seed only under deterministic inference: serve with it, so seeds reach the engine
    one += ["engine.extra_args.enable_deterministic_inference=true"] if name == "sglang" else []
    # vLLM reports each step's CUDA graph only with cudagraph_metrics: test_engine_steps_reach_llmlaunch_bench
    one += ["engine.engine_args.cudagraph_metrics=true"] if name == "vllm" else []
    _, spec = plan([f"engine={name}", "model.path=/models/standin-llm", "engine.max_num_seqs=8", *one])
    env = MPI_RANK_ENV if name == "trtllm" else {}
    with serve_standin(spec, tmp_path_factory.mktemp(name), extra_env=env, metrics=True) as server:
        server.name = name
        yield server


def events(server, event=None):
    if not server.calls.exists():
        return []
    rows = [json.loads(line) for line in server.calls.read_text().splitlines() if line.strip()]
    return [r for r in rows if event is None or r["event"] == event]


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def last_generate(server, prompt):
    return wait_for(lambda: [e for e in events(server, "generate") if e.get("prompt") == prompt])[-1]


# ----------------------------------------------------------------------------- tests
def test_engine_started_with_the_launch_spec(engine):
    init = events(engine, "init")
    assert len(init) == 1
    args = init[0]["args"]
    if engine.name == "vllm":  # model.json rendered by the registry
        assert (
            args["model"] == "/models/standin-llm" and args["tensor_parallel_size"] == 1 and args["max_num_seqs"] == 8
        )
        assert args["distributed_executor_backend"] == "mp" and args["enable_log_requests"] is False
    elif engine.name == "sglang":
        assert (
            args["model_path"] == "/models/standin-llm"
            and args["tp_size"] == 1
            and args["nnodes"] == 1
            and args["max_running_requests"] == 8
        )
        assert init[0]["thread"] == "sglang-loop"  # built on the runtime's loop thread, so it binds to that loop
    elif engine.name == "trtllm":  # model.yaml rendered by launcher/engines/trtllm/llmapi.py
        assert (
            args["model"],
            args["backend"],
            args["tensor_parallel_size"],
            args["pipeline_parallel_size"],
            args["max_batch_size"],
        ) == ("/models/standin-llm", "pytorch", 1, 1, 8)
        assert args["kv_cache_config"] == {"free_gpu_memory_fraction": 0.9} and "gpus_per_node" not in args
        assert init[0]["mpi_env"] == []  # left the job's MPI world before TensorRT-LLM loaded
    else:
        assert args["model_path"] == "/models/standin-llm" and args["backend"] == "turbomind"
        assert args["backend_config"]["tp"] == 1 and args["backend_config"]["max_batch_size"] == 8
        (loop,) = events(engine, "start_loop")
        assert loop["use_async_api"] is True and loop["running"] is True


def test_streaming_sends_pieces_in_order(engine):
    responses, error = generate(engine, "a b c d e f g h i j", max_tokens=5)
    assert error is None
    # the pieces in order (text made while a response is being sent goes out merged in the next one); some
    # engines send the finish reason in one more, empty, response
    assert "".join(r["text_output"] for r in responses) == " t0 t1 t2 t3 t4"
    counts = [r["output_tokens"] for r in responses]
    assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] == 5
    assert all(
        r["output_tokens"] == r["text_output"].count(" t") + sum(p["text_output"].count(" t") for p in responses[:i])
        for i, r in enumerate(responses)
    )
    assert [r["finish_reason"] for r in responses[:-1]] == [""] * (len(responses) - 1) and responses[-1][
        "finish_reason"
    ] == "length"
    assert all(r["input_tokens"] == 10 for r in responses[1:])


def test_first_token_split_reaches_the_metrics_port(engine):
    """Streamed requests' first tokens are split into parse / add / engine / back / respond / send on the metrics
    port; they add up to less than the TTFT the client saw, the engine's share holds the stand-in's delay before its
    first piece, and non-streamed requests are not counted.  vLLM's share splits by its own request stamps
    (RequestOutput.metrics: queued, first token made); the engines without such stamps report it all as `engine`."""
    from launcher.python_backend.timings import mean_first_token_ms, settled_server_metrics

    before, _ = settled_server_metrics(engine.metrics_url, engine.model)
    ttft = []
    for i in range(4):
        s = Stream(engine)
        try:
            t0 = time.monotonic()
            s.send(f"first token {i}", 3)
            first, error, _ = s.next(timeout=60)
            assert error is None and first is not None
            ttft.append(1000 * (time.monotonic() - t0))
            assert s.collect()[1] is None
        finally:
            s.close()
    assert generate(engine, "not streamed", 3, stream=False)[1] is None
    after = wait_for(
        lambda: (m := settled_server_metrics(engine.metrics_url, engine.model)[0])["count"] - before["count"] >= 4 and m
    )
    means = mean_first_token_ms(before, after)
    assert means is not None and means["requests"] == 4, (before, after)
    # the stand-in waits LLMLAUNCH_STANDIN_DELAY_S (10 ms) before each piece
    assert means["engine"] >= 9 and means["parse"] > 0 and means["respond"] > 0 and means["send"] > 0, means
    assert means["inside_server"] < sum(ttft) / len(ttft), (means, ttft)
    if engine.name == "vllm":  # the hand-over to its scheduler, and its output path back to the stub's loop
        assert means["add"] > 0 and means["back"] > 0 and means["add"] + means["back"] < means["engine"], means
    else:
        assert means["add"] == 0 and means["back"] == 0, means


def test_prefix_cache_hits_reach_the_metrics_port(engine):
    """The prompt tokens an engine's prefix cache served, as it reports them per request (vLLM's
    RequestOutput.num_cached_tokens, SGLang's meta_info cached_tokens), are counted on the metrics port under the hf
    engine's names, so llmlaunch-bench --server-metrics reads every engine's hit rate alike; engines that report none
    count nothing.  The stand-ins cache whole blocks of 4 words of the prompts they prefilled."""
    import uuid

    from launcher.python_backend.cache_splits import prefix_cache_split
    from launcher.python_backend.timings import settled_engine_metrics

    before = settled_engine_metrics(engine.metrics_url, engine.model)
    shared = " ".join(f"{uuid.uuid4().hex[:6]}{i}" for i in range(10))  # words no earlier prompt has
    for prompt in (shared, shared + " and then more", "another prompt entirely here"):
        assert generate(engine, prompt, 3, stream=True)[1] is None
    read = lambda: prefix_cache_split(before, settled_engine_metrics(engine.metrics_url, engine.model))  # noqa: E731
    if engine.name not in ("vllm", "sglang"):
        assert read() is None
        return
    split = wait_for(read)
    # 10 + 13 + 4 prompt words; the second prompt shares its first 10 words with the first: 8 in whole blocks
    assert split == {"prompt_tokens": 27, "cached_prompt_tokens": 8, "prefix_hit_rate": round(8 / 27, 4)}, split


def test_kv_cache_use_reaches_the_metrics_port_where_the_engine_reports_it(engine):
    """An engine that reports its KV cache in use (vLLM's SchedulerStats.kv_cache_usage, given to the model's stat
    logger) has it on the metrics port as llmlaunch_engine_kv_cache_usage while requests run, what a service scales
    by (serve.autoscale.signal=kv_cache); an engine that reports none has no such gauge.  The vLLM stand-in holds 1/8
    of its cache per running request."""
    from launcher.engines.registry import ENGINES
    from launcher.python_backend.timings import ENGINE_KV_USAGE, fetch_metrics_text
    from launcher.service.scrape import parse

    s = Stream(engine)
    try:
        s.send("one long generation", 300)
        first, error, _ = s.next(timeout=60)
        assert error is None and first is not None
        page = lambda: parse(fetch_metrics_text(engine.metrics_url))  # noqa: E731
        if not ENGINES[engine.name].kv_usage:
            time.sleep(1.5)  # a push of the model's metrics
            assert (ENGINE_KV_USAGE, "") not in page()
            return
        assert wait_for(lambda: page().get((ENGINE_KV_USAGE, "")) == 0.125), page()
    finally:
        s.close()


def test_engine_steps_reach_llmlaunch_bench(engine, tmp_path, capsys):
    """vLLM's engine-core steps, as its scheduler statistics report them to the model's stat logger
    (counters.EngineSteps), reach the metrics port, and llmlaunch-bench --server-metrics prints and records them for
    the measured requests: steps, decode rows and prompt tokens a step, requests running a step, the CUDA-graph shares
    (engine.engine_args.cudagraph_metrics=true) and the run's wall time a step.  vLLM needs a GPU, so its stand-in
    plays the engine at vLLM 0.25's API boundary: it steps each request on its own, a prompt's step PIECEWISE and each
    decode row's FULL.  The other engines report no steps."""
    from launcher.bench.cli import main
    from launcher.python_backend.timings import fetch_engine_metrics

    if engine.name != "vllm":  # (the earlier tests' requests ran on it)
        assert fetch_engine_metrics(engine.metrics_url, engine.model)["steps"] == 0
        return
    out = tmp_path / "result.json"
    n, tokens = 4, 5
    argv = ["--url", engine.grpc_url, "--model", engine.model, "--dataset-name", "synthetic", "--input-len", "8"]
    argv += ["--output-len", str(tokens), "--num-prompts", str(n), "--concurrency", "2", "--ignore-eos"]
    argv += ["--warmup", "1", "--no-progress", "--server-metrics", engine.metrics_url, "--result-json", str(out)]
    assert main(argv) == 0
    steps = json.loads(out.read_text())["server_engine_steps"]
    # the measured requests alone (not the warm-up's): a step for each token, each request's first from its prompt's
    assert steps["steps"] == n * tokens, steps
    assert steps["decode_rows"] == round(n * (tokens - 1) / (n * tokens), 2) and steps["prefill_tokens"] > 0, steps
    assert (steps["graph_full"], steps["graph_piecewise"], steps["graph_none"]) == (0.8, 0.2, 0.0), steps
    assert 1 <= steps["running"] <= 2 and steps["waiting"] == 0 and steps["scheduled_tokens"] >= 1, steps
    assert steps["wall_step_ms"] > 0 and "step_ms" not in steps and "launch_ms" not in steps, steps
    printed = capsys.readouterr().out
    assert f"engine steps: {n * tokens} steps, " in printed and "CUDA graphs: 80% full, 20% piecewise" in printed


def test_final_counts_only_sends_text_alone_until_the_last_response(engine):
    """Request parameter final_counts_only: the counts and finish_reason come once, on the final response."""
    responses, error = generate(engine, "a b c d e f g h i j", max_tokens=5, parameters={"final_counts_only": True})
    assert error is None
    assert "".join(r["text_output"] for r in responses) == " t0 t1 t2 t3 t4"
    assert all(sorted(r) == ["text_output"] for r in responses[:-1]), responses
    last = responses[-1]
    assert (last["input_tokens"], last["output_tokens"], last["finish_reason"]) == (10, 5, "length"), responses
    responses, error = generate(engine, "a b", max_tokens=5, parameters={"final_counts_only": 3})
    assert responses == [] and "final_counts_only=3 must be true or false" in str(error), error


def test_non_streaming_returns_the_whole_completion(engine):
    responses, error = generate(engine, "one two three", max_tokens=10, stream=False)
    assert error is None and len(responses) == 1
    r = responses[0]
    assert (r["text_output"], r["input_tokens"], r["output_tokens"], r["finish_reason"]) == (" t0 t1 t2", 3, 3, "stop")


def test_ignore_eos_and_stop_words(engine):
    responses, _ = generate(engine, "one two", max_tokens=6, stream=False, ignore_eos=True)
    assert (responses[0]["output_tokens"], responses[0]["finish_reason"]) == (6, "length")
    responses, _ = generate(engine, "a b c d e f", max_tokens=6, stream=False, stop_words=[" t2"])
    assert (responses[0]["text_output"], responses[0]["finish_reason"]) == (" t0 t1", "stop")


def test_contract_sampling_inputs_reach_the_engine(engine):
    prompt = "sampling check prompt"
    generate(
        engine,
        prompt,
        max_tokens=4,
        stream=False,
        temperature=0.5,
        top_k=0,
        top_p=0.9,
        random_seed=7,
        min_length=2,
        repetition_penalty=1.1,
        stop_words=["zz"],
        end_id=5,
    )
    s = last_generate(engine, prompt)["sampling"]
    if engine.name == "vllm":
        assert (
            s["max_tokens"],
            s["min_tokens"],
            s["temperature"],
            s["top_k"],
            s["seed"],
            s["stop"],
            s["stop_token_ids"],
            s["output_kind"],
        ) == (4, 2, 0.5, -1, 7, ["zz"], [5], "DELTA")
        assert s["top_p"] == pytest.approx(0.9) and s["repetition_penalty"] == pytest.approx(1.1)
    elif engine.name == "trtllm":
        assert (
            s["max_tokens"],
            s["min_tokens"],
            s["temperature"],
            s["top_k"],
            s["seed"],
            s["stop"],
            s["stop_token_ids"],
            s["n"],
        ) == (4, 2, 0.5, None, 7, ["zz"], [5], 1)
        assert (
            s["top_p"] == pytest.approx(0.9)
            and s["repetition_penalty"] == pytest.approx(1.1)
            and s["ignore_eos"] is False
        )
    elif engine.name == "sglang":
        assert (
            s["max_new_tokens"],
            s["min_new_tokens"],
            s["temperature"],
            s["top_k"],
            s["sampling_seed"],
            s["stop"],
            s["stop_token_ids"],
        ) == (4, 2, 0.5, -1, 7, ["zz"], [5])
        assert s["top_p"] == pytest.approx(0.9)
    else:
        # stop strings are matched by the adapter, in the text (LMDeploy's own stop_words match tokens)
        assert (
            s["max_new_tokens"],
            s["min_new_tokens"],
            s["do_sample"],
            s["temperature"],
            s["random_seed"],
            s["stop_words"],
            s["stop_token_ids"],
        ) == (4, 2, True, 0.5, 7, None, [5])
        assert s["top_p"] == pytest.approx(0.9) and s["repetition_penalty"] == pytest.approx(1.1)


def test_bad_request_gets_a_clear_error(engine):
    _, error = generate(engine, "hello", max_tokens=0)
    assert error is not None and "max_tokens must be >= 1" in str(error)
    _, error = generate(engine, "hello", max_tokens=3, beam_width=2)
    assert error is not None and "beam_width 2 is not supported" in str(error)
    if engine.name == "sglang":  # the context SGLang resolved (its tokenizer manager's), not ServerArgs' setting
        _, error = generate(engine, "hello", max_tokens=10_000_000)
        assert error is not None and "exceeds the model limit of 32768 tokens" in str(error)


def test_vllm_continues_a_request_after_the_tokens_it_made_elsewhere(tmp_path, tiny_model_dir):
    """A stream the front end moves (launcher/frontend/migration.py) reaches vLLM as the prompt's ids (tokenized as vLLM
    does, with the model's tokenizer) then the tokens its client has, its max_tokens less those; the client's counts
    stay its own.  A request vLLM cannot continue (stop strings) says so with output_ids [-1] on its first response,
    and is refused with continue_ids.  At vLLM's API boundary: the stand-in engine (tests/standins/vllm)."""
    from transformers import AutoTokenizer

    from launcher.cli import plan
    from tests.standins.server import serve_standin

    args = ["engine=vllm", "model.path=/models/standin-llm", f"model.tokenizer={tiny_model_dir}", "engine.frontends=1"]
    _, spec = plan(args)
    with serve_standin(spec, tmp_path) as server:
        prompt = "the cat sat on a mat"
        whole, error = generate(server, prompt, max_tokens=6, ignore_eos=True)
        assert error is None and "".join(r["text_output"] for r in whole) == " t0 t1 t2 t3 t4 t5"
        moved, error = generate(server, prompt, max_tokens=6, ignore_eos=True, continue_ids=[100, 101])
        assert error is None and "".join(r["text_output"] for r in moved) == " t2 t3 t4 t5"
        ids = AutoTokenizer.from_pretrained(tiny_model_dir).encode(prompt)
        call = wait_for(lambda: [e for e in events(server, "generate") if isinstance(e["prompt"], dict)])[-1]
        assert call["prompt"] == {"prompt_token_ids": [*ids, 100, 101]} and call["sampling"]["max_tokens"] == 4
        # the client's prompt tokens (vLLM's count of the prompt it got, less the continued ones): the stand-in counts a text
        # prompt in words, the tokenizer in tokens
        assert moved[-1]["output_tokens"] == 6 and moved[-1]["input_tokens"] == len(ids)

        held, error = generate(server, prompt, max_tokens=6, stop_words=["t4"], parameters={"return_token_ids": True})
        assert error is None and held[0]["output_ids"] == [-1] and "output_ids" not in held[-1]
        _, error = generate(server, prompt, max_tokens=6, stop_words=["t4"], continue_ids=[100])
        assert error is not None and "continue_ids is not supported with stop strings" in str(error)


def test_vllm_disagg_prefills_on_one_instance_and_the_decode_reads_its_blocks_through_the_handle(tmp_path):
    """`engine=vllm disagg.prefill=1 disagg.decode=1`: each instance's model.json carries NIXL's kv_transfer_config
    (recompute where a load fails) and its engine starts with its own side channel (RankEnv.kv_transfer) and UCX's
    CUDA-IPC reads on (llmlaunch's default where the user has not set UCX_CUDA_IPC_ENABLE_GET_ZCOPY); through the
    front end a request is prefilled on one instance (one token, kv_transfer_params do_remote_decode), whose
    kv_transfer_params come back as kv_handle and go with the request to the other instance as its kv_from, reaching
    vLLM as that request's kv_transfer_params.  A kv_from that is not such a handle is refused naming it.  At vLLM's
    API boundary: the stand-in engine (tests/standins/vllm) answers as vLLM 0.25's NixlConnector does; NIXL itself
    (the blocks' read) runs only on a GPU."""
    from launcher.cli import plan
    from launcher.frontend import FrontendConfig, FrontendProcess
    from launcher.handoff.rank_env import PRIVATE
    from launcher.ports import free_port
    from launcher.python_backend.cache_splits import kv_transfer_split
    from launcher.python_backend.timings import fetch_engine_metrics, fetch_first_token_metrics
    from tests.integration.test_frontend import _env
    from tests.standins.server import serve_standin

    _, spec = plan(
        ["engine=vllm", "model.path=/models/standin-llm", "engine.frontends=1", "disagg.prefill=1", "disagg.decode=1"]
    )
    sides = [free_port(), free_port()]
    with (
        serve_standin(spec, tmp_path / "p", {f"{PRIVATE}KV_TRANSFER": f"127.0.0.1:{sides[0]}"}, metrics=True) as p,
        serve_standin(spec, tmp_path / "d", {f"{PRIVATE}KV_TRANSFER": f"127.0.0.1:{sides[1]}"}, metrics=True) as d,
    ):
        for server, side in zip((p, d), sides):
            init = events(server, "init")[0]
            assert init["side_channel"] == ["127.0.0.1", side]
            assert init["ucx"]["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "on"  # reads over CUDA IPC without NVLink too
            config = init["args"]["kv_transfer_config"]
            assert (config["kv_connector"], config["kv_role"], config["kv_load_failure_policy"]) == (
                "NixlConnector",
                "kv_both",
                "recompute",
            )
        cfg = FrontendConfig(
            [tuple([h, int(port)]) for h, port in (s.grpc_url.rsplit(":", 1) for s in (p, d))],
            "127.0.0.1",
            free_port(),
            0,
            spec.model_name,
            probe_interval_s=0.5,
            kv_transfer=[f"127.0.0.1:{sides[0]}", ""],
        )
        fe = FrontendProcess(cfg, env=_env()).start()
        try:
            fe.wait_ready(60)
            endpoint = type("Endpoint", (), {"grpc_url": f"127.0.0.1:{cfg.port}", "model": spec.model_name})
            prompt = "the prompt of a request served in two parts"
            got, error = generate(endpoint, prompt, max_tokens=5, ignore_eos=True)
            assert error is None and "".join(r["text_output"] for r in got) == " t0 t1 t2 t3 t4"
            # the decode's stream is the client's, as it asked for it: counts only on the final response
            got, error = generate(
                endpoint, prompt, max_tokens=5, ignore_eos=True, parameters={"final_counts_only": True}
            )
            assert error is None and all(sorted(r) == ["text_output"] for r in got[:-1]), got
            assert (got[-1]["output_tokens"], got[-1]["finish_reason"]) == (5, "length"), got
        finally:
            fe.stop()
        # the decode instance's connector reported both reads in its scheduler statistics: on its metrics port
        moved = lambda: kv_transfer_split({}, fetch_engine_metrics(d.metrics_url, d.model))  # noqa: E731
        assert wait_for(lambda: (moved() or {}).get("transfers") == 2), moved()
        assert moved()["bytes"] == 2 * 32768 and moved()["ms_per_transfer"] == 2.0, moved()
        first = last_generate(p, prompt)
        asked = first["sampling"]["extra_args"]["kv_transfer_params"]
        assert first["sampling"]["max_tokens"] == 1 and asked["do_remote_decode"] and not asked["do_remote_prefill"]
        second = last_generate(d, prompt)
        handle = second["sampling"]["extra_args"]["kv_transfer_params"]
        assert handle["do_remote_prefill"] and handle["remote_request_id"] == first["request_id"]
        assert (handle["remote_host"], handle["remote_port"]) == ("127.0.0.1", sides[0])
        assert second["sampling"]["max_tokens"] == 5

        # the handle straight from the prefill instance, and a kv_from that is not one
        done, error = generate(p, "another prompt", max_tokens=1, stream=False, kv_export=True)
        assert error is None and json.loads(done[-1]["kv_handle"])["remote_port"] == sides[0]
        # every kv_export request's first token is counted on the prefill instance (not streamed, but its decode's
        # first token waits for it: llmlaunch-bench --prefill-metrics splits it out)
        counted = lambda: fetch_first_token_metrics(p.metrics_url, p.model)["count"]  # noqa: E731
        assert wait_for(lambda: counted() == 3), counted()
        _, error = generate(d, "another prompt", max_tokens=3, kv_from="10.0.0.5:8005")
        assert error is not None and "is not the kv_handle a vLLM prefill returns" in str(error)
        plain, error = generate(d, "a whole request", max_tokens=2)
        assert error is None and "kv_handle" not in plain[-1]
        assert last_generate(d, "a whole request")["sampling"]["extra_args"] is None


def test_llmlaunch_vllm_disagg_gives_each_instance_a_side_channel_and_sends_requests_through_the_prefill(
    tmp_path, tiny_model_dir
):
    """`llmlaunch engine=vllm disagg.prefill=1 disagg.decode=1` on this machine (vLLM's stand-in on the ranks'
    PYTHONPATH through cluster.env): each rank picked a port of its own for NIXL's side channel and its engine started
    with it, and with the user's UCX setting (cluster.env) rather than llmlaunch's default; a request through rank 0's
    front end is prefilled on replica 0 and decoded on replica 1 with the handle replica 0's engine returned.  At
    vLLM's API boundary (tests/standins/vllm); NIXL itself runs only on a GPU."""
    import signal

    from launcher.client.request import Generation
    from launcher.client.stream import generate as stream
    from tests.integration.test_frontend import LocalLaunch
    from tests.standins.server import STANDINS

    calls = tmp_path / "calls.jsonl"
    job = LocalLaunch(
        tmp_path,
        "engine=vllm",
        f"model.path={tiny_model_dir}",  # read for its shape only: the stand-in loads no weights
        "engine.device=cpu",
        "engine.frontends=1",
        "disagg.prefill=1",
        "disagg.decode=1",
        f"+cluster.env.PYTHONPATH={STANDINS}",
        f"+cluster.env.LLMLAUNCH_STANDIN_LOG={calls}",
        "+cluster.env.LLMLAUNCH_STANDIN_DELAY_S=0.01",
        "+cluster.env.UCX_CUDA_IPC_ENABLE_GET_ZCOPY=off",  # the user's word on UCX's transports stands
    )
    try:
        ep = job.wait_endpoint()
        prompt = "a prompt that travels from one instance to the other"
        rec = stream(ep.url, ep.model, Generation(prompt, max_tokens=5, ignore_eos=True))
        assert not rec.error and rec.text == " t0 t1 t2 t3 t4", rec.error
        rows = [json.loads(line) for line in calls.read_text().splitlines()]
        sides = {tuple(r["side_channel"]) for r in rows if r["event"] == "init"}
        assert len(sides) == 2 and all(host == "127.0.0.1" and port != 5600 for host, port in sides), sides
        assert {r["ucx"].get("UCX_CUDA_IPC_ENABLE_GET_ZCOPY") for r in rows if r["event"] == "init"} == {"off"}
        asked, handed = [
            r["sampling"]["extra_args"] for r in rows if r["event"] == "generate" and r["prompt"] == prompt
        ]
        assert asked["kv_transfer_params"]["do_remote_decode"]
        handle = handed["kv_transfer_params"]
        assert handle["do_remote_prefill"] and (handle["remote_host"], handle["remote_port"]) in sides
        job.proc.send_signal(signal.SIGINT)
        assert job.proc.wait(90) == 0, job.tail()
    finally:
        job.kill()
    job.assert_nothing_left(ep)


def test_sglang_bans_bad_words_through_logit_bias(engine):
    """SGLang has no bad-words parameter: each word's single-token spellings (bare and after a space) get a -inf
    logit bias; a word that is several tokens however spelled is refused, naming it, and the model serves on."""
    if engine.name != "sglang":
        pytest.skip("SGLang's mapping (the other engines take bad_words as such)")
    responses, error = generate(engine, "ban check prompt", max_tokens=3, stream=False, bad_words=["t1", " t2 "])
    assert error is None and responses[0]["output_tokens"] == 3
    bias = last_generate(engine, "ban check prompt")["sampling"]["logit_bias"]
    assert bias == {"101": float("-inf"), "102": float("-inf")}, bias
    _, error = generate(engine, "ban refused", max_tokens=3, stream=False, bad_words=["two words"])
    assert "bad_words: 'two words' is more than one token" in str(error) and "engine=vllm" in str(error), error
    assert generate(engine, "after a refusal", max_tokens=2, stream=False)[1] is None


def test_sglang_refuses_a_seeded_sampled_request_unless_it_runs_deterministic_inference(tmp_path, monkeypatch):
    """SGLang ignores sampling_seed outside enable_deterministic_inference; the model says so instead of sampling
    unseeded. The adapter runs in this process against the SGLang stand-in (SGLang needs a GPU)."""
    import asyncio

    from launcher.python_backend.triton_io import InvalidRequest, SamplingParams
    from tests.standins.server import STANDINS
    from tests.unit.test_engine_launch import load_model_module

    monkeypatch.syspath_prepend(str(STANDINS))
    monkeypatch.setenv("LLMLAUNCH_STANDIN_DELAY_S", "0")
    model = load_model_module("sglang")
    log = type("Log", (), {"info": lambda self, m: None, "warn": lambda self, m: None})()

    async def answer(extra_args: str, **params) -> str:
        adapter = model.SGLangAdapter({"model_path": str(tmp_path), "extra_args": extra_args}, log)
        await adapter.start()
        try:
            request = type("Request", (), {"prompt": "a b c", "params": SamplingParams(max_tokens=3, **params)})()
            return "".join([piece.text async for piece in adapter.generate("r1", request)])
        finally:
            await adapter.stop()

    with pytest.raises(InvalidRequest, match="enable_deterministic_inference=true"):
        asyncio.run(answer("{}", temperature=1.0, seed=7))
    assert asyncio.run(answer("{}", temperature=0.0, seed=7))  # greedy: the seed changes nothing, so it may stay
    assert asyncio.run(answer("{}", temperature=1.0))
    assert asyncio.run(answer('{"enable_deterministic_inference": true}', temperature=1.0, seed=7))


def test_trtllm_greedy_bad_words_and_penalties_map_to_sampling_params(engine):
    """TensorRT-LLM takes temperature > 0 only: greedy (temperature 0 or absent) is top_k 1; bad_words -> bad,
    presence/frequency penalties, ignore_eos and seed by their own names."""
    if engine.name != "trtllm":
        pytest.skip("TensorRT-LLM's SamplingParams")
    prompt = "greedy trtllm"
    responses, error = generate(
        engine,
        prompt,
        max_tokens=3,
        stream=False,
        ignore_eos=True,
        bad_words=["nope"],
        presence_penalty=0.5,
        frequency_penalty=0.25,
        seed=11,
        top_k=5,
    )
    assert error is None and responses[0]["output_tokens"] == 3
    s = last_generate(engine, prompt)["sampling"]
    assert (s["top_k"], s["temperature"], s["top_p"], s["bad"], s["ignore_eos"], s["seed"]) == (
        1,
        None,
        None,
        ["nope"],
        True,
        11,
    )
    assert (s["presence_penalty"], s["frequency_penalty"], s["repetition_penalty"]) == (0.5, 0.25, None)


def test_lmdeploy_greedy_keeps_the_repetition_penalty_and_refusals_are_clear(engine):
    """LMDeploy's preprocess drops the penalty of a do_sample=False request; temperature above 2 and
    requests it refuses (RequestError) come back as errors that say why."""
    if engine.name != "lmdeploy":
        pytest.skip("LMDeploy's GenerationConfig semantics")
    prompt = "greedy with a penalty"
    responses, error = generate(engine, prompt, max_tokens=3, stream=False, repetition_penalty=1.3)
    assert error is None and responses[0]["output_tokens"] == 3
    s = last_generate(engine, prompt)["sampling"]
    assert (s["do_sample"], s["top_k"], s["temperature"]) == (True, 1, 1.0) and s[
        "repetition_penalty"
    ] == pytest.approx(1.3)
    prompt = "plain greedy"
    generate(engine, prompt, max_tokens=2, stream=False)
    s = last_generate(engine, prompt)["sampling"]
    assert (s["do_sample"], s["top_k"], s["repetition_penalty"]) == (False, 1, 1.0)
    _, error = generate(engine, "too hot", max_tokens=2, temperature=3.0)
    assert error is not None and "LMDeploy accepts temperature in [0, 2]" in str(error)
    _, error = generate(engine, " ".join(["w"] * 4096), max_tokens=2)
    assert error is not None and "context_length_exceeded" in str(error), error
    # a stop string is found in the text even where the engine's pieces split it, and with ignore_eos too
    responses, error = generate(engine, "a b c d e f g h", max_tokens=8, ignore_eos=True, stop_words=["3 t"])
    assert error is None and "".join(r["text_output"] for r in responses) == " t0 t1 t2 t"
    assert responses[-1]["finish_reason"] == "stop" and responses[-1]["output_tokens"] == 5
    responses, error = generate(engine, "a b c d e f g h", max_tokens=8, stop_words=[" t1"], min_length=3)
    assert error is None and "".join(r["text_output"] for r in responses) == " t0 t1 t2 t3 t4 t5 t6 t7"
    responses, error = generate(engine, "still serving", max_tokens=2, stream=False)
    assert error is None and responses[0]["text_output"] == " t0 t1"


def test_cancel_aborts_the_engine_request(engine):
    prompt = "please cancel me " * 3
    s = Stream(engine)
    try:
        s.send(prompt, max_tokens=3000, ignore_eos=True)
        for _ in range(3):
            out, error, final = s.next()
            assert error is None and not final
    finally:
        s.close(cancel=True)
    rid = last_generate(engine, prompt)["request_id"]
    aborts = wait_for(lambda: [e for e in events(engine, "abort") if e["request_id"] == rid])
    assert aborts, f"{engine.name}: no abort recorded for {rid}; events: {events(engine)[-5:]}"


def test_engine_error_becomes_an_error_response_and_the_model_keeps_serving(engine):
    responses, error = generate(engine, "x y z FAIL_AT_2 w", max_tokens=10)
    assert error is not None and "stand-in engine failure at token 2" in str(error)
    assert "".join(r["text_output"] for r in responses) == " t0 t1"  # what was streamed before the failure
    responses, error = generate(engine, "after the failure", max_tokens=2, stream=False)
    assert error is None and responses[0]["text_output"] == " t0 t1"


def check_concurrent_streams(server, n: int, first_length: int) -> None:
    """n streams at once, stream i asking for first_length + i tokens: each gets exactly its own script."""
    streams = [Stream(server) for _ in range(n)]
    try:
        for i, s in enumerate(streams):
            s.send(" ".join(["w"] * 20) + f" s{i}", max_tokens=first_length + i)
        for i, s in enumerate(streams):
            responses, error = s.collect()
            assert error is None
            assert "".join(r["text_output"] for r in responses) == "".join(f" t{k}" for k in range(first_length + i))
    finally:
        for s in streams:
            s.close()


def test_concurrent_streams_do_not_mix(engine):
    check_concurrent_streams(engine, 4, 6)


def test_unload_calls_finalize_which_shuts_the_engine_down(engine):
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(engine.grpc_url)
    try:
        c.unload_model(engine.model)
    finally:
        c.close()
    assert wait_for(lambda: events(engine, "shutdown"), timeout=30), (
        f"{engine.name}: finalize did not shut the engine down"
    )


def test_sglang_worker_node_hosts_its_engine_share_and_takes_no_requests(tmp_path):
    """Node 1 of a 2-node SGLang copy, as launcher.rank starts it (environment from the rendezvous)."""
    from launcher.cli import plan
    from launcher.render import repository_files
    from tests.standins.server import STANDINS, serve, write_repository

    _, spec = plan(["cluster=slurm", "engine=sglang", "tp=16", "nodes=2", "model.path=/models/standin-llm"])
    repo = write_repository(repository_files(spec), tmp_path / "repo")
    log = tmp_path / "calls.jsonl"
    env = {
        "LLMLAUNCH_STANDIN_LOG": str(log),
        "_LLMLAUNCH_GROUP_RANK": "1",
        "_LLMLAUNCH_GROUP_SIZE": "2",
        "_LLMLAUNCH_LEADER_ADDR": "10.0.0.1",
        "_LLMLAUNCH_DIST_PORT": "29555",
    }
    with serve(
        repo,
        ["sglang_model"],
        tmp_path / "server.log",
        "sglang_model",
        extra_env=env,
        ready_timeout_s=60,
        pythonpath=[STANDINS],
    ) as server:
        server.model, server.calls = "sglang_model", log
        (init,) = events(server, "init")
        assert (
            init["args"]["nnodes"],
            init["args"]["node_rank"],
            init["args"]["dist_init_addr"],
            init["args"]["tp_size"],
        ) == (2, 1, "10.0.0.1:29555", 16)
        _, error = generate(server, "hello", max_tokens=3)
        assert error is not None and "takes no requests" in str(error)
    assert events(server, "shutdown")


def test_trtllm_llm_args_reach_model_yaml_and_unknown_keys_are_refused(tmp_path):
    """engine.llm_args is written into model.yaml over llmlaunch's arguments; a key tensorrt_llm.LLM does not take
    fails the model's load with a message listing the valid ones."""
    from launcher.cli import plan
    from launcher.render import repository_files
    from tests.standins.server import failed_load_log, write_repository

    _, spec = plan(
        [
            "engine=trtllm",
            "model.path=/models/standin-llm",
            "+engine.llm_args.enable_chunked_prefill=true",
            "+engine.llm_args.max_batch_size=4",
            "+engine.llm_args.no_such_arg=1",
        ]
    )
    files = repository_files(spec)
    assert (
        "enable_chunked_prefill: true" in files["tensorrt_llm/1/model.yaml"]
        and "max_batch_size: 4" in files["tensorrt_llm/1/model.yaml"]
    )
    repo = write_repository(files, tmp_path / "repo")
    env = {"LLMLAUNCH_STANDIN_LOG": str(tmp_path / "calls.jsonl")}
    text = failed_load_log(repo, spec.model_name, tmp_path / "server.log", env)
    assert (
        "tensorrt_llm.LLM takes no ['no_such_arg']" in text
        and "enable_chunked_prefill" in text
        and "valid keys:" in text
    ), text[-2000:]
