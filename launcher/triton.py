"""Find a tritonserver, start it, know when it really serves, stop it cleanly.

`resolve_tritonserver` prefers, in order: an explicit path (cluster profile),
`tritonserver` on PATH, `/opt/tritonserver/bin/tritonserver` (NGC containers),
and the `nvidia-pytriton` wheel, which ships the binary and the python backend
but needs the stub for the running Python copied beside the backend and its
libraries on LD_LIBRARY_PATH.

`TritonServer` is the one place a server process is started and stopped:
its own process group, readiness = live + ready + model ready + one real
one-token request answered, within a deadline, failing at once with the log's
tail if the process dies; stop = SIGTERM (Triton drains in-flight requests),
then SIGKILL after a deadline, then removal of the job's leftover shm regions.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from launcher.errors import LaunchError
from launcher.paths import PACKAGE_ROOT
from launcher.stage import latest as latest_stage

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
    env.setdefault("_LLMLAUNCH_PYTHON", sys.executable)
    if extra:
        env.update(extra)
    env.setdefault(ENGINE_LD_LIBRARY_PATH, own_lib)
    # The stub ignores PYTHONPATH: each model.py appends its entries (this root first) to sys.path itself.
    env["_LLMLAUNCH_ROOT"] = root  # the checkout the server's models import llmlaunch from
    stub_python = env.get(STUB_PYTHON_ENV, "")
    if stub_python:
        # The stub takes its environment from the first python3 on PATH (it ignores PYTHONPATH), so this
        # interpreter's bin dir goes first; the engine process keeps the launcher's interpreter (_LLMLAUNCH_PYTHON).
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
ENGINE_LD_LIBRARY_PATH = "_LLMLAUNCH_ENGINE_LD_LIBRARY_PATH"

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


# ----------------------------------------------------------------------------- ports
def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host if host not in ("", "0.0.0.0") else "0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_ports(host: str, ports: Dict[str, int]) -> None:
    """Local runs fail clearly on a taken port: which port, which setting changes it."""
    problems = []
    for key, p in ports.items():
        if not port_free(host, p):
            problems.append(
                (
                    f"serve.{key}={p}",
                    f"port {p} on {host} is already in use",
                    f"stop what uses it, or pick another port: serve.{key}={free_port(host)}",
                )
            )
    if problems:
        raise LaunchError(problems)


def pick_ports(host: str, wanted: Dict[str, int], avoid=()) -> Dict[str, int]:
    """Ranks on shared nodes: keep the configured port when free, else take a free one (never crash-loop); never
    one of `avoid` (ports this rank keeps for something else: rank 0's front end) nor one port for two keys."""
    chosen: Dict[str, int] = {}
    avoid = set(avoid)
    bind = "0.0.0.0" if host in ("", "0.0.0.0") else host
    for key, p in wanted.items():
        while p <= 0 or p in avoid or p in chosen.values() or not port_free(host, p):
            p = free_port(bind)  # the configured port (if any) is taken: any free one outside `avoid`
        chosen[key] = p
    return chosen


def stop_group(proc: subprocess.Popen, grace_s: float) -> int:
    """SIGTERM a child started in its own process group, SIGKILL the group after `grace_s`; its status."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(timeout=grace_s if sig == signal.SIGTERM else None)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def end_group(proc: subprocess.Popen) -> None:
    """SIGKILL what is left of the process group that `proc` led, once `proc` has exited and been
    reaped (stray python-backend stubs), and nothing else.

    The group is named by the leader's pid. The kernel keeps that number allocated while any member
    of the group is left, so it cannot name a new process then. Once no member is left it is free,
    and after the pid counter wraps (32,768 on many machines, threads included: minutes on a busy
    node) a new process can get it and lead a group of its own under it, e.g. another rank's
    tritonserver, which starts in its own session. So: a live process holding the number means the
    group is gone and the number is someone else's; leave it alone. (Killing the group blindly in a
    `stop()` long after the server exited is how an unrelated server can be killed.)"""
    if proc.returncode is None:
        raise ValueError("end_group is for a leader that has exited (use stop_group)")
    if os.path.exists(f"/proc/{proc.pid}"):
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ----------------------------------------------------------------------------- readiness
class ServerDied(RuntimeError):
    pass


def _read_end(path: Path, size: int) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return None


def _last_lines(text: Optional[str], lines: int) -> str:
    return "(no log)" if text is None else "\n".join(text.splitlines()[-lines:])


def log_tail(path: Path, lines: int = 30) -> str:
    return _last_lines(_read_end(path, 16384), lines)


_GLOG_ERROR = re.compile(r"^E\d{4} [\d:.]+ +\d+ [^\]]+\] ?(.*)$")
# errors every CPU-only tritonserver logs at start (no CUDA driver): not why anything failed
_BENIGN = ("CudaDriverHelper has not been initialized",)
_EXCEPTION = re.compile(r"\b\w+(?:Error|Exception): .*$")


def log_errors(path: Path, limit: int = 3, width: int = 700) -> list:
    """The last `limit` distinct error lines tritonserver logged (glog's E lines, in the log's last MiB: the ones
    nearest the failure, for a server that served a while), each cut at `width` characters, the python stub's escaped
    traceback lines unfolded.  A model that fails to load logs its reason there, and then tritonserver prints its
    model and settings tables and shuts down: the last lines alone do not say why (a stub's ModuleNotFoundError, an
    engine that refused its parameters)."""
    return _errors_in(_read_end(path, 1 << 20), limit, width)


def _errors_in(text: Optional[str], limit: int = 3, width: int = 700) -> list:
    found: dict = {}  # a message's exception (else its first line) -> the message: Triton logs one failure as the
    # instance's and again as the model's, with different prefixes; the first wording is kept, the latest place
    for line in (text or "").splitlines():
        m = _GLOG_ERROR.match(line)
        if not m:
            continue
        msg = m.group(1).strip().strip('"').replace('\\"', '"')
        if msg.startswith(_BENIGN):
            continue
        first = msg.split("\\n")[0]
        exc = _EXCEPTION.search(first)
        key = exc.group(0) if exc else first
        found[key] = found.pop(key, msg)
    out = []
    for msg in list(found.values())[-limit:]:
        msg = msg if len(msg) <= width else msg[:width] + " ..."
        out.append("\n    ".join(part for part in msg.split("\\n") if part.strip()))
    return out


def log_excerpt(path: Path, lines: int = 30) -> str:
    """What to show of a server log when the server failed: its error lines (log_errors), then its last lines."""
    text = _read_end(path, 1 << 20)  # read once for both
    errors = _errors_in(text)
    head = "errors:\n" + "\n".join(f"  {e}" for e in errors) + "\nlast lines:\n" if errors else ""
    return head + _last_lines(text, lines)


def probe_request(url: str, model: str, timeout_s: float = 60.0) -> str:
    """One real one-token streaming request; returns the text. Raises on error or timeout."""
    import queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    results: "queue.Queue" = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"Hello"]], dtype=object))
        mt = grpcclient.InferInput("max_tokens", [1, 1], "INT32")
        mt.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        st = grpcclient.InferInput("stream", [1, 1], "BOOL")
        st.set_data_from_numpy(np.array([[False]], dtype=bool))
        client.start_stream(
            callback=lambda result=None, error=None: results.put((result, error)), stream_timeout=timeout_s
        )
        client.async_stream_infer(model, [text, mt, st], enable_empty_final_response=True)
        out = ""
        deadline = time.monotonic() + timeout_s
        while True:
            result, error = results.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                raise RuntimeError(f"probe request failed: {error}")
            resp = result.get_response()
            arr = result.as_numpy("text_output")
            if arr is not None:
                out += b"".join(x if isinstance(x, bytes) else str(x).encode() for x in arr.reshape(-1)).decode(
                    errors="replace"
                )
            if resp.parameters.get("triton_final_response") and resp.parameters["triton_final_response"].bool_param:
                return out
    finally:
        try:
            client.stop_stream()
        finally:
            client.close()


def wait_ready(
    proc: subprocess.Popen,
    url: str,
    model: str,
    log_path: Path,
    deadline_s: float,
    progress: Optional[Callable[[str], None]] = None,
    probe: bool = True,
    what: str = "tritonserver",
    marks: Optional[Dict[str, float]] = None,
) -> float:
    """Block until `model` answers a real request. Returns seconds waited. `marks` gets the wall-clock times the
    server first answered live ("server_live"), its model ready ("model_ready") and the probe's one token
    ("first_token"): the time-to-READY breakdown (launcher/readiness.py)."""
    marks = {} if marks is None else marks
    import tritonclient.grpc as grpcclient

    t0 = time.monotonic()
    last_note = 0.0
    client = None
    stage = "starting"
    try:
        while True:
            elapsed = time.monotonic() - t0
            if proc.poll() is not None:
                raise ServerDied(
                    f"{what} exited with status {proc.returncode} while {stage} ({elapsed:.1f}s); {log_path}:\n{log_excerpt(log_path)}"
                )
            if elapsed > deadline_s:
                raise TimeoutError(
                    f"{what} not ready after {deadline_s:.0f}s (stage: {stage}); raise serve.ready_timeout_s if loading is slow. {log_path}:\n{log_excerpt(log_path, 15)}"
                )
            try:
                if client is None:
                    client = grpcclient.InferenceServerClient(url)
                if not client.is_server_live():
                    stage = "starting"
                elif not client.is_model_ready(model):
                    marks.setdefault("server_live", time.time())
                    stage = f"loading model {model}"
                else:
                    marks.setdefault("server_live", time.time())
                    marks.setdefault("model_ready", time.time())
                    stage = "answering a first request"
                    if probe:
                        probe_request(url, model, timeout_s=max(5.0, deadline_s - elapsed))
                    marks["first_token"] = time.time()
                    return time.monotonic() - t0
            except Exception as e:  # not up yet (connection refused) or model error
                if stage == "answering a first request":
                    raise ServerDied(
                        f"{what} is up but {model} failed its first request: {e}\nlast lines of {log_path}:\n{log_tail(log_path, 15)}"
                    ) from None
            if progress and elapsed - last_note >= 2.0:
                last_note = elapsed
                inside = latest_stage(log_tail(log_path, 400))  # what the model says it is doing
                progress(f"waiting for {what}: {stage}{f' ({inside})' if inside else ''} ({elapsed:.0f}s)")
            time.sleep(0.1)
    finally:
        if client is not None:
            client.close()


# ----------------------------------------------------------------------------- the server process
class TritonServer:
    """A tritonserver child process: `with TritonServer(argv, ...) as s: ...`.

    `argv` is what `launcher.render.tritonserver_argv` returned; `shm_prefix`
    names the python backend's shm regions so leftovers can be removed.
    """

    def __init__(
        self,
        argv: List[str],
        *,
        env: Dict[str, str],
        log_path: Path,
        grpc_url: str,
        model: str,
        ready_timeout_s: float = 600.0,
        drain_timeout_s: float = 30.0,
        shm_prefix: str = "",
        probe: bool = True,
        progress: Optional[Callable[[str], None]] = None,
        inherit_output: bool = False,
    ):
        self.inherit_output = inherit_output  # True: the server writes to our stdout (one log per rank)
        self.argv = list(argv)
        self.env = env
        self.log_path = Path(log_path)
        self.grpc_url = grpc_url
        self.model = model
        self.ready_timeout_s = ready_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self.shm_prefix = shm_prefix
        self.probe = probe
        self.progress = progress
        self.proc: Optional[subprocess.Popen] = None
        self.ready_s: Optional[float] = None
        self.marks: Dict[str, float] = {}  # wall-clock times of its start: "started", then wait_ready's

    def start(self) -> "TritonServer":
        argv = list(self.argv)
        # tritonserver itself, or behind a launcher that runs the rest of the line (trtllm-llmapi-launch)
        if any(Path(a).name == "tritonserver" for a in argv[:2]):
            argv.append(f"--exit-timeout-secs={int(self.drain_timeout_s)}")
        if self.inherit_output:
            sys.stdout.flush()
            out = None
        else:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")
        # Own process group: Ctrl-C in the terminal reaches us, and we decide how the server stops.
        self.marks = {"started": time.time()}
        from launcher.rank.drain import children_ignore_drain_signal

        with children_ignore_drain_signal():  # Slurm's time-limit signal reaches the step's every process
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        if out is not None:
            out.close()
        return self

    def terminate(self) -> None:
        """Ask the server to drain and exit (SIGTERM); `wait`/`stop` finish the job."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        """Block until the server exits (signals are still handled); returns its status."""
        assert self.proc is not None
        while True:
            try:
                return self.proc.wait()
            except InterruptedError:
                continue

    def returncode(self) -> Optional[int]:
        return None if self.proc is None else self.proc.poll()

    def wait_ready(self) -> float:
        assert self.proc is not None
        self.ready_s = wait_ready(
            self.proc,
            self.grpc_url,
            self.model,
            self.log_path,
            self.ready_timeout_s,
            self.progress,
            self.probe,
            marks=self.marks,
        )
        return self.ready_s

    def stop(self, grace_s: Optional[float] = None) -> Optional[int]:
        """SIGTERM (Triton stops taking requests and drains), SIGKILL after `grace_s` (default: the drain
        deadline); then stray stubs of its group ended and the job's shm regions removed."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            stop_group(self.proc, self.drain_timeout_s + 15 if grace_s is None else grace_s)
        end_group(self.proc)  # the server is gone; its stubs may not be
        remove_shm(self.shm_prefix)
        return self.proc.returncode

    def __enter__(self) -> "TritonServer":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def remove_shm(prefix: str) -> List[str]:
    """Remove python-backend shm regions left by a killed server (only this prefix: ranks share /dev/shm)."""
    if not prefix:
        return []
    removed = []
    for p in glob.glob(f"/dev/shm/{glob.escape(prefix)}*"):
        try:
            os.unlink(p)
            removed.append(p)
        except OSError:
            pass
    return removed
