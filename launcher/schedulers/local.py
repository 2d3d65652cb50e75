"""`cluster=local`: serve on this machine, in the foreground, until Ctrl-C or SIGTERM.

One rank: a tritonserver child of this process. Several ranks (tp/replicas on
one machine): one `python -m launcher.rank` process per rank, with the local
rank table's variables, rendezvous through files in the run dir — the same
per-rank path Slurm tasks take. Either way: wait until rank 0 answers a real
request, print the endpoint, serve, and on a signal drain and stop everything
(exit 0). A rank dying unasked stops the others and exits non-zero with its log.

`LocalScheduler` is the registry entry (launcher/schedulers/base.py): `llmlaunch` serves in the foreground;
a sweep launches the same foreground server as a child process (`python -m launcher.schedulers.local RUN_DIR`).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional

from launcher.domains import PUBLIC_PORTS
from launcher.rank.topology import local_rank_env, private
from launcher.rundir import RunDir, Stopped, wait_for_endpoint
from launcher.schedulers.base import Endpoint, Request, Scheduler, bench_command, ready_report
from launcher.spec import LaunchSpec


def say(msg: str) -> None:
    print(f"llmlaunch: {msg}", file=sys.stderr, flush=True)


def endpoint_banner(url: str, model: str, openai_url: str = "", ready: str = "") -> str:
    openai = ""
    if openai_url:
        body = shlex.quote(f'{{"model": "{model}", "prompt": "The capital of France is", "max_tokens": 32}}')
        openai = (
            f"openai: {openai_url}\ntry: curl {openai_url}/completions -H 'Content-Type: application/json' -d {body}\n"
        )
    return (
        f"endpoint: {url}\n"
        f"model: {model}\n"
        f'try: {shlex.quote(sys.executable)} -m launcher.client --url {url} --prompt "The capital of France is" --max-tokens 32\n'
        f"{openai}" + (f"ready: {ready}\n" if ready else "") + f"bench: {bench_command(url, model)}\n"
    )


def _ready_line(record: dict, run: RunDir) -> str:
    """The banner's `ready:` line: the time-to-READY breakdown and where the run record is."""
    from launcher.readiness import format_breakdown

    return f"{format_breakdown(record['time_to_ready'])} (record {run.record_path})"


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


def serve_foreground(spec: LaunchSpec, run_dir: str, record: Optional[dict] = None) -> int:
    from launcher.models import resolve_model
    from launcher.ports import check_ports
    from launcher.triton_install import resolve_tritonserver

    ports = {k: int(getattr(spec.serve, k)) for k in PUBLIC_PORTS}
    check_ports(spec.host, ports)  # before any work: a taken port is a config problem
    install = resolve_tritonserver(spec.cluster.tritonserver)
    say(f"tritonserver: {install.binary} ({install.source})")
    spec = resolve_model(spec, say)
    run = RunDir(run_dir).write_spec(spec)
    if record is not None:
        run.write_record(record)
    say(f"run dir: {run}")
    stop = _Stop()
    if spec.world_size == 1:
        return _serve_one(spec, run, install, stop)
    return _serve_ranks(spec, run, stop)


