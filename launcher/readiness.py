"""Time to READY, broken down: from the wall-clock marks a launch leaves, the time each phase took.

Every mark is a `time.time()` taken where the thing happened (or tritonserver's own log time), never an estimate:

    submitted      the `llmlaunch` command started (a sweep: the point's launch began; without either, Slurm's
                   Submit time of the job)
    allocated      the job's nodes were given to it (Slurm: its Start time; locally: = submitted)
    ranks_started  every rank is running and has met the others (rank 0, after the rendezvous)
    load_start     rank 0's tritonserver is up and starts loading the model (its log: "loading: MODEL:1")
    model_ready    the model is loaded: weights, compile, graphs (its log: "successfully loaded 'MODEL'")
    server_live    its gRPC endpoint is up (its log: "Started GRPCInferenceService"; else the first live answer)
    first_token    the first real request (rank 0's one-token probe) answered
    serving        endpoint.json written: front end (replicas > 1) and OpenAI API up, the job serves

`breakdown` turns them into phases (seconds), with the engine's own load phases (weights, compile, graph
capture, where the engine reports them: `Engine.load_phases`) and Slurm's queue reason. Engines inside
the server report phases and versions with `report_phase` / `report_version`: a line on stderr, which
tritonserver writes to the rank's log, parsed here.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Dict, Iterable, List, Optional, Tuple

from launcher.handoff.rank_env import RankEnv

# (phase key, from mark, to mark, label): in the order they happen
PHASES: Tuple[Tuple[str, str, str, str], ...] = (
    ("queue_s", "submitted", "allocated", "queue wait"),
    ("ranks_s", "allocated", "ranks_started", "allocation to ranks started"),
    ("server_s", "ranks_started", "load_start", "tritonserver up"),
    ("load_s", "load_start", "model_ready", "model/engine load"),
    ("endpoint_s", "model_ready", "server_live", "gRPC endpoint up"),
    ("first_token_s", "server_live", "first_token", "first real token"),
    ("frontend_s", "first_token", "serving", "front end and OpenAI API up"),
)
MARKS = (
    "submitted",
    "allocated",
    "ranks_started",
    "load_start",
    "model_ready",
    "server_live",
    "first_token",
    "serving",
)

PHASE_PREFIX = "llmlaunch-phase: "
VERSION_PREFIX = "llmlaunch-version: "
# the packages whose versions a record lists, as the ranks' interpreter has them installed
PACKAGES = ("torch", "transformers", "vllm", "tensorrt_llm", "sglang", "lmdeploy", "tritonclient", "nvidia-pytriton")


def _rank_tag() -> str:
    """` rank N` (the rank's RankEnv.rank, which its server and the engine inherit): ranks sharing one log (an
    srun step's output) tell their lines apart by it."""
    rank = RankEnv.from_environ(os.environ).rank
    return "" if rank is None else f" rank {rank}"


def report_phase(name: str, seconds: float) -> None:
    """Inside a starting server: one load phase's duration, for the time-to-READY breakdown."""
    print(f"{PHASE_PREFIX}{name} {seconds:.3f}{_rank_tag()}", file=sys.stderr, flush=True)


def report_version(package: str, version: str) -> None:
    """Inside a starting server: the version of a package it imported."""
    print(f"{VERSION_PREFIX}{package} {version}{_rank_tag()}", file=sys.stderr, flush=True)


def own_lines(log_text: str, rank: int, server_pid: int = 0) -> str:
    """A log several ranks may share, less the lines another rank's tag or another tritonserver's process id marks
    as not this rank's (untagged lines are kept; so is every tritonserver line when none carries `server_pid`, as
    where a container runtime starts the server)."""
    out = []
    if server_pid and not re.search(rf"^[IWE]\d{{4}} [\d:.]+ +{server_pid} ", log_text, re.M):
        server_pid = 0
    for line in log_text.splitlines():
        if line.startswith((PHASE_PREFIX, VERSION_PREFIX)):
            m = re.search(r" rank (\d+)$", line)
            if m and int(m.group(1)) != rank:
                continue
        elif server_pid:
            m = re.match(r"^[IWE]\d{4} [\d:.]+ +(\d+) ", line)
            if m and int(m.group(1)) != server_pid:
                continue
        out.append(line)
    return "\n".join(out)


def reported_phases(log_text: str) -> Dict[str, float]:
    """The `llmlaunch-phase:` lines of a log: phase -> seconds (the first of each: a restarted engine's later
    ones are not this start's)."""
    out: Dict[str, float] = {}
    for m in re.finditer(re.escape(PHASE_PREFIX) + r"(\w+) ([0-9.]+)", log_text):
        out.setdefault(m.group(1), float(m.group(2)))
    return out


def reported_versions(log_text: str) -> Dict[str, str]:
    """The `llmlaunch-version:` lines of a log: package -> version."""
    return {m.group(1): m.group(2) for m in re.finditer(re.escape(VERSION_PREFIX) + r"(\S+) (\S+)", log_text)}


def phases_from_patterns(patterns: Dict[str, str], log_text: str) -> Dict[str, float]:
    """An engine that logs its own load phases (vLLM): phase -> the first number its pattern matches."""
    out: Dict[str, float] = {}
    for key, pattern in patterns.items():
        m = re.search(pattern, log_text)
        if m:
            out[key] = float(m.group(1))
    return out


_TRITON_TIME = r"^[IWE](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d+) +\d+ [\w.]+:\d+\] \"?"


def triton_log_marks(log_text: str, model: str, since: float) -> Dict[str, float]:
    """When tritonserver started loading `model` ("load_start"), finished ("model_ready") and started its gRPC
    endpoint ("server_live"), from its log lines' times (UTC, without a year: the year of `since`). Lines before `since` (an earlier run appending to the same
    log) are skipped; a time far from `since` (a clock read another way) is not taken."""
    import calendar

    year = time.gmtime(since).tm_year
    out: Dict[str, float] = {}
    wanted = (
        ("load_start", f"loading: {model}:"),
        ("model_ready", f"successfully loaded '{model}'"),
        ("server_live", "Started GRPCInferenceService"),
    )
    for m in re.finditer(_TRITON_TIME + r"(.*)$", log_text, re.M):
        mo, d, h, mi, sec, frac, rest = m.groups()
        for key, needle in wanted:
            if key in out or not rest.startswith(needle):
                continue
            t = calendar.timegm((year, int(mo), int(d), int(h), int(mi), int(sec), 0, 0, 0)) + float("0." + frac)
            if since - 2.0 <= t <= since + 86400:
                out[key] = t
    return out


def phase_pairs(load_phases) -> List[List]:
    """Load phases as [[name, seconds], ...] in the order the engine went through them (JSON files keep a list's
    order; a mapping, written with sorted keys, would not)."""
    items = load_phases.items() if isinstance(load_phases, dict) else (load_phases or [])
    return [[str(k), round(float(v), 3)] for k, v in items]


def breakdown(marks: Dict[str, float], load_phases=None, queue_reason: str = "") -> dict:
    """Marks -> {"queue_s": ..., ..., "total_s": ..., "load_phases": [[name, s], ...], "queue_reason": ...}. A
    phase whose marks are missing is left out (an older run dir, or a launch that never got there); `total_s`
    runs from the first mark to the last."""
    out: dict = {}
    for key, start, end, _label in PHASES:
        if marks.get(start) is not None and marks.get(end) is not None:
            out[key] = round(max(0.0, float(marks[end]) - float(marks[start])), 3)
    present = [float(marks[m]) for m in MARKS if marks.get(m) is not None]
    if len(present) >= 2:
        out["total_s"] = round(present[-1] - present[0], 3)
    if load_phases:
        out["load_phases"] = phase_pairs(load_phases)
    out["queue_reason"] = queue_reason
    return out


def format_breakdown(b: dict) -> str:
    """One line: `time to READY 12.3s: queue wait 0.0s (Resources), ..., model/engine load 5.1s (weights 1.2s,
    graphs 3.0s), first real token 0.05s, ...`."""
    parts: List[str] = []
    for key, _start, _end, label in PHASES:
        if key not in b:
            continue
        text = f"{label} {b[key]:.2f}s"
        if key == "queue_s" and b.get("queue_reason"):
            text += f" ({b['queue_reason']})"
        if key == "load_s" and b.get("load_phases"):
            text += " (" + ", ".join(f"{k} {v:.2f}s" for k, v in phase_pairs(b["load_phases"])) + ")"
        parts.append(text)
    total = f" {b['total_s']:.1f}s" if "total_s" in b else ""
    return f"time to READY{total}: " + (", ".join(parts) or "no marks recorded")


# summary.csv's time-to-READY columns (launcher/bench/report.py), in order
CSV_COLUMNS = (
    ("ready_total_s",) + tuple(f"ready_{key}" for key, *_ in PHASES) + ("ready_queue_reason", "ready_load_phases")
)


def csv_columns(b: Optional[dict]) -> Dict[str, object]:
    """A breakdown as summary.csv's columns (empty where it is absent)."""
    b = b or {}
    row: Dict[str, object] = {"ready_total_s": b.get("total_s")}
    for key, *_ in PHASES:
        row[f"ready_{key}"] = b.get(key)
    row["ready_queue_reason"] = b.get("queue_reason", "")
    row["ready_load_phases"] = " ".join(f"{k}={v}" for k, v in phase_pairs(b.get("load_phases")))
    return row


def queue_reasons(seen: Iterable[str]) -> str:
    """The reasons Slurm gave while the job was PENDING, each once, in order ("" when it started at once)."""
    out: List[str] = []
    for r in seen:
        if r and r not in ("None", "(null)") and r not in out:
            out.append(r)
    return ", ".join(out)


def process_start_time(pid: Optional[int] = None) -> float:
    """When this process (or `pid`) was created, from /proc: boot time + its start in clock ticks. Falls back to
    now where /proc is not there."""
    try:
        stat = open(f"/proc/{pid or os.getpid()}/stat").read()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22 (starttime); fields after the command name
        btime = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime"))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def slurm_time(text: str) -> Optional[float]:
    """Slurm's `2026-11-27T21:30:00` (the cluster's local time) as a Unix time; None for Unknown/N/A."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
