"""What the hf model measures inside the server, as Triton custom metrics on the metrics port.

1. Where a streamed request's first token spends its time inside the model.  A client sees
   time to first token (TTFT); this splits the part spent inside the model into six,
   measured per streamed request on one clock (CLOCK_MONOTONIC is shared by every process
   of the machine).  A kv_export request (a prefill replica's part of a disaggregated request:
   one token, not streamed) is counted too: its time is part of its decode's first token.

  parse    the model's `execute` took the request -> read and checked it, queued it with the engine
  add      queued -> the engine process received it (the socket, the engine process's reader thread)
  engine   received -> first token made (tokenize, wait for a slot and the prefill budget,
           prefill, sample, detokenize)
  back     first token made -> the stub has it (the engine process's message, the socket back,
           the stub's receive thread)
  respond  the stub has it -> its response built, the send about to begin (a responder thread's
           queue where the stream has one, merging outputs, building the response's tensors)
  send     the response sender's send call: the response handed to tritonserver, a round trip
           from the stub to the server process and back

   Client TTFT minus the six is tritonserver, gRPC and the client.

  llmlaunch_first_token_seconds{model="...",part="parse|add|engine|back|respond|send"}   seconds, summed
  llmlaunch_first_tokens{model="..."}                                                requests counted

2. How the engine loop spends a step (launcher.hf.reporting.EngineStats): is the served engine bound by
   the GPU or by its host work?  A step's wall time is launch + wait + host work; on a GPU,
   `gpu` is each step's span on the stream and `gpu_idle` the GPU waiting for the host to
   queue the next step.

  llmlaunch_engine_seconds{model="...",part="step|launch|wait|gpu|gpu_idle"}  seconds, summed
  llmlaunch_engine_steps{model="...",kind="all|ahead|gpu_timed|gpu_gap"}     steps counted
  llmlaunch_engine_tokens{model="...",kind="decode|prefill"}                 tokens counted

   The vLLM model counts its engine core's steps from the scheduler statistics vLLM gives the front ends' stat
   loggers (launcher/engines/vllm/core.py, counters.EngineSteps: VLLM_STEP_COUNTERS): steps, decode and prefill
   tokens as above, the requests running and waiting at each step, and, with the engine argument
   cudagraph_metrics=true (its CUDAGraphStat), the tokens each step scheduled and its CUDA-graph runtime mode.  vLLM
   reports no time per step: `engine_step_split` gives these figures and no step_ms.

  llmlaunch_engine_steps{model="...",kind="graph_seen|graph_full|graph_piecewise|graph_none"}  steps counted
  llmlaunch_engine_tokens{model="...",kind="scheduled"}                      tokens counted
  llmlaunch_engine_step_requests{model="...",kind="running|waiting"}        requests, summed over steps

Every metric is a counter, so a mean over any window is the difference of its sums divided by
the difference of a count (`mean_first_token_ms`, `engine_step_split`).  Each update of a
Triton metric is a round trip from the stub to the server, too dear for the response path, so
sums are kept in the stub and pushed once a second (launcher/python_backend/counters.py).

3. The prefix cache: prompt tokens of the requests admitted, and of those served from the cache, not prefilled
   (launcher/python_backend/cache_splits.py: `prefix_cache_split`). The hf engine counts them in its scheduler; the vLLM and SGLang models count what their
   engine reports per request (RequestOutput.num_cached_tokens; meta_info's cached_tokens).

  llmlaunch_engine_prompt_tokens{model="...",kind="admitted|cached"}          tokens counted

4. Keys and values moved between engines (disaggregated serving): the transfers a decode engine made from a prefill
   engine, those that failed (the decode then computes the prompt itself), the bytes moved and the time the moves
   took (cache_splits.py: `kv_transfer_split`).  The hf engine counts its fetches (launcher/hf/kv_transfer.py); vLLM's model counts
   what its KV connector reports in the engine's scheduler statistics (NIXL's transfers: launcher/engines/vllm/core.py).

  llmlaunch_kv_transfers{model="...",kind="done|failed"}                       transfers counted
  llmlaunch_kv_transfer_bytes{model="..."}                                     bytes moved
  llmlaunch_kv_transfer_seconds{model="..."}                                   seconds the moves took, summed

5. The KV cache in use, a gauge where the engine reports it (the hf engine's pool; vLLM's SchedulerStats): what a
   service scales by with serve.autoscale.signal=kv_cache (launcher/service/signals.py).

  llmlaunch_engine_kv_cache_usage{model="..."}                                 share, 0..1
"""

