"""TensorRT-LLM's `engine.layout=ensemble`: preprocessing -> tensorrt_llm -> postprocessing (+ optional BLS), for
releases that still ship the C++ backend (docs/engines.md says which).

Targets the `inflight_batcher_llm` layout of triton-inference-server/tensorrtllm_backend
v0.9 and later (the C++ `tensorrtllm` backend, parameters as string values);
with `engine.backend=python` the tensorrt_llm model uses the backend's
LLM-API python model (`backend: "python"`, v0.17 and later), which reads the
same parameter names. Every value the seeds fill in with sed is a field of
`TRTLLMEngineConfig`; unset values are left out instead of left as `${...}`.

Our own preprocessing/postprocessing models (launcher/engines/trtllm/models/) serve
the common contract on the ensemble: they also carry `ignore_eos`, the token
counts and `finish_reason`, so every llmlaunch endpoint answers alike.
"""

from __future__ import annotations

import os
from typing import List, Tuple

from launcher import pbtxt
from launcher.engines.base import RenderedModel, tokenizer_path
from launcher.engines.trtllm.llmapi import looks_like_engine_dir


def check(c) -> List[Tuple[str, str, str]]:
    """Rules across fields (each field's own domain is declared in launcher/engines/trtllm/config.py)."""
    return _fields_check(c) + _path_problems(c)


def _fields_check(c) -> List[Tuple[str, str, str]]:
    e, problems = c.engine, []
    if not e.engine_dir:
        problems.append(
            (
                "engine.engine_dir=''",
                "the tensorrt_llm model needs a built TensorRT-LLM engine folder (gpt_model_path)",
                "set engine.engine_dir=/path/to/trt_engines/<model>/<tp>-gpu (or model.path)",
            )
        )
    if not (e.tokenizer_dir or c.model.tokenizer or c.model.path):
        problems.append(
            (
                "engine.tokenizer_dir=''",
                "pre/postprocessing need the model's tokenizer",
                "set engine.tokenizer_dir=/path/to/hf_model or model.tokenizer",
            )
        )
    if e.batching_strategy == "V1" and e.decoupled:
        problems.append(
            (
                "engine.batching_strategy='V1' with engine.decoupled=true",
                "V1 (no in-flight batching) cannot stream",
                "set engine.decoupled=false, or batching_strategy=inflight_fused_batching",
            )
        )
    return problems


def _path_problems(c) -> List[Tuple[str, str, str]]:
    """engine.engine_dir, where it exists here, must be a built engine, not a checkpoint."""
    d = c.engine.engine_dir
    if d and os.path.isdir(d) and not looks_like_engine_dir(d) and os.path.isfile(os.path.join(d, "config.json")):
        return [
            (
                f"engine.engine_dir={d!r}",
                "holds no rank<N>.engine file: a Hugging Face checkpoint, not a built "
                "TensorRT-LLM engine, which engine.layout=ensemble serves",
                "set engine.layout=llmapi to serve the "
                "checkpoint as it is, or engine.engine_dir=<the folder trtllm-build wrote>",
            )
        ]
    return []


def host_paths(c) -> List[Tuple[str, str, str]]:
    """The engine folder, and the tokenizer pre/postprocessing load (the first of engine.tokenizer_dir,
    model.tokenizer, model.path given: the key named is the one it came from)."""
    e, m = c.engine, c.model
    tok = next(
        (
            (k, v)
            for k, v in (
                ("engine.tokenizer_dir", e.tokenizer_dir),
                ("model.tokenizer", m.tokenizer),
                ("model.path", m.path),
            )
            if v
        ),
        ("engine.tokenizer_dir", ""),
    )
    return [("engine.engine_dir", e.engine_dir, "trtllm_engine"), (tok[0], tok[1], "tokenizer")]


