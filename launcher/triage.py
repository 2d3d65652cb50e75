"""Failure triage across ranks: from every rank's log and the run dir's records, the root cause first.

Pure: the caller reads the files (launcher/logs.py) and hands their text here. Every error line of every log is
an event with the time its line carries (a rank's own lines, `[llmlaunch rank N host YYYY-MM-DD HH:MM:SS.mmm]`;
tritonserver's glog lines, `E1127 21:24:28.123456 ...`; Slurm's `... AT 2026-11-27T21:24:28 ***`); a line without
a time of its own (a Python traceback, `srun: error: ...`) takes the time of the last timed line above it, and
counts as a root cause only when no error carries a time of its own. srun's line about a task that ended badly
(`srun: error: node2: task 1: Killed`) is about that task's rank and node, whichever log it is in: a rank whose
own process was killed says nothing else. The failure and lost-replica records are
events too, at the time the rank wrote them. The earliest error is the root cause; the later ones are listed as
its consequences (one per rank and message).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


def log_time(t: Optional[float] = None) -> str:
    """Local time to the millisecond, as rank log lines carry it (what this module parses back)."""
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


# a rank's own lines (launcher/rank/: run_rank's say, with log_time)
_RANK_LINE = re.compile(r"^\[llmlaunch rank (\d+) (\S+) (\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)\] (.*)$")
# tritonserver (glog): severity, month, day, time
_GLOG = re.compile(r"^([IWEF])(\d{2})(\d{2}) (\d{2}:\d{2}:\d{2}(?:\.\d+)?) +\d+ [^\]]*\] ?(.*)$")
# an ISO time anywhere in the line (slurmstepd's "*** STEP 12.0 ON node1 CANCELLED AT 2026-11-27T21:24:28 ***",
# Python logging's "2026-11-27 21:24:28,123")
_ISO = re.compile(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(?:[.,](\d+))?")
# lines that say something failed, whatever wrote them
_ERROR = re.compile(
    r"^(?:Traceback \(most recent call last\)|[\w.]+(?:Error|Exception|Exit)(?::|$)|srun: error:|slurmstepd: error:|"
    r"error:|ERROR\b|FATAL\b)|Segmentation fault|core dumped|\bBus error\b|\bAborted\b"
)
# a rank's own lines that are errors (the rest of its lines are progress)
_RANK_ERROR = re.compile(r"^FAILED\b|: failing the job$|\bLOST\b|did not arrive|\bunasked\b")
# srun's word on tasks that ended badly ("srun: error: node2: task 1: Killed", "... tasks 3-5: Exited with exit code
# 1"): it lands in the batch script's log (which is rank 0's), but it is about the task it names, and srun's task N
# is rank N. A rank whose own process was killed (SIGKILL, the OOM killer) says nothing else.
_SRUN_TASK = re.compile(r"^srun: error: ([\w.-]+): tasks? (\d+)[\d,-]*: (.+)$")
# errors every CPU-only tritonserver logs at start (no CUDA driver, no NVML): not why anything failed
_BENIGN = ("CudaDriverHelper has not been initialized", "Error: Failed to initialize NVML")
CONTEXT = 6  # lines shown either side of the root cause


@dataclass(frozen=True)
class Event:
    """One error: where it was said, when, and the lines around it."""

    time: Optional[float]  # seconds since the epoch; None when neither the line nor any line above it has a time
    timed: bool  # the line carries its own time (not one taken from a line above it)
    rank: Optional[int]  # None: the batch script or Slurm said it, not a rank
    host: str  # the node ("" when no line of that log named it)
    source: str  # the log file's name, or the record's
    line_no: int  # 1-based line in `source` (0 for a record)
    text: str  # the error line (a glog message with its escaped newlines expanded)
    context: Tuple[str, ...] = ()  # the lines around it
    at: int = -1  # the error line's index in `context` (-1: a record's, which has none)

    def where(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "the batch script"
        return f"{who}{f' on {self.host}' if self.host else ''}"

    def when(self) -> str:
        if self.time is None:
            return "time unknown"
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.time)) + f".{int(self.time * 1000) % 1000:03d}"
        return stamp if self.timed else f"after {stamp}"


def _local(date_s: str, clock: str, frac: str = "") -> Optional[float]:
    try:
        t = time.mktime(time.strptime(f"{date_s} {clock}", "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None
    return t + (float(f"0.{frac}") if frac else 0.0)


def line_time(line: str, year: int) -> Optional[float]:
    """The time a log line carries, local time (as the nodes wrote it), None when it has none. glog lines carry no
    year: `year` is the log's (its file's modification time)."""
    m = _RANK_LINE.match(line)
    if m:
        d, _, c = m.group(3).partition(" ")
        clock, _, frac = c.partition(".")
        return _local(d, clock, frac)
    m = _GLOG.match(line)
    if m:
        clock, _, frac = m.group(4).partition(".")
        return _local(f"{year:04d}-{m.group(2)}-{m.group(3)}", clock, frac)
    m = _ISO.search(line)
    if m:
        return _local(m.group(1), m.group(2), m.group(3) or "")
    return None


def error_text(line: str) -> Optional[str]:
    """The error a line states (its message), None when it states none."""
    m = _RANK_LINE.match(line)
    if m:
        msg = m.group(4)
        return msg if _RANK_ERROR.search(msg) else None
    m = _GLOG.match(line)
    if m:
        msg = m.group(5).strip()
        if m.group(1) not in "EF" or msg.startswith(_BENIGN) or msg.strip('"').startswith(_BENIGN):
            return None
        return msg.strip('"').replace('\\"', '"').replace("\\n", "\n    ")
    s = line.strip()
    return s if s and _ERROR.search(s) and not s.startswith(_BENIGN) else None


def srun_task(line: str) -> Optional[Tuple[int, str, str]]:
    """(rank, node, what) of srun's line about a task that ended badly, None for any other line."""
    m = _SRUN_TASK.match(line.strip())
    return (int(m.group(2)), m.group(1), m.group(3).strip()) if m else None


