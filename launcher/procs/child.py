"""A supervised child service (the replicas' front end, the OpenAI API), both sides of it.

The parent's side, `ChildService`: the service's config (one JsonConfig dataclass, launcher/procs/config.py) written
to a file, the child started as `python -m <module> --config FILE --die-with-parent` in a session of its own, waited
for until a probe says it is ready, stopped with SIGTERM and then SIGKILL after its drain deadline.  The file is
always a file, one way for every caller: in the run directory where the parent has one (rank 0 and a local run:
<run>/frontend.json, <run>/openai.json, so what the child was told stays beside its logs and goes into
llmlaunch-logs' archive), else a private temporary file, removed when the child is stopped (tests, benchmarks).  A
file rather than the JSON on the command line: `ps` stays readable, and the file can be read after the fact and
given to `python -m <module> --config FILE` again to run the service alone.

The child's side: `child_config` reads that command line back into the same dataclass (a bad file ends the child
naming the field), and `die_with_parent` makes the child go when the process that started it dies."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Type, TypeVar, Union

from launcher.procs.config import ConfigError, JsonConfig
from launcher.procs.drain import DRAIN_SIGNAL, children_ignore_drain_signal
from launcher.procs.group import stop_group, term_with_parent

C = TypeVar("C", bound=JsonConfig)


class ChildService:
    """What a service's handle shares; subclasses give `module` (what `python -m` runs), `what` (for messages) and
    drain_s (SIGTERM's grace).  `cfg`: the service's config; `config_path`: where it is written (None: a temporary
    file)."""

    what = "service"  # what messages call it
    module = ""  # what `python -m` runs: its main reads the config with child_config

    def __init__(
        self,
        cfg: JsonConfig,
        env: Optional[Dict[str, str]] = None,
        config_path: Union[str, os.PathLike, None] = None,
    ):
        self.cfg = cfg
        self.env = env
        self.config_path = Path(config_path) if config_path is not None else None
        self.temporary = config_path is None  # the handle made the file, and removes it when the child stops
        self.proc = None

    def argv(self) -> List[str]:
        return [sys.executable, "-m", self.module, "--config", str(self.config_path), "--die-with-parent"]

    @property
    def drain_s(self) -> float:
        raise NotImplementedError

    def start(self):
        import subprocess

        if self.config_path is None:
            fd, name = tempfile.mkstemp(prefix=f"llmlaunch-{self.module.rpartition('.')[2]}-", suffix=".json")
            os.close(fd)
            self.config_path = Path(name)
        self.cfg.write(self.config_path)  # as it is now: a retry on fresh ports writes the ports it then serves on
        sys.stdout.flush()
        # Own session: a terminal's Ctrl-C reaches the parent, which decides how the service stops.
        with children_ignore_drain_signal():  # it installs its own handler: a notice to drain, not death
            self.proc = subprocess.Popen(self.argv(), env=self.env, start_new_session=True)
        return self

    def drain_notice(self) -> None:
        """Refuse new requests from now on, naming the reason (launcher/procs/drain.py); running ones go on."""
        if self.poll() is None:
            try:
                os.killpg(self.proc.pid, DRAIN_SIGNAL)
            except ProcessLookupError:
                pass

    def poll(self) -> Optional[int]:
        return None if self.proc is None else self.proc.poll()

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, where: str) -> float:
        """Seconds until `ready()` is true (it may raise OSError or a gRPC error meanwhile); raises if the child
        exits first or `timeout_s` passes."""
        t0 = time.monotonic()
        while True:
            if self.poll() is not None:
                raise RuntimeError(f"the {self.what} exited with status {self.poll()} before it was ready")
            try:
                if ready():
                    return time.monotonic() - t0
            except Exception:  # noqa: BLE001 - not answering yet
                pass
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"the {self.what} on {where} not ready after {timeout_s:.0f}s")
            time.sleep(0.1)

    def terminate(self) -> None:
        if self.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self) -> Optional[int]:
        """SIGTERM (the service drains), SIGKILL after the drain deadline; a temporary config file goes then."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            stop_group(self.proc, self.drain_s)
        if self.temporary and self.config_path is not None:
            self.config_path.unlink(missing_ok=True)
        return self.proc.returncode


def child_config(cls: Type[C], module: str, description: str, what: str, argv: Optional[List[str]] = None) -> C:
    """The child's side of ChildService: `python -m <module> --config FILE [--die-with-parent]` parsed, FILE read
    into `cls` (an unreadable file, an unknown key, a missing one or a value of the wrong type ends the process with
    status 2, naming it), and with --die-with-parent, `die_with_parent(what)` asked for."""
    p = argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=description,
        epilog=f"FILE holds one JSON object of {cls.__name__}'s fields ({cls.__module__}); a key left out takes its "
        f"default:\n{cls.fields_help()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, metavar="FILE", help=f"the {cls.__name__} to serve, as JSON")
    p.add_argument(
        "--die-with-parent",
        action="store_true",
        help="stop (SIGTERM) when the process that started this one dies; the launcher's handles pass it",
    )
    args = p.parse_args(argv)
    try:
        cfg = cls.read(args.config)
    except ConfigError as e:
        p.exit(2, f"{p.prog}: {e}\n")
    if args.die_with_parent:
        die_with_parent(what)
    return cfg


def die_with_parent(what: str) -> None:
    """In the child: SIGTERM when the parent dies (even by SIGKILL), so no service outlives the process that
    started it."""
    if term_with_parent is not None:
        term_with_parent()
    if os.getppid() == 1:
        raise SystemExit(f"{what}: the parent is already gone")