def _instances(e) -> int:
    # Tokenising is cheap but serial per instance: one instance per 8 sequences, at most 8.
    return e.preprocessing_instances or min(8, max(1, e.max_num_seqs // 8))


def render_models(spec) -> List[RenderedModel]:
    e = spec.engine
    tok = e.tokenizer_dir or tokenizer_path(spec)
    models = [_preprocessing(e, tok), _tensorrt_llm(e), _postprocessing(e, tok), _ensemble(spec)]
    if e.bls:
        bls = pbtxt.python_model(
            "tensorrt_llm_bls", e.max_num_seqs, {"tensorrt_llm_model_name": "tensorrt_llm", "tokenizer_dir": tok}
        )
        models.append(RenderedModel("tensorrt_llm_bls", bls, {"1/model.py": "trtllm/tensorrt_llm_bls/1/model.py"}))
    return models


def _pb():
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2


def _preprocessing(e, tok: str) -> RenderedModel:
    """text -> ids, words -> id lists (python backend)."""
    pb, inp, out = _pb(), pbtxt.tensor_input, pbtxt.tensor_output
    pre = pb.ModelConfig(name="preprocessing", backend="python", max_batch_size=e.max_num_seqs)
    pre.input.extend(
        [
            inp("QUERY", "BYTES", [1]),
            inp("REQUEST_OUTPUT_LEN", "INT32", [1]),
            inp("BAD_WORDS_DICT", "BYTES", [-1], optional=True),
            inp("STOP_WORDS_DICT", "BYTES", [-1], optional=True),
            inp("END_ID", "INT32", [1], optional=True),
            inp("PAD_ID", "INT32", [1], optional=True),
            inp("IGNORE_EOS", "BOOL", [1], optional=True),
            # Triton rejects ensemble inputs no step consumes, so the contract's
            # extras come here: seed/random_seed merge into one, the rest is noted.
            inp("RANDOM_SEED", "UINT64", [1], optional=True),
            inp("SEED", "UINT64", [1], optional=True),
            inp("EXCLUDE_INPUT_IN_OUTPUT", "BOOL", [1], optional=True),
        ]
    )
    pre.output.extend(
        [
            out("INPUT_ID", "INT32", [-1]),
            out("REQUEST_INPUT_LEN", "INT32", [1]),
            out("BAD_WORDS_IDS", "INT32", [2, -1]),
            out("STOP_WORDS_IDS", "INT32", [2, -1]),
            out("REQUEST_OUTPUT_LEN", "INT32", [-1]),
            out("OUT_END_ID", "INT32", [1]),
            out("OUT_PAD_ID", "INT32", [1]),
            out("OUT_RANDOM_SEED", "UINT64", [1]),
        ]
    )
    pre.instance_group.add(count=_instances(e), kind=pb.ModelInstanceGroup.KIND_CPU)
    pbtxt.set_parameters(pre, {"tokenizer_dir": tok, "tokenizer_type": e.tokenizer_type, "add_special_tokens": True})
    return RenderedModel("preprocessing", pre, {"1/model.py": "trtllm/preprocessing/1/model.py"})


def _tensorrt_llm(e) -> RenderedModel:
    """The engine itself (C++ backend or LLM-API python model)."""
    pb, inp, out = _pb(), pbtxt.tensor_input, pbtxt.tensor_output
    trt = pb.ModelConfig(name="tensorrt_llm", backend=e.backend, max_batch_size=e.max_num_seqs)
    trt.model_transaction_policy.decoupled = bool(e.decoupled)
    trt.dynamic_batching.preferred_batch_size.append(e.max_num_seqs)
    trt.dynamic_batching.max_queue_delay_microseconds = int(e.max_queue_delay_microseconds)
    trt.input.extend(
        [
            inp("input_ids", "INT32", [-1], ragged=True),
            inp("input_lengths", "INT32", [1], reshape=[]),
            inp("request_output_len", "INT32", [1], reshape=[]),
            inp("end_id", "INT32", [1], optional=True, reshape=[]),
            inp("pad_id", "INT32", [1], optional=True, reshape=[]),
            inp("stop_words_list", "INT32", [2, -1], optional=True, ragged=True),
            inp("bad_words_list", "INT32", [2, -1], optional=True, ragged=True),
            inp("beam_width", "INT32", [1], optional=True, reshape=[]),
            inp("temperature", "FP32", [1], optional=True, reshape=[]),
            inp("runtime_top_k", "INT32", [1], optional=True, reshape=[]),
            inp("runtime_top_p", "FP32", [1], optional=True, reshape=[]),
            inp("repetition_penalty", "FP32", [1], optional=True, reshape=[]),
            inp("presence_penalty", "FP32", [1], optional=True, reshape=[]),
            inp("frequency_penalty", "FP32", [1], optional=True, reshape=[]),
            inp("min_length", "INT32", [1], optional=True, reshape=[]),
            inp("random_seed", "UINT64", [1], optional=True, reshape=[]),
            inp("return_log_probs", "BOOL", [1], optional=True, reshape=[]),
            inp("streaming", "BOOL", [1], optional=True),
        ]
    )
    trt.output.extend(
        [
            out("output_ids", "INT32", [-1, -1]),
            out("sequence_length", "INT32", [-1]),
            out("cum_log_probs", "FP32", [-1]),
            out("output_log_probs", "FP32", [-1, -1]),
        ]
    )
    trt.instance_group.add(count=1, kind=pb.ModelInstanceGroup.KIND_CPU)
    params = {
        "gpt_model_type": e.batching_strategy,
        "gpt_model_path": e.engine_dir,
        "batch_scheduler_policy": e.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": e.kv_cache_free_gpu_mem_fraction,
        "max_beam_width": e.max_beam_width,
        "exclude_input_in_output": e.exclude_input_in_output,
        "enable_kv_cache_reuse": e.enable_kv_cache_reuse,
        "enable_chunked_context": e.enable_chunked_context,
        # CPU-side tensors are what the python pre/postprocessing exchange with it.
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
    }
    if e.max_tokens_in_paged_kv_cache:
        params["max_tokens_in_paged_kv_cache"] = e.max_tokens_in_paged_kv_cache
    if e.max_attention_window_size:
        params["max_attention_window_size"] = e.max_attention_window_size
    pbtxt.set_parameters(trt, params)
    return RenderedModel("tensorrt_llm", trt, {}, {"1/.keep": ""})


def _postprocessing(e, tok: str) -> RenderedModel:
    """ids -> text, plus the contract's counts and finish reason."""
    pb, inp, out = _pb(), pbtxt.tensor_input, pbtxt.tensor_output
    post = pb.ModelConfig(name="postprocessing", backend="python", max_batch_size=e.max_num_seqs)
    post.input.extend(
        [
            inp("TOKENS_BATCH", "INT32", [-1, -1]),
            inp("SEQUENCE_LENGTH", "INT32", [-1]),
            inp("REQUEST_INPUT_LEN", "INT32", [1], optional=True),
            inp("REQUEST_OUTPUT_LEN", "INT32", [-1], optional=True),
            inp("STREAM", "BOOL", [1], optional=True),
        ]
    )
    post.output.extend(
        [
            out("OUTPUT", "BYTES", [-1]),
            out("INPUT_TOKENS", "INT32", [1]),
            out("OUTPUT_TOKENS", "INT32", [1]),
            out("FINISH_REASON", "BYTES", [1]),
        ]
    )
    post.instance_group.add(count=e.postprocessing_instances or _instances(e), kind=pb.ModelInstanceGroup.KIND_CPU)
    pbtxt.set_parameters(post, {"tokenizer_dir": tok, "tokenizer_type": e.tokenizer_type, "skip_special_tokens": True})
    return RenderedModel("postprocessing", post, {"1/model.py": "trtllm/postprocessing/1/model.py"})


# The ensemble's steps: (model, its inputs from the ensemble's tensors, its outputs to them). The contract's names
# are on the outside; the tensors between steps start with _.
PREPROCESSING_STEP = (
    "preprocessing",
    {
        "QUERY": "text_input",
        "REQUEST_OUTPUT_LEN": "max_tokens",
        "BAD_WORDS_DICT": "bad_words",
        "STOP_WORDS_DICT": "stop_words",
        "END_ID": "end_id",
        "PAD_ID": "pad_id",
        "IGNORE_EOS": "ignore_eos",
        "RANDOM_SEED": "random_seed",
        "SEED": "seed",
        "EXCLUDE_INPUT_IN_OUTPUT": "exclude_input_in_output",
    },
    {
        "INPUT_ID": "_INPUT_ID",
        "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
        "BAD_WORDS_IDS": "_BAD_WORDS_IDS",
        "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
        "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
        "OUT_END_ID": "_END_ID",
        "OUT_PAD_ID": "_PAD_ID",
        "OUT_RANDOM_SEED": "_RANDOM_SEED",
    },
)
TENSORRT_LLM_STEP = (
    "tensorrt_llm",
    {
        "input_ids": "_INPUT_ID",
        "input_lengths": "_REQUEST_INPUT_LEN",
        "request_output_len": "_REQUEST_OUTPUT_LEN",
        "end_id": "_END_ID",
        "pad_id": "_PAD_ID",
        "stop_words_list": "_STOP_WORDS_IDS",
        "bad_words_list": "_BAD_WORDS_IDS",
        "beam_width": "beam_width",
        "temperature": "temperature",
        "runtime_top_k": "top_k",
        "runtime_top_p": "top_p",
        "repetition_penalty": "repetition_penalty",
        "presence_penalty": "presence_penalty",
        "frequency_penalty": "frequency_penalty",
        "min_length": "min_length",
        "random_seed": "_RANDOM_SEED",
        "return_log_probs": "return_log_probs",  # accepted as TensorRT-LLM clients send it; none come back
        "streaming": "stream",
    },
    {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH"},
)
POSTPROCESSING_OUTPUTS = {
    "OUTPUT": "text_output",
    "INPUT_TOKENS": "input_tokens",
    "OUTPUT_TOKENS": "output_tokens",
    "FINISH_REASON": "finish_reason",
}


def _ensemble(spec) -> RenderedModel:
    """The contract's names on the outside, the three steps inside."""
    e = spec.engine
    ens = _pb().ModelConfig(name=spec.model_name, platform="ensemble", max_batch_size=e.max_num_seqs)
    steps = ens.ensemble_scheduling.step
    post_inputs = {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"}
    if not e.decoupled:
        # Triton refuses an ensemble step mixing tensors of a decoupled model with others
        # ("receives inputs originated from different decoupled models"), so with streaming the
        # postprocessing step sees only tensorrt_llm's outputs: token counts per response, no
        # finish reason. `engine.bls=true` (model tensorrt_llm_bls) serves the full contract.
        post_inputs.update(
            {"REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN", "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN", "STREAM": "stream"}
        )
    for model, inputs, outputs in (
        PREPROCESSING_STEP,
        TENSORRT_LLM_STEP,
        ("postprocessing", post_inputs, POSTPROCESSING_OUTPUTS),
    ):
        s = steps.add(model_name=model, model_version=-1)
        for k, v in inputs.items():
            s.input_map[k] = v
        for k, v in outputs.items():
            s.output_map[k] = v
    # The contract's inputs and outputs that the steps use: Triton refuses an ensemble input no step reads, and a
    # request that sends another (a token-id prompt, top_log_probs) is refused by name.  No step returns log
    # probabilities: the OpenAI API answers a request for them that gets none with a 400 (engine.bls=true refuses it).
    used = {v for st in steps for v in st.input_map.values()} | {v for st in steps for v in st.output_map.values()}
    ens.input.extend(t for t in pbtxt.contract_inputs() if t.name in used)
    for t in ens.input:
        if t.name == "text_input":  # the one prompt the ensemble takes
            t.optional = False
    ens.output.extend(t for t in pbtxt.contract_outputs() if t.name in used)
    return RenderedModel(spec.model_name, ens, {}, {"1/.keep": ""})
