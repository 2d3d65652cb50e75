"""The interpreter and environment an engine's own process runs with when a Triton python model starts it.

An engine started from inside the stub (the hf engine process, vLLM's engine core) runs the launcher's interpreter
with the launcher's library path, not the stub's: the stub's environment is made for the stub (the nvidia-pytriton
stub needs numpy<2, docs/engines.md "GPU machines"), and its LD_LIBRARY_PATH puts libpython's directory first
(launcher.triton_install.ENGINE_LD_LIBRARY_PATH says what that did to the hf engine's attention).
"""

from __future__ import annotations

import os
import sys

from launcher.handoff.rank_env import RankEnv


def engine_python() -> str:
    """An interpreter of the launcher's environment (inside the Triton stub, sys.executable is the stub binary).

    RankEnv.python (set by launcher.triton_install.server_env to the launcher's own interpreter) comes first:
    an embedded stub does not know the virtual environment it was started from, and its sys.prefix
    may be the system Python's, which lacks torch."""
    forced = RankEnv.from_environ(os.environ).python
    if forced and os.access(forced, os.X_OK):
        return forced
    exe = sys.executable or ""
    if os.path.basename(exe).startswith("python"):
        return exe
    for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", "python3", "python"):
        cand = os.path.join(sys.exec_prefix, "bin", name)
        if os.access(cand, os.X_OK):
            return cand
    raise RuntimeError(f"cannot find a python interpreter for the engine process under {sys.exec_prefix}/bin")


def engine_environ(environ=None) -> dict:
    """The environment of an engine process: `environ` (default: this process's) with LD_LIBRARY_PATH replaced by
    `_LLMLAUNCH_ENGINE_LD_LIBRARY_PATH` where that is set and not "inherit" ("" removes it)."""
    env = dict(os.environ if environ is None else environ)
    lib = RankEnv.from_environ(env).engine_ld_library_path  # see launcher.triton_install.ENGINE_LD_LIBRARY_PATH
    if lib is not None and lib != "inherit":
        if lib:
            env["LD_LIBRARY_PATH"] = lib
        else:
            env.pop("LD_LIBRARY_PATH", None)
    return env


def start_engine_process(module: str):
    """`python -m module FD` under the engine's interpreter and environment, FD the child's end of a socketpair;
    (the Popen, the parent's multiprocessing Connection).  The engine processes' handshakes run over that
    connection (launcher.hf.client, launcher.engines.vllm.core_process)."""
    import socket
    import subprocess
    from multiprocessing.connection import Connection

    parent, child = socket.socketpair()
    proc = subprocess.Popen(
        [engine_python(), "-m", module, str(child.fileno())],
        pass_fds=(child.fileno(),),
        env=engine_environ(),
        stdin=subprocess.DEVNULL,
    )
    child.close()
    return proc, Connection(parent.detach())
