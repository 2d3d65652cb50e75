#!/usr/bin/env python3
"""What the serving path itself costs a first token, part by part, with no engine (one_gpu.sh step 2d).

The hf engine's served TTFT at one stream is the in-process TTFT plus 2.3-2.6 ms on an H100 host, against a 2 ms target.  This script measures the path
without the engine: the `first_echo` fixture model (launcher/testing/models/first_echo) parses each request with the
hf model's own code and answers at once with its Responder, one variant per model instance in one
tritonserver:

  inline        execute answers itself: tritonserver, the python-backend stub, gRPC and the client (the floor)
  thread        a responder thread answers (one thread hand-off in the stub)
  process       a child process answers over a socketpair, as the hf model's engine process, and the stub's
                receive thread responds (the hf model's default path, engine aside)
  process_each  as process, inputs looked up one name at a time (the lookups request_arrays avoids)
  inline_3ms, process_3ms
                as inline / process, the answering side sleeping 3 ms first (the hf engine's own TTFT on an
                H100 at one stream): the threads along the path have slept that long before they are woken,
                as around a real first token.  Their hop and TTFT are given less the 3 ms.
  process_3ms_spin
                as process_3ms, the stub's receive thread and the child polling their socket in a loop instead
                of blocking on it (tried against the slow wake-up; on the H100 host no better than process_3ms:
                the polling thread holds the GIL that the stub's other threads need)

One stream, one request at a time (concurrency 1), through the benchmark's own client
(launcher.client.stream.TritonStream); rounds take the variants in turn.  The final response carries the model's
CLOCK_MONOTONIC stamps, so each first token splits into:

  handoff   submit() -> gRPC's sending thread has the request (the client's own; outside TTFT, which counts from
            the send, as llmlaunch-bench does)
  request   client send -> execute began (client, gRPC, tritonserver, the stub's IPC)
  parse     reading and validating the inputs
  hop       parsed -> the answering thread has the output (thread hand-off, or the child process and back)
  build     the response built (triton_io.Responder)
  send      the stub's send call (a round trip to tritonserver)
  response  send began -> the client has the response (tritonserver, gRPC, the client's receive thread)

TTFT = request + parse + hop + build + response.  Medians (p50) of each, then the TTFT mean and p90, and
each variant's median TTFT over inline's.

--clients sync,aio also runs every variant through a grpc.aio client (rows " aio"), which sends from the thread
that asks (an asyncio loop): no hand-off, so its `request` part is what TritonStream's is from gRPC's send on.

    python -m benchmark.first_response                       # 1,000 requests x 3 rounds a variant
    python -m benchmark.first_response --requests 3000 --rounds 5 --json first_response.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from benchmark.servers import CHECKOUT
from launcher.client.request import Generation, build_request
from launcher.client.response import StreamRecord
from launcher.client.stream import TritonStream

# variant -> the fixture's parameters
VARIANTS = {
    "inline": {"via": "inline", "parse": "once"},
    "thread": {"via": "thread", "parse": "once"},
    "process": {"via": "process", "parse": "once"},
    "process_each": {"via": "process", "parse": "each"},
    "inline_3ms": {"via": "inline", "parse": "once", "delay_ms": 3},
    "process_3ms": {"via": "process", "parse": "once", "delay_ms": 3},
    "process_3ms_spin": {"via": "process", "parse": "once", "delay_ms": 3, "spin": True},
}
PARTS = ("handoff", "request", "parse", "hop", "build", "send", "response")
CLIENTS = ("sync", "aio")
PROMPT = " ".join(["word"] * 100)  # the text is parsed, never tokenized


def make_repo(dest: Path, variants: list[str]) -> Path:
    """One first_echo model per variant, named first_<variant>, one instance each (its stub imports this checkout's
    launcher: the hf model's parsing and Responder)."""
    from launcher.testing.serve import variants_repository

    return variants_repository(
        dest, "first_echo", {f"first_{v}": dict(VARIANTS[v], pythonpath=str(CHECKOUT)) for v in variants}
    )


def split(rec: StreamRecord, delay_ms: float = 0.0) -> dict:
    """One request's first token, part by part (ms), from the client's times and the model's stamps; the model's
    deliberate delay taken out of hop and TTFT."""
    began, parsed, had, start, done = (float(x) for x in rec.text.split()[1:])
    first = rec.times[0]
    return {
        "ttft": (first - rec.sent) * 1e3 - delay_ms,
        "handoff": (rec.sent - rec.queued) * 1e3,
        "request": (began - rec.sent) * 1e3,
        "parse": (parsed - began) * 1e3,
        "hop": (had - parsed) * 1e3 - delay_ms,
        "build": (start - had) * 1e3,
        "send": (done - start) * 1e3,
        "response": (first - start) * 1e3,
    }


def _request(model: str, rid: str):
    return build_request(model, Generation(PROMPT, 2, stream=True, ignore_eos=True), rid)


def _checked(rec: StreamRecord, model: str, delay_ms: float) -> dict:
    if rec.error:
        raise RuntimeError(f"{model}: {rec.error}")
    if len(rec.times) != 2 or rec.piece(0) != " x":
        raise RuntimeError(f"{model}: {len(rec.times)} responses, first {rec.piece(0)!r}; expected 2, ' x'")
    return split(rec, delay_ms)


def run_variant(stream: TritonStream, model: str, n: int, tag: str, delay_ms: float = 0.0) -> list[dict]:
    """n requests one after another on one stream; each one's split (less the model's delay_ms)."""
    out = []
    for i in range(n):
        rid = f"{tag}-{i}"
        rec = stream.submit(_request(model, rid), StreamRecord(rid))
        stream.wait(rec, timeout=60)
        out.append(_checked(rec, model, delay_ms))
    return out


def run_variant_aio(url: str, model: str, n: int, tag: str, delay_ms: float = 0.0, warmup: int = 0) -> list[dict]:
    """As run_variant through a grpc.aio stream of its own (`warmup` unmeasured requests first: a new connection):
    the request is written from the asyncio loop's thread, stamped just before (queued = sent: no hand-off)."""
    import asyncio
    import time

    import grpc
    from tritonclient.grpc import service_pb2_grpc

    from launcher.client.connection import parse_url
    from launcher.client.response import text_output_index

    async def go() -> list[dict]:
        async with grpc.aio.insecure_channel(parse_url(url)) as channel:
            # one deadline for the stream (a timeout per response would wrap each read in a task of its own)
            call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(timeout=60 + (warmup + n))
            responses = call.__aiter__()
            out = []
            for i in range(warmup + n):
                rid = f"{tag}-{i}"
                request, rec = _request(model, rid), StreamRecord(rid)
                rec.queued = rec.sent = time.perf_counter()
                await call.write(request)
                while not rec.done:
                    resp = await responses.__anext__()
                    rec.times.append(time.perf_counter())
                    ir = resp.infer_response
                    if resp.error_message:
                        rec.error, rec.done = resp.error_message, True
                        break
                    at = text_output_index(ir)
                    rec.chunks.append(ir.raw_output_contents[at] if 0 <= at < len(ir.raw_output_contents) else b"")
                    rec.done = ir.parameters["triton_final_response"].bool_param
                if i >= warmup:
                    out.append(_checked(rec, model, delay_ms))
            await call.done_writing()
            return out

    return asyncio.run(go())


def summarize(rows: list[dict]) -> dict:
    p50 = {k: round(statistics.median(r[k] for r in rows), 4) for k in ("ttft",) + PARTS}
    ttft = sorted(r["ttft"] for r in rows)
    return {
        "n": len(rows),
        "p50": p50,
        "ttft_mean": round(statistics.fmean(ttft), 4),
        "ttft_p90": round(ttft[int(0.9 * (len(ttft) - 1))], 4),
    }


def measure(
    url: str, variants: list[str], n: int, rounds: int, warmup: int, clients: tuple = ("sync",), log=print
) -> dict:
    """Per row (a variant, "<variant> aio" through the grpc.aio client): the split's medians, TTFT mean and p90,
    each round's median, and the median TTFT over inline's (of the same client)."""

    def name(v, client):
        return v + (" aio" if client == "aio" else "")

    rows: dict[str, list[dict]] = {name(v, c): [] for c in clients for v in variants}
    per_round: dict[str, list[float]] = {k: [] for k in rows}
    with TritonStream(url) as stream:
        for v in variants:  # first requests map the stub's shared memory: not measured
            run_variant(stream, f"first_{v}", warmup, f"w{v}", VARIANTS[v].get("delay_ms", 0))
        for r in range(rounds):
            for c in clients:
                for v in variants:
                    delay, tag = VARIANTS[v].get("delay_ms", 0), f"r{r}{c}{v}"
                    got = (
                        run_variant(stream, f"first_{v}", n, tag, delay)
                        if c == "sync"
                        else run_variant_aio(url, f"first_{v}", n, tag, delay, warmup)
                    )
                    key = name(v, c)
                    rows[key] += got
                    per_round[key].append(statistics.median(x["ttft"] for x in got))
                    log(f"round {r + 1}/{rounds} {key:24s} TTFT p50 {per_round[key][-1]:.3f} ms")
    out = {k: dict(summarize(rows[k]), rounds=[round(x, 4) for x in per_round[k]]) for k in rows}
    for c in clients:
        base = out.get(name("inline", c))
        if base is not None:
            for v in variants:
                out[name(v, c)]["vs_inline"] = round(out[name(v, c)]["p50"]["ttft"] / base["p50"]["ttft"], 3)
    return out


def table(result: dict) -> str:
    head = "| variant | TTFT p50 (ms) | rounds | " + " | ".join(PARTS) + " | TTFT mean / p90 | × inline |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for v, row in result.items():
        p = row["p50"]
        lines.append(
            f"| {v} | {p['ttft']:.3f} | {' / '.join(f'{x:.3f}' for x in row['rounds'])} | "
            + " | ".join(f"{p[k]:.3f}" for k in PARTS)
            + f" | {row['ttft_mean']:.3f} / {row['ttft_p90']:.3f} | {row.get('vs_inline', float('nan')):.2f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1000, help="requests of each variant in each round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each takes every variant once")
    ap.add_argument("--warmup", type=int, default=50, help="unmeasured requests per variant first")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    ap.add_argument(
        "--clients",
        default="sync",
        help="comma-separated: sync (TritonStream, the benchmark's client), "
        "aio (a grpc.aio stream: no hand-off to a sending thread)",
    )
    ap.add_argument("--json", default="", help="write the results here too")
    args = ap.parse_args(argv)
    from launcher.testing.serve import chosen_variants, measure_variants

    variants = chosen_variants(ap, args.variants, VARIANTS)
    if args.requests < 1 or args.rounds < 1 or args.warmup < 1:
        ap.error("--requests, --rounds and --warmup must be >= 1")
    clients = tuple(c.strip() for c in args.clients.split(",") if c.strip())
    if not clients or any(c not in CLIENTS for c in clients):
        ap.error(f"--clients {args.clients!r}: comma-separated, of {', '.join(CLIENTS)}")
    measure_variants(
        "llmlaunch-first-response-",
        lambda d: make_repo(d, variants),
        lambda url: measure(url, variants, args.requests, args.rounds, args.warmup, clients),
        table,
        args.json,
        {"requests": args.requests, "rounds": args.rounds, "clients": list(clients)},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