def task_deaths(texts: Iterable[str]) -> List[Tuple[int, str, str]]:
    """Every rank srun reported ended badly in these logs, once each, in the order reported: (rank, node, what)."""
    out: Dict[int, Tuple[int, str, str]] = {}
    for text in texts:
        for line in text.splitlines():
            if line.startswith("srun: error:"):
                t = srun_task(line)
                if t and t[0] not in out:
                    out[t[0]] = t
    return list(out.values())


def rank_of_line(line: str) -> Optional[Tuple[int, str]]:
    """(rank, host) a rank's own line names."""
    m = _RANK_LINE.match(line)
    return (int(m.group(1)), m.group(2)) if m else None


def rank_message(line: str) -> Optional[Tuple[int, str]]:
    """(rank, what it says) of a rank's own line; None for any other line (its server's output)."""
    m = _RANK_LINE.match(line)
    return (int(m.group(1)), m.group(4)) if m else None


def scan_log(
    text: str, *, source: str, rank: Optional[int], host: str = "", year: Optional[int] = None, context: int = CONTEXT
) -> List[Event]:
    """Every error line of one log. `rank`: the log's rank (None for the batch script's); `host` is learned from
    the rank's own lines when not given. A traceback is one error: its exception line, with the frames as context."""
    year = year or time.localtime().tm_year
    lines = text.splitlines()
    if not host:
        host = next((r[1] for r in map(rank_of_line, lines) if r and (rank is None or r[0] == rank)), "")
    events: List[Event] = []
    last_t: Optional[float] = None
    in_traceback = False
    for i, line in enumerate(lines):
        t = line_time(line, year)
        if t is not None:
            last_t = t
        msg = error_text(line)
        if msg is None:
            continue
        if msg.startswith("Traceback (most recent call last)"):
            in_traceback = True  # its exception line, further down, is the event
            continue
        if in_traceback and line[:1] in (" ", "\t"):
            continue
        in_traceback = False
        lo, hi = max(0, i - context), min(len(lines), i + context + 1)
        who, where = rank, host
        task = srun_task(line)
        if task:
            who, where = task[0], task[1]
        events.append(
            Event(
                t if t is not None else last_t,
                t is not None,
                who,
                where,
                source,
                i + 1,
                msg,
                tuple(lines[lo:hi]),
                i - lo,
            )
        )
    return events


def record_events(failures: Iterable[Dict], lost: Iterable[Dict], source: str = "") -> List[Event]:
    """The run dir's failure_rank<N>.json and replica_lost<R>.json records as events at the time they were written."""
    out = []
    for f in failures:
        what = f.get("reason") or f"exited with status {f.get('exit_code')}"
        out.append(
            Event(
                f.get("time"),
                f.get("time") is not None,
                f.get("rank"),
                f.get("host", ""),
                source or f"failure_rank{f.get('rank')}.json",
                0,
                f"rank failed: {what}",
                tuple((f.get("log_tail") or "").splitlines()[-2 * CONTEXT :]),
            )
        )
    for r in lost:
        out.append(
            Event(
                r.get("time"),
                r.get("time") is not None,
                r.get("rank"),
                r.get("host", ""),
                source or f"replica_lost{r.get('replica')}.json",
                0,
                f"replica {r.get('replica')} lost: {r.get('reason')}",
                tuple((r.get("log_tail") or "").splitlines()[-2 * CONTEXT :]),
            )
        )
    return out