def _serve_one(spec: LaunchSpec, run: RunDir, install, stop: _Stop) -> int:
    from launcher.render import shm_prefix, tritonserver_argv
    from launcher.triton import TritonServer
    from launcher.triton_install import server_env

    job_id = str(os.getpid())
    rank = spec.ranks[0]
    argv = tritonserver_argv(
        spec,
        rank,
        tritonserver=install.binary,
        repository=str(run.repository),
        job_id=job_id,
        backend_directory=install.backend_directory,
    )
    env = server_env(
        install, {**spec.cluster.env, private("RANK"): "0", private("WORLD_SIZE"): "1", "LLMLAUNCH_RUN_DIR": str(run)}
    )
    host = spec.host if spec.host not in ("0.0.0.0", "") else "127.0.0.1"
    url = f"{host}:{spec.serve.grpc_port}"
    log = run.local_rank_log(0)
    say(f"starting: {shlex.join(argv)}")
    say(f"log: {log}")
    server = TritonServer(
        argv,
        env=env,
        log_path=log,
        grpc_url=url,
        model=spec.model_name,
        ready_timeout_s=float(spec.serve.ready_timeout_s),
        drain_timeout_s=float(spec.serve.drain_timeout_s),
        shm_prefix=shm_prefix(job_id, 0),
        progress=say,
    ).start()
    api = None  # the OpenAI API (launcher/openai_api) once the server is ready
    try:
        waited = _wait_or_stop(server, stop)
        if waited is None:
            server.stop()
            return 0
        say(f"READY in {waited:.1f}s")
        from launcher.openai_api.process import start_api

        api = start_api(
            spec,
            url,
            spec.host,
            spec.serve.openai_port,
            say,
            float(spec.serve.ready_timeout_s),
            config_path=run.openai_config,
        )
        ports = {k: getattr(spec.serve, k) for k in PUBLIC_PORTS}  # as rank 0 writes them
        from launcher.record import gpu_inventory, write_startup

        # one rank, no rendezvous: its ranks are started once its server is
        marks = {**server.marks, "ranks_started": server.marks["started"], "serving": time.time()}
        gpus = gpu_inventory()
        write_startup(
            run,
            spec,
            log_path=log,
            marks=marks,
            server_url=url,
            nodes=[socket.gethostname()],
            gpus={socket.gethostname(): gpus} if gpus else {},
            server_pid=server.proc.pid,
        )
        run.write_endpoint(
            {
                "url": f"grpc://{url}",
                "model": spec.model_name,
                **ports,
                "openai_url": f"{api.cfg.url}/v1",
                "job_id": job_id,
            }
        )
        rec = ready_report(run, say, job_id=job_id)
        sys.stdout.write(endpoint_banner(f"grpc://{url}", spec.model_name, f"{api.cfg.url}/v1", _ready_line(rec, run)))
        sys.stdout.flush()
        while stop.signum is None:
            if server.returncode() is not None or api.poll() is not None:
                from launcher.logtext import log_excerpt

                what = "tritonserver" if server.returncode() is not None else "the OpenAI API server"
                code = server.returncode() if server.returncode() is not None else api.poll()
                say(f"{what} exited unasked with status {code}; {log}:\n{log_excerpt(log)}")
                api.stop()
                server.stop()
                return 1
            time.sleep(0.2)
        api.stop()  # first: its running requests finish while the server still serves them
        code = server.stop()
        say(f"stopped (tritonserver status {code})")
        return 0
    except BaseException:
        if api is not None:
            api.stop()
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
        raise LaunchError(
            ("tritonserver", str(result["error"]), "read the log above; fix the model or raise serve.ready_timeout_s")
        )
    return result["waited"]


def _serve_ranks(spec: LaunchSpec, run: RunDir, stop: _Stop) -> int:
    """Several ranks on this machine, each through `python -m launcher.rank` like a Slurm task.

    A replica lost while serving (replicas > 1) is reported and the rest go on serving, as on Slurm."""
    from launcher.logtext import log_excerpt
    from launcher.triage import describe_lost

    reported_lost: set = set()

    job_id = str(os.getpid())
    procs: List[subprocess.Popen] = []
    base_env = dict(os.environ)
    if not base_env.get("CUDA_VISIBLE_DEVICES") and any(r.gpus for r in spec.ranks):
        # Like a Slurm task given the node's GPUs: each rank then takes its own slice
        # (rank.rank_environment); without this every rank would land on GPU 0.
        base_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(int(spec.cluster.gpus_per_node)))
    for r in spec.ranks:
        env = dict(base_env)
        env.update(local_rank_env(r.rank, spec.world_size, r.local_rank, job_id))
        with open(run.local_rank_log(r.rank), "ab") as out:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "launcher.rank", str(run)],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    say(f"started {len(procs)} ranks; logs in {run.logs}")

    class _RankDied(Exception):
        pass

    def check() -> None:
        """Stopped on a signal; a rank that died unasked ends the job (a lost replica's ranks exit 0)."""
        if stop.signum is not None:
            raise Stopped()
        dead = [(i, p.returncode) for i, p in enumerate(procs) if p.poll() is not None]
        lost = set(run.lost_replica_ids(spec.replicas))
        for r in sorted(lost - reported_lost):  # the ranks of a lost replica record it and exit 0 (rank.decide_exit)
            reported_lost.add(r)
            record = run.read_lost(r)
            if record is not None:  # written whole (a hard link), so readable once it exists
                say(describe_lost(record))
        fatal = [(i, rc) for i, rc in dead if rc != 0 or spec.ranks[i].replica not in lost]
        if fatal:
            i, rc = fatal[0]
            say(
                f"rank {i} exited with status {rc}; stopping the others. Its log:\n{log_excerpt(run.local_rank_log(i))}"
            )
            raise _RankDied()

    def not_ready(_elapsed: float) -> Exception:
        say("not ready before serve.ready_timeout_s; stopping")
        return _RankDied()

    t0 = time.monotonic()
    code = 0
    try:
        ep = wait_for_endpoint(
            run,
            timeout_s=float(spec.serve.ready_timeout_s),
            on_timeout=not_ready,
            check=check,
            progress=lambda: f"waiting for {len(procs)} ranks: {run.ready_count()} leaders ready",
            say=say,
            repeat_s=2.0,
            on_change=False,
            interval_s=0.2,
        )
        say(f"READY in {time.monotonic() - t0:.1f}s ({len(procs)} ranks)")
        rec = ready_report(run, say, job_id=job_id)
        sys.stdout.write(endpoint_banner(ep["url"], ep["model"], ep.get("openai_url", ""), _ready_line(rec, run)))
        sys.stdout.flush()
        if ep.get("metrics_url"):  # frontend: replicas > 1 serve through rank 0's front end
            say(f"front end over {len(ep.get('replicas', []))} replicas; metrics {ep['metrics_url']}")
        while True:
            check()
            time.sleep(0.2)
    except Stopped:
        pass
    except _RankDied:
        code = 1
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + float(spec.serve.drain_timeout_s) + 20
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    say("stopped")
    return code


