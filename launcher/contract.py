"""The one request/response contract every llmlaunch model serves.

It is the interface of TensorRT-LLM's `ensemble` model (and what Triton's
generate endpoint maps onto), so a client or load tool written for a
TensorRT-LLM ensemble works unchanged against any llmlaunch endpoint.

This module is data only (no Triton, no torch): rendering builds the
`config.pbtxt` inputs/outputs from it, the python models validate requests
against it, and the client builds requests from it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tensor:
    name: str  # tensor name on the wire
    dtype: str  # Triton dtype without the TYPE_ prefix: BYTES, INT32, BOOL, FP32, UINT64
    dims: tuple = (1,)  # shape without the batch dimension (models use max_batch_size 0 and dims [1] or [-1])
    optional: bool = True  # required inputs are rejected when absent
    doc: str = ""  # what it means; engines that cannot honour it log a note and ignore it


INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "BYTES", (1,), True, "the prompt, UTF-8 (this or input_ids is required)"),
    Tensor("input_ids", "INT32", (-1,), True, "the prompt as token ids of the served model, in place of text_input"),
    Tensor(
        "continue_ids",
        "INT32",
        (-1,),
        True,
        "token ids this request already generated on another server (a stream moved mid-generation by the front "
        "end): the model continues after them as if it had generated them, counts them in output_tokens, "
        "max_tokens and min_length, and sends none of their text",
    ),
    Tensor(
        "kv_from",
        "BYTES",
        (1,),
        True,
        "where the keys and values of this prompt wait, computed by a prefill engine (disaggregated serving): the "
        "kv_handle that prefill returned, or for the hf engine host:port of the prefill engine; the model takes "
        "them and computes only the rest of the prompt; where they cannot be had (unreachable, evicted), it computes "
        "the whole prompt",
    ),
    Tensor(
        "kv_export",
        "BOOL",
        (1,),
        True,
        "this request is the prefill of a request another engine decodes (disaggregated serving): the engine keeps "
        "the prompt's keys and values for it and, where it has a handle for them, returns it as kv_handle",
    ),
    Tensor("max_tokens", "INT32", (1,), False, "number of tokens to generate (>= 1)"),
    Tensor("stream", "BOOL", (1,), True, "stream one response per new piece of text; default false"),
    Tensor(
        "exclude_input_in_output",
        "BOOL",
        (1,),
        True,
        "never echo the prompt (llmlaunch never does; accepted for compatibility)",
    ),
    Tensor("min_length", "INT32", (1,), True, "minimum new tokens before EOS / stop words may end the request"),
    Tensor("ignore_eos", "BOOL", (1,), True, "generate exactly max_tokens (benchmarks)"),
    Tensor("end_id", "INT32", (1,), True, "token id that ends generation; default the tokenizer's EOS"),
    Tensor("pad_id", "INT32", (1,), True, "padding token id (accepted for compatibility)"),
    Tensor("bad_words", "BYTES", (-1,), True, "words that must not be generated"),
    Tensor("stop_words", "BYTES", (-1,), True, "generation stops after any of these strings; they are not returned"),
    Tensor("top_k", "INT32", (1,), True, "sample among the k most likely tokens; 0 = off"),
    Tensor("top_p", "FP32", (1,), True, "nucleus sampling; 1.0 = off"),
    Tensor("temperature", "FP32", (1,), True, "0 or absent = greedy"),
    Tensor("repetition_penalty", "FP32", (1,), True, "1.0 = off"),
    Tensor("presence_penalty", "FP32", (1,), True, "0.0 = off"),
    Tensor("frequency_penalty", "FP32", (1,), True, "0.0 = off"),
    Tensor("random_seed", "UINT64", (1,), True, "sampling seed for this request"),
    Tensor("seed", "UINT64", (1,), True, "alias of random_seed (Triton generate endpoint name)"),
    Tensor(
        "return_log_probs",
        "BOOL",
        (1,),
        True,
        "each new token's id and log probability (the log_prob_ids and log_probs outputs); engines that cannot "
        "return them refuse the request",
    ),
    Tensor("top_log_probs", "INT32", (1,), True, "with return_log_probs: the k most likely tokens too (0-20)"),
    Tensor(
        "return_prompt_log_probs",
        "BOOL",
        (1,),
        True,
        "each prompt token's log probability, and top_log_probs of them (prompt_log_prob_ids, prompt_log_probs "
        "on the first response)",
    ),
    Tensor(
        "guided_decoding_guide_type",
        "BYTES",
        (1,),
        True,
        "constrain the output (structured output): 'json' (any JSON object), 'json_schema', 'regex' or "
        "'ebnf_grammar' (GUIDE_KINDS); engines that cannot constrain refuse the request",
    ),
    Tensor(
        "guided_decoding_guide",
        "BYTES",
        (1,),
        True,
        "the JSON schema, regular expression or EBNF grammar the output follows (none for 'json')",
    ),
    Tensor("beam_width", "INT32", (1,), True, "only 1 is supported by streaming engines; others are rejected"),
)

OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "BYTES", (-1,), False, "new text: the delta when streaming, the whole completion otherwise"),
    Tensor("input_tokens", "INT32", (1,), False, "tokens in the prompt"),
    Tensor(
        "output_ids",
        "INT32",
        (-1,),
        True,
        "sent only to a request with the return_token_ids parameter: the ids of the new tokens whose text has been "
        "sent (in this response or before it; ids whose text is held back come with the response that sends it); "
        "[-1] on the first response of a request the model cannot continue elsewhere (continue_ids)",
    ),
    Tensor("output_tokens", "INT32", (1,), False, "tokens generated so far (cumulative)"),
    Tensor(
        "kv_handle",
        "BYTES",
        (1,),
        True,
        "on the final response of a kv_export request, where the engine has one: the handle of the prompt's keys "
        "and values, to send as kv_from with the request to the decode engine (vLLM: its kv_transfer_params, JSON)",
    ),
    Tensor(
        "finish_reason",
        "BYTES",
        (1,),
        False,
        "empty while streaming; 'length', 'stop' or 'cancelled' on the last response",
    ),
    # Log probabilities, sent only to a request that asked (return_log_probs, return_prompt_log_probs): a row per
    # token, its own id (log prob) first, then its top_log_probs most likely ids (log probs), most likely first.
    # They are the model's own distribution: before temperature, penalties and top-k/top-p (vLLM's default too).
    Tensor("log_prob_ids", "INT32", (-1, -1), True, "per new token of this response: its id, then the top ids"),
    Tensor("log_probs", "FP32", (-1, -1), True, "the log probabilities of log_prob_ids"),
    Tensor("prompt_log_prob_ids", "INT32", (-1, -1), True, "per prompt token, from the first: its id, then the top"),
    Tensor("prompt_log_probs", "FP32", (-1, -1), True, "their log probabilities; the first token's row is NaN"),
)

# The most likely tokens a request may ask log probabilities of (top_log_probs), as OpenAI's API allows.
MAX_TOP_LOG_PROBS = 20

# guided_decoding_guide_type's values (TensorRT-LLM's names for them): what each guide is.  The EBNF dialect is
# xgrammar's (GBNF-like: `root ::= "yes" | "no"`), which vLLM, SGLang and TensorRT-LLM all compile.
GUIDE_KINDS = {
    "json": "any JSON object (no guide)",
    "json_schema": "a JSON value that validates against the guide, a JSON schema",
    "regex": "text that matches the guide, a regular expression",
    "ebnf_grammar": "text the guide, an EBNF grammar whose start rule is `root`, derives",
}


@dataclass(frozen=True)
class Parameter:
    name: str  # key among the request's Triton parameters (gRPC `parameters`, the generate endpoint's JSON keys)
    kind: str  # "bool" (the one kind so far): true / false, or "true" / "false" / "1" / "0" as text
    default: object  # the value when the request does not send it
    doc: str = ""  # what it means


# Request parameters, not input tensors: llmlaunch's models ignore a parameter they do not know, and a model that does
# not know one of these serves the request as before (an unknown input tensor would fail it).  Not every Triton model
# is so lenient: Triton's own vLLM backend turns every request parameter into a vLLM SamplingParams field and fails a
# request whose parameter it does not know.  So the models that honour these say so in their config
# (HONOURED_PARAMETERS_KEY), and llmlaunch-bench sends them only where a model does, unless asked.
PARAMETERS: tuple[Parameter, ...] = (
    Parameter(
        "final_counts_only",
        "bool",
        False,
        "streaming: send input_tokens, output_tokens and finish_reason on the final response only, "
        "text_output alone before it (a quarter of the tensors per token to send and parse; "
        "the TensorRT-LLM ensemble sends them on every response)",
    ),
    Parameter(
        "return_token_ids",
        "bool",
        False,
        "each response carries output_ids: the front end keeps them to move a stream to another replica "
        "mid-generation (launcher/frontend/migration.py); models that cannot continue a request ignore it",
    ),
)

# A request parameter (string) naming the client's session: the front end of `replicas=N` with serve.routing=prefix
# keeps a session's requests on one replica while it is within its load bound (launcher/frontend/routing.py); the
# OpenAI API sets it from the `X-Session-ID` header.  The models ignore it, as they ignore any parameter they do not
# know.
SESSION_PARAMETER = "session_id"
SESSION_HEADER = "X-Session-ID"  # the OpenAI API's header that becomes SESSION_PARAMETER

# The config parameter (config.pbtxt `parameters`) naming, comma-separated, the PARAMETERS a model honours: written by
# launcher.pbtxt.python_model for the hf, vLLM, SGLang, LMDeploy and TensorRT-LLM BLS models, read by
# launcher.client.control.honoured_parameters.
HONOURED_PARAMETERS_KEY = "llmlaunch_request_parameters"

# The config parameters naming the served model's tokenizer folder (the hf, vLLM, SGLang and LMDeploy models:
# tokenizer_path; the TensorRT-LLM BLS model: tokenizer_dir), read by launcher.client.control.served_tokenizer so
# llmlaunch-bench counts and builds prompts in the served model's tokens.
TOKENIZER_KEYS = ("tokenizer_path", "tokenizer_dir")

INPUT_NAMES = tuple(t.name for t in INPUTS)
REQUIRED_INPUTS = tuple(t.name for t in INPUTS if not t.optional)
OUTPUT_NAMES = tuple(t.name for t in OUTPUTS)
