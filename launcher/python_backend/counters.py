"""The sums a served model keeps in its stub and pushes to tritonserver's metrics port (the metric names, the
readers and the formatting are launcher/python_backend/timings.py's): where streamed requests' first tokens spent
their time, the prompt tokens the engine's prefix cache served, and the thread that pushes them once a second
(each update of a Triton metric is a round trip from the stub to the server, too dear for the response path)."""

from __future__ import annotations

import threading

from launcher.python_backend.timings import PARTS


class FirstTokenTimes:
    """Sums of the six parts of streamed requests' first tokens (thread-safe); `totals_map` feeds `Counters`."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sums = [0.0] * len(PARTS)
        self._count = 0

    def add(
        self, began: float, queued: float, received: float, made: float, got: float, sending: float, sent: float
    ) -> None:
        """One streamed request's first response: time.monotonic() stamps of the seven moments
        (launcher/python_backend/timings.py's docstring names them)."""
        parts = (queued - began, received - queued, made - received, got - made, sending - got, sent - sending)
        with self._lock:
            for i, v in enumerate(parts):
                self._sums[i] += max(0.0, v)  # a clock read on another core can be a few ns behind
            self._count += 1

    def totals(self) -> tuple[list[float], int]:
        with self._lock:
            return list(self._sums), self._count

    def totals_map(self) -> dict:
        sums, n = self.totals()
        return {"count": n, **dict(zip(PARTS, sums))}

    def summary(self) -> str:
        sums, n = self.totals()
        if not n:
            return "no streamed requests"
        return f"{n} streamed requests, first token inside the server (mean ms): " + ", ".join(
            f"{p} {1000 * s / n:.2f}" for p, s in zip(PARTS, sums)
        )


class PromptTokens:
    """Prompt tokens of the requests an engine finished, and of those its prefix cache served, not prefilled, as the
    engine reports them per request (thread-safe); `totals_map` feeds `Counters` (PROMPT_TOKEN_COUNTERS)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._prompt = self._cached = 0

    def add(self, prompt: int, cached: int) -> None:
        with self._lock:
            self._prompt += prompt
            self._cached += min(cached, prompt)

    def totals_map(self) -> dict:
        with self._lock:
            return {"prompt_tokens": self._prompt, "cached_prompt_tokens": self._cached}


class KVTransfers:
    """Transfers of keys and values an engine reports (thread-safe): done, failed, bytes and seconds; `totals_map`
    feeds `Counters` (KV_TRANSFER_COUNTERS).  vLLM's KV connectors report them per engine step in the scheduler
    statistics (`add_vllm`)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._done = self._failed = self._bytes = 0
        self._seconds = 0.0

    def add(self, done: int = 0, failed: int = 0, nbytes: int = 0, seconds: float = 0.0) -> None:
        with self._lock:
            self._done += done
            self._failed += failed
            self._bytes += nbytes
            self._seconds += seconds

    def add_vllm(self, data) -> None:
        """One step's KVConnectorStats data as vLLM 0.25's scheduler sends it (SchedulerStats.kv_connector_stats):
        NIXL's lists of transfer_duration (s), bytes_transferred and num_failed_transfers per transfer; a
        MultiConnector's one such mapping per connector.  Other connectors' figures are left out."""
        if not isinstance(data, dict):
            return
        if "transfer_duration" in data or "num_failed_transfers" in data:
            durations = data.get("transfer_duration") or ()
            failed = len(data.get("num_failed_transfers") or ())
            self.add(len(durations), failed, int(sum(data.get("bytes_transferred") or ())), float(sum(durations)))
            return
        for inner in data.values():
            self.add_vllm(inner)

    def totals_map(self) -> dict:
        with self._lock:
            return {
                "kv_transfers": self._done,
                "kv_transfer_failures": self._failed,
                "kv_transfer_bytes": self._bytes,
                "kv_transfer_s": self._seconds,
            }


class EngineSteps:
    """An engine core's steps as vLLM reports them to a front end's stat loggers (thread-safe): steps counted, the
    requests running and waiting summed over them, the tokens the steps made and prefilled, and the steps by CUDA-graph
    runtime mode; `totals_map` feeds `Counters` (VLLM_STEP_COUNTERS) under the hf engine's keys where a figure means
    the same (steps, decode_tokens, prefill_tokens).  vLLM sends each step's scheduler statistics to one front end and
    each batch of outputs to the front end of its requests, so the sums of a core's front ends are the core's."""

    # CUDAGraphStat.runtime_mode is str(CUDAGraphMode): its name; anything else (a later mode) counts as none
    _MODES = {"FULL": "graph_full_steps", "PIECEWISE": "graph_piecewise_steps"}

    def __init__(self):
        self._lock = threading.Lock()
        self._sums = dict.fromkeys(
            (
                "steps",
                "running_sum",
                "waiting_sum",
                "decode_tokens",
                "prefill_tokens",
                "scheduled_tokens",
                "graph_steps",
                "graph_full_steps",
                "graph_piecewise_steps",
                "graph_none_steps",
            ),
            0,
        )

    def add_vllm(self, scheduler_stats, iteration_stats) -> None:
        """What one call of vLLM 0.25's StatLoggerBase.record gives: `scheduler_stats` (SchedulerStats, one engine step;
        None for a batch of outputs without them) and `iteration_stats` (IterationStats of the batch's outputs; None
        without outputs or request statistics).  Fields an older or newer vLLM lacks count as zero.

        A batch's first tokens (one per request that finished its prefill: time_to_first_tokens_iter) are left out of
        the decode tokens, as the hf engine counts its decode rows, and its prompt tokens are those computed here
        (PromptTokenStats.computed: not the prefix cache's or a KV transfer's), as the hf engine counts what it
        prefilled; the prompt's total where vLLM gives no breakdown."""
        add = {}
        if scheduler_stats is not None:
            add["steps"] = 1
            add["running_sum"] = getattr(scheduler_stats, "num_running_reqs", 0) or 0
            add["waiting_sum"] = (getattr(scheduler_stats, "num_waiting_reqs", 0) or 0) + (
                getattr(scheduler_stats, "num_skipped_waiting_reqs", 0) or 0
            )
            graph = getattr(scheduler_stats, "cudagraph_stats", None)  # only with cudagraph_metrics=True
            if graph is not None:
                add["graph_steps"] = 1
                add["scheduled_tokens"] = getattr(graph, "num_unpadded_tokens", 0) or 0
                add[self._MODES.get(str(getattr(graph, "runtime_mode", "")), "graph_none_steps")] = 1
        if iteration_stats is not None:
            first = len(getattr(iteration_stats, "time_to_first_tokens_iter", None) or ())
            add["decode_tokens"] = max(0, (getattr(iteration_stats, "num_generation_tokens", 0) or 0) - first)
            prompt = getattr(iteration_stats, "prompt_token_stats", None)
            computed = getattr(prompt, "computed", None)
            add["prefill_tokens"] = (
                computed if computed is not None else getattr(iteration_stats, "num_prompt_tokens", 0) or 0
            )
        if not add:
            return
        with self._lock:
            for key, value in add.items():
                self._sums[key] += value

    def totals_map(self) -> dict:
        with self._lock:
            return dict(self._sums)


class Latest:
    """A gauge's value as a thread last saw it (thread-safe): `take` gives it once, so a process whose value went stale
    pushes nothing over another's newer one (several instances of a model share one gauge)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._value: float | None = None

    def set(self, value: float) -> None:
        with self._lock:
            self._value = float(value)

    def take(self) -> float | None:
        with self._lock:
            value, self._value = self._value, None
            return value


class Counters:
    """Cumulative totals pushed to Triton counters, and gauges set, every interval_s by a thread.

    `counters` are rows of FIRST_TOKEN_COUNTERS / ENGINE_COUNTERS, `gauges` of ENGINE_GAUGES; `read()` returns the
    running totals and the gauges' values by their keys, missing keys (or None) counting as unchanged.  Raises
    nothing: without custom metrics (--allow-metrics=false, an old backend) nothing is pushed."""

    def __init__(self, model: str, counters, read, interval_s: float = 1.0, gauges=()):
        self.model = model
        self.counters = tuple(counters)
        self.gauges = tuple(gauges)
        self.read = read
        self.interval_s = interval_s
        self._pushed: dict = {}
        self._metrics = None  # ([(key, metric)], families) once created
        self._gauge_keys: set = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Counters":
        try:
            import triton_python_backend_utils as pb_utils

            families, metrics = {}, []
            kinds = [(row, pb_utils.MetricFamily.COUNTER) for row in self.counters]
            kinds += [(row, pb_utils.MetricFamily.GAUGE) for row in self.gauges]
            for (family, label, value, key, doc), kind in kinds:
                if family not in families:
                    families[family] = pb_utils.MetricFamily(name=family, kind=kind, description=doc)
                labels = {"model": self.model, **({label: value} if label else {})}
                metrics.append((key, families[family].Metric(labels=labels)))
            self._gauge_keys = {row[3] for row in self.gauges}
            self._metrics = (metrics, list(families.values()))  # metrics, then families
        except Exception:  # no custom metrics here: the summaries are still logged at the end
            self._metrics = None
            return self
        self._thread = threading.Thread(target=self._loop, name="llmlaunch-metrics", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.push()

    def push(self) -> None:
        if self._metrics is None:
            return
        try:
            now = self.read()
        except Exception:  # the engine is going away
            return
        try:
            for key, metric in self._metrics[0]:
                value = now.get(key)
                if value is None:
                    continue
                if key in self._gauge_keys:
                    metric.set(value)
                    continue
                delta = value - self._pushed.get(key, 0)
                if delta > 0:
                    metric.increment(delta)
                    self._pushed[key] = value
        except Exception:  # the server is going away
            return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.push()
        # Triton wants a family's metrics deleted before the family: the tuple drops its items in order
        self._metrics = None
