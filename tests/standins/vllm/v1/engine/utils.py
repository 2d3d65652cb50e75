"""Stand-in: vllm.v1.engine.utils.get_engine_zmq_addresses / launch_core_engines (what vLLM's API servers use
to start one engine core for several front-end clients).

The stand-in's engine core is a sleeping child process: `launch_core_engines` starts it, records the launch
(client count, addresses), and returns when it is "ready"; its manager's `sentinels()` / `shutdown()` are
vLLM's. The clients (AsyncLLM.from_vllm_config with client_addresses) generate on their own, as the stand-in
AsyncLLM does. LLMLAUNCH_STANDIN_CORE_FAIL=<message> makes the launch raise, as a core that fails to load.
"""

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Optional

import _standin


@dataclass
class EngineZmqAddresses:
    inputs: list
    outputs: list
    coordinator_input: Optional[str] = None
    coordinator_output: Optional[str] = None
    frontend_stats_publish_address: Optional[str] = None


def get_engine_zmq_addresses(vllm_config, num_api_servers=1, *, defer_api_server_ports=True):
    def ipc():
        return f"ipc://{tempfile.gettempdir()}/{uuid.uuid4()}"

    return EngineZmqAddresses(
        inputs=[ipc() for _ in range(num_api_servers)], outputs=[ipc() for _ in range(num_api_servers)]
    )


class CoreEngineProcManager:
    def __init__(self):
        self.proc = subprocess.Popen(["sleep", "1000000"])
        _standin.record("vllm", "core_started", core_pid=self.proc.pid)

    def sentinels(self):
        # a pidfd stands in for multiprocessing's sentinel: readable once the process exits
        return [os.pidfd_open(self.proc.pid)]

    def finished_procs(self):
        code = self.proc.poll()
        return {} if code is None else {"EngineCore_DP0": code}

    def shutdown(self, timeout=None):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
            _standin.record("vllm", "core_shutdown")


@contextlib.contextmanager
def launch_core_engines(vllm_config, executor_class, log_stats, addresses, num_api_servers=1):
    fail = os.environ.get("LLMLAUNCH_STANDIN_CORE_FAIL")
    if fail:
        raise RuntimeError(fail)
    manager = CoreEngineProcManager()
    time.sleep(float(os.environ.get("LLMLAUNCH_STANDIN_CORE_LOAD_S", "0")))  # the core loading its model
    yield manager, None, addresses, None
    _standin.record(
        "vllm",
        "launch_core",
        clients=num_api_servers,
        inputs=list(addresses.inputs),
        outputs=list(addresses.outputs),
        api_process_rank=vllm_config.api_process_rank,
        executable=sys.executable,  # the interpreter of the process that started the core
    )
