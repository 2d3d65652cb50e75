#!/usr/bin/env python3
"""How many streamed responses/s the data-parallel front end (launcher/frontend) passes on (re-run on a new host),
by number of front-end worker processes.

    python -m benchmark.frontend_capacity                                  # 2 replicas x 2 instances, processes 1,2
    python -m benchmark.frontend_capacity --replicas 4 --instances 2 --processes 1,2,4 --clients 6
    python -m benchmark.frontend_capacity --loops asyncio,uvloop           # compare event loops
    python -m benchmark.frontend_capacity --max-tokens 2 --concurrency 8   # short requests: the request path

Backends: --replicas tritonservers serving `emitter` (launcher/testing/models/emitter: the
emitter fixture, one-token responses as fast as the python backend sends them, stopping when
cancelled) with --instances instances each; intermediate responses carry text_output only
(full_outputs=false), the cheapest real response. Load: --clients client processes, each with its
own gRPC connection and one ModelStreamInfer stream carrying --concurrency endless requests. A
client parses nothing (raw bytes, the cheapest consumer there is) and counts the responses it
receives inside a --seconds window that starts --warmup seconds after the load; then it cancels.
With --max-tokens N each request ends after N responses and the client sends it again at once: the
window then also counts requests, and the front end's CPU per request prices its request path (pick,
dispatch, a new upstream request), where endless streams price its response path alone.

Runs, in order:
1. direct: client k talks to replica k % R itself: what backends + clients do with no front end;
2. through the front end, for each event loop in --loops and each P in --processes: P worker
   processes share the port (SO_REUSEPORT; the kernel spreads the clients' connections).
With --routing kv, each replica's stand-in publisher stores and evicts --kv-blocks-per-s blocks a second
while the load runs, so the front end's KV-event subscriber thread competes with its event loop as it does
against real engines. For each: responses/s, the front end's CPU (all its processes) in cores and microseconds per
response, the machine's busy cores, and the front end's error counters (must stay 0).

A front end is a bottleneck when its responses/s falls below the direct figure while the machine
still has idle cores, or when it is busy ~1 core per process. On a machine without spare cores
(2 cores here) backends, clients and front end share them, so the direct figure is the ceiling
and `us_per_response` is the portable figure: one front-end process sustains about
1e6 / us_per_response responses/s on a core of its own.

Prints a table on stderr and one JSON document on stdout (--json FILE also writes it there).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import time
import urllib.request
from pathlib import Path

from benchmark.servers import fixture_servers, frontend

MODEL = "emitter"


def log(msg: str) -> None:
    print(f"[frontend_capacity] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- CPU accounting
_TICK = os.sysconf("SC_CLK_TCK")


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system) of every live process in process group `pgid`."""
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fields = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields[0] is state; pgrp is the 5th stat field
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def machine_busy() -> tuple:
    """(busy seconds, all seconds) summed over CPUs, from /proc/stat."""
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = v[3] + v[4]
    return (sum(v) - idle) / _TICK, sum(v) / _TICK


# ----------------------------------------------------------------------------- the load
def client_main(
    url: str, model: str, concurrency: int, t_a: float, t_b: float, tag: str, out, max_tokens: int = 0
) -> None:
    """One client process: one connection, one stream, `concurrency` requests in flight; counts the responses (and
    the requests that ended) received in [t_a, t_b) (perf_counter, CLOCK_MONOTONIC: shared by the processes).
    max_tokens 0: endless requests, responses left unparsed (the cheapest consumer there is); N: requests of N
    responses, each sent again as its last one arrives (responses parsed to find the last)."""
    import grpc
    from tritonclient.grpc import service_pb2

    from launcher.client.request import Generation, build_request

    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", 2**31 - 1)]
    n = ended = 0
    error = ""
    tokens = max_tokens or 2**31 - 1
    requests = [
        build_request(model, Generation("capacity", max_tokens=tokens), f"{tag}-{i}").SerializeToString()
        for i in range(concurrency)
    ]
    parse = service_pb2.ModelStreamInferResponse.FromString if max_tokens else None
    try:
        with grpc.insecure_channel(url, options=options) as ch:
            rpc = ch.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer", response_deserializer=parse)
            sendq: queue.SimpleQueue = queue.SimpleQueue()
            for raw in requests:
                sendq.put(raw)
            call = rpc(iter(sendq.get, None))
            perf = time.perf_counter
            sent = 0
            try:
                for msg in call:
                    t = perf()
                    if t >= t_b:
                        break
                    if parse is not None:
                        if msg.error_message:
                            error = msg.error_message
                            break
                        last = msg.infer_response.parameters.get("triton_final_response")
                        if last is not None and last.bool_param:
                            sendq.put(requests[sent % concurrency])
                            sent += 1
                            ended += t >= t_a
                    n += t >= t_a
            except grpc.RpcError as e:
                error = f"{e.code().name}: {e.details()}"
            call.cancel()
    except Exception as e:  # reported, not raised: the parent prints it
        error = f"{type(e).__name__}: {e}"
    out.put((tag, n, error, ended))


