"""`cluster=local`: serve on this machine, in the foreground, until Ctrl-C or SIGTERM.

Every launch, of one rank or many (tp/replicas on one machine), runs each rank as a `python -m launcher.rank RUN_DIR`
process with the local launcher's RankEnv (launcher/handoff/rank_env.py), rendezvousing through files in the run
dir: the per-rank path Slurm tasks take (launcher/rank/rank.py), so the engine's rank hooks, the servers'
environment and endpoint.json are the same everywhere. This side starts the ranks by module name (it imports nothing
of launcher.rank: the launch layer stays below the rank layer), says what they say in their logs as they say it
(their servers' own output stays there), waits until rank 0 publishes endpoint.json, prints the endpoint, serves,
and on a signal drains and stops every rank (exit 0). A rank dying unasked stops the others and exits non-zero with
its log.

`LocalScheduler` is the registry entry (launcher/schedulers/base.py): `llmlaunch` serves in the foreground;
a sweep launches the same foreground server as a child process (`python -m launcher.schedulers.local RUN_DIR`).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

from launcher.domains import PUBLIC_PORTS
from launcher.handoff.rank_env import local_launcher_env
from launcher.rundir import RunDir, Stopped, wait_for_endpoint
from launcher.schedulers.base import Endpoint, Request, Scheduler, bench_command, ready_report
from launcher.spec import LaunchSpec

RANK_MODULE = "launcher.rank"  # what each rank runs: `python -m launcher.rank RUN_DIR` (launcher/rank/main.py)


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
    install = resolve_tritonserver(spec.cluster.tritonserver)  # the ranks find the same one
    say(f"tritonserver: {install.binary} ({install.source})")
    spec = resolve_model(spec, say)
    run = RunDir(run_dir).write_spec(spec)
    if record is not None:
        run.write_record(record)
    say(f"run dir: {run}")
    return _LocalRanks(spec, run).serve(_Stop())


class _RankDied(Exception):
    """A rank exited unasked (or never got ready): the launch ends non-zero."""


class _Relay:
    """What the ranks say (launcher/rank/main.py's lines in their logs), said here as they write it: the user's view
    of the load, the serving and the stop. The servers' own output stays in the logs."""

    def __init__(self, logs: List[Path], label: bool):
        self.logs = logs
        self.label = label  # several ranks: each line names its rank
        self.offsets = [p.stat().st_size if p.exists() else 0 for p in logs]  # an earlier run's lines are not ours
        self.partial = [b""] * len(logs)  # the end of each log that is not a whole line yet

    def pump(self) -> None:
        from launcher.triage import rank_message

        for i, path in enumerate(self.logs):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[i])
                    data = f.read()
            except OSError:  # not created yet
                continue
            self.offsets[i] += len(data)
            *lines, self.partial[i] = (self.partial[i] + data).split(b"\n")
            for line in lines:
                said = rank_message(line.decode(errors="replace"))
                if said is not None:
                    say(f"rank {said[0]}: {said[1]}" if self.label else said[1])


