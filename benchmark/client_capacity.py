#!/usr/bin/env python3
"""How much streaming load one llmlaunch-bench process can take, and what it adds (re-run on a new client host).

Three measurements:

1. replay (no server): real-shaped ModelStreamInferResponse messages pushed
   through TritonStream's receive loop, against a loop that only takes the
   time: the client's own work per response, in microseconds.
2. capacity: the `emitter` fixture model (launcher/testing/models/emitter) sends
   one-token responses as fast as it can; the benchmark's load generator
   (launcher.bench.runner, --processes 1, 2, ...) consumes them. Reports
   responses/s in all and per process, and client CPU microseconds per response
   (gRPC's threads included), against the target of 10x --reference-rate.
3. latency: the emitter stamps each response with its send time
   (CLOCK_MONOTONIC, the clock of perf_counter on the same machine) at a paced
   rate; receive minus stamp, for TritonStream and for a bare gRPC loop that
   only takes the time. The difference is what the client adds per response.

    python -m benchmark.client_capacity                      # starts its own tritonserver with the emitter
    python -m benchmark.client_capacity --url HOST:PORT      # an already running one serving `emitter`
    python -m benchmark.client_capacity --processes 1,2,4 --instances 8 --json capacity.json

--reference-rate defaults to 6,877 responses/s: the hf engine's static-batch
generate at batch 128 on one H100 (tokens/s), taken as one response per token.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

from benchmark.servers import fixture_servers
from launcher.client.request import Generation, build_request
from launcher.client.response import StreamRecord
from launcher.client.stream import TritonStream


def _pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


# --------------------------------------------------------------------------- 1. replay


def fake_responses(n: int, requests: int):
    """Messages as the emitter sends them: 4 outputs, final flag on the last of each request."""
    import struct

    from tritonclient.grpc import service_pb2

    per = n // requests
    msgs = []
    for r in range(requests):
        for i in range(per):
            m = service_pb2.ModelStreamInferResponse()
            ir = m.infer_response
            ir.model_name, ir.id = "emitter", str(r)
            for name, dtype, raw in (
                ("text_output", "BYTES", struct.pack("<I", 2) + b" x"),
                ("input_tokens", "INT32", struct.pack("<i", 3)),
                ("output_tokens", "INT32", struct.pack("<i", i + 1)),
                ("finish_reason", "BYTES", struct.pack("<I", 6) + b"length" if i == per - 1 else struct.pack("<I", 0)),
            ):
                o = ir.outputs.add()
                o.name, o.datatype = name, dtype
                o.shape.extend([1, 1])
                ir.raw_output_contents.append(raw)
            ir.parameters["triton_final_response"].bool_param = i == per - 1
            msgs.append(m)
    return msgs


def replay(n: int = 200_000, requests: int = 100) -> dict:
    blobs = [m.SerializeToString() for m in fake_responses(n, requests)]
    from tritonclient.grpc import service_pb2

    parse = service_pb2.ModelStreamInferResponse.FromString
    t = time.perf_counter()
    msgs = [parse(b) for b in blobs]
    parse_us = (time.perf_counter() - t) / n * 1e6

    perf = time.perf_counter
    sink = []
    t = perf()
    for _ in msgs:  # the least a receive loop can do
        sink.append(perf())
    bare_us = (perf() - t) / n * 1e6

    # TritonStream's own receive loop, fed from memory instead of a socket
    stream = TritonStream.__new__(TritonStream)
    stream.url, stream._on_done, stream._pending, stream._dead = "replay", None, {}, ""
    stream._outbox = queue.Queue()
    stream._lock = threading.Lock()
    stream._cond = threading.Condition(stream._lock)
    done = []
    stream._on_done = done.append
    for r in range(requests):
        stream._pending[str(r)] = StreamRecord(str(r))
    stream._responses = iter(msgs)
    t = perf()
    stream._receive()
    ours_us = (perf() - t) / n * 1e6
    assert len(done) == requests and all(rec.output_tokens == n // requests for rec in done)
    return {
        "responses": n,
        "protobuf_parse_us": parse_us,
        "bare_loop_us": bare_us,
        "triton_stream_us": ours_us,
        "added_us": ours_us - bare_us,
    }


# --------------------------------------------------------------------------- 2. capacity


def capacity(url: str, model: str, processes: int, streams: int, concurrency: int, requests: int, tokens: int) -> dict:
    from launcher.bench.runner import Job, LoadSpec, run_load

    gens = [Generation("capacity test prompt", max_tokens=tokens)]
    spec = LoadSpec(concurrency=concurrency, num_requests=requests, processes=processes, streams=streams, timeout=600)
    cpu0, child0, wall0 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = run_load(Job(url=url, model=model, gens=gens, spec=spec))
    wall = time.perf_counter() - wall0
    child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (
        (time.process_time() - cpu0)
        if processes == 1
        else (child1.ru_utime + child1.ru_stime - child0.ru_utime - child0.ru_stime)
    )
    recs = [rec for _, rec in out.records]
    errors = [rec.error for rec in recs if rec.error]
    n = sum(len(rec.times) for rec in recs)
    end = max(rec.times[-1] for rec in recs if rec.times)
    dur = end - out.t0
    return {
        "processes": processes,
        "streams": streams,
        "concurrency": concurrency,
        "responses": n,
        "seconds": dur,
        "responses_per_s": n / dur,
        "per_process_per_s": n / dur / processes,
        "client_cpu_us_per_response": cpu / n * 1e6,
        "client_cpu_cores": cpu / wall,
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
    }


# --------------------------------------------------------------------------- 3. latency


def _bare_consume(url, reqs, expect):
    """Minimal consumer: raw gRPC stream, record (time, message) and nothing else."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    ch = grpc.insecure_channel(url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
    q = queue.Queue()
    for r in reqs:
        q.put(r)
    q.put(None)
    got = []
    perf = time.perf_counter
    for resp in stub.ModelStreamInfer(iter(q.get, None)):
        got.append((perf(), resp))
        if len(got) >= expect:
            break
    ch.close()
    return [(t, r.infer_response.raw_output_contents[0][4:].decode()) for t, r in got]


