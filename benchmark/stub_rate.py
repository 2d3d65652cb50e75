#!/usr/bin/env python3
"""How many streamed responses a second one python-backend stub sends, by how its tensors are built.

A streamed request of the hf model gets one response per engine step.  One Triton model instance (one
stub process) builds and sends them all, and at 32 streams on an H100 it could not keep up: it merged
tokens, so a client saw a piece every 3.3-4.2 ms against 1.86 in-process.  In a stub, building a pb_utils.Tensor costs 12 us (INT32) to 30 us (BYTES), and a tensor's
first send copies it into shared memory, while a tensor sent before is sent again from there; so the hf
model's responses (launcher.serving.triton_io.Responder) keep the tensors that repeat.  This script
measures what that buys, with the `emitter` fixture model (launcher/testing/models/emitter: one request at a time,
responses as fast as the python backend allows, built by the real Responder), one instance a variant, in
one tritonserver:

  fresh       every tensor of every response built afresh (the Responder before this change)
  cached      tensors kept: the text cycles through --pieces distinct pieces (a model's frequent tokens)
  cached_new  tensors kept, but every text is new (output_tokens and the rest still repeat): the worst case
  bare        without the Responder: one text tensor resent, a new output_tokens tensor, input_tokens and an
              empty finish_reason resent (the four contract outputs on every response)
  bare_text   the same with text_output alone on every response but the last: what the three counts cost a
              response in the stub and in tritonserver (the contract sends them on every one)

Rounds take the variants in turn, so the machine's drift falls on each alike.  Every response's text and
the final count are checked (a kept tensor resent must still carry its own text).  Per variant:
responses/s over one request of --responses responses (median of the rounds, from the first response to
the last), and CPU microseconds per response of its stub and of tritonserver (from /proc; tritonserver's
gRPC front end and the backend's side of each send).  Then each variant's rate over `fresh`'s.

    python benchmark/stub_rate.py                                   # 20,000 responses x 3 rounds a variant
    python benchmark/stub_rate.py --responses 50000 --rounds 5 --json stub_rate.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.client import Generation, StreamRecord, TritonStream, build_request  # noqa: E402

VARIANTS = ("fresh", "cached", "cached_new", "bare", "bare_text")
TICK = os.sysconf("SC_CLK_TCK")


def emitter_params(variant: str, pieces: int, responses: int) -> dict:
    """The emitter's parameters for a variant."""
    if variant.startswith("bare"):  # the emitter's own tensors, one text (" x")
        return {"full_outputs": "false" if variant == "bare_text" else "true", "pieces": 1}
    return {"responder": "fresh" if variant == "fresh" else "cached", "pythonpath": str(ROOT),
            "pieces": responses + 1 if variant == "cached_new" else pieces}


def make_repo(dest: Path, variants: list[str], pieces: int, responses: int) -> Path:
    """One emitter model per variant, named emitter_<variant>, one instance each."""
    from launcher.testing.serve import variants_repository

    return variants_repository(dest, "emitter", {f"emitter_{v}": emitter_params(v, pieces, responses) for v in variants})


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads), seconds; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def find_stubs(variants: list[str]) -> dict[str, int]:
    """variant -> pid of its stub process (the stub's argv names its model file), and "server" -> their parent."""
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if not argv or b"triton_python_backend_stub" not in argv[0]:
            continue
        for v in variants:
            if any(f"/emitter_{v}/".encode() in a for a in argv):
                found[v] = int(entry.name)
                found["server"] = ppid
    return found