class _LocalRanks:
    """The ranks of one local launch, each a `python -m launcher.rank` process in its own session (Ctrl-C reaches
    this process, which stops them in order)."""

    def __init__(self, spec: LaunchSpec, run: RunDir):
        self.spec, self.run = spec, run
        self.job_id = str(os.getpid())
        self.procs: List[subprocess.Popen] = []
        self.relay = _Relay([run.local_rank_log(r.rank) for r in spec.ranks], label=spec.world_size > 1)
        self.reported_lost: set = set()  # replicas whose loss was said

    def start(self) -> None:
        spec, run = self.spec, self.run
        base_env = dict(os.environ)
        if not base_env.get("CUDA_VISIBLE_DEVICES") and any(r.gpus for r in spec.ranks):
            # Like a Slurm task given the node's GPUs: each rank then takes its own slice
            # (rank.rank_environment); without this every rank would land on GPU 0.
            base_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(int(spec.cluster.gpus_per_node)))
        argv = [sys.executable, "-m", RANK_MODULE, str(run)]
        for r in spec.ranks:
            env = {**base_env, **local_launcher_env(r.rank, spec.world_size, r.local_rank, self.job_id).to_environ()}
            with open(run.local_rank_log(r.rank), "ab") as out:
                self.procs.append(
                    subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
                )
        n = len(self.procs)
        logs = f"log: {run.local_rank_log(0)}" if n == 1 else f"logs in {run.logs}"
        say(f"started {n} rank{'s' if n > 1 else ''} ({shlex.join(argv)}); {logs}")

    def serve(self, stop: "_Stop") -> int:
        """Start the ranks, wait until rank 0 serves, print the endpoint, serve until a signal or a rank's end."""
        spec, run = self.spec, self.run
        t0 = time.monotonic()
        code = 0
        try:
            self.start()
            ep = wait_for_endpoint(
                run,
                # the ranks' own deadline comes first, and says which stage it was in
                timeout_s=float(spec.serve.ready_timeout_s) + 30,
                on_timeout=self.not_ready,
                check=lambda: self.check(stop),
                interval_s=0.2,
            )
            n = len(self.procs)
            say(f"READY in {time.monotonic() - t0:.1f}s ({n} rank{'s' if n > 1 else ''})")
            rec = ready_report(run, say, job_id=self.job_id)
            sys.stdout.write(endpoint_banner(ep.url, ep.model, ep.openai_url, _ready_line(rec, run)))
            sys.stdout.flush()
            if ep.frontend is not None:  # replicas > 1 serve through rank 0's front end
                say(f"front end over {len(ep.replicas)} replicas; metrics {ep.metrics_url}")
            while True:
                self.check(stop)
                time.sleep(0.2)
        except Stopped:
            pass
        except _RankDied:
            code = 1
        finally:
            self.stop_all()
        return code

    def check(self, stop: "_Stop") -> None:
        """Stopped on a signal; a rank that died unasked ends the job (a lost replica's ranks exit 0, as on Slurm:
        the others go on serving)."""
        from launcher.logtext import log_excerpt
        from launcher.triage import describe_lost

        self.relay.pump()
        if stop.signum is not None:
            raise Stopped()
        spec, run = self.spec, self.run
        dead = [(i, p.returncode) for i, p in enumerate(self.procs) if p.poll() is not None]
        lost = set(run.lost_replica_ids(spec.replicas))  # after `dead`: a lost replica's rank records it, then exits
        for r in sorted(lost - self.reported_lost):
            self.reported_lost.add(r)
            record = run.read_lost(r)
            if record is not None:  # written whole (a hard link), so readable once it exists
                say(describe_lost(record))
        fatal = [(i, rc) for i, rc in dead if rc != 0 or spec.ranks[i].replica not in lost]
        if fatal:
            i, rc = fatal[0]
            self.relay.pump()  # its last words first
            others = "; stopping the others" if len(self.procs) > 1 else ""
            log = run.local_rank_log(i)
            say(f"rank {i} exited with status {rc}{others}. Its log, {log}:\n{log_excerpt(log)}")
            raise _RankDied()

    def not_ready(self, _elapsed: float) -> Exception:
        say(f"not serving after serve.ready_timeout_s={self.spec.serve.ready_timeout_s}; stopping")
        return _RankDied()

    def stop_all(self) -> None:
        """SIGTERM to every rank still running (each drains its server), SIGKILL after serve.drain_timeout_s + 20 s;
        what they say meanwhile is said here."""
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + float(self.spec.serve.drain_timeout_s) + 20
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            self.relay.pump()
            time.sleep(0.2)
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.relay.pump()
        say("stopped")


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
        # The child completes the run record (its time to READY, which a sweep's rows read) once it sees
        # endpoint.json: it is done starting then. Bounded: a record that cannot be completed is no failure.
        deadline = time.monotonic() + 30
        while "time_to_ready" not in (run.read_record() or {}) and time.monotonic() < deadline:
            check()
            time.sleep(0.2)
        endpoint.url, endpoint.model, endpoint.doc = ep.url, ep.model, ep
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
