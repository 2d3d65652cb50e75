"""Does llmlaunch serve on this machine at all: `llmlaunch <overrides>` started, one streamed request through the
client's command line, stopped with Ctrl-C's signal.  Run first on a new machine (benchmark/gpu/one_gpu.sh step 0),
so that a measurement that fails later fails for its own reason, not for a server that never came up.

    python -m benchmark.smoke                                   # the default model on CPU
    python -m benchmark.smoke engine.device=cuda serve.grpc_port=18001 serve.http_port=18000

Prints the endpoint and model llmlaunch announced, the client's exit status, time and answer, and llmlaunch's exit
status after the stop; exits 1 when the request failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmark.servers import llmlaunch, stop_llmlaunch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="llmlaunch overrides (KEY=VALUE)")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=600, help="seconds llmlaunch may take to READY")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="llmlaunch-smoke-") as tmp:
        log = Path(tmp) / "llmlaunch.log"
        with llmlaunch(args.overrides, log, args.timeout) as served:
            print(f"endpoint: {served.url}\nmodel: {served.model}", flush=True)
            t0 = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-m", "launcher.client", "--url", served.url, "--prompt", args.prompt]
                + ["--max-tokens", str(args.max_tokens)],
                capture_output=True,
                text=True,
            )
            took = time.perf_counter() - t0
            print(f"client rc={out.returncode} in {took:.2f}s: {out.stdout[-200:]!r} {out.stderr[-300:]}", flush=True)
            print(f"llmlaunch exit {stop_llmlaunch(served.proc)}", flush=True)
    return 0 if out.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