@dataclass(frozen=True)
class Triage:
    root: Optional[Event]  # the earliest error, None when no log and no record states one
    consequences: Tuple[Event, ...]  # the later errors, one per rank and message, in time order
    sources: Tuple[str, ...]  # what was read


def _order(e: Event):
    # errors with a time of their own first (by it), then the ones whose time is borrowed, then the unknown;
    # at one time a log line before a record (the line says more than the record's summary of it)
    return (not e.timed, e.time is None, e.time or 0.0, e.line_no == 0, e.source, e.line_no)


def _key(e: Event) -> Tuple[Optional[int], str]:
    """Same rank, same message (digits aside): one consequence."""
    return e.rank, re.sub(r"\d+", "#", e.text.split("\n")[0])[:160]


SAME_S = 2.0  # a record within this many seconds of an error line of its rank's log says what that line said


def _said_in_log(rec: Event, events: Sequence[Event]) -> bool:
    return any(
        e.line_no and e.rank == rec.rank and e.timed and rec.time is not None and abs(e.time - rec.time) <= SAME_S
        for e in events
    )


def triage(events: Sequence[Event], sources: Sequence[str] = ()) -> Triage:
    """The root cause and its consequences. A record whose rank's log says the same (an error line within
    SAME_S of it) is left out: the log line has the lines around it."""
    events = [e for e in events if e.line_no or not _said_in_log(e, events)]
    ordered = sorted(events, key=_order)
    if not ordered:
        return Triage(None, (), tuple(sources))
    root = ordered[0]
    seen = {_key(root)}
    rest = []
    for e in sorted(ordered[1:], key=lambda e: (e.time is None, e.time or 0.0, e.source, e.line_no)):
        k = _key(e)
        if k in seen:
            continue
        seen.add(k)
        rest.append(e)
    return Triage(root, tuple(rest), tuple(sources))


WIDTH = 300  # characters of a context line shown (the archive has them whole)


def _clip(line: str) -> str:
    line = line.rstrip()
    return line if len(line) <= WIDTH else line[:WIDTH] + " ..."


def render(t: Triage, *, archive: str = "", limit: int = 20) -> str:
    """The report: the root cause and the lines around it, then its consequences."""
    out: List[str] = []
    if t.root is None:
        out.append(f"no error found in {len(t.sources)} logs and records")
    else:
        r = t.root
        out.append(f"root cause: {r.where()} at {r.when()} ({r.source}{f' line {r.line_no}' if r.line_no else ''}):")
        out += [f"  {line}" for line in r.text.splitlines()]
        if r.context:
            out.append(f"  lines around it in {r.source}:" if r.line_no else "  its log ends:")
            out += [f"    {'>' if i == r.at else ' '} {_clip(line)}" for i, line in enumerate(r.context)]
        if t.consequences:
            out.append(f"consequences ({len(t.consequences)}, in time order):")
            for e in t.consequences[:limit]:
                out.append(
                    f"  {e.when()}  {e.where()}: {_clip(e.text.splitlines()[0])}  ({e.source}{f':{e.line_no}' if e.line_no else ''})"
                )
            if len(t.consequences) > limit:
                out.append(f"  ... and {len(t.consequences) - limit} more (in the archive)")
    if archive:
        out.append(f"every rank's logs and records: {archive}")
    return "\n".join(out)


# ----------------------------------------------------------------------------- the run dir's records, in a line
def describe_failure(f: Dict) -> str:
    # "reason" (why the rank failed the job) is absent from records of older versions
    what = f"failed: {f['reason']}" if f.get("reason") else f"exited with status {f['exit_code']}"
    return f"rank {f['rank']} on node {f['host']} (node index {f['node']}) {what}; {f['log']}:\n{f['log_tail']}"


def describe_lost(r: Dict) -> str:
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"]))
    return f"replica {r['replica']} lost at {at} on {r['host']}: {r['reason']} (ranks {', '.join(map(str, r['ranks']))}; log {r['log']})"


def describe_restart(r: Dict) -> str:
    """One restart in place of a replica's server (launcher/rank/rank.py: Rank.restart_in_place)."""
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"]))
    outcome = f"serving again after {r['ready_s']:.1f}s" if r.get("ready_s") is not None else "not serving (yet)"
    return (
        f"replica {r['replica']} restarted in place at {at} on {r['host']} (restart {r['restart']} of "
        f"{r['max_restarts']}): {r['reason']}; {outcome}"
    )


def describe_walltime(w: Dict, serving_again: bool) -> str:
    """One allocation's drain at its time limit, and what came of it."""
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(w["time"]))
    then = (
        (
            "requeued; serving again at the endpoint above"
            if serving_again
            else "requeued; the endpoint follows once it serves again"
        )
        if w.get("requeue")
        else "ended"
    )
    return f"allocation {w.get('attempt', 0)} drained at its time limit at {at} on {w.get('host', '?')}: {then}"
