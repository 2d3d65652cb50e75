"""The run record, RUN_DIR/record.json: what a launch was and how it went, enough to launch it again.

    schema          RECORD_SCHEMA of the llmlaunch that wrote it (a newer one is refused: `read_record`)
    llmlaunch       version and git commit of the checkout that launched it
    overrides       the command line's overrides; config: the composed config they made
    scheduler, run_dir, job_id, submitted
    environment     the ranks' interpreter: Python, platform, installed packages (a hash over name==version)
    versions        tritonserver (as the server reported it), the engine's packages (as the engine imported
                    them, else as rank 0's interpreter has them installed)
    nodes, gpus     every rank's node; each node's GPUs as nvidia-smi lists them
    endpoint        where it served; time_to_ready (launcher/readiness.py) and the marks it came from
    bench           the sweep points measured against it, with their headline metrics

The launching side writes its part before the job starts (`base_record`); rank 0 writes what the ranks saw to
startup.json just before endpoint.json; `complete_record` joins the two at READY. `config_from_record` is
`llmlaunch --from-record RUN_DIR/record.json [overrides]`: the record's config, with the new overrides on top.
"""

from __future__ import annotations

import hashlib
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher.handoff.endpoint import EndpointRecord
from launcher.logtext import read_end
from launcher.readiness import PACKAGES, breakdown, phase_pairs, reported_versions

RECORD_SCHEMA = 1


