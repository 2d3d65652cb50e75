"""Start a tritonserver, know when it really serves, stop it cleanly (launcher/triton_install.py finds it).

`TritonServer` is the one place a server process is started and stopped:
its own process group (and SIGTERM from the kernel if the process that started it dies: launcher/procs/group.py), readiness = live + ready + model ready + one real
one-token request answered, within a deadline, failing at once with the log's
tail if the process dies; stop = SIGTERM (Triton drains in-flight requests),
then SIGKILL after a deadline, then removal of the job's leftover shm regions.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from launcher.logtext import log_excerpt, log_tail
from launcher.ports import RECONNECT_SOON
from launcher.procs.drain import children_ignore_drain_signal
from launcher.procs.group import end_group, stop_group, term_with_parent
from launcher.stage import latest as latest_stage


class ServerDied(RuntimeError):
    pass


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
    server_id: str = "",
) -> float:
    """Block until `model` answers a real request. Returns seconds waited. `marks` gets the wall-clock times the
    server first answered live ("server_live"), its model ready ("model_ready") and the probe's one token
    ("first_token"): the time-to-READY breakdown (launcher/readiness.py). `server_id` (its `--id`): answers on `url`
    count only from the server that reports it, not from another one already listening there."""
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
                    client = grpcclient.InferenceServerClient(url, channel_args=RECONNECT_SOON)
                if not client.is_server_live():
                    stage = "starting"
                elif server_id and (other := client.get_server_metadata().name) != server_id:
                    # ours binds its port only once its models are loaded: until then it may be another's
                    stage = f"starting (another server answers on {url}: {other!r})"
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
        with children_ignore_drain_signal():  # Slurm's time-limit signal reaches the step's every process
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=term_with_parent,
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
            server_id=next((a.split("=", 1)[1] for a in self.argv if a.startswith("--id=")), ""),
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
