"""Which tritonserver a rank runs, and the environment it runs in.

`resolve_tritonserver` prefers, in order: an explicit path (cluster profile), `tritonserver` on PATH,
`/opt/tritonserver/bin/tritonserver` (NGC containers), and the `nvidia-pytriton` wheel, which ships the binary and
the python backend but needs the stub for the running Python copied beside the backend and its libraries on
LD_LIBRARY_PATH. `server_env` is the environment every server gets (the python backend's stub must find this
interpreter's libpython and the checkout llmlaunch runs from).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

from launcher.errors import LaunchError
from launcher.handoff.rank_env import RankEnv
from launcher.paths import PACKAGE_ROOT

NGC_PATH = "/opt/tritonserver/bin/tritonserver"
WHEEL_SOURCE = "nvidia-pytriton wheel"


@dataclass(frozen=True)
class TritonInstall:
    binary: str  # the tritonserver executable
    backend_directory: str  # --backend-directory; "" = the binary's default
    env: Dict[str, str] = field(default_factory=dict)  # environment additions (LD_LIBRARY_PATH, PATH)
    source: str = ""  # where it came from, for messages


def _python_env(python: str = sys.executable) -> Dict[str, str]:
    """Make the python backend stub run the interpreter llmlaunch runs in.

    The stub links libpython3.X.so: the interpreter's own LIBDIR must come first, or a system
    libpython of another build is picked and compiled modules fail to import."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    bindir = str(Path(python).parent)
    env = {"PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    if libdir:
        env["LD_LIBRARY_PATH"] = libdir
    return env


def _wheel_install() -> Optional[TritonInstall]:
    try:
        import importlib.util

        spec = importlib.util.find_spec("pytriton")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    binary = root / "bin" / "tritonserver"
    if not binary.exists():
        return None
    backends = root / "backends"
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub_src = root / "python_backend_stubs" / ver / "triton_python_backend_stub"
    stub_dst = backends / "python" / "triton_python_backend_stub"
    if not stub_dst.exists():
        if not stub_src.exists():
            raise LaunchError(
                (
                    f"nvidia-pytriton at {root}",
                    f"ships no python backend stub for Python {ver}",
                    "run llmlaunch with Python 3.8-3.13, or install a tritonserver (cluster.tritonserver=/path)",
                )
            )
        try:
            shutil.copy2(stub_src, stub_dst)
        except OSError as e:
            raise LaunchError(
                (
                    str(stub_dst),
                    f"cannot install the python backend stub there ({e})",
                    f"copy {stub_src} to {stub_dst} once, with write access to the environment",
                )
            ) from None
    libs = root.parent.parent / "nvidia_pytriton.libs"
    env = _python_env()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (env.get("LD_LIBRARY_PATH", ""), str(libs)) if p)
    return TritonInstall(str(binary), str(backends), env, WHEEL_SOURCE)


def resolve_tritonserver(explicit: str = "") -> TritonInstall:
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise LaunchError(
                (
                    f"cluster.tritonserver={explicit!r}",
                    "not an executable file",
                    "point it at a tritonserver binary, or leave it empty to search",
                )
            )
        return TritonInstall(explicit, "", _python_env(), "cluster.tritonserver")
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(on_path, "", _python_env(), "PATH")
    if os.access(NGC_PATH, os.X_OK):
        return TritonInstall(NGC_PATH, "", _python_env(), NGC_PATH)
    wheel = _wheel_install()
    if wheel:
        return wheel
    raise LaunchError(
        (
            "tritonserver",
            "not found: looked at (1) cluster.tritonserver (empty), (2) `tritonserver` on PATH, (3) /opt/tritonserver/bin/tritonserver (NGC containers), (4) the nvidia-pytriton wheel",
            "pip install nvidia-pytriton==0.7.0 (ships tritonserver and the python backend), or set cluster.tritonserver=/path/to/tritonserver",
        )
    )


