"""A run directory: the files one job's ranks and tools share, each with one writer and one reader here.

    <run>/launch.json           the frozen spec every rank reads (written before submission)
    <run>/model_repository/     the rendered Triton repository
    <run>/submission.sh         (Slurm) the sbatch text, as submitted through submitit (submitit writes it)
    <run>/job.json              (Slurm) the submission record: job id, run dir, slurm.conf, model
    <run>/endpoint.json         written by rank 0 once it really serves (launcher/handoff/endpoint.py)
    <run>/startup.json          written by rank 0 just before endpoint.json: its time-to-READY marks, versions,
                                nodes and GPUs (launcher/record.py)
    <run>/record.json           the run record (launcher/record.py): written by the launching side before the
                                job starts, completed at READY, bench results added by a sweep
    <run>/ready_rank<N>.json    written by each leader once it serves, with the ports its server bound
                                (both carry the rendezvous's token: an earlier run's file never counts)
    <run>/frontend.json         rank 0's replicas front end's config (a FrontendConfig, launcher/frontend/server.py),
                                written by rank 0 as it starts the front end, read by it (launcher/procs/child.py)
    <run>/openai.json           the OpenAI API's config (an OpenAIConfig, launcher/openai_api/process.py), likewise
    <run>/failure_rank<N>.json  written by a rank whose server died unasked
    <run>/replica_lost<R>.json  written once per replica lost while the job serves (replicas > 1)
    <run>/replica_restart<R>_<K>.json  written by replica R's rank as it starts its dead server again (restart K)
    <run>/walltime<A>.json      written by rank 0 when Slurm's time-limit signal drains allocation A of the job
                                (A: $SLURM_RESTART_COUNT, 0 in the first); the batch script requeues on it
    <run>/logs-<time>.tar.gz    llmlaunch-logs: every rank's logs and the records, in one archive
    <run>/rendezvous/<job>/     the file rendezvous of ranks without MPI
    <run>/<job>_<rank>_log.out  one log per rank (Slurm); logs/rank<N>.log locally
    <run>/llmlaunch.log         a sweep's local server: the `llmlaunch` child's output
    <run>/step.sh, ranks.log    a sweep point in its own allocation: the srun step and its output

`wait_for_endpoint` is the one loop that waits for endpoint.json, with progress lines on stderr.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

from launcher.handoff.endpoint import EndpointRecord

ENDPOINT = "endpoint.json"
SPEC = "launch.json"
JOB = "job.json"
RECORD = "record.json"
STARTUP = "startup.json"
FRONTEND_CONFIG = "frontend.json"
OPENAI_CONFIG = "openai.json"
REPOSITORY = "model_repository"
LOGS = "logs"


def _read(path: Path) -> Optional[dict]:
    """A JSON record, or None while it is absent or half-written by a writer without a rename."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write(path: Path, obj) -> None:
    """Whole or not at all: readers poll these files while ranks write them."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    tmp.rename(path)


def record_once(path: Path, obj) -> bool:
    """Write `path` unless it exists (atomic on a shared filesystem: a hard link is created or
    refused whole, also over NFS). Returns whether this call wrote it."""
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


class RunDir:
    """One job's run directory (`path`); every file name of it is spelled in this class only."""

    def __init__(self, path: Union[str, os.PathLike, "RunDir"]):
        self.path = Path(path.path if isinstance(path, RunDir) else path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __truediv__(self, other):
        return self.path / other

    # ------------------------------------------------------------------ the spec and the repository
    @property
    def repository(self) -> Path:
        return self.path / REPOSITORY

    @property
    def spec_path(self) -> Path:
        return self.path / SPEC

    def write_spec(self, spec) -> "RunDir":
        """Materialise a plan: the rendered repository, the logs folder and launch.json."""
        from launcher.render import repository_files

        self.repository.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        for rel, text in repository_files(spec).items():
            dst = self.repository / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(text)
        self.spec_path.write_text(spec.to_json())
        return self

    def read_spec(self):
        from launcher.spec import LaunchSpec

        return LaunchSpec.from_json(self.spec_path.read_text())

    def read_launch(self) -> Optional[dict]:
        """launch.json as plain data, None when unreadable (tools that only need a value or two of it)."""
        return _read(self.spec_path)

    # ------------------------------------------------------------------ endpoint
    @property
    def endpoint_path(self) -> Path:
        return self.path / ENDPOINT

    def write_endpoint(self, record: EndpointRecord) -> None:
        _write(self.endpoint_path, record.to_dict())

    def read_endpoint(self) -> Optional[EndpointRecord]:
        """The record rank 0 wrote; None while there is none (LaunchError where a file is not one)."""
        doc = _read(self.endpoint_path)
        return None if doc is None else EndpointRecord.from_dict(doc, str(self.endpoint_path))

    def has_endpoint(self) -> bool:
        return self.endpoint_path.exists()

    def serving(self, token: str) -> bool:
        """Whether rank 0 wrote endpoint.json for this run: it carries this rendezvous's token (a file left
        by an earlier run of the same dir does not count)."""
        ep = self.read_endpoint()
        return ep is not None and bool(token) and ep.token == token

    # ------------------------------------------------------------------ the run record and rank 0's startup facts
    @property
    def record_path(self) -> Path:
        return self.path / RECORD

    def write_record(self, doc: Dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        _write(self.record_path, doc)

    def read_record(self) -> Optional[dict]:
        return _read(self.record_path)

    def write_startup(self, doc: Dict) -> None:
        _write(self.path / STARTUP, doc)

    def read_startup(self) -> Optional[dict]:
        return _read(self.path / STARTUP)

    # ------------------------------------------------------------------ rank 0's child services' configs
    @property
    def frontend_config(self) -> Path:
        return self.path / FRONTEND_CONFIG

    @property
    def openai_config(self) -> Path:
        return self.path / OPENAI_CONFIG

    # ------------------------------------------------------------------ readiness of leaders
    def ready_path(self, rank: int) -> Path:
        return self.path / f"ready_rank{rank}.json"

    def write_ready(self, rank: int, doc: Dict) -> None:
        _write(self.ready_path(rank), doc)

    def read_ready(self, rank: int) -> Optional[dict]:
        return _read(self.ready_path(rank))

    def ready_records(self) -> List[dict]:
        return [r for r in (_read(p) for p in sorted(self.path.glob("ready_rank*.json"))) if r is not None]

    def ready_count(self) -> int:
        return len(list(self.path.glob("ready_rank*.json")))

    # ------------------------------------------------------------------ failures
    def failure_path(self, rank: int) -> Path:
        return self.path / f"failure_rank{rank}.json"

    def write_failure(self, rank: int, doc: Dict) -> None:
        _write(self.failure_path(rank), doc)

    def failure_files(self) -> List[Path]:
        return sorted(self.path.glob("failure_rank*.json"))

    def failures(self) -> List[dict]:
        """Every readable failure record, by file name."""
        return [f for f in (_read(p) for p in self.failure_files()) if f is not None]

    # ------------------------------------------------------------------ lost replicas
    def lost_path(self, replica: int) -> Path:
        return self.path / f"replica_lost{replica}.json"

    def record_lost(self, replica: int, doc: Dict) -> bool:
        """Once per replica, whichever of its ranks comes first; whether this call wrote it."""
        return record_once(self.lost_path(replica), doc)

    def replica_lost(self, replica: int) -> bool:
        return self.lost_path(replica).exists()

    def read_lost(self, replica: int) -> Optional[dict]:
        return _read(self.lost_path(replica))

    def lost_replica_ids(self, replicas: int) -> Tuple[int, ...]:
        return tuple(r for r in range(replicas) if self.replica_lost(r))

    def lost_replicas(self) -> List[dict]:
        """The readable replica_lost<R>.json records, by replica."""
        out = [r for r in (_read(p) for p in self.path.glob("replica_lost*.json")) if r is not None]
        return sorted(out, key=lambda r: r.get("replica", 0))

    def clear_lost(self) -> None:
        """Records of an earlier run of this dir (a requeued job) must not stop this run's ranks, nor count as this
        run's restarts."""
        for stale in [*self.path.glob("replica_lost*.json"), *self.path.glob("replica_restart*.json")]:
            stale.unlink(missing_ok=True)

    # ------------------------------------------------------------------ replicas restarted in place
    def write_restart(self, replica: int, restart: int, doc: Dict) -> None:
        """Replica `replica`'s restart number `restart` (its rank, or its leader for a copy of several ranks, writes
        it at the restart and again once the server serves)."""
        _write(self.path / f"replica_restart{replica}_{restart}.json", doc)

    def claim_restart(self, replica: int, restart: int, doc: Dict) -> bool:
        """A copy of several ranks: the first of its ranks to find its server dead asks for the copy's restart number
        `restart`; whether this call asked (the others join it)."""
        self.path.mkdir(parents=True, exist_ok=True)
        return record_once(self.path / f"replica_restart{replica}_{restart}.json", doc)

    def read_restart(self, replica: int, restart: int) -> Optional[dict]:
        return _read(self.path / f"replica_restart{replica}_{restart}.json")

    def restart_asked(self, replica: int, restart: int) -> bool:
        """Whether a rank of `replica` asked for its restart number `restart`."""
        return (self.path / f"replica_restart{replica}_{restart}.json").exists()

    def restarts(self) -> List[dict]:
        """The readable restart records, by replica and restart."""
        out = [r for r in (_read(p) for p in self.path.glob("replica_restart*.json")) if r is not None]
        return sorted(out, key=lambda r: (r.get("replica", 0), r.get("restart", 0)))

    # ------------------------------------------------------------------ the time limit
    def walltime_path(self, attempt: str) -> Path:
        """Spelled as launcher/render.py's walltime_record spells it for the batch script."""
        return self.path / f"walltime{attempt or 0}.json"

    def write_walltime(self, attempt: str, doc: Dict) -> None:
        _write(self.walltime_path(attempt), doc)

    def walltime_records(self) -> List[dict]:
        """Each allocation's drain at its time limit, in allocation order."""
        out = [r for r in (_read(p) for p in self.path.glob("walltime*.json")) if r is not None]
        return sorted(out, key=lambda r: int(r.get("attempt") or 0))

    def clear_endpoint(self) -> None:
        """The job no longer serves at the endpoint it announced (drained at its time limit): tools must not send
        requests there; a requeued job's rank 0 writes its new one."""
        self.endpoint_path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ the Slurm submission record
    def write_job(self, record: Dict) -> None:
        (self.path / JOB).write_text(json.dumps(record))

    def read_job(self) -> Optional[dict]:
        return _read(self.path / JOB)

    # ------------------------------------------------------------------ logs and the rendezvous
    @property
    def logs(self) -> Path:
        return self.path / LOGS

    def local_rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"

    def slurm_rank_log(self, job_id: str, rank: Union[int, str]) -> Path:
        """submitit's per-task log (stderr joined to stdout)."""
        return self.path / f"{job_id}_{rank}_log.out"

    def slurm_rank_logs(self, job_id: str) -> List[Path]:
        return sorted(self.path.glob(f"{job_id}_*_log.out"))

    def log_files(self) -> List[Tuple[Path, Optional[int]]]:
        """Every log of the run with the rank that wrote it (None: the batch script's or the sweep's own):
        Slurm's per-task logs (rank 0's also holds the batch script's output), local ranks' logs, a sweep's."""
        out: List[Tuple[Path, Optional[int]]] = []
        for p in sorted(self.path.glob("*_*_log.out")):
            rank = p.name[: -len("_log.out")].rsplit("_", 1)[-1]
            out.append((p, int(rank) if rank.isdigit() else None))
        for p in sorted(self.logs.glob("rank*.log")) if self.logs.is_dir() else []:
            rank = p.stem[len("rank") :]
            out.append((p, int(rank) if rank.isdigit() else None))
        out += [(p, None) for p in (self.server_log, self.step_log) if p.exists()]
        return out

    def log_texts(self) -> List[Tuple[Path, Optional[int], str]]:
        """(path, rank, text) of every log of the run (log_files) that can be read now."""
        out = []
        for path, rank in self.log_files():
            try:
                out.append((path, rank, path.read_text(errors="replace")))
            except OSError:  # a log removed or unreadable: triage goes on with the others
                continue
        return out

    def record_files(self) -> List[Path]:
        """The run's JSON records and scripts (not the model repository, not submitit's pickles)."""
        return sorted(p for p in self.path.iterdir() if p.is_file() and p.suffix in (".json", ".sh"))

    def archive_path(self, stamp: str) -> Path:
        return self.path / f"logs-{stamp}.tar.gz"

    def rendezvous_dir(self, job_id: str) -> Path:
        return self.path / "rendezvous" / str(job_id)

    @property
    def server_log(self) -> Path:
        """A sweep's local server: the `llmlaunch` child's stdout and stderr."""
        return self.path / "llmlaunch.log"

    @property
    def step_script(self) -> Path:
        """A sweep point in its own allocation: the srun step that starts the ranks."""
        return self.path / "step.sh"

    @property
    def step_log(self) -> Path:
        return self.path / "ranks.log"


def default_run_dir(spec) -> str:
    """A new run dir for a launch of `spec`: <cluster.jobs_dir>/<job_name>/<time>-<random>, absolute."""
    root = Path(spec.cluster.jobs_dir or "llmlaunch-jobs")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return str((root / spec.job_name / f"{stamp}-{uuid.uuid4().hex[:6]}").absolute())


class Stopped(Exception):
    """Raised by a wait's `check` when the user asked to stop while the job was loading."""


def wait_for_endpoint(
    run: RunDir,
    *,
    timeout_s: float,
    on_timeout: Callable[[float], BaseException],
    check: Callable[[], None] = lambda: None,
    progress: Callable[[], str] = lambda: "",
    say: Optional[Callable[[str], None]] = None,
    repeat_s: float = 10.0,
    on_change: bool = True,
    interval_s: float = 0.25,
) -> EndpointRecord:
    """Until endpoint.json is there: its record. Each round, `check()` first (it raises when the job failed
    or its process ended), then the endpoint, then `progress()`: a line `say` prints with the seconds waited,
    when it changed (`on_change`) or `repeat_s` after the last one. After `timeout_s`, raises
    `on_timeout(seconds waited)`."""
    t0 = time.monotonic()
    last_msg, last_t = "", None
    while True:
        check()
        ep = run.read_endpoint()
        if ep is not None:
            return ep
        elapsed = time.monotonic() - t0
        msg = progress()
        if say and msg and ((on_change and msg != last_msg) or last_t is None or elapsed - last_t > repeat_s):
            say(f"{msg} ({elapsed:.0f}s)")
            last_msg, last_t = msg, elapsed
        if elapsed > timeout_s:
            raise on_timeout(elapsed)
        time.sleep(interval_s)
