"""vLLM's engine core, started from a process of the launcher's interpreter instead of from the Triton stub.

The served vLLM model's first front end (launcher/engines/vllm/model.py) does not start the engine core itself: it
starts `python -m launcher.engines.vllm.core_process FD` with the launcher's interpreter and library path
(launcher.python_backend.engine_env), and that process starts the core for the model's N front ends with vLLM's own
`launch_core_engines` (launcher.engines.vllm.core.launch_core) and stays beside it to stop it. The front ends stay
in the stubs: `AsyncLLM` clients on the addresses this process hands back.

Why: a core started from the stub is a fork of the stub and runs the stub's environment, made for the stub (the
nvidia-pytriton stub needs numpy<2; its library path puts libpython's directory first), while the engine core is
where vLLM spends its CPU a step (scheduling, input preparation) and where its worker runs the GPU. On one H100 a
core started from the stub served 0.83-0.86 of the tokens/s of one started here, its part of a first token the
longer one (docs/performance/vllm.md measures the two layouts).

Protocol (pickled tuples over one socketpair, `multiprocessing.connection` framing, as launcher.hf.client):
  parent -> child: ("init", engine kwargs as model.json gives them (plain data), front-end count), later ("stop",)
  child -> parent: ("ready", the clients' addresses: launch_core's info) | ("error", message), then
                   ("exited", {process name: exit code}) if the core's processes end without being asked.
The child stops the core and exits when it is asked, when the parent's end closes (the stub died), or on SIGTERM.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

from launcher.python_backend.engine_env import engine_python, start_engine_process


class CoreProcess:
    """The parent side, in the first front end's stub: start the core process, read its addresses, watch it, stop it."""

    def __init__(self, kwargs: dict, count: int, timeout: float):
        """kwargs: AsyncEngineArgs' keyword arguments as plain data (config fields as mappings: core.vllm_kwargs
        builds vLLM's objects in the child); count: the front ends (clients) the core serves; timeout: seconds the
        core may take to load."""
        self.kwargs, self.count, self.timeout = kwargs, count, timeout
        self.proc: subprocess.Popen | None = None
        self.conn = None
        self._lock = threading.Lock()

    def start(self) -> dict:
        """Start the core process and wait until the engine core is up; the clients' addresses (launch_core's info).
        Raises RuntimeError with the child's error if the core does not start."""
        python = engine_python()
        self.proc, self.conn = start_engine_process("launcher.engines.vllm.core_process")
        self.conn.send(("init", self.kwargs, self.count))
        if not self.conn.poll(self.timeout):
            self.kill()
            raise RuntimeError(f"vLLM's engine core did not start within {self.timeout:.0f} s")
        try:
            kind, payload = self.conn.recv()
        except EOFError:
            code = self.proc.wait()
            raise RuntimeError(
                f"vLLM's engine core process ({python}) exited with status {code} while starting (its error is in the "
                "server log)"
            ) from None
        if kind != "ready":
            self.kill()
            # the interpreter named: vLLM must import there, not only in the stub's environment
            raise RuntimeError(f"vLLM's engine core failed to start under {python}: {payload}")
        return payload

    def wait(self) -> dict:
        """Block until the core ends; {process name: exit code} (the core process's own code where it said none)."""
        proc = self.proc
        try:
            kind, codes = self.conn.recv()
            if kind == "exited":
                return codes
        except (EOFError, OSError):
            pass
        return {"vLLM engine core process": proc.wait() if proc is not None else None}

    def shutdown(self, timeout: float = 60.0) -> None:
        """Ask the core process to stop the core, and wait for it (killed after `timeout`)."""
        with self._lock:
            proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            self.conn.send(("stop",))
        except (OSError, ValueError):
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self, grace: float = 10.0) -> None:
        """Stop the core process at once: SIGTERM first, which it answers by stopping the core (a SIGKILL would leave
        the core without the process that stops it), SIGKILL after `grace` seconds."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main(fd: int) -> int:
    """The child: start the core for the front ends the parent names, hand back their addresses, stop it when told."""
    from multiprocessing.connection import Connection, wait

    from launcher.engines.vllm import core as vllm_core

    # a stop of the server's process group reaches this process too: stop the core on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    conn = Connection(fd)
    _, kwargs, count = conn.recv()
    try:
        core, info = vllm_core.launch_core(*vllm_core.engine_config(vllm_core.vllm_kwargs(kwargs), count, -1), count)
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return 1
    try:
        conn.send(("ready", info))
        manager = core[0]
        sentinels = list(manager.sentinels()) if manager is not None else []
        ready = wait([conn, *sentinels])
        if conn in ready:  # ("stop",), or the parent's end closed
            return 0
        conn.send(("exited", manager.finished_procs()))
        return 1
    finally:
        vllm_core.stop_core(core)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
