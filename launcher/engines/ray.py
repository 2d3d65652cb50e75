"""A Ray cluster for one model copy that spans nodes (vLLM, and LMDeploy's PyTorch backend).

vLLM (`distributed_executor_backend="ray"`) and LMDeploy's PyTorch engine
(`PytorchEngineConfig(distributed_executor_backend="ray")`) run a model copy over
several nodes by placing their GPU workers on a Ray cluster that already exists and
that the engine joins with `ray.init()` (vLLM docs "Distributed inference and serving",
examples/online_serving/multi-node-serving.sh; LMDeploy docs/en/advance/pytorch_multinodes.md).
llmlaunch builds that cluster per model copy:

* the copy's leader rank runs tritonserver; its python model calls `RayHead.start()`
  (`ray start --head --port=<_LLMLAUNCH_DIST_PORT> --block` as a child process group),
  waits until every node of the copy has joined, exports RAY_ADDRESS so the engine's
  `ray.init()` joins this cluster, builds the engine, and stops the head in `finalize`;
* every other rank of the copy runs, instead of tritonserver, the command from
  `worker_command()`: `python -m launcher.engines.ray worker --address <leader>:<port>`,
  which waits until the head's port answers and then becomes
  `ray start --address=<leader>:<port> --block` (so SIGTERM from the rank launcher stops it).

The `ray` executable is looked up on PATH (the rank's environment puts the job's Python
environment first). Nothing here imports ray at module load; the argv builders are pure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from launcher.engines.base import copy_nodes


def head_argv(port: int, node_ip: str, ray: str = "ray", extra: Sequence[str] = ()) -> List[str]:
    """`ray start` for the copy's head node; --block keeps it in the foreground so stopping it stops Ray."""
    argv = [ray, "start", "--head", f"--port={int(port)}", "--block", "--include-dashboard=false"]
    if node_ip:
        argv.append(f"--node-ip-address={node_ip}")
    return argv + list(extra)


def worker_argv(address: str, node_ip: str = "", ray: str = "ray", extra: Sequence[str] = ()) -> List[str]:
    """`ray start` that joins the head at `address` ("host:port") and blocks."""
    argv = [ray, "start", f"--address={address}", "--block"]
    if node_ip:
        argv.append(f"--node-ip-address={node_ip}")
    return argv + list(extra)


def worker_command(python: str, address: str, node_ip: str = "", timeout_s: float = 900.0) -> List[str]:
    """What a non-leader rank of a Ray-spanning copy runs instead of tritonserver."""
    argv = [python, "-m", "launcher.engines.ray", "worker", f"--address={address}", f"--timeout={int(timeout_s)}"]
    if node_ip:
        argv.append(f"--node-ip-address={node_ip}")
    return argv


class RayHooks:
    """The per-rank hooks of an engine whose model copy over several nodes runs on a per-copy Ray cluster
    (Engine.rank_env / rank_command): `across(engine config)` says whether that engine config puts such a copy on
    Ray, `env` is more environment for the copy's ranks (the engine's own switches). `ctx` is the rank's
    launcher.rank.rendezvous.RankContext. For the per_group engines a copy that spans nodes has one rank per node;
    group_rank is its node index inside the copy, and group_rank 0 (the copy's leader) is the one that serves."""

    def __init__(self, across: Callable[[object], bool], env: Sequence[Tuple[str, str]] = ()):
        self.across, self.env = across, tuple(env)

    def uses_ray(self, spec) -> bool:
        """Does a model copy of this job run its workers on a per-copy Ray cluster?"""
        return copy_nodes(spec) > 1 and self.across(spec.engine)

    def rank_env(self, spec, ctx) -> Dict[str, str]:
        """The address Ray and vLLM advertise for this node."""
        if not self.uses_ray(spec):
            return {}
        env = {"RAY_USAGE_STATS_ENABLED": "0"}
        if _own_addr(ctx):
            env["VLLM_HOST_IP"] = _own_addr(ctx)  # vLLM's workers bind/advertise this address (multi-NIC nodes)
        env.update(self.env)
        return env

    def rank_command(self, spec, ctx) -> Optional[List[str]]:
        """The copy's leader runs tritonserver (its model starts the Ray head); the other nodes join the
        head with `ray start --block` instead of running a tritonserver."""
        if not self.uses_ray(spec) or ctx.rank.group_rank == 0:
            return None
        return worker_command(
            spec.python, f"{ctx.leader_addr}:{ctx.dist_port}", _own_addr(ctx), float(spec.serve.ready_timeout_s)
        )


