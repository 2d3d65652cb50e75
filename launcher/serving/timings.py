"""Where a streamed request's first token spends its time inside the server (the hf model), as Triton
custom metrics on the metrics port.

A client sees time to first token (TTFT); this splits the part spent inside the
model into three, measured per streamed request on one clock (CLOCK_MONOTONIC is
shared by every process of the machine):

  add      the model's `execute` queued the request -> the engine process received it
           (the socket, the engine process's main thread)
  engine   received -> first token made (tokenize, wait for a slot and the prefill budget,
           prefill, sample, detokenize)
  respond  first token made -> its response handed to tritonserver (the socket back, the
           responder thread's queue, building and sending the response)

Client TTFT minus the three is tritonserver, gRPC and the client.  Exposed as
counters (Prometheus text on tritonserver's metrics port):

  llmlaunch_first_token_seconds{model="...",part="add|engine|respond"}   seconds, summed
  llmlaunch_first_tokens{model="..."}                                     requests counted

so that a part's mean over any window is the difference of its seconds divided by
the difference of the count (`read_first_token_metrics` + `mean_first_token_ms`).
Each update of a Triton metric is a round trip from the stub to the server, too
dear for the response path, so sums are kept here and pushed once a second.
"""

from __future__ import annotations

import re
import threading
import time

PARTS = ("add", "engine", "respond")
SECONDS = "llmlaunch_first_token_seconds"
COUNT = "llmlaunch_first_tokens"


class FirstTokenTimes:
    """Sums of the three parts (thread-safe), pushed to Triton counters by `start()`'s thread, if metrics exist."""

    def __init__(self, model: str, interval_s: float = 1.0):
        self.model = model
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._sums = [0.0] * len(PARTS)
        self._count = 0
        self._pushed = ([0.0] * len(PARTS), 0)
        self._metrics = None  # (part metrics, count metric) once created
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, queued: float, received: float, made: float, sent: float) -> None:
        """One streamed request's first response: time.monotonic() stamps of the four moments."""
        parts = (received - queued, made - received, sent - made)
        with self._lock:
            for i, v in enumerate(parts):
                self._sums[i] += max(0.0, v)  # a clock read on another core can be a few ns behind
            self._count += 1

    def totals(self) -> tuple[list[float], int]:
        with self._lock:
            return list(self._sums), self._count

    def summary(self) -> str:
        sums, n = self.totals()
        if not n:
            return "no streamed requests"
        return f"{n} streamed requests, first token inside the server (mean ms): " + ", ".join(
            f"{p} {1000 * s / n:.2f}" for p, s in zip(PARTS, sums))

    # -- Triton metrics ------------------------------------------------------------------------------------
    def start(self) -> "FirstTokenTimes":
        """Create the counters (if this Triton has custom metrics) and push every interval_s; returns self.
        Raises nothing: without metrics (--allow-metrics=false, an old backend) the sums stay local."""
        try:
            import triton_python_backend_utils as pb_utils

            seconds = pb_utils.MetricFamily(name=SECONDS, kind=pb_utils.MetricFamily.COUNTER,
                                            description="seconds streamed requests spent before their first "
                                                        "response, by part (llmlaunch.serving.timings)")
            count = pb_utils.MetricFamily(name=COUNT, kind=pb_utils.MetricFamily.COUNTER,
                                          description="streamed requests counted in llmlaunch_first_token_seconds")
            self._metrics = ([seconds.Metric(labels={"model": self.model, "part": p}) for p in PARTS],
                             count.Metric(labels={"model": self.model}), (seconds, count))  # metrics, then families
        except Exception:  # no custom metrics here: the summary is still logged at the end
            self._metrics = None
            return self
        self._thread = threading.Thread(target=self._loop, name="first-token-metrics", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.push()

    def push(self) -> None:
        if self._metrics is None:
            return
        sums, n = self.totals()
        done_sums, done_n = self._pushed
        if n == done_n:
            return
        parts, count, _ = self._metrics
        try:
            for metric, now, before in zip(parts, sums, done_sums):
                metric.increment(now - before)
            count.increment(n - done_n)
        except Exception:  # the server is going away
            return
        self._pushed = (sums, n)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.push()
        # Triton wants a family's metrics deleted before the family: the tuple drops its items in order
        self._metrics = None


# ------------------------------------------------------------------------------------- reading them back
_SAMPLE = re.compile(r'^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)\s*$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def read_first_token_metrics(text: str, model: str | None = None) -> dict:
    """Prometheus text of tritonserver's /metrics -> {"count": n, "add": s, "engine": s, "respond": s}
    (summed over models unless `model` names one; zeros when absent)."""
    out = {"count": 0.0, **{p: 0.0 for p in PARTS}}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) not in (SECONDS, COUNT):
            continue
        labels = dict(_LABEL.findall(m.group(2)))
        if model is not None and labels.get("model") != model:
            continue
        value = float(m.group(3))
        if m.group(1) == COUNT:
            out["count"] += value
        elif labels.get("part") in PARTS:
            out[labels["part"]] += value
    return out


def mean_first_token_ms(before: dict, after: dict) -> dict | None:
    """Mean milliseconds per part between two `read_first_token_metrics` readings (None: no requests between)."""
    n = after["count"] - before["count"]
    if n <= 0:
        return None
    means = {p: round(1000.0 * (after[p] - before[p]) / n, 3) for p in PARTS}
    means["inside_server"] = round(sum(means[p] for p in PARTS), 3)
    means["requests"] = int(n)
    return means


def fetch_first_token_metrics(url: str, model: str | None = None, timeout: float = 10.0) -> dict:
    """`read_first_token_metrics` of tritonserver's /metrics at `url` (http://HOST:PORT/metrics)."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout) as r:
        return read_first_token_metrics(r.read().decode("utf-8", "replace"), model)


def first_token_split(url: str, model: str | None, before: dict, expected: int, ttft_mean_ms: float | None,
                      wait_s: float = 5.0) -> dict | None:
    """After a run: wait (up to wait_s) for the model's once-a-second push to count `expected` more first tokens
    than `before`, then the mean split (`mean_first_token_ms`) plus `outside_server` = the client's mean TTFT
    minus the time inside the model (tritonserver, gRPC and the client).  None when nothing was counted."""
    deadline = time.monotonic() + wait_s
    while True:
        after = fetch_first_token_metrics(url, model)
        if after["count"] - before["count"] >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    split = mean_first_token_ms(before, after)
    if split is not None and ttft_mean_ms is not None:
        split["outside_server"] = round(ttft_mean_ms - split["inside_server"], 3)
    return split
