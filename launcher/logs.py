"""llmlaunch-logs JOB_OR_RUN_DIR: every rank's logs and records in one archive, and the root cause first.

The side effects of triage (reading the run dir, writing the archive); launcher/triage.py decides what the root
cause is. `llmlaunch` runs the same when a job it follows fails (launcher/schedulers/slurm.py: follow).
"""

from __future__ import annotations

import sys
import tarfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

from launcher import jobindex
from launcher.errors import LaunchError
from launcher.rundir import RunDir
from launcher.triage import Triage, record_events, render, scan_log, triage


def find_run(arg: str) -> RunDir:
    """A run dir given as such, or the one llmlaunch recorded for a Slurm job id."""
    p = Path(arg)
    if p.is_dir():
        return RunDir(p)
    if p.suffix or "/" in arg:
        raise LaunchError(
            (
                arg,
                "no such run directory",
                "give a job id llmlaunch printed or its run dir (`run dir: ...` in llmlaunch-status)",
            )
        )
    return RunDir(jobindex.find(arg)["run_dir"])


def analyse(run: RunDir) -> Triage:
    """Every log's errors and the run's records, triaged."""
    events, sources = [], []
    for path, rank, text in run.log_texts():
        try:
            year = time.localtime(path.stat().st_mtime).tm_year
        except OSError:
            continue
        events += scan_log(text, source=path.name, rank=rank, year=year)
        sources.append(path.name)
    fails, lost = run.failures(), run.lost_replicas()
    events += record_events(fails, []) + record_events([], lost)
    sources += [p.name for p in run.failure_files()]
    return triage(events, sources)


def write_archive(run: RunDir, stamp: Optional[str] = None) -> Path:
    """One .tar.gz of every log and record of the run, under the run dir's name."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    out = run.archive_path(stamp)
    files: List[Path] = [p for p, _ in run.log_files()] + [p for p in run.record_files() if p != out]
    rdv = run.path / "rendezvous"
    if rdv.is_dir():  # which ranks arrived
        files += sorted(p for p in rdv.rglob("*") if p.is_file())
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for p in files:
            tar.add(p, arcname=f"{run.path.name}/{p.relative_to(run.path)}")
    tmp.rename(out)
    return out


def report(run: RunDir) -> Tuple[str, Path]:
    """The triage text (root cause first) and the archive it names."""
    archive = write_archive(run)
    return render(analyse(run), archive=str(archive)), archive


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(f"usage: {Path(sys.argv[0]).name} <job id | run dir>", file=sys.stderr)
        raise SystemExit(2)
    try:
        run = find_run(argv[0])
        text, _ = report(run)
    except LaunchError as e:
        print(e.render(), file=sys.stderr)
        raise SystemExit(2) from None
    print(text)
    raise SystemExit(0)


if __name__ == "__main__":
    main()
