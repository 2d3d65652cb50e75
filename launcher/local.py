"""`cluster=local`: serve on this machine, in the foreground, until Ctrl-C or SIGTERM.

One rank: a tritonserver child of this process. Several ranks (tp/replicas on
one machine): one `python -m launcher.rank` process per rank, with the local
rank table's variables, rendezvous through files in the run dir — the same
per-rank path Slurm tasks take. Either way: wait until rank 0 answers a real
request, print the endpoint, serve, and on a signal drain and stop everything
(exit 0). A rank dying unasked stops the others and exits non-zero with its log.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from launcher.spec import LaunchSpec


def say(msg: str) -> None:
    print(f"llmlaunch: {msg}", file=sys.stderr, flush=True)


def endpoint_banner(url: str, model: str) -> str:
    return (
        f"endpoint: {url}\n"
        f"model: {model}\n"
        f"try: {shlex.quote(sys.executable)} -m launcher.client --url {url} --prompt \"The capital of France is\" --max-tokens 32\n"
        f"bench: llmlaunch-bench --url {url} --model {model} --dataset synthetic --num-prompts 64 --concurrency 8\n"
    )


class _Stop:
    """Records the first SIGINT/SIGTERM; the main loop does the stopping."""

    def __init__(self):
        self.signum = None
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, self)

    def __call__(self, signum, _frame):
        if self.signum is None:
            say(f"{signal.Signals(signum).name}: draining in-flight requests and stopping")
        self.signum = signum


def serve_foreground(spec: LaunchSpec, run_dir: str) -> int:
    from launcher.jobdir import resolve_model, write_run_dir
    from launcher.triton import check_ports, resolve_tritonserver

    ports = {k: int(spec.serve[k]) for k in ("grpc_port", "http_port", "metrics_port")}
    check_ports(spec.host, ports)  # before any work: a taken port is a config problem
    install = resolve_tritonserver(spec.cluster.get("tritonserver", ""))
    say(f"tritonserver: {install.binary} ({install.source})")
    spec = resolve_model(spec, say)
    run = write_run_dir(spec, run_dir)
    say(f"run dir: {run}")
    stop = _Stop()
    if spec.world_size == 1:
        return _serve_one(spec, run, install, stop)
    return _serve_ranks(spec, run, stop)


def _serve_one(spec: LaunchSpec, run: Path, install, stop: _Stop) -> int:
    from launcher.render import shm_prefix, tritonserver_argv
    from launcher.triton import TritonServer, server_env

    job_id = str(os.getpid())
    rank = spec.ranks[0]
    argv = tritonserver_argv(spec, rank, tritonserver=install.binary, repository=str(run / "model_repository"), job_id=job_id, backend_directory=install.backend_directory)
    env = server_env(install, {**spec.cluster.get("env", {}), "LLMLAUNCH_RANK": "0", "LLMLAUNCH_WORLD_SIZE": "1", "LLMLAUNCH_RUN_DIR": str(run)})
    host = spec.host if spec.host not in ("0.0.0.0", "") else "127.0.0.1"
    url = f"{host}:{spec.serve['grpc_port']}"
    log = run / "logs" / "rank0.log"
    say(f"starting: {shlex.join(argv)}")
    say(f"log: {log}")
    server = TritonServer(
        argv,
        env=env,
        log_path=log,
        grpc_url=url,
        model=spec.model_name,
        ready_timeout_s=float(spec.serve["ready_timeout_s"]),
        drain_timeout_s=float(spec.serve["drain_timeout_s"]),
        shm_prefix=shm_prefix(job_id, 0),
        progress=say,
    ).start()
    try:
        waited = _wait_or_stop(server, stop)
        if waited is None:
            server.stop()
            return 0
        say(f"READY in {waited:.1f}s")
        ports = {k: spec.serve[k] for k in ("grpc_port", "http_port", "metrics_port")}  # as rank 0 writes them
        (run / "endpoint.json").write_text(json.dumps({"url": f"grpc://{url}", "model": spec.model_name, **ports, "job_id": job_id}))
        sys.stdout.write(endpoint_banner(f"grpc://{url}", spec.model_name))
        sys.stdout.flush()
        while stop.signum is None:
            if server.returncode() is not None:
                from launcher.triton import log_excerpt

                say(f"tritonserver exited unasked with status {server.returncode()}; {log}:\n{log_excerpt(log)}")
                server.stop()
                return 1
            time.sleep(0.2)
        code = server.stop()
        say(f"stopped (tritonserver status {code})")
        return 0
    except BaseException:
        server.stop()
        raise


def _wait_or_stop(server, stop: _Stop):
    """wait_ready, but give up early (None) when the user presses Ctrl-C while loading."""
    import threading

    result: Dict[str, object] = {}

    def target():
        try:
            result["waited"] = server.wait_ready()
        except BaseException as e:  # reported below, in the main thread
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    while t.is_alive():
        if stop.signum is not None:
            return None
        t.join(0.1)
    if "error" in result:
        from launcher.errors import LaunchError

        server.stop()
        raise LaunchError(("tritonserver", str(result["error"]), "read the log above; fix the model or raise serve.ready_timeout_s"))
    return result["waited"]


def _serve_ranks(spec: LaunchSpec, run: Path, stop: _Stop) -> int:
    """Several ranks on this machine, each through `python -m launcher.rank` like a Slurm task.

    A replica lost while serving (replicas > 1) is reported and the rest go on serving, as on Slurm."""
    from launcher.rank import lost_replicas
    from launcher.slurm import describe_lost
    from launcher.triton import log_excerpt

    reported_lost: set = set()

    job_id = str(os.getpid())
    procs: List[subprocess.Popen] = []
    base_env = dict(os.environ)
    if not base_env.get("CUDA_VISIBLE_DEVICES") and any(r.gpus for r in spec.ranks):
        # Like a Slurm task given the node's GPUs: each rank then takes its own slice
        # (rank.rank_environment); without this every rank would land on GPU 0.
        base_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(int(spec.cluster.get("gpus_per_node", 0))))
    for r in spec.ranks:
        env = dict(base_env)
        env.update(
            {
                "LLMLAUNCH_RANK": str(r.rank),
                "LLMLAUNCH_WORLD_SIZE": str(spec.world_size),
                "LLMLAUNCH_LOCAL_RANK": str(r.local_rank),
                "LLMLAUNCH_NODE_RANK": "0",
                "LLMLAUNCH_NNODES": "1",
                "LLMLAUNCH_JOB_ID": job_id,
            }
        )
        log = run / "logs" / f"rank{r.rank}.log"
        with open(log, "ab") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "launcher.rank", str(run)], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
    say(f"started {len(procs)} ranks; logs in {run / 'logs'}")
    endpoint = run / "endpoint.json"
    t0 = time.monotonic()
    shown = False
    last = 0.0
    code = 0
    while True:
        if stop.signum is not None:
            break
        dead = [(i, p.returncode) for i, p in enumerate(procs) if p.poll() is not None]
        lost = set(lost_replicas(run, spec.replicas))
        for r in lost - reported_lost:  # the ranks of a lost replica record it and exit 0 (rank.decide_exit)
            reported_lost.add(r)
            say(describe_lost(json.loads((run / f"replica_lost{r}.json").read_text())))
        fatal = [(i, rc) for i, rc in dead if rc != 0 or spec.ranks[i].replica not in lost]
        if fatal:
            i, rc = fatal[0]
            say(f"rank {i} exited with status {rc}; stopping the others. Its log:\n{log_excerpt(run / 'logs' / f'rank{i}.log')}")
            code = 1
            break
        if not shown and endpoint.exists():
            ep = json.loads(endpoint.read_text())
            say(f"READY in {time.monotonic() - t0:.1f}s ({len(procs)} ranks)")
            sys.stdout.write(endpoint_banner(ep["url"], ep["model"]))
            sys.stdout.flush()
            if ep.get("metrics_url"):  # frontend: replicas > 1 serve through rank 0's front end
                say(f"front end over {len(ep.get('replicas', []))} replicas; metrics {ep['metrics_url']}")
            shown = True
        elif not shown and time.monotonic() - last > 2:
            last = time.monotonic()
            ready = len(list(run.glob("ready_rank*.json")))
            say(f"waiting for {len(procs)} ranks: {ready} leaders ready ({time.monotonic() - t0:.0f}s)")
        if not shown and time.monotonic() - t0 > float(spec.serve["ready_timeout_s"]):
            say("not ready before serve.ready_timeout_s; stopping")
            code = 1
            break
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + float(spec.serve["drain_timeout_s"]) + 20
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    say("stopped")
    return code
