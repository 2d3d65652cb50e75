"""What lives across the points of one sweep in this process (Hydra's basic launcher runs them one after another):
the sweep's axes, the server the last point left running (a point that changes only client-side values reuses it),
why a server failed to start, the counts the end of the sweep reports."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple


def say(msg: str) -> None:
    print(f"llmlaunch sweep: {msg}", file=sys.stderr, flush=True)


@dataclass
class SweepInfo:
    """What on_multirun_start learnt from the command line."""

    sweep_dir: Path
    overrides: List[str]
    axes: List[str]
    total: int
    dry_run: bool = False
    existed: Optional[Path] = None  # the deepest part of sweep_dir that existed before the sweep (dry-run cleanup)
    multirun_yaml: Optional[bytes] = None  # its multirun.yaml before Hydra rewrote it (dry run puts it back)

    def to_json(self) -> str:
        return (
            json.dumps(
                {
                    "format": "llmlaunch-sweep/1",
                    "overrides": self.overrides,
                    "axes": self.axes,
                    "points": self.total,
                    "argv": sys.argv,
                },
                indent=1,
            )
            + "\n"
        )


@dataclass
class Server:
    """A server this sweep launched: its key, the backend that launched it, the endpoint it serves."""

    key: str  # server_key of the points it serves
    backend: Any  # launcher.schedulers.base.Scheduler: the registry entry that launched it
    spec: Any  # the LaunchSpec of its launch
    first_point: str = ""  # the point it was launched for
    endpoint: Any = None  # launcher.schedulers.base.Endpoint, once it serves
    metrics_url: str = ""  # where the bench reads the first-token split (first_token_metrics_url), if any
    prefill_metrics_url: str = ""  # those of them that are prefill replicas' (disagg; prefill_metrics_url)

    @property
    def kind(self) -> str:
        return self.backend.name

    @property
    def url(self) -> str:
        return self.endpoint.url if self.endpoint else ""

    @property
    def job_id(self) -> str:
        return self.endpoint.job_id if self.endpoint else ""

    def describe(self) -> str:
        s = self.spec
        return f"{self.kind} server {self.key} (engine={s.engine.name} tp={s.tp} pp={s.pp} nodes={s.nodes} replicas={s.replicas})"

    def alive(self) -> bool:
        return self.endpoint is not None and self.backend.alive(self.endpoint)

    def stop(self) -> None:
        if self.endpoint is not None:
            self.backend.stop(self.endpoint)


@dataclass
class State:
    """What lives across the points of one sequential sweep (Hydra's basic launcher: one process)."""

    info: Optional[SweepInfo] = None
    server: Optional[Server] = None
    failed_servers: Dict[str, str] = field(default_factory=dict)  # server key -> why it did not start
    counts: Dict[str, int] = field(default_factory=dict)  # skipped / measured / failed / launches
    dry_key: Optional[str] = None  # dry run: the server a real run would have running now
    dry_first: str = ""  # dry run: the point that would have launched it
    exit_hooked: bool = False


STATE = State()


def count(what: str) -> None:
    STATE.counts[what] = STATE.counts.get(what, 0) + 1


def sweep_info(sweep_dir: Path) -> Tuple[Optional[List[str]], int]:
    """(axes, number of points) of the sweep this job belongs to: from on_multirun_start in this
    process, else from <sweep_dir>/sweep.json (submitit jobs), else unknown (None, 0)."""
    if STATE.info is not None and STATE.info.sweep_dir == sweep_dir:
        return STATE.info.axes, STATE.info.total
    try:
        doc = json.loads((sweep_dir / "sweep.json").read_text())
        return list(doc["axes"]), int(doc.get("points", 0))
    except (OSError, ValueError, KeyError):
        return None, 0


def read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tokenizer_for(spec) -> str:
    """The model's tokenizer folder when it is readable here (exact token counts), else '' (estimates)."""
    from launcher.engines.registry import ENGINES

    for p in ENGINES[spec.engine.name].tokenizer_folders(spec):
        if p and any((Path(p) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            return str(p)
    return ""


def in_allocation() -> bool:
    """True inside a job hydra-submitit-launcher submitted (submitit's job script exports
    SUBMITIT_EXECUTOR=slurm): the point is its own allocation. A sweep started inside salloc is not."""
    return os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and bool(os.environ.get("SLURM_JOB_ID"))


def hook_exit() -> None:
    """Stop the running server however this process ends (Ctrl-C, an exception, SIGTERM)."""
    if STATE.exit_hooked:
        return
    import atexit
    import signal

    atexit.register(stop_server)
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))
    STATE.exit_hooked = True


def stop_server() -> None:
    server, STATE.server = STATE.server, None
    if server is not None:
        say(f"stopping {server.describe()}")
        try:
            server.stop()
        except Exception as e:  # never let teardown hide the sweep's own outcome
            say(f"could not stop {server.describe()}: {e}")
