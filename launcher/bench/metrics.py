"""Per-request results and the metrics computed from them.

Definitions (vLLM's benchmark_serving, which most published numbers use):

* TTFT: first response carrying text minus the time the request was sent:
  when gRPC's sending thread took it.  The client's own hand-off to that
  thread before it (`client_handoff_ms`, 0.03-0.07 ms p50 on an H100 host, more
  when the client is short of CPU) is reported apart: it is the client library's, not the server's.
* ITL: gaps between consecutive responses carrying text, pooled over requests
  (a response that carries several tokens counts once).  `tokens_per_response`
  says how many a text response carried: 1 where the server sends one a token,
  more where it merges them (the hf engine's engine.stream_interval_ms, a
  server that fell behind), and then ITL is the gap between those merged pieces.
* TPOT: per request (last token time - first token time) / (output tokens - 1),
  for requests with more than one output token.
* E2EL: final response minus send time.
* Throughputs divide by the run duration: first measured send to last completion.
* Goodput: requests/s of successful requests within every given SLO
  (ttft / tpot / e2el, milliseconds).

A request fails when it got an error, or finished without output tokens
("zero-token"); failures are data, counted and kept in the results, never
used in the latency statistics.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestResult:
    index: int  # request number in the run (the sample is dataset[index % len(dataset)])
    prompt_len: int  # prompt tokens according to the dataset (tokenizer or estimate)
    max_tokens: int  # requested output length
    sent: float  # send time (gRPC's sending thread took it), seconds since the run started
    token_times: list = field(default_factory=list)  # receive time of every response with text, s since start
    end: Optional[float] = None  # final response time, s since start
    input_tokens: int = 0  # server's input_tokens, else prompt_len
    output_tokens: int = 0  # server's output_tokens, else re-counted from the text
    output_tokens_source: str = "server"  # server | tokenizer | estimate
    responses: int = 0  # responses received, the empty final one included
    finish_reason: str = ""  # the server's finish_reason
    error: str = ""  # server/stream error, or "zero output tokens"
    text: Optional[str] = None  # generated text, kept with --save-text
    queued: Optional[float] = None  # when the load generator queued it for sending, s since start (None: not known)

    @property
    def success(self) -> bool:
        return not self.error

    @property
    def first_token(self) -> Optional[float]:
        """Receive time of the first response with text, s since start."""
        return self.token_times[0] if self.token_times else None

    @property
    def ttft(self) -> Optional[float]:
        return self.token_times[0] - self.sent if self.token_times else None

    @property
    def e2el(self) -> Optional[float]:
        return None if self.end is None else self.end - self.sent

    @property
    def itl(self) -> list:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot(self) -> Optional[float]:
        if self.output_tokens > 1 and len(self.token_times) >= 1 and self.end is not None:
            return (self.token_times[-1] - self.token_times[0]) / (self.output_tokens - 1)
        return None

    def to_json(self) -> dict:
        d = asdict(self)
        d["success"] = self.success
        d["first_token"] = self.first_token
        d["ttft"], d["tpot"], d["e2el"] = self.ttft, self.tpot, self.e2el
        if d["text"] is None:
            del d["text"]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "RequestResult":
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


def from_record(index: int, sample, rec, t0: float, tokens=None, save_text: bool = False) -> RequestResult:
    """A RequestResult from a client StreamRecord (times made relative to t0)."""
    token_times = [t - t0 for t, c in zip(rec.times, rec.chunks) if len(c) > 4]
    text = rec.text if (save_text or rec.output_tokens is None) else None
    if rec.output_tokens is not None:
        n_out, source = rec.output_tokens, "server"
    else:  # the model does not report counts: re-count the text
        n_out = tokens.count(text) if tokens is not None else len(token_times)
        source = ("tokenizer" if tokens.exact else "estimate") if tokens is not None else "responses"
    res = RequestResult(
        index=index,
        prompt_len=sample.prompt_len,
        max_tokens=sample.output_len,
        sent=rec.sent - t0,
        token_times=token_times,
        end=(rec.times[-1] - t0) if rec.times else None,
        input_tokens=rec.input_tokens if rec.input_tokens is not None else sample.prompt_len,
        output_tokens=n_out,
        output_tokens_source=source,
        responses=len(rec.times),
        finish_reason=rec.finish_reason,
        error=rec.error,
        text=text if save_text else None,
        queued=(rec.queued - t0) if rec.queued else None,
    )
    if not res.error and res.output_tokens <= 0:
        res.error = "zero output tokens"
    return res


def _stats(values: list, scale: float = 1000.0) -> dict:
    """mean / p50 / p90 / p99 / max of values (seconds) in milliseconds."""
    if not values:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}, "max": None}
    import numpy as np

    a = np.asarray(values, dtype=float) * scale
    out = {"mean": float(a.mean())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(a, p))
    out["max"] = float(a.max())
    return out


def parse_slos(items) -> dict:
    """['ttft:500', 'tpot:50'] -> {'ttft': 500.0, 'tpot': 50.0} (milliseconds)."""
    slos = {}
    for item in items or ():
        key, sep, value = item.partition(":")
        key = key.strip().lower()
        if not sep or key not in ("ttft", "tpot", "e2el"):
            raise ValueError(f"bad --goodput item {item!r}: use ttft:MS, tpot:MS or e2el:MS")
        try:
            slos[key] = float(value)
        except ValueError:
            raise ValueError(f"bad --goodput value in {item!r}: milliseconds expected") from None
        if slos[key] <= 0:
            raise ValueError(f"--goodput {key} must be > 0 ms")
    return slos


def compute(results: list, duration: float, slos: Optional[dict] = None) -> dict:
    """Aggregate metrics of one run."""
    ok = [r for r in results if r.success]
    errors = sum(1 for r in results if r.error and r.error != "zero output tokens")
    zero = sum(1 for r in results if r.error == "zero output tokens")
    duration = max(duration, 1e-9)
    total_in = sum(r.input_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    m = {
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": errors,
        "zero_token": zero,
        "duration_s": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "responses_per_s": sum(r.responses for r in results) / duration,
    }
    m["ttft_ms"] = _stats([r.ttft for r in ok if r.ttft is not None])
    m["tpot_ms"] = _stats([r.tpot for r in ok if r.tpot is not None])
    m["itl_ms"] = _stats([x for r in ok for x in r.itl])
    pieces = sum(len(r.token_times) for r in ok)
    m["tokens_per_response"] = sum(r.output_tokens for r in ok if r.token_times) / pieces if pieces else None
    m["e2el_ms"] = _stats([r.e2el for r in ok if r.e2el is not None])
    # the client's hand-off from queueing a request to gRPC sending it: outside TTFT, shown so that a busy client
    # (its hand-off grows when its processes are short of CPU) is seen
    m["client_handoff_ms"] = _stats([r.sent - r.queued for r in ok if r.queued is not None])
    if slos:
        good = 0
        for r in ok:
            vals = {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.e2el}
            if all(vals[k] is None or vals[k] * 1000 <= slo for k, slo in slos.items()):
                good += 1
        m["goodput"] = good / duration
        m["goodput_requests"] = good
        m["slos_ms"] = dict(slos)
    else:
        m["goodput"] = None
    return m


def failure_summary(m: dict) -> str:
    """'' when every request succeeded, else a sentence with the counts."""
    if not m["failed"]:
        return ""
    parts = []
    if m["errors"]:
        parts.append(f"{m['errors']} with errors")
    if m["zero_token"]:
        parts.append(f"{m['zero_token']} with zero output tokens")
    return f"{m['failed']} of {m['requests']} requests failed ({', '.join(parts)})"


def _fmt(v, digits=2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}"


def format_table(m: dict, title: str = "Serving Benchmark Result") -> str:
    """The end-of-run text table."""
    w = 50
    lines = [f" {title} ".center(w, "=")]

    def row(name, value):
        lines.append(f"{name:<34}{value:>16}")

    row("Successful requests:", _fmt(m["completed"]))
    row("Failed requests:", _fmt(m["failed"]))
    if m["failed"]:
        row("  errors:", _fmt(m["errors"]))
        row("  zero output tokens:", _fmt(m["zero_token"]))
    row("Benchmark duration (s):", _fmt(m["duration_s"]))
    row("Total input tokens:", _fmt(m["total_input_tokens"]))
    row("Total generated tokens:", _fmt(m["total_output_tokens"]))
    row("Request throughput (req/s):", _fmt(m["request_throughput"]))
    if m.get("goodput") is not None:
        row("Request goodput (req/s):", _fmt(m["goodput"]))
    row("Output token throughput (tok/s):", _fmt(m["output_throughput"]))
    row("Total token throughput (tok/s):", _fmt(m["total_token_throughput"]))
    names = {
        "ttft": "Time to First Token",
        "tpot": "Time per Output Token (excl. 1st token)",
        "itl": "Inter-token Latency",
        "e2el": "End-to-end Latency",
    }
    for key in LATENCIES:
        s = m[f"{key}_ms"]
        lines.append(f" {names[key]} ".center(w, "-"))
        row(f"Mean {key.upper()} (ms):", _fmt(s["mean"]))
        for p in PERCENTILES:
            row(f"P{p} {key.upper()} (ms):", _fmt(s[f"p{p}"]))
        if key == "ttft" and (m.get("client_handoff_ms") or {}).get("p99") is not None:  # outside TTFT (client's)
            row("Client hand-off P99 (ms):", _fmt(m["client_handoff_ms"]["p99"], 3))
        if key == "itl" and m.get("tokens_per_response") is not None:  # ITL is per response: how many tokens one held
            row("Tokens per response (mean):", _fmt(m["tokens_per_response"]))
    lines.append("=" * w)
    return "\n".join(lines)


def format_first_token_split(split: dict) -> str:
    """--server-metrics: where the mean TTFT goes (launcher/python_backend/timings.py), as rows under the table; with
    --prefill-metrics the model's rows are the decode replicas', the prefill replicas' engine and inside after them."""
    w = 50
    lines = [" Mean TTFT, inside the model / outside ".center(w, "-")]
    for key, name in (
        ("parse", "reading the request"),
        ("add", "to the engine process"),
        ("engine", "engine: queue, prefill"),
        ("back", "first token back to the stub"),
        ("respond", "response built"),
        ("send", "response sent to tritonserver"),
        (
            "outside_server",
            "front end, gRPC, client" if split.get("prefill") else "tritonserver, gRPC, client",
        ),
    ):
        # add and back are the hf engine process's hops; the other engines' models count them in `engine`
        if split.get(key) is not None and (split[key] or key not in ("add", "back")):
            lines.append(f"{name + ' (ms):':<34}{_fmt(split[key]):>16}")
        if key == "send" and split.get("prefill"):  # disagg: the rows above are the decode replicas'
            pre = split["prefill"]
            lines.append(f"{'prefill replica, engine (ms):':<34}{_fmt(pre['engine']):>16}")
            lines.append(f"{'prefill replica, inside (ms):':<34}{_fmt(pre['inside_server']):>16}")
    if split.get("outside_server") is None and split.get("client_requests") is not None:
        # means over different requests do not subtract: say so rather than print a part that is not one
        lines.append(f"{'tritonserver, gRPC, client (ms):':<34}{'not split':>16}")
        lines.append(f"{'requests timed by the client:':<34}{_fmt(split['client_requests']):>16}")
    lines.append(f"{'requests counted by the model:':<34}{_fmt(split['requests']):>16}")
    if split.get("prefill"):
        lines.append(f"{'... by the prefill replicas:':<34}{_fmt(split['prefill']['requests']):>16}")
    lines.append("=" * w)
    return "\n".join(lines)