from __future__ import annotations

import re
import time

from launcher.python_backend.step_splits import engine_step_split, format_engine_split

PARTS = ("parse", "add", "engine", "back", "respond", "send")
SPLIT_KEYS = PARTS + ("inside_server", "outside_server")  # a first_token_split's figures, in order
SECONDS = "llmlaunch_first_token_seconds"
COUNT = "llmlaunch_first_tokens"
ENGINE_SECONDS = "llmlaunch_engine_seconds"
ENGINE_STEPS = "llmlaunch_engine_steps"
ENGINE_TOKENS = "llmlaunch_engine_tokens"
ENGINE_STEP_REQUESTS = "llmlaunch_engine_step_requests"
ENGINE_REQUEST_SECONDS = "llmlaunch_engine_request_seconds"
ENGINE_REQUESTS = "llmlaunch_engine_requests"
ENGINE_INTAKES = "llmlaunch_engine_intakes"
ENGINE_PROMPT_TOKENS = "llmlaunch_engine_prompt_tokens"
ENGINE_PREEMPTED = "llmlaunch_engine_preempted"
KV_TRANSFERS = "llmlaunch_kv_transfers"
KV_TRANSFER_BYTES = "llmlaunch_kv_transfer_bytes"
KV_TRANSFER_SECONDS = "llmlaunch_kv_transfer_seconds"