def server_env(install: TritonInstall, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    # the hf engine process runs this interpreter, so by default with this library path, not the stub's
    # (ENGINE_LD_LIBRARY_PATH says why)
    own_lib = (extra or {}).get("LD_LIBRARY_PATH", env.get("LD_LIBRARY_PATH", ""))
    for k, v in install.env.items():
        if k in ("LD_LIBRARY_PATH", "PYTHONPATH") and env.get(k):
            env[k] = v + os.pathsep + env[k]
        else:
            env[k] = v
    # model.py files import the llmlaunch package from this checkout.
    root = str(PACKAGE_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONIOENCODING", "UTF-8")
    # Processes a python model starts (the hf engine) run this interpreter, with its environment's packages.
    env.setdefault(RankEnv.var("python"), sys.executable)
    if extra:
        env.update(extra)
    env.setdefault(ENGINE_LD_LIBRARY_PATH, own_lib)  # a value the user set stays
    # The stub ignores PYTHONPATH: each model.py appends its entries (this root first) to sys.path itself.
    env.update(RankEnv(root=root).to_environ())  # the checkout the server's models import llmlaunch from
    stub_python = env.get(STUB_PYTHON_ENV, "")
    if stub_python:
        # The stub takes its environment from the first python3 on PATH (it ignores PYTHONPATH), so this
        # interpreter's bin dir goes first; the engine process keeps the launcher's interpreter (RankEnv.python).
        env["PATH"] = str(Path(stub_python).parent) + os.pathsep + env.get("PATH", "")
    if install.source == WHEEL_SOURCE:
        check_stub_numpy(stub_python)
    return env


# The python backend stub of nvidia-pytriton 0.7.0 (Triton 2.51) is compiled against numpy 1.x: under numpy 2
# it loads models but aborts on the first BYTES input ("unpack_from requires a buffer of at least 84215049
# bytes", seen on the GPU machine).  Current CUDA builds of torch come with numpy 2, so there the stub needs an
# environment of its own.  The stub runs the first `python3` on PATH's environment and ignores PYTHONPATH
# (checked: sys.path inside the stub), so the way to give it one is an interpreter: LLMLAUNCH_STUB_PYTHON.
STUB_PYTHON_ENV = "LLMLAUNCH_STUB_PYTHON"
# The library path the hf engine process runs with.  server_env sets it to the launcher's own LD_LIBRARY_PATH (the
# engine runs the launcher's interpreter, so that path is the one it is known to work with); a value set by the user
# stays, and "inherit" keeps the stub's (LD_LIBRARY_PATH with the server's additions first).  The choice decides
# which cuDNN the engine runs.  The server's additions put the
# directory of libpython first, and on the GPU host that directory (/usr/lib/x86_64-linux-gnu) also holds a system
# cuDNN: an engine on the inherited path loaded torch's libcudnn but the system's libcudnn_graph, a mix of two
# versions whose decode attention took 0.12-0.15 ms more GPU time a step (1.87 ms vs 1.72-1.75 at one stream on an
# H100: served 0.93 of in-process).  On the launcher's own path the engine loads torch's cuDNN whole, as in-process.
# (Its cost, a per-shape plan built on the host for every new attention shape of an eager step, is gone since eager
# steps keep off cuDNN's attention: HFModelRunner._init_attention_backends.)  An engine in the stub itself
# (engine_process=false) cannot get a path of its own; it loads torch's cuDNN by full path first instead
# (launcher.python_backend.torch_libs).
ENGINE_LD_LIBRARY_PATH = RankEnv.var("engine_ld_library_path")

_NUMPY_VERSION = "import importlib.metadata as m; print(m.version('numpy'))"


def stub_numpy_version(stub_python: str = "") -> Optional[str]:
    """The numpy the stub will import: that of `stub_python`'s environment, else of this one."""
    if not stub_python:
        try:
            from importlib.metadata import version

            return version("numpy")
        except Exception:
            return None
    try:
        out = subprocess.run([stub_python, "-I", "-c", _NUMPY_VERSION], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise LaunchError(
            (
                f"{STUB_PYTHON_ENV}={stub_python}",
                f"cannot run it ({e})",
                "point it at the python3 of a virtual environment that has numpy<2",
            )
        ) from None
    return out.stdout.strip() or None if out.returncode == 0 else None


STUB_ENV_FIX = (
    f"python3 -m venv ~/.cache/llmlaunch/stub-env && ~/.cache/llmlaunch/stub-env/bin/pip install 'numpy<2', "
    f"then export {STUB_PYTHON_ENV}=~/.cache/llmlaunch/stub-env/bin/python3 (only the stub runs there; "
    "the engine keeps this environment and its numpy)"
)


def check_stub_numpy(stub_python: str = "") -> None:
    found = stub_numpy_version(stub_python)
    where = f"{STUB_PYTHON_ENV}={stub_python}" if stub_python else f"numpy {found} in {sys.prefix}"
    if found is None:
        raise LaunchError((where, "the python backend stub needs numpy, and that environment has none", STUB_ENV_FIX))
    if int(found.split(".")[0]) >= 2:
        raise LaunchError(
            (
                where if stub_python else f"numpy {found}",
                f"the nvidia-pytriton tritonserver's stub is built against numpy 1.x and aborts on the first text request under numpy {found}",
                STUB_ENV_FIX,
            )
        )