def run_load(
    urls: list, clients: int, concurrency: int, warmup: float, seconds: float, fe_pgid: int = 0, max_tokens: int = 0
) -> dict:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = time.perf_counter() + 2.0 + 0.1 * clients  # time for the clients to start and connect
    t_a, t_b = start + warmup, start + warmup + seconds
    procs = [
        ctx.Process(
            target=client_main,
            args=(urls[k % len(urls)], MODEL, concurrency, t_a, t_b, f"c{k}", out, max_tokens),
            daemon=True,
        )
        for k in range(clients)
    ]
    for p in procs:
        p.start()
    time.sleep(max(0.0, t_a - time.perf_counter()))
    cpu_a, (busy_a, _) = group_cpu(fe_pgid) if fe_pgid else 0.0, machine_busy()
    time.sleep(max(0.0, t_b - time.perf_counter()))
    cpu_b, (busy_b, _) = group_cpu(fe_pgid) if fe_pgid else 0.0, machine_busy()
    results = [out.get(timeout=seconds + warmup + 120) for _ in procs]
    for p in procs:
        p.join(30)
    n = sum(r[1] for r in results)
    ended = sum(r[3] for r in results)
    errors = [r[2] for r in results if r[2]]
    fe_cpu = cpu_b - cpu_a
    return {
        "responses_per_s": n / seconds,
        "responses": n,
        "requests_per_s": ended / seconds if max_tokens else None,
        "frontend_us_per_request": fe_cpu / ended * 1e6 if fe_pgid and max_tokens and ended else None,
        "per_client_per_s": [round(r[1] / seconds) for r in sorted(results)],
        "frontend_cores": fe_cpu / seconds if fe_pgid else None,
        "frontend_us_per_response": fe_cpu / n * 1e6 if fe_pgid and n else None,
        "machine_busy_cores": (busy_b - busy_a) / seconds,
        "machine_cores": os.cpu_count(),
        "client_errors": errors,
    }


