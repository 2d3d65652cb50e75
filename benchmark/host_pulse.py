"""The host's pulse through a GPU lease: how fast its CPU runs a fixed piece of Python now, and how fast the GPU clocks.

    python -m benchmark.host_pulse --out OUT/pulse.jsonl [--every 2] [--for SECONDS]

Every `--every` seconds it times the same small work (a pure-Python loop, and numpy calls on arrays of a few hundred
numbers, the kind vLLM's engine core makes once a step) and appends one JSON line: the wall time, both timings in
µs, the 1-minute load average, and, where pynvml imports, GPU 0's SM clock, power and utilization.  It runs until
killed (engines.sh starts it for the life of each command) or for `--for` seconds.

Why: the served and in-process figures of one lease have moved by a fifth to a third between runs minutes apart
(docs/performance/vllm.md), more than any change measured; `window` says, for a row's start and end, how fast the
host was then against the whole lease, so a slow row can be told apart from a slow host.  Its own cost is a few
milliseconds of one core every `--every` seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

_WORK = range(20000)


def _python_us() -> float:
    t = time.perf_counter()
    total = 0
    for i in _WORK:
        total += i * i
    return (time.perf_counter() - t) * 1e6


def _numpy_us() -> float | None:
    try:
        import numpy as np
    except ImportError:
        return None
    a = np.arange(256, dtype=np.int32)
    out = np.empty_like(a)
    t = time.perf_counter()
    for _ in range(200):
        np.cumsum(a, out=out)
        np.repeat(a[:128], 1)
        a[:128].tolist()
    return (time.perf_counter() - t) * 1e6


_NVML: list = []  # [pynvml, GPU 0's handle] once initialized; [None] where there is none


def _gpu():
    """GPU 0's (SM clock MHz, power W, utilization %), or None where pynvml does not import or find one."""
    try:
        if not _NVML:
            _NVML.append(None)
            import pynvml

            pynvml.nvmlInit()
            _NVML[:] = [pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)]
        if _NVML[0] is None:
            return None
        pynvml, h = _NVML
        return (
            pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
        )
    except Exception:  # noqa: BLE001 - no GPU, no pynvml: the CPU's pulse alone
        return None


def pulse_once() -> dict:
    gpu = _gpu()
    return {
        "t": time.time(),
        "python_us": round(_python_us(), 1),
        "numpy_us": None if (n := _numpy_us()) is None else round(n, 1),
        "load1": os.getloadavg()[0],
        "sm_mhz": gpu[0] if gpu else None,
        "power_w": gpu[1] if gpu else None,
        "gpu_util": gpu[2] if gpu else None,
    }


def read(path: str) -> list:
    if not path or not os.path.exists(path):
        return []
    ticks = []
    with open(path) as f:
        for line in f:
            try:
                ticks.append(json.loads(line))
            except ValueError:  # the line the pulse is writing now
                pass
    return ticks


def _median(ticks: list, key: str):
    values = [t[key] for t in ticks if t.get(key) is not None]
    return statistics.median(values) if values else None


def window(path: str, start: float, end: float, reach: float = 5.0) -> dict | None:
    """The pulse between wall times `start` and `end` against the whole file: the medians of the ticks inside, and
    `python_x` / `numpy_x`, their timings over the file's medians (above 1: the host's CPU ran slower then).  A load
    shorter than the ticks' spacing has the tick nearest its middle, within `reach` seconds; None where none is."""
    ticks = read(path)
    inside = [t for t in ticks if start <= t["t"] <= end]
    if not inside and ticks:
        middle = (start + end) / 2
        nearest = min(ticks, key=lambda t: abs(t["t"] - middle))
        inside = [nearest] if abs(nearest["t"] - middle) <= reach else []
    if not inside:
        return None
    out = {"ticks": len(inside)}
    for key in ("python_us", "numpy_us", "sm_mhz", "power_w", "gpu_util"):
        out[key] = _median(inside, key)
    out["load1_max"] = max(t["load1"] for t in inside)
    for key, name in (("python_us", "python_x"), ("numpy_us", "numpy_x")):
        whole = _median(ticks, key)
        out[name] = round(out[key] / whole, 3) if out[key] is not None and whole else None
    return out


def text(w: dict | None) -> str:
    """One window as the benchmarks print it beside a row."""
    if not w:
        return ""
    parts = [f"host: python {w['python_x']:.2f}x"]
    if w.get("numpy_x") is not None:
        parts.append(f"numpy {w['numpy_x']:.2f}x")
    parts.append(f"load {w['load1_max']:.1f}")
    if w.get("sm_mhz") is not None:
        parts.append(f"SM {w['sm_mhz']:.0f} MHz")
    return "  " + " ".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON lines file to append the ticks to")
    p.add_argument("--every", type=float, default=2.0, help="seconds between ticks")
    p.add_argument("--for", dest="duration", type=float, default=0.0, help="stop after this many seconds (0: never)")
    args = p.parse_args(argv)
    end = time.monotonic() + args.duration if args.duration > 0 else float("inf")
    with open(args.out, "a") as f:
        while time.monotonic() < end:
            f.write(json.dumps(pulse_once()) + "\n")
            f.flush()
            time.sleep(max(0.0, min(args.every, end - time.monotonic())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