def latency(url: str, model: str, rate: float, concurrent: int, tokens: int, rounds: int = 3) -> dict:
    """Receive minus send stamp, alternating bare loop and TritonStream `rounds` times."""
    interval_us = concurrent / rate * 1e6
    params = {"stamp": True, "interval_us": interval_us}

    def reqs(tag):
        return [
            build_request(model, Generation("latency", max_tokens=tokens), f"{tag}{i}", params)
            for i in range(concurrent)
        ]

    def tail(values):  # drop each run's start-up tenth
        return values[len(values) // 10 :]

    lag = {"bare_grpc_loop": [], "triton_stream": []}
    medians = {"bare_grpc_loop": [], "triton_stream": []}
    for r in range(rounds):
        pairs = _bare_consume(url, reqs(f"b{r}-"), concurrent * tokens)
        values = tail(sorted(((t, (t - float(s)) * 1e6) for t, s in pairs)))
        lag["bare_grpc_loop"] += [v for _, v in values]
        medians["bare_grpc_loop"].append(statistics.median(v for _, v in values))
        with TritonStream(url) as stream:
            recs = [stream.submit(q) for q in reqs(f"s{r}-")]
            for rec in recs:
                stream.wait(rec)
        values = tail(sorted((t, (t - float(rec.piece(i))) * 1e6) for rec in recs for i, t in enumerate(rec.times)))
        lag["triton_stream"] += [v for _, v in values]
        medians["triton_stream"].append(statistics.median(v for _, v in values))
    out = {"paced_rate_per_s": rate, "concurrent_requests": concurrent, "rounds": rounds}
    for key, values in lag.items():
        out[key] = {
            "median_us": statistics.median(values),
            "p90_us": _pct(values, 90),
            "p99_us": _pct(values, 99),
            "round_medians_us": [round(m) for m in medians[key]],
        }
    out["added_median_us"] = out["triton_stream"]["median_us"] - out["bare_grpc_loop"]["median_us"]
    out["added_p99_us"] = out["triton_stream"]["p99_us"] - out["bare_grpc_loop"]["p99_us"]
    return out


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="a tritonserver already serving the emitter model (default: start one)")
    p.add_argument("--model", default="emitter")
    p.add_argument("--instances", type=int, default=4, help="emitter instances when starting a server (default 4)")
    p.add_argument("--processes", default="1,2", help="client process counts to try (default 1,2)")
    p.add_argument("--streams", type=int, default=1, help="gRPC streams per client process")
    p.add_argument("--concurrency", type=int, help="requests in flight (default: emitter instances)")
    p.add_argument("--requests", type=int, default=32, help="requests per capacity run")
    p.add_argument("--tokens", type=int, default=4000, help="responses per request")
    p.add_argument("--reference-rate", type=float, default=6877.0, help="responses/s of the fastest reported run")
    p.add_argument("--paced-rate", type=float, help="latency test rate, responses/s (default: --reference-rate)")
    p.add_argument("--paced-requests", type=int, default=2, help="concurrent paced requests in the latency test")
    p.add_argument("--paced-tokens", type=int, default=4000)
    p.add_argument("--skip-replay", action="store_true")
    p.add_argument(
        "--full-outputs", default="true", help="emitter sends all four outputs on every response (true/false)"
    )
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)

    report: dict = {
        "host_cpus": os.cpu_count(),
        "reference_rate": args.reference_rate,
        "target_rate": 10 * args.reference_rate,
    }
    if not args.skip_replay:
        report["replay"] = replay()
        r = report["replay"]
        print(
            f"replay: protobuf parse {r['protobuf_parse_us']:.2f} us, bare loop {r['bare_loop_us']:.2f} us, "
            f"TritonStream loop {r['triton_stream_us']:.2f} us per response (adds {r['added_us']:.2f} us)",
            flush=True,
        )

    def measure(url):
        report["capacity"] = []
        for n_proc in [int(x) for x in args.processes.split(",")]:
            conc = args.concurrency or args.instances
            c = capacity(url, args.model, n_proc, args.streams, max(conc, n_proc), args.requests, args.tokens)
            report["capacity"].append(c)
            print(
                f"capacity: {n_proc} process(es) x {args.streams} stream(s), {c['concurrency']} in flight: "
                f"{c['responses_per_s']:,.0f} responses/s ({c['per_process_per_s']:,.0f} per process), client "
                f"{c['client_cpu_us_per_response']:.1f} CPU us/response, {c['client_cpu_cores']:.2f} cores busy, "
                f"errors {c['errors']}",
                flush=True,
            )
        rate = args.paced_rate or args.reference_rate
        lat = latency(url, args.model, rate, args.paced_requests, args.paced_tokens)
        report["latency"] = lat
        print(
            f"latency at {rate:,.0f} responses/s: send->record median {lat['triton_stream']['median_us']:.0f} us "
            f"(p99 {lat['triton_stream']['p99_us']:.0f}) vs bare gRPC loop {lat['bare_grpc_loop']['median_us']:.0f} us "
            f"(p99 {lat['bare_grpc_loop']['p99_us']:.0f}): client adds {lat['added_median_us']:.0f} us median, "
            f"{lat['added_p99_us']:.0f} us p99; round medians bare {lat['bare_grpc_loop']['round_medians_us']}, "
            f"TritonStream {lat['triton_stream']['round_medians_us']}",
            flush=True,
        )

    if args.url:
        measure(args.url)
    else:
        need = max(args.instances, args.paced_requests)
        with fixture_servers(1, need, {"emitter": {"full_outputs": args.full_outputs}}) as (url,):
            measure(url)
    best = max(c["responses_per_s"] for c in report["capacity"])
    report["best_responses_per_s"] = best
    print(
        f"best: {best:,.0f} responses/s = {best / args.reference_rate:.1f}x the reference rate "
        f"({args.reference_rate:,.0f}/s; target 10x)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