# One row per counter: (metric family, its label (None: none but the model's), label value, the key of its value in
# the totals a `Counters` reads, description).  First-token keys are FirstTokenTimes.totals_map's; engine keys are
# EngineStats' fields (launcher.hf.reporting).
FIRST_TOKEN_COUNTERS = tuple(
    (
        SECONDS,
        "part",
        p,
        p,
        "seconds streamed (and kv_export) requests spent before their first response, by part (launcher.python_backend.timings)",
    )
    for p in PARTS
) + ((COUNT, None, None, "count", "streamed (and kv_export) requests counted in llmlaunch_first_token_seconds"),)
_ENGINE_SECONDS_DOC = "seconds of the engine loop by part: step (wall), launch, wait (for the GPU), gpu, gpu_idle"
# one description for a family's every row, the hf engine's kinds and vLLM's: whoever registers the family first
# gives it its help text
_ENGINE_STEPS_DOC = (
    "engine steps: all, queued ahead (overlap), timed on the GPU, timed with their gap since the step before (not the "
    "first after the engine stood idle), with prompt tokens, prompts alone through a CUDA graph, prompts beside decode "
    "rows through a mixed CUDA graph; vLLM: steps that reported their CUDA graph (graph_seen), by runtime mode "
    "(graph_full, graph_piecewise, graph_none)"
)
_ENGINE_TOKENS_DOC = (
    "tokens the engine ran, by kind (vLLM: scheduled, the tokens of steps that reported their CUDA graph)"
)
ENGINE_COUNTERS = (
    tuple(
        (ENGINE_SECONDS, "part", p, key, _ENGINE_SECONDS_DOC)
        for p, key in (
            ("step", "wall_s"),
            ("launch", "launch_s"),
            ("wait", "wait_s"),
            ("gpu", "gpu_s"),
            ("gpu_idle", "gpu_idle_s"),
        )
    )
    + tuple(
        (ENGINE_STEPS, "kind", k, key, _ENGINE_STEPS_DOC)
        for k, key in (
            ("all", "steps"),
            ("ahead", "ahead_steps"),
            ("gpu_timed", "gpu_steps"),
            ("gpu_gap", "gpu_gaps"),
            ("prompt", "prompt_steps"),
            ("prompt_graph", "prompt_graph_steps"),
            ("mixed", "mixed_steps"),
        )
    )
    + tuple(
        (ENGINE_TOKENS, "kind", k, key, _ENGINE_TOKENS_DOC)
        for k, key in (("decode", "decode_tokens"), ("prefill", "prefill_tokens"))
    )
    + tuple(
        (
            ENGINE_REQUEST_SECONDS,
            "part",
            p,
            key,
            "seconds requests spent in the engine from being added, summed: until "
            "a KV-cache slot (queued), until their first token (first_token)",
        )
        for p, key in (("queued", "queued_s"), ("first_token", "to_first_token_s"))
    )
    + tuple(
        (
            ENGINE_REQUESTS,
            "kind",
            k,
            key,
            "requests given a slot (admitted), requests with a first token (first_token), "
            "requests handed to the engine (intake)",
        )
        for k, key in (("admitted", "admitted"), ("first_token", "first_tokens"), ("intake", "intake_requests"))
    )
    + (
        (
            ENGINE_INTAKES,
            None,
            None,
            "intake_calls",
            "hand-overs of requests to the engine (add_requests calls), the text prompts of each tokenized in one call",
        ),
    )
    + tuple(
        (
            ENGINE_PROMPT_TOKENS,
            "kind",
            k,
            key,
            "prompt tokens of the requests admitted (admitted), of those found in the prefix cache, not prefilled "
            "(cached); prompt tokens whose keys and values came from a prefill engine into the prefix cache "
            "(imported)",
        )
        for k, key in (
            ("admitted", "prompt_tokens"),
            ("cached", "cached_prompt_tokens"),
            ("imported", "imported_prompt_tokens"),
        )
    )
    + (
        (
            ENGINE_PREEMPTED,
            None,
            None,
            "preempted",
            "requests preempted because the KV-cache pool ran out (computed again once there is room)",
        ),
    )
    + tuple(
        (
            KV_TRANSFERS,
            "kind",
            k,
            key,
            "transfers of a prompt's keys and values from a prefill engine: done, and failed (the prompt then "
            "computed here)",
        )
        for k, key in (("done", "kv_transfers"), ("failed", "kv_transfer_failures"))
    )
    + (
        (KV_TRANSFER_BYTES, None, None, "kv_transfer_bytes", "bytes of keys and values moved from prefill engines"),
        (KV_TRANSFER_SECONDS, None, None, "kv_transfer_s", "seconds the moves of keys and values took, summed"),
    )
)
# The counters only vLLM's model fills (counters.EngineSteps): kept apart so the hf model, which pushes
# ENGINE_COUNTERS, registers no family or label it never counts
VLLM_ONLY_COUNTERS = (
    tuple(
        (ENGINE_STEPS, "kind", k, key, _ENGINE_STEPS_DOC)
        for k, key in (
            ("graph_seen", "graph_steps"),
            ("graph_full", "graph_full_steps"),
            ("graph_piecewise", "graph_piecewise_steps"),
            ("graph_none", "graph_none_steps"),
        )
    )
    + ((ENGINE_TOKENS, "kind", "scheduled", "scheduled_tokens", _ENGINE_TOKENS_DOC),)
    + tuple(
        (
            ENGINE_STEP_REQUESTS,
            "kind",
            k,
            key,
            "requests running (running) and waiting for a slot (waiting) as each engine step left them, summed over "
            "steps",
        )
        for k, key in (("running", "running_sum"), ("waiting", "waiting_sum"))
    )
)
# what the vLLM model pushes of its engine core's steps: the hf engine's rows it fills the same way, and its own
VLLM_STEP_COUNTERS = (
    tuple(row for row in ENGINE_COUNTERS if row[3] in ("steps", "decode_tokens", "prefill_tokens")) + VLLM_ONLY_COUNTERS
)
# the prefix cache's two counters, which the models of engines that report a request's cached prompt tokens (vLLM,
# SGLang: launcher.python_backend.async_runtime) push under the same names as the hf engine
PROMPT_TOKEN_COUNTERS = tuple(row for row in ENGINE_COUNTERS if row[0] == ENGINE_PROMPT_TOKENS)
RUNTIME_COUNTERS = FIRST_TOKEN_COUNTERS + PROMPT_TOKEN_COUNTERS  # what those models push
# the transfers' counters, which a runtime engine's model pushes where its engine moves keys and values (vLLM with a
# KV connector: its adapter's kv_transfers)
KV_TRANSFER_COUNTERS = tuple(row for row in ENGINE_COUNTERS if row[0].startswith("llmlaunch_kv_transfer"))
# Gauges, set once a second where the engine reports them (Engine.kv_usage): the share of its KV cache that running
# requests hold, which a service may scale by (serve.autoscale.signal=kv_cache)
ENGINE_KV_USAGE = "llmlaunch_engine_kv_cache_usage"
ENGINE_GAUGES = (
    (
        ENGINE_KV_USAGE,
        None,
        None,
        "kv_cache_usage",
        "the share of the engine's KV cache that running requests hold (0..1), as the engine last reported it",
    ),
)