def _own_addr(ctx) -> str:
    return ctx.hosts[ctx.rank.rank] if ctx.hosts else ""


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_port(
    host: str, port: int, timeout_s: float, interval_s: float = 1.0, sleep: Callable[[float], None] = time.sleep
) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if port_open(host, port):
            return True
        if time.monotonic() >= deadline:
            return False
        sleep(interval_s)


class RayHead:
    """The head of one copy's Ray cluster, owned by the leader's python model."""

    def __init__(
        self,
        port: int,
        node_ip: str,
        expected_nodes: int,
        timeout_s: float = 900.0,
        ray: str = "",
        log: Callable[[str], None] = print,
    ):
        self.port, self.node_ip, self.expected_nodes, self.timeout_s = (
            int(port),
            node_ip,
            int(expected_nodes),
            timeout_s,
        )
        self.ray = ray or shutil.which("ray") or "ray"
        self.log = log
        self.proc: Optional[subprocess.Popen] = None

    @property
    def address(self) -> str:
        return f"{self.node_ip or '127.0.0.1'}:{self.port}"

    def start(self) -> str:
        """Start the head, wait for the copy's other nodes, export RAY_ADDRESS; returns the address."""
        argv = head_argv(self.port, self.node_ip, self.ray)
        self.log(f"starting the Ray head for this model copy: {' '.join(argv)}")
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        self.proc = subprocess.Popen(argv, env=env, start_new_session=True)
        if not wait_for_port(self.node_ip or "127.0.0.1", self.port, self.timeout_s):
            self.stop()
            raise RuntimeError(
                f"the Ray head did not open port {self.port} within {self.timeout_s:.0f}s (is `ray` installed in the job's environment?)"
            )
        self.wait_for_nodes()
        os.environ["RAY_ADDRESS"] = self.address
        return self.address

    def wait_for_nodes(self) -> None:
        import ray  # only on the leader of a multi-node copy, where the engine needs it anyway

        ray.init(address=self.address, logging_level="warning")
        try:
            deadline = time.monotonic() + self.timeout_s
            while True:
                alive = sum(1 for n in ray.nodes() if n.get("Alive"))
                if alive >= self.expected_nodes:
                    self.log(f"Ray cluster ready: {alive}/{self.expected_nodes} nodes")
                    return
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(f"the Ray head exited with status {self.proc.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"only {alive} of {self.expected_nodes} nodes joined the Ray cluster at {self.address} within {self.timeout_s:.0f}s; check the other ranks' logs"
                    )
                time.sleep(2.0)
        finally:
            ray.shutdown()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout_s)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start_copy_head(engine: str, nnodes: int, log: Callable[[str], None]) -> "RayHead":
    """A copy leader's model: the Ray head of its copy over `nnodes` nodes, started on the dist port and leader address
    its rank handed the server (launcher.handoff.rank_env.RankEnv), once the other nodes have joined."""
    from launcher.handoff.rank_env import RankEnv

    env = RankEnv.from_environ(os.environ)
    if not env.dist_port:
        raise RuntimeError(
            f"{engine}: {RankEnv.var('dist_port')} is not set; multi-node copies are started by `python -m launcher.rank`"
        )
    head = RayHead(env.dist_port, env.leader_addr or "", nnodes, log=log)
    head.start()
    return head


def _worker_main(args) -> int:
    host, _, port = args.address.rpartition(":")
    print(f"[llmlaunch ray worker] waiting for the Ray head at {args.address}", flush=True)
    if not wait_for_port(host, int(port), args.timeout):
        print(
            f"[llmlaunch ray worker] the Ray head at {args.address} did not answer within {args.timeout:.0f}s",
            file=sys.stderr,
            flush=True,
        )
        return 1
    argv = worker_argv(args.address, args.node_ip_address, args.ray)
    print(f"[llmlaunch ray worker] {' '.join(argv)}", flush=True)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.execvp(argv[0], argv)
    return 127  # not reached


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.engines.ray")
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="join a model copy's Ray cluster once its head answers")
    w.add_argument("--address", required=True, help="head host:port")
    w.add_argument("--node-ip-address", default="", help="this node's address as the others reach it")
    w.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the head")
    w.add_argument("--ray", default="ray", help="the ray executable")
    args = parser.parse_args(argv)
    return _worker_main(args)


if __name__ == "__main__":
    sys.exit(main())