def frontend_errors(metrics_port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    out = {"errors": 0.0, "rejected": 0.0, "down": 0.0}
    for line in text.splitlines():
        if line.startswith("llmlaunch_frontend_errors_total{"):
            out["errors"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("llmlaunch_frontend_rejected_total"):
            out["rejected"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("llmlaunch_frontend_replica_up{"):
            out["down"] += 1 - float(line.rsplit(" ", 1)[1])
    return out


def show(name: str, r: dict) -> None:
    fe = (
        ""
        if r["frontend_cores"] is None
        else f", front end {r['frontend_cores']:.2f} cores = {r['frontend_us_per_response']:.1f} us/response"
    )
    if r.get("frontend_us_per_request") is not None:
        fe += f", {r['frontend_us_per_request']:.1f} us/request"
    asked = f"; {r['requests_per_s']:,.0f} requests/s" if r.get("requests_per_s") is not None else ""
    log(
        f"{name}: {r['responses_per_s']:,.0f} responses/s{asked}{fe}; machine {r['machine_busy_cores']:.2f}/{r['machine_cores']} cores busy"
        + (f"; ERRORS {r['client_errors'][:2]}" if r["client_errors"] else "")
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=2, help="tritonservers behind the front end (default 2)")
    p.add_argument("--instances", type=int, default=2, help="emitter instances per tritonserver (default 2)")
    p.add_argument("--processes", default="1,2", help="front-end worker process counts to try (default 1,2)")
    p.add_argument("--loops", default="auto", help="event loops to try: auto, asyncio, uvloop (default auto)")
    p.add_argument("--clients", type=int, default=4, help="client processes = client connections (default 4)")
    p.add_argument("--concurrency", type=int, default=2, help="requests in flight per client stream (default 2)")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=0,
        help="responses per request: 0 endless (default: the response path alone); N: each request ends after N and "
        "is sent again, so the window also counts requests and the front end's CPU per request (its request path)",
    )
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of load before the window")
    p.add_argument("--seconds", type=float, default=5.0, help="measuring window")
    p.add_argument("--skip-direct", action="store_true")
    p.add_argument("--routing", default="least_outstanding", help="the front end's serve.routing policy")
    p.add_argument(
        "--kv-blocks-per-s",
        type=int,
        default=1000,
        help="with --routing kv: blocks each replica's stand-in publisher stores (and evicts a second later) a second "
        "while the load runs, as an engine's cache does (default 1000; 0: publishers silent)",
    )
    p.add_argument("--tokenizer", default="", help="--routing kv: the tokenizer folder (default: the tiny model's)")
    p.add_argument(
        "--migrations",
        default="0",
        help="the front end's max_migrations to try, alternated within each process count (default 0): above 0 it "
        "asks the emitter for output_ids on every response and keeps them, as it does to move engine=hf streams; "
        "--migrations 0,3 --rounds 3 says what that bookkeeping costs",
    )
    p.add_argument("--rounds", type=int, default=1, help="times each front-end run is repeated, alternated")
    p.add_argument("--json", help="also write the JSON document here")
    args = p.parse_args(argv)

    report = {
        "machine_cores": os.cpu_count(),
        "replicas": args.replicas,
        "instances": args.instances,
        "clients": args.clients,
        "concurrency_per_client": args.concurrency,
        "max_tokens": args.max_tokens,
        "seconds": args.seconds,
        "model": MODEL,
        "runs": [],
    }
    if args.routing == "kv" and not args.tokenizer:
        from launcher.tiny import ensure_tiny_model

        args.tokenizer = str(ensure_tiny_model())
    with fixture_servers(args.replicas, args.instances, {MODEL: {"full_outputs": "false"}}) as urls:
        log(f"{args.replicas} tritonservers x {args.instances} {MODEL} instances: {', '.join(urls)}")
        if not args.skip_direct:
            r = run_load(urls, args.clients, args.concurrency, args.warmup, args.seconds, max_tokens=args.max_tokens)
            r.update(mode="direct", processes=0, loop="")
            report["runs"].append(r)
            show("direct to the replicas", r)
            time.sleep(1.0)
        migrations = [int(x) for x in args.migrations.split(",")]
        for loop in args.loops.split(","):
            for n in [int(x) for x in args.processes.split(",")]:
                for rnd, m in [(r, m) for r in range(args.rounds) for m in migrations]:
                    with frontend(
                        urls, n, loop, MODEL, args.routing, args.tokenizer, args.kv_blocks_per_s, max_migrations=m
                    ) as (url, metrics_port, pgid):
                        r = run_load(
                            [url], args.clients, args.concurrency, args.warmup, args.seconds, pgid, args.max_tokens
                        )
                        r.update(
                            mode="frontend",
                            processes=n,
                            loop=loop,
                            max_migrations=m,
                            round=rnd,
                            frontend_counters=frontend_errors(metrics_port),
                        )
                    report["runs"].append(r)
                    show(f"front end, {n} process(es), loop {loop}, max_migrations {m}, round {rnd + 1}", r)
                    time.sleep(1.0)
    direct = next((r["responses_per_s"] for r in report["runs"] if r["mode"] == "direct"), None)
    for r in report["runs"]:
        if direct and r["mode"] == "frontend":
            r["ratio_to_direct"] = r["responses_per_s"] / direct
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