def kv_cache_usage(stats: dict) -> float | None:
    """The hf engine's share of its KV-cache pool in use, from its EngineStats (None before it reported a pool)."""
    return stats["kv_blocks_used"] / stats["kv_blocks"] if stats.get("kv_blocks") else None


def engine_summary(stats: dict) -> str:
    """The whole run's `engine_step_split` of an engine's EngineStats dict, as one log line."""
    split = engine_step_split({}, stats)
    if split is None:
        return "no engine steps"
    return f"{split['steps']} engine steps, " + format_engine_split(split)


# ------------------------------------------------------------------------------------- reading them back
_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)\s*$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def read_counters(text: str, counters, model: str | None = None) -> dict:
    """Prometheus text of tritonserver's /metrics -> {key: value} of `counters` (rows of FIRST_TOKEN_COUNTERS /
    ENGINE_COUNTERS), summed over models unless `model` names one; zeros when absent."""
    wanted = {(family, value): key for family, _, value, key, _ in counters}
    label_of = {family: label for family, label, _, _, _ in counters}
    out = {key: 0.0 for key in wanted.values()}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) not in label_of:
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        if model is not None and labels.get("model") != model:
            continue
        label = label_of[m.group(1)]
        key = wanted.get((m.group(1), labels.get(label) if label else None))
        if key is not None:
            out[key] += float(m.group(3))
    return out


def read_first_token_metrics(text: str, model: str | None = None) -> dict:
    """Prometheus text of tritonserver's /metrics -> {"count": n, "parse": s, "add": s, ..., "send": s}
    (summed over models unless `model` names one; zeros when absent)."""
    return read_counters(text, FIRST_TOKEN_COUNTERS, model)


def read_engine_metrics(text: str, model: str | None = None) -> dict:
    """Prometheus text -> the engine's totals by EngineStats field (steps, wall_s, launch_s, ...) and by
    counters.EngineSteps key (running_sum, graph_full_steps, ...)."""
    return read_counters(text, ENGINE_COUNTERS + VLLM_ONLY_COUNTERS, model)


def mean_first_token_ms(before: dict, after: dict) -> dict | None:
    """Mean milliseconds per part between two `read_first_token_metrics` readings (None: no requests between)."""
    n = after["count"] - before["count"]
    if n <= 0:
        return None
    means = {p: round(1000.0 * (after[p] - before[p]) / n, 3) for p in PARTS}
    means["inside_server"] = round(sum(means[p] for p in PARTS), 3)
    means["requests"] = int(n)
    return means


def fetch_metrics_text(url: str, timeout: float = 10.0) -> str:
    """tritonserver's /metrics at `url` (http://HOST:PORT/metrics); several servers' (the replicas' leaders), one
    after the other, where `url` lists them with commas: the readers below sum every server's counters, so their
    totals are the job's."""
    import urllib.request

    texts = []
    for one in (u.strip() for u in url.split(",")):
        if one:
            with urllib.request.urlopen(one, timeout=timeout) as r:
                texts.append(r.read().decode("utf-8", "replace"))
    return "\n".join(texts)


def fetch_first_token_metrics(url: str, model: str | None = None, timeout: float = 10.0) -> dict:
    """`read_first_token_metrics` of tritonserver's /metrics at `url` (http://HOST:PORT/metrics)."""
    return read_first_token_metrics(fetch_metrics_text(url, timeout), model)


def fetch_engine_metrics(url: str, model: str | None = None, timeout: float = 10.0) -> dict:
    """`read_engine_metrics` of tritonserver's /metrics at `url`."""
    return read_engine_metrics(fetch_metrics_text(url, timeout), model)