# Metrics compared by the identity test (--compare): (key, label, higher is better)
COMPARED = (
    ("request_throughput", "Request throughput (req/s)", True),
    ("output_throughput", "Output throughput (tok/s)", True),
    ("total_token_throughput", "Total throughput (tok/s)", True),
    ("duration_s", "Total latency (s)", False),
    ("ttft_ms.mean", "Mean TTFT (ms)", False),
    ("ttft_ms.p99", "P99 TTFT (ms)", False),
    ("tpot_ms.mean", "Mean TPOT (ms)", False),
    ("itl_ms.mean", "Mean ITL (ms)", False),
    ("e2el_ms.mean", "Mean E2EL (ms)", False),
    ("e2el_ms.p99", "P99 E2EL (ms)", False),
)


def _get(m: dict, key: str):
    for part in key.split("."):
        m = m.get(part) if isinstance(m, dict) else None
    return m


def speedups(a: dict, b: dict) -> dict:
    """How many times better B is than A, per compared metric (>1 = B better)."""
    out = {}
    for key, _, higher in COMPARED:
        va, vb = _get(a, key), _get(b, key)
        if va is None or vb is None:
            out[key] = None
        elif higher:
            out[key] = vb / va if va else None
        else:
            out[key] = va / vb if vb else None
    return out


def format_speedup(a: dict, b: dict, name_a: str, name_b: str) -> str:
    sp = speedups(a, b)
    wa = max(12, len(name_a) + 2)
    wb = max(12, len(name_b) + 2)
    lines = [" Identity test: speedup of B over A ".center(34 + wa + wb + 10, "=")]
    lines.append(f"A = {name_a}    B = {name_b}")
    lines.append(f"{'metric':<34}{'A':>{wa}}{'B':>{wb}}{'speedup':>10}")
    for key, label, _ in COMPARED:
        s = sp[key]
        lines.append(
            f"{label:<34}{_fmt(_get(a, key)):>{wa}}{_fmt(_get(b, key)):>{wb}}{(f'{s:.2f}x' if s else 'n/a'):>10}"
        )
    return "\n".join(lines)


def finite(x) -> Optional[float]:
    """JSON-safe float (inf/nan -> None)."""
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x