class LocalScheduler(Scheduler):
    """cluster.scheduler=local: the ranks as processes of this machine, served in the foreground."""

    name = "local"
    job_placeholder = "<pid>"
    on_this_machine = True

    def dryrun(self, spec: LaunchSpec, run_dir: str) -> Request:
        from launcher.render import rank_commands

        return Request(self.name, spec, run_dir, rank_commands(spec, run_dir, self.job_placeholder))

    def serve(self, request: Request) -> int:
        return serve_foreground(request.spec, request.run_dir, request.record)

    def launch(self, request: Request) -> Endpoint:
        """The foreground server as a child process group (a sweep's server): `python -m launcher.schedulers.local
        RUN_DIR` serves the spec written there; returns once it serves, its output in llmlaunch.log."""
        from launcher.errors import LaunchError
        from launcher.logtext import log_excerpt
        from launcher.models import resolve_model

        spec = resolve_model(request.spec, say)  # the child finds the same cached model; we learn its tokenizer
        run = RunDir(request.run_dir).write_spec(spec)
        if request.record is not None:  # the child completes it at READY (serve_foreground)
            run.write_record(request.record)
        log = run.server_log
        argv = [sys.executable, "-m", "launcher.schedulers.local", str(run)]
        say(f"starting: {shlex.join(argv)}; log {log}")
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        endpoint = Endpoint("", "", str(proc.pid), run, spec, proc=proc)

        def check() -> None:
            if proc.poll() is not None:
                raise LaunchError(
                    (
                        "server",
                        f"exited with status {proc.returncode} before serving; {log}:\n{log_excerpt(log, 15)}",
                        f"read {log}",
                    )
                )

        def timeout(_elapsed: float) -> Exception:
            self.stop(endpoint)
            return LaunchError(
                ("server", f"not serving after serve.ready_timeout_s={spec.serve.ready_timeout_s}", f"read {log}")
            )

        ep = wait_for_endpoint(
            run, timeout_s=float(spec.serve.ready_timeout_s) + 60, on_timeout=timeout, check=check, interval_s=0.2
        )
        endpoint.url, endpoint.model, endpoint.doc = ep["url"], ep["model"], ep
        return endpoint

    def stop(self, endpoint: Endpoint) -> None:
        """SIGTERM to its process group (it drains), SIGKILL after serve.drain_timeout_s + 20 s."""
        from launcher.triton import stop_group

        proc = endpoint.proc
        if proc is None or proc.poll() is not None:
            return
        stop_group(proc, float(endpoint.spec.serve.drain_timeout_s) + 20)
        say(f"stopped local server (pid {proc.pid}, status {proc.returncode})")


def main(argv: Optional[List[str]] = None) -> None:
    """python -m launcher.schedulers.local RUN_DIR: serve the spec written there, in the foreground."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m launcher.schedulers.local <run_dir>", file=sys.stderr)
        raise SystemExit(2)
    from launcher.errors import LaunchError

    try:
        code = serve_foreground(RunDir(argv[0]).read_spec(), argv[0])
    except LaunchError as e:
        print(e.render(), file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(code)


if __name__ == "__main__":
    main()
