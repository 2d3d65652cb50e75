"""How much memory `llmlaunch` holds on this machine: every process of a local launch (llmlaunch itself,
tritonserver, the python-backend stubs, the hf engine process, the OpenAI API), at READY and at its peak while
llmlaunch-bench sends requests.

    python -m benchmark.memory                      # the default launch: SmolLM2-135M-Instruct on CPU
    python -m benchmark.memory model=tiny --requests 64 --concurrency 8

Two sums per reading: RSS (each process's resident pages, shared libraries counted in every process that maps
them) and PSS (shared pages divided among the processes sharing them: what the launch really takes, the figure to
hold against a machine's memory).  The peak is sampled every 0.2 s while the load runs.  Prints a table and, with
--json, writes the readings.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmark.servers import checkout_env, llmlaunch


def tree(root: int) -> list[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def memory_of(pid: int) -> tuple[int, int, str]:
    """(RSS bytes, PSS bytes, command) of one process; zeros once it is gone."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return 0, 0, ""
    kb = {line.split(":")[0]: int(line.split()[1]) for line in rollup if line.endswith("kB")}
    return kb.get("Rss", 0) * 1024, kb.get("Pss", 0) * 1024, cmd


def reading(root: int) -> dict:
    """The launch's memory now: RSS and PSS summed, and each process's."""
    procs = [(pid, *memory_of(pid)) for pid in tree(root)]
    return {
        "rss": sum(p[1] for p in procs),
        "pss": sum(p[2] for p in procs),
        "processes": [{"pid": p[0], "rss": p[1], "pss": p[2], "cmd": p[3][:120]} for p in procs if p[1]],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=64, help="requests llmlaunch-bench sends (default 64)")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds the launch may take to serve")
    ap.add_argument("--json", help="write the readings here")
    ap.add_argument("overrides", nargs="*", help="llmlaunch overrides (default: none, the default launch)")
    args = ap.parse_args(argv)
    log = Path(f"/tmp/llmlaunch-memory-{int(time.time())}.log")
    with llmlaunch(args.overrides, log, args.timeout) as served:
        ready = reading(served.proc.pid)
        peak = dict(ready)
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                now = reading(served.proc.pid)
                if now["pss"] > peak["pss"]:
                    peak.update(now)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        bench = [sys.executable, "-m", "launcher.bench", "--url", served.url, "--model", served.model,
                 "--dataset-name", "synthetic", "--input-len", str(args.input_len), "--output-len",
                 str(args.output_len), "--num-prompts", str(args.requests), "--concurrency", str(args.concurrency),
                 "--ignore-eos"]  # fmt: skip
        r = subprocess.run(bench, env=checkout_env(), capture_output=True, text=True)
        stop.set()
        sampler.join()
        if r.returncode != 0:
            print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
            return 1
    gib = 2**30
    print(f"{'reading':<22}{'RSS GiB':>10}{'PSS GiB':>10}")
    for name, doc in (("at READY", ready), (f"peak, {args.requests} requests C={args.concurrency}", peak)):
        print(f"{name:<22}{doc['rss'] / gib:>10.2f}{doc['pss'] / gib:>10.2f}")
    print("processes at the peak (PSS GiB):")
    for p in sorted(peak["processes"], key=lambda p: -p["pss"]):
        print(f"  {p['pss'] / gib:6.2f}  {p['cmd']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"ready": ready, "peak": peak, "argv": sys.argv}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