def one_request(url: str, model: str, n: int, pieces: int) -> dict:
    """One streamed request of n responses; responses/s from the first response to the last.  Checks every
    response's text (piece i is " t<i % pieces>", " x" when pieces is 1; the last is " x") and the count."""
    with TritonStream(url) as stream:
        rec = stream.submit(build_request(model, Generation("a b c", n, stream=True), "r0"), StreamRecord("r0"))
        stream.wait(rec, timeout=600)
    if rec.error:
        raise RuntimeError(f"{model}: {rec.error}")
    if len(rec.times) != n:
        raise RuntimeError(f"{model}: {len(rec.times)} responses, expected {n}")
    for i in range(1, n):
        want = " x" if pieces == 1 else f" t{i % pieces}"
        if rec.piece(i - 1) != want:
            raise RuntimeError(f"{model}: response {i} carries {rec.piece(i - 1)!r}, expected {want!r}")
    if rec.output_tokens != n or rec.finish_reason != "length":
        raise RuntimeError(f"{model}: final response says {rec.output_tokens} tokens, {rec.finish_reason!r}; "
                           f"expected {n}, 'length'")
    span = rec.times[-1] - rec.times[0]
    return {"rate": (n - 1) / span if span > 0 else float("nan")}


def measure(url: str, variants: list[str], n: int, rounds: int, warmup: int, pieces: int, log=print) -> dict:
    pids = find_stubs(variants)
    npieces = {v: emitter_params(v, pieces, n)["pieces"] for v in variants}
    for v in variants:  # each stub's first sends grow its shared memory: not measured
        one_request(url, f"emitter_{v}", warmup, npieces[v])
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(rounds):
        for v in variants:
            before = {k: cpu_seconds(p) for k, p in pids.items()}
            res = one_request(url, f"emitter_{v}", n, npieces[v])
            after = {k: cpu_seconds(p) for k, p in pids.items()}
            for who in ("server", v):
                if before.get(who) is not None and after.get(who) is not None:
                    res[f"{'server' if who == 'server' else 'stub'}_us"] = (after[who] - before[who]) / n * 1e6
            runs[v].append(res)
            log(f"round {r + 1}/{rounds} {v:10s} {res['rate']:9,.0f} responses/s"
                + (f"  stub {res['stub_us']:.0f} us, tritonserver {res['server_us']:.0f} us a response"
                   if "stub_us" in res and "server_us" in res else ""))
    out = {}
    for v, rs in runs.items():
        row = {"rounds": [round(x["rate"], 1) for x in rs], "rate": round(statistics.median(x["rate"] for x in rs), 1)}
        for key in ("stub_us", "server_us"):
            vals = [x[key] for x in rs if key in x]
            row[key] = round(statistics.median(vals), 1) if vals else None
        out[v] = row
    if "fresh" in out:
        for v, row in out.items():
            row["vs_fresh"] = round(row["rate"] / out["fresh"]["rate"], 3)
    return out


def table(result: dict) -> str:
    lines = ["| variant | responses/s (median) | rounds | × fresh | stub µs / response | tritonserver µs / response |",
             "|---|---|---|---|---|---|"]
    for v, row in result.items():
        fmt = lambda x: "—" if x is None else f"{x:,.0f}"  # noqa: E731
        lines.append(f"| {v} | {row['rate']:,.0f} | {' / '.join(f'{x:,.0f}' for x in row['rounds'])} | "
                     f"{row.get('vs_fresh', float('nan')):.2f} | {fmt(row['stub_us'])} | {fmt(row['server_us'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--responses", type=int, default=20000, help="responses in each measured request")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; each takes every variant once")
    ap.add_argument("--warmup", type=int, default=2000, help="responses of one unmeasured request per variant")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: " + ", ".join(VARIANTS))
    ap.add_argument("--pieces", type=int, default=1000,
                    help="distinct texts of the `cached` variant's responses (cycled), as a model's frequent tokens")
    ap.add_argument("--json", default="", help="write the results here too")
    args = ap.parse_args(argv)
    from launcher.testing.serve import chosen_variants, measure_variants

    variants = chosen_variants(ap, args.variants, VARIANTS)
    if args.responses < 2 or args.rounds < 1 or args.pieces < 1 or args.warmup < 2:
        ap.error("--responses and --warmup must be >= 2, --rounds and --pieces >= 1")
    measure_variants("llmlaunch-stub-rate-", lambda d: make_repo(d, variants, args.pieces, args.responses),
                     lambda url: measure(url, variants, args.responses, args.rounds, args.warmup, args.pieces), table,
                     args.json, {"responses": args.responses, "rounds": args.rounds, "pieces": args.pieces})
    return 0

if __name__ == "__main__":
    sys.exit(main())