# ----------------------------------------------------------------------------- facts
def llmlaunch_identity() -> Dict[str, Any]:
    """This llmlaunch's version and, from a git checkout, its commit (and whether files differ from it)."""
    from launcher import __version__
    from launcher.paths import PACKAGE_ROOT

    doc: Dict[str, Any] = {"version": __version__, "commit": "", "dirty": False}
    if shutil.which("git") and (PACKAGE_ROOT / ".git").exists():
        try:
            rev = subprocess.run(
                ["git", "-C", str(PACKAGE_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            )
            doc["commit"] = rev.stdout.strip() if rev.returncode == 0 else ""
            st = subprocess.run(
                ["git", "-C", str(PACKAGE_ROOT), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            doc["dirty"] = bool(st.stdout.strip()) if st.returncode == 0 else False
        except (OSError, subprocess.TimeoutExpired):
            pass
    return doc


def installed_versions(packages=PACKAGES) -> Dict[str, str]:
    """The versions this interpreter has installed, of the packages a record lists (absent ones left out)."""
    from importlib import metadata

    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def environment_fingerprint() -> Dict[str, Any]:
    """This interpreter and what is installed in it: two runs with the same hash had the same packages."""
    from importlib import metadata

    dists = sorted({f"{(d.metadata['Name'] or '').lower()}=={d.version}" for d in metadata.distributions()})
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "packages": len(dists),
        "packages_sha256": hashlib.sha256("\n".join(dists).encode()).hexdigest(),
    }


def gpu_inventory(timeout_s: float = 10.0) -> List[str]:
    """This node's GPUs, one `index, name, uuid, memory` line each (nvidia-smi); without nvidia-smi, the devices
    the launcher made visible (CUDA_VISIBLE_DEVICES, else Slurm's GPU ids); [] when there are none."""
    import os

    if shutil.which("nvidia-smi") is None:
        visible = (
            os.environ.get("CUDA_VISIBLE_DEVICES")
            or os.environ.get("SLURM_STEP_GPUS")
            or os.environ.get("SLURM_JOB_GPUS")
            or ""
        )
        return [f"visible device {d}" for d in visible.split(",") if d]
    try:
        p = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,uuid,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in p.stdout.splitlines() if line.strip()] if p.returncode == 0 else []


def server_version(url: str) -> str:
    """tritonserver's version as the running server reports it (gRPC server metadata); "" when it cannot say."""
    try:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(url.replace("grpc://", ""))
        try:
            return str(client.get_server_metadata().version)
        finally:
            client.close()
    except Exception:  # a record without it is still a record
        return ""


def startup_doc(
    *,
    marks: Dict[str, float],
    log_text: str,
    load_phases: Dict[str, float],
    server_url: str,
    nodes: List[str],
    gpus: Dict[str, List[str]],
    token: str = "",
) -> Dict[str, Any]:
    """What rank 0 writes to startup.json: its marks, the engine's load phases and
    the versions it reported, tritonserver's version, the nodes and their GPUs, its interpreter."""
    versions = installed_versions()
    versions.update(reported_versions(log_text))  # what the engine imported wins over what is installed
    tv = server_version(server_url)
    if tv:
        versions["tritonserver"] = tv
    return {
        "marks": {k: round(float(v), 3) for k, v in marks.items() if v is not None},
        "load_phases": phase_pairs(load_phases),
        "versions": versions,
        "nodes": nodes,
        "gpus": gpus,
        "environment": environment_fingerprint(),
        "token": token,
    }


# ----------------------------------------------------------------------------- the record
def base_record(
    config: Optional[dict],
    overrides: List[str],
    scheduler: str,
    run_dir: str,
    *,
    identity: Optional[dict] = None,
    submitted: Optional[float] = None,
    from_record: str = "",
) -> Dict[str, Any]:
    """The launching side's part, written before the job starts."""
    doc = {
        "schema": RECORD_SCHEMA,
        "llmlaunch": identity if identity is not None else llmlaunch_identity(),
        "overrides": list(overrides),
        "config": config,
        "scheduler": scheduler,
        "run_dir": str(run_dir),
        "submitted": round(time.time() if submitted is None else submitted, 3),
    }
    if from_record:
        doc["from_record"] = from_record
    return doc


def join_record(
    record: Optional[dict],
    startup: Optional[dict],
    *,
    endpoint: Optional[EndpointRecord] = None,
    marks: Optional[Dict[str, float]] = None,
    queue_reason: str = "",
    job_id: str = "",
    nodes: str = "",
) -> Dict[str, Any]:
    """Pure: the base record (or a bare one) with what the ranks saw and the time-to-READY breakdown. `marks`
    are the launching side's (submitted, allocated), which win over rank 0's."""
    rec = dict(record or {"schema": RECORD_SCHEMA})
    st = startup or {}
    all_marks = dict(st.get("marks") or {})
    all_marks.update({k: v for k, v in (marks or {}).items() if v is not None})
    if rec.get("submitted") is not None:  # llmlaunch's own time: before Slurm's (whole seconds) Submit
        all_marks["submitted"] = rec["submitted"]
    all_marks.setdefault("allocated", all_marks.get("submitted"))  # no queue: the machine is there at once
    rec["marks"] = {k: round(float(v), 3) for k, v in all_marks.items() if v is not None}
    rec["time_to_ready"] = breakdown(rec["marks"], st.get("load_phases"), queue_reason)
    for key in ("versions", "gpus", "environment"):
        if st.get(key) is not None:
            rec[key] = st[key]
    rec["nodes"] = st.get("nodes") or ([n for n in nodes.split(",") if n] if nodes else rec.get("nodes", []))
    if job_id:
        rec["job_id"] = str(job_id)
    if endpoint is not None:
        rec["endpoint"] = {"url": endpoint.url, "model": endpoint.model, "openai_url": endpoint.openai_url}
    return rec


def complete_record(run, **kw) -> Dict[str, Any]:
    """At READY: join record.json's base with startup.json (rank 0's) and write it whole. Returns it."""
    rec = join_record(run.read_record(), run.read_startup(), endpoint=run.read_endpoint(), **kw)
    run.write_record(rec)
    return rec


def add_bench(run, entry: Dict[str, Any]) -> None:
    """A sweep point measured against this run's server: appended to the record's `bench` list."""
    rec = run.read_record()
    if rec is None:
        return
    rec.setdefault("bench", []).append(entry)
    run.write_record(rec)


def read_record(path: str) -> Dict[str, Any]:
    """A record to launch from, or a LaunchError naming what is wrong with it (exit 2)."""
    import json
    from pathlib import Path

    from launcher.errors import LaunchError

    p = Path(path)
    if p.is_dir():
        p = p / "record.json"
    try:
        rec = json.loads(p.read_text())
    except OSError as e:
        raise LaunchError(
            (
                f"--from-record {path}",
                f"cannot read it ({e.strerror or e})",
                "give RUN_DIR/record.json of a run llmlaunch started",
            )
        ) from None
    except ValueError as e:
        raise LaunchError(
            (f"--from-record {path}", f"not a JSON record ({e})", "give RUN_DIR/record.json of a run llmlaunch started")
        ) from None
    schema = rec.get("schema") if isinstance(rec, dict) else None
    if not isinstance(schema, int):
        raise LaunchError(
            (
                f"--from-record {path}",
                "it has no record schema version: not a run record",
                "give RUN_DIR/record.json of a run llmlaunch started",
            )
        )
    if schema > RECORD_SCHEMA:
        by = (rec.get("llmlaunch") or {}).get("version", "?")
        raise LaunchError(
            (
                f"--from-record {path}",
                f"it was written by a newer llmlaunch ({by}, record schema {schema}); "
                f"this llmlaunch ({llmlaunch_identity()['version']}) reads record schema {RECORD_SCHEMA} and older",
                f"launch it with that llmlaunch, or give its overrides on the command line: {' '.join(rec.get('overrides') or []) or '(none)'}",
            )
        )
    if not isinstance(rec.get("config"), dict):
        raise LaunchError(
            (
                f"--from-record {path}",
                "it holds no composed config (written by a launch that did not start from `llmlaunch`)",
                f"launch with its overrides instead: {' '.join(rec.get('overrides') or []) or '(none)'}",
            )
        )
    return rec


def log_text(path, size: int = 4 << 20) -> str:
    """The last `size` bytes of a log ("" when unreadable)."""
    return read_end(Path(path), size) or ""


def write_startup(
    run,
    spec,
    *,
    log_path,
    marks: Dict[str, float],
    server_url: str,
    nodes: List[str],
    gpus: Dict[str, List[str]],
    token: str = "",
    server_pid: int = 0,
) -> None:
    """Rank 0, just before endpoint.json: startup.json with its marks, tritonserver's
    load times from its log, the engine's load phases (`Engine.load_phases`), versions, nodes and GPUs. Without
    its own log file (a sweep point's srun step writes every rank's output to one), the step's log, of which only
    rank 0's lines (`own_lines`, by the server's process id `server_pid`) count."""
    from pathlib import Path

    from launcher.engines.registry import ENGINES
    from launcher.readiness import own_lines, triton_log_marks

    try:
        path = Path(log_path)
        if not path.exists() and run.step_log.exists():
            path = run.step_log
        text = own_lines(log_text(path), 0, server_pid)
        all_marks = dict(marks)
        since = all_marks.get("started") or all_marks.get("ranks_started") or time.time() - 3600
        all_marks.update(triton_log_marks(text, spec.model_name, since))  # the server's own times win over polling's
        phases = ENGINES[spec.engine.name].load_phases(text)
        doc = startup_doc(
            marks=all_marks,
            log_text=text,
            load_phases=phases,
            server_url=server_url,
            nodes=nodes,
            gpus=gpus,
            token=token,
        )
    except Exception as e:  # a fact that cannot be read must not keep a serving job from READY
        doc = {
            "marks": {k: v for k, v in marks.items() if v is not None},
            "nodes": nodes,
            "gpus": gpus,
            "token": token,
            "error": f"{type(e).__name__}: {e}",
        }
    run.write_startup(doc)