def settle(read, quiet_s: float, wait_s: float, poll_s: float = 0.25) -> dict:
    """`read()` once its value has not changed for quiet_s (totals that arrive late have come in); at most wait_s."""
    deadline = time.monotonic() + wait_s
    last, since = read(), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(min(poll_s, quiet_s))
        now = read()
        if now != last:
            last, since = now, time.monotonic()
    return last


def settled_engine_metrics(url: str, model: str | None, wait_s: float = 5.0) -> dict:
    """`fetch_engine_metrics` once the totals settle: unchanged for longer than the model's push interval (the engine
    process sends its totals when it goes idle, and the model pushes them within a second); at most wait_s."""
    return settle(lambda: fetch_engine_metrics(url, model), 1.25, wait_s)


def settled_server_metrics(url: str, model: str | None, wait_s: float = 5.0) -> tuple[dict, dict]:
    """(first-token totals, engine totals) of the model, read from one /metrics text each time, once neither has
    changed for longer than the model's push interval; at most wait_s.  Read before a run: the first tokens and steps
    of requests answered just before it are pushed up to a second late and would be counted in the run."""

    def read():
        text = fetch_metrics_text(url)
        return read_first_token_metrics(text, model), read_engine_metrics(text, model)

    return settle(read, 1.25, wait_s)


def engine_splits_after(url: str, model: str | None, before: dict, wait_s: float = 5.0) -> tuple:
    """After a run: (`engine_step_split`, `prefix_cache_split`, `kv_transfer_split`) from `before` to the engine's
    settled totals (`settled_engine_metrics`), each None where the model counted none."""
    from launcher.python_backend.cache_splits import kv_transfer_split, prefix_cache_split

    after = settled_engine_metrics(url, model, wait_s)
    return engine_step_split(before, after), prefix_cache_split(before, after), kv_transfer_split(before, after)


def first_token_split(
    url: str, model: str | None, before: dict, expected: int, ttft_mean_ms: float | None, wait_s: float = 5.0
) -> dict | None:
    """After a run: wait (up to wait_s) for the model's once-a-second push to count `expected` more first tokens
    than `before`, then the mean split (`mean_first_token_ms`) plus `outside_server` = the client's mean TTFT
    minus the time inside the model (tritonserver, gRPC and the client).  None when nothing was counted.

    The two means must be over the same requests for their difference to mean anything: `before` is read once the
    requests not measured (a warm-up) have been counted, `expected` is how many requests the client took a first
    token of and `ttft_mean_ms` their mean TTFT.  Where the model counted another number (requests of another
    client, a warm-up pushed late), `outside_server` is None and `client_requests` says how many the client had."""
    deadline = time.monotonic() + wait_s
    while True:
        after = fetch_first_token_metrics(url, model)
        if after["count"] - before["count"] >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    split = mean_first_token_ms(before, after)
    if split is not None and ttft_mean_ms is not None:
        same = split["requests"] == expected
        split["outside_server"] = round(ttft_mean_ms - split["inside_server"], 3) if same else None
        split["client_requests"] = int(expected)
    return split


def with_prefill_split(split: dict | None, prefill: dict | None, ttft_mean_ms: float | None) -> dict | None:
    """A disaggregated run's first-token split: `split` over the decode replicas (their requests: the prompt's keys
    and values moved in, its last token computed) with `prefill`, the same split over the prefill replicas (each
    prompt's one-token request), under "prefill"; `outside_server` becomes the client's mean TTFT minus both insides:
    the front end's two legs, gRPC and the client.  None where a side counted other requests than the client timed
    (a prefill that failed, so its decode computed the prompt itself; another client's requests)."""
    if split is None or prefill is None:
        return split
    out = dict(split)
    out["prefill"] = {k: prefill[k] for k in (*PARTS, "inside_server", "requests")}
    expected = split.get("client_requests")
    same = ttft_mean_ms is not None and split["requests"] == prefill["requests"] == expected
    out["outside_server"] = round(ttft_mean_ms - split["inside_server"] - prefill["inside_server"], 3) if same else None
    return out
