"""One rank of a job, from the rendezvous to its exit status: `Rank(...).run()`.

Steps, in order: rendezvous (rank 0 picks ports and a dist port, every rank learns every rank's address), start
this rank's command (tritonserver, or an engine's own worker command) as a supervised child, and on a leader wait
until it answers a real request; rank 0 then publishes the job (the replicas' front end, the OpenAI API, the run
record's start, `endpoint.json`). A rank whose child dies writes `failure_rank<N>.json` and exits non-zero, which
`srun --kill-on-bad-exit=1` turns into the whole job stopping (fail fast); with replicas > 1 a serving job first
starts a one-rank replica's server again in place (launcher/rank/restart.py, serve.max_restarts), then loses that
replica instead (launcher/rank/supervise.py: `decide_exit` is the whole rule).

SIGTERM / SIGINT / SIGUSR2 (time limit, preemption) are forwarded to the child as SIGTERM so Triton drains before
it exits; SIGUSR2 (Slurm's time-limit signal) also tells rank 0's front ends to refuse new requests and records the
drain, on which the batch script of a requeue=true job requeues it (launcher/procs/drain.py).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from launcher.engines.registry import ENGINES
from launcher.frontend.process import connect_host
from launcher.handoff.endpoint import EndpointRecord, FrontendEntry, RankEntry, ReplicaEntry
from launcher.logtext import log_excerpt
from launcher.openai_api.process import start_api
from launcher.ports import metrics_url, pick_ports
from launcher.procs.drain import DRAIN_SIGNAL, REASON_ENV, walltime_reason
from launcher.rank.frontend import start_for_rank0
from launcher.rank.join import JoinRefused, ServiceDrain, join_service, leave_service
from launcher.rank.rendezvous import (
    RankContext,
    RendezvousTimeout,
    arrival_barrier,
    bind_address,
    make_comm,
    rendezvous,
    rendezvous_key,
)
from launcher.rank.restart import restart_in_place, restart_on_fresh_ports
from launcher.rank.supervise import decide_exit, end_lost_server, frontend_only, signal_text, supervise
from launcher.rank.topology import Topology, rank_environment, visible_devices
from launcher.record import write_startup
from launcher.render import rank_command, shm_prefix
from launcher.rundir import RunDir
from launcher.triton import ServerDied, TritonServer
from launcher.triton_install import resolve_tritonserver, server_env

STOPPED_OK = (0, -signal.SIGTERM)  # a server's status after a stop asked for: it drained and exited


class Rank:
    """This process's rank. Its state is in attributes: where it stands (`topo`, `ctx` and `infos` after the
    rendezvous), the allocation it runs in (`attempt`), the children it supervises (`server`, and on rank 0
    `frontend` and `api`), and the signal that stops it (`stop_signal`, None while nobody asked)."""

    def __init__(
        self,
        run: RunDir,
        spec,
        topo: Topology,
        environ: Dict[str, str],
        log: Path,
        say: Callable[[str], None],
        inherit_output: bool = False,
    ):
        self.rundir, self.spec, self.topo, self.environ, self.log, self.say = run, spec, topo, environ, log, say
        self.inherit_output = inherit_output  # the server's output goes to this process's (srun's per-task log)
        self.me = spec.ranks[topo.rank]
        self.edef = ENGINES[spec.engine.name]
        # which allocation of a requeued job this is ("" in the first): names its rendezvous and its drain record
        self.attempt = environ.get("SLURM_RESTART_COUNT", "")
        self.ctx: Optional[RankContext] = None
        self.infos: List[dict] = []
        self.marks: Dict[str, float] = {}  # time-to-READY marks of this rank's start (launcher/readiness.py)
        self.server: Optional[TritonServer] = None
        self.frontend = None  # rank 0's replicas front end (launcher/frontend) when replicas > 1
        self.api = None  # rank 0's OpenAI API (launcher/openai_api), in front of the public gRPC endpoint
        self.stop_signal: Optional[int] = None
        self.waited = 0.0  # seconds the server took to answer its first request
        self.restarts = 0  # times this rank's server was started again in place (replicas > 1, serve.max_restarts)

    # ------------------------------------------------------------------------------------------ the whole life
    def run(self) -> int:
        """Run the rank to the end; its exit status."""
        if self.topo.world_size != self.spec.world_size:
            raise SystemExit(
                f"rank {self.topo.rank}: the launcher started {self.topo.world_size} ranks but the plan has "
                f"{self.spec.world_size}"
            )
        if self.topo.rank == 0:
            # Records of an earlier run of this dir (a requeued job) must not stop this run's ranks. Nobody
            # writes one before the job serves, and every rank passes the rendezvous only after rank 0.
            self.rundir.clear_lost()
        if not self.meet():
            return 1
        self.start()
        try:
            if self.me.role == "leader":
                self.wait_ready()
                if self.me.rank == 0:
                    self.publish()
            ended, code = self.supervise()
        except BaseException as e:  # died while loading, or timed out, or stopped while loading
            self.say(f"stopped while starting: {e}" if self.stopped() else f"FAILED: {e}")
            self.stop_children()
            self.server.stop()
            why = str(e) if isinstance(e, JoinRefused) else ""  # the router's reason, not the server's status
            return self.finish("server", self.server.returncode() or 1, started=False, why=why)
        return self.finish(ended, code, started=True)

    def stopped(self) -> bool:
        return self.stop_signal is not None

    # ------------------------------------------------------------------------------------------ the steps
    def meet(self) -> bool:
        """The arrival barrier and the rendezvous. False, after recording who never came, when some rank did not."""
        topo, spec = self.topo, self.spec
        try:
            if topo.world_size > 1:  # every rank there before anything waits without a deadline (MPI_Init does)
                arrival_barrier(
                    self.rundir.rendezvous_dir(rendezvous_key(topo, self.attempt)),
                    topo.rank,
                    topo.world_size,
                    float(spec.serve.rendezvous_timeout_s),
                )
            self.ctx, self.infos = rendezvous(spec, topo, make_comm(spec, topo, self.rundir.path, self.attempt))
        except RendezvousTimeout as e:  # MPI has not started: the arrival barrier comes first
            self.rundir.write_failure(
                topo.rank,
                {
                    "rank": topo.rank,
                    "node": self.me.node,
                    "host": topo.hostname,
                    "exit_code": 1,
                    "log": str(self.log),
                    "log_tail": "",
                    "time": time.time(),
                    "reason": str(e),
                    "missing_ranks": e.missing,
                },
            )
            self.say(f"FAILED: {e}")
            return False
        self.marks["ranks_started"] = time.time()  # every rank has arrived: the time-to-READY breakdown's mark
        if self.environ.get("SLURM_JOB_START_TIME"):  # Slurm 23.02+: when the allocation began
            self.marks["allocated"] = float(self.environ["SLURM_JOB_START_TIME"])
        return True

    def start(self) -> None:
        """Start this rank's server, with the signals that stop it forwarded."""
        spec, ctx = self.spec, self.ctx
        self.install = resolve_tritonserver(spec.cluster.tritonserver)
        rank_env = rank_environment(spec, ctx, self.rundir.path, visible_devices(self.environ))
        self.env = server_env(self.install, {**spec.cluster.env, **rank_env, **self.edef.rank_env(spec, ctx)})
        self.host = self.reached_at()
        self.server = self.make_server()
        os.environ[REASON_ENV] = walltime_reason(ctx.job_id, spec.requeue)  # what rank 0's front ends will say
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(s, self.on_signal)
        self.server.start()

    def reached_at(self) -> str:
        """Where this rank's server is reached: on one machine, at the address a public server binds (serve.host;
        loopback for 0.0.0.0) or on loopback; across nodes, at the rendezvous's address."""
        if not self.spec.loopback:
            return self.ctx.hosts[self.me.rank]
        return connect_host(self.spec.host) if self.me.serves == "public" else "127.0.0.1"

    def make_server(self) -> TritonServer:
        spec, ctx, me = self.spec, self.ctx, self.me
        argv = self.edef.rank_command(spec, ctx)
        if argv is None:
            argv = rank_command(
                spec,
                me,
                tritonserver=self.install.binary,
                repository=str(self.rundir.repository),
                job_id=ctx.job_id,
                ports=ctx.ports or None,
                backend_directory=self.install.backend_directory,
            )
        self.say(
            f"{me.role} of replica {me.replica}, gpus {list(me.gpus) or 'none'}, leader {ctx.leader_addr}: {' '.join(argv)}"
        )
        return TritonServer(
            argv,
            env=self.env,
            log_path=self.log,
            grpc_url=f"{self.host}:{ctx.ports.get('grpc_port', 0)}",
            model=spec.model_name,
            ready_timeout_s=float(spec.serve.ready_timeout_s),
            drain_timeout_s=float(spec.serve.drain_timeout_s),
            shm_prefix=shm_prefix(ctx.job_id, me.rank),
            progress=self.say,
            inherit_output=self.inherit_output,
        )

    def on_signal(self, signum, _frame) -> None:
        if self.spec.service is not None and ServiceDrain.defers(self, signum):
            return  # a replica job of a service serves on until its successor does (launcher/rank/join.py)
        first = self.stop_signal is None
        self.stop_signal = signum
        if first and self.me.rank == 0 and self.spec.service is not None and self.api is not None:
            leave_service(self, f"signal {signal.Signals(signum).name}")
        if signum == DRAIN_SIGNAL:
            # Slurm's time-limit signal: the server finishes what runs (up to serve.drain_timeout_s), the front
            # ends refuse new requests naming why, every rank then exits 0 (launcher/procs/drain.py)
            for child in (self.frontend, self.api):  # first: new requests are refused from now on
                if child is not None:
                    child.drain_notice()
            if first and self.me.rank == 0:
                self.record_drain()
            self.server.terminate()
            return
        self.server.terminate()
        for child in (self.frontend, self.api):
            if child is not None:
                child.terminate()

    def record_drain(self) -> None:
        """Rank 0 at the time limit: nothing new is served at this endpoint (a requeued job's rank 0 writes the next
        one), and this allocation's drain record, on which the batch script requeues a requeue=true job."""
        self.rundir.clear_endpoint()
        self.rundir.write_walltime(
            self.attempt,
            {
                "attempt": int(self.attempt or 0),
                "job_id": self.ctx.job_id,
                "time": time.time(),
                "requeue": self.spec.requeue,
                "drain_timeout_s": float(self.spec.serve.drain_timeout_s),
                "host": self.topo.hostname,
            },
        )
        self.say(f"draining at the time limit: {os.environ[REASON_ENV]}")

    def wait_ready(self) -> None:
        """A leader: until its server answers a real request, then its ready file. Another listener on this node
        (another job's server) can take a port between our pick and tritonserver's bind (ports are picked outside
        the ephemeral range, launcher.ports.free_port, so no outgoing connection can); the leader then retries on
        fresh ports instead of failing the job: its ready file says which it bound, and rank 0's front end and
        endpoint.json take them from there.  A tp copy's workers cannot follow a restarted leader engine (their
        collectives lose their peer), so a copy restarts as a whole there (launcher/rank/restart.py)."""
        me, ctx = self.me, self.ctx
        for tries in range(3):
            try:
                self.waited = self.server.wait_ready()
                break
            except ServerDied as e:
                if tries == 2 or "already in use" not in str(e):
                    raise
                front = [
                    *self.infos[me.rank]["frontend_ports"].values(),
                    self.infos[me.rank]["openai_port"],
                ]  # rank 0's
                ctx.ports.update(pick_ports(bind_address(self.spec), {k: 0 for k in ctx.ports}, avoid=front))
                restart_on_fresh_ports(self, f"a port was taken while starting; retrying on {ctx.ports}")
        self.say(f"READY in {self.waited:.1f}s: {self.spec.model_name} at {self.server.grpc_url}")
        self.rundir.write_ready(
            me.rank,
            {
                "rank": me.rank,
                "replica": me.replica,
                "addr": self.host,
                "ports": ctx.ports,
                "ready_s": round(self.waited, 2),
                "time": time.time(),
                "token": ctx.token,
            },
        )

    def publish(self) -> None:
        """Rank 0, its server ready: the replicas' front end (replicas > 1), the OpenAI API, the run record's start
        and endpoint.json, which tells the launching side the job serves."""
        spec, ctx, run = self.spec, self.ctx, self.rundir
        leaders = [i for i in self.infos if spec.ranks[i["rank"]].role == "leader"]
        public = {
            "url": f"grpc://{self.host}:{ctx.ports['grpc_port']}",
            **{k: ctx.ports[k] for k in ("grpc_port", "http_port", "metrics_port")},
        }
        bound = {0: ctx.ports}  # rank -> the ports its server bound (a retry may have changed them)
        if spec.replicas > 1:  # wait for every replica leader, then serve them all on the public port
            self.frontend, public, bound = start_for_rank0(
                spec,
                run.path,
                self.infos,
                leaders,
                self.host,
                ctx.ports,
                ctx.token,
                avoid=[*ctx.ports.values(), self.infos[0]["openai_port"]],
                alive=lambda: self.server.returncode() is None,
                say=self.say,
            )
        self.api = start_api(
            spec,
            public["url"].replace("grpc://", ""),
            spec.host,
            self.infos[0]["openai_port"],
            self.say,
            float(spec.serve.ready_timeout_s),
            config_path=run.openai_config,
            avoid=[*ctx.ports.values(), *self.infos[0]["frontend_ports"].values()],
        )
        write_startup(
            run,
            spec,
            log_path=self.log,
            marks={**self.marks, **self.server.marks, "serving": time.time()},
            server_url=self.server.grpc_url,
            nodes=[i.get("host", i["addr"]) for i in self.infos],
            gpus={i["host"]: i["gpus"] for i in self.infos if i.get("gpus")},
            token=ctx.token,
            server_pid=self.server.proc.pid,
        )
        frontend = public.get("frontend")  # replicas > 1: the front end serves the public ports
        run.write_endpoint(
            EndpointRecord(
                url=public["url"],
                model=spec.model_name,
                job_id=ctx.job_id,
                host=self.host,
                grpc_port=public["grpc_port"],
                http_port=public["http_port"],
                metrics_port=public["metrics_port"],
                metrics_url=public.get("metrics_url") or metrics_url(self.host, public["metrics_port"]),
                openai_port=self.api.cfg.port,
                openai_url=f"http://{self.host}:{self.api.cfg.port}/v1",
                token=ctx.token,
                ready_s=round(self.waited, 2),
                ranks=tuple(RankEntry(i["rank"], i["addr"]) for i in self.infos),
                replicas=tuple(
                    ReplicaEntry(
                        replica=spec.ranks[i["rank"]].replica,
                        addr=i["addr"],
                        grpc_port=bound[i["rank"]]["grpc_port"],
                        # the leader's own tritonserver metrics (its model's first-token split and engine totals):
                        # the public metrics port is the front end's
                        metrics_url=metrics_url(i["addr"], bound[i["rank"]].get("metrics_port")),
                    )
                    for i in leaders
                ),
                frontend=FrontendEntry(frontend["pid"], frontend["processes"]) if frontend else None,
            )
        )
        if spec.service is not None:  # a replica job of a service: the router routes to it from now on
            join_service(self)

    def supervise(self) -> Tuple[str, Optional[int]]:
        """Until something this rank supervises ends (launcher/rank/supervise.py says what each answer means); a
        replica's server that dies while the job serves is first started again in place (launcher/rank/restart.py)."""
        if self.spec.replicas == 1:
            return supervise(self.server, None, self.stopped, lambda: False, self.api)
        run, replica = self.rundir, self.me.replica
        while True:
            ended, code = supervise(self.server, self.frontend, self.stopped, self.copy_ended, self.api)
            if self.stopped():
                break
            if ended == "replica" and not run.replica_lost(replica):  # the copy restarts as a whole: join it
                code = end_lost_server(self.server, grace_s=1.0)  # its group is broken: nothing it runs can finish
                if restart_in_place(self, code, asked=True):
                    continue
                ended = "server"  # this rank's part of the restart failed: its copy is lost
                break
            if ended != "server" or not restart_in_place(self, code):
                break
        if ended == "replica":
            code = end_lost_server(self.server)
        return ended, code

    def copy_ended(self) -> bool:
        """Another rank of this replica recorded it lost, or asked for the copy's next restart (launcher/rank/
        restart.py): either way this rank's server has lost its group."""
        run, replica = self.rundir, self.me.replica
        return run.replica_lost(replica) or run.restart_asked(replica, self.restarts + 1)

    # ------------------------------------------------------------------------------------------ the end
    def finish(self, ended: str, code: Optional[int], started: bool, why: str = "") -> int:
        """The exit status once `ended` ended with `code`: a stop asked for exits 0 after the drain; a lost replica
        is left behind (replicas > 1, a serving job); anything else unasked fails the job."""
        if not self.stopped() and self.spec.replicas > 1 and started:
            return self.replica_ended(ended, code)
        self.stop_children()  # they drain with the servers (or failed with them), then go
        if not self.stopped():
            what = {"frontend": "front end", "api": "OpenAI API"}.get(ended, "server")
            return self.fail(code if code else 1, why or f"{what} exited with status {code} unasked", code)
        self.server.stop()  # the server has exited; this ends stray stubs and removes the rank's shm regions
        self.say(f"stopped (signal {self.stop_signal}), status {code}")
        return 0 if code in STOPPED_OK else code

    def replica_ended(self, ended: str, code: Optional[int]) -> int:
        """Data-parallel replicas: a replica lost while the job serves is not the end of the job."""
        spec, me, run = self.spec, self.me, self.rundir
        frontend = "none" if self.frontend is None else "running" if self.frontend.poll() is None else "exited"
        out = decide_exit(
            ended,
            replicas=spec.replicas,
            replica=me.replica,
            serving=run.serving(self.ctx.token),
            code=code,
            lost=run.lost_replica_ids(spec.replicas),
            frontend=frontend,
        )
        if out.replica_lost:
            self.record_lost(ended, code)
        if not out.exits:
            # Rank 0: its server is gone, the front end goes on for the replicas left (it already
            # marked this one down: its requests in flight got an error naming it).
            self.server.stop()
            self.say(f"{out.reason}; rank 0 keeps the front end up")
            ended, fe_code = frontend_only(
                self.frontend, self.stopped, lambda: len(run.lost_replica_ids(spec.replicas)) >= spec.replicas
            )
            if self.stopped():
                if self.api is not None:
                    self.api.stop()
                fe_code = self.frontend.stop()
                self.say(f"stopped (signal {self.stop_signal}), front end status {fe_code}")
                return 0 if fe_code in STOPPED_OK else fe_code
            if ended == "frontend":
                code = fe_code
            out = decide_exit(
                ended,
                replicas=spec.replicas,
                replica=me.replica,
                serving=True,
                code=code,
                lost=run.lost_replica_ids(spec.replicas),
            )
        if out.failure:
            return self.fail(out.status, out.reason, code)
        if self.api is not None:
            self.api.stop()
        self.server.stop()
        self.say(f"{out.reason}: this rank exits 0 so the job goes on")
        return 0

    def record_lost(self, ended: str, code: Optional[int]) -> None:
        """replica_lost<R>.json for this rank's replica (the first of its ranks to get here writes it)."""
        me = self.me
        if ended == "replica":
            why = f"rank {me.rank} stopped its server (status {signal_text(code)}): another rank of replica {me.replica} was lost"
        else:
            why = f"the server of rank {me.rank} ({me.role}) exited with status {signal_text(code)} unasked"
        ranks = [r.rank for r in self.spec.ranks if r.replica == me.replica]
        wrote = self.rundir.record_lost(
            me.replica,
            {
                "replica": me.replica,
                "ranks": ranks,
                "rank": me.rank,
                "node": me.node,
                "host": self.topo.hostname,
                "exit_code": code,
                "reason": why,
                "log": str(self.log),
                "log_tail": log_excerpt(self.log, 25),
                "time": time.time(),
            },
        )
        self.say(f"replica {me.replica} LOST: {why}" + ("" if wrote else " (already recorded by another of its ranks)"))

    def fail(self, status: int, what: str, code: Optional[int]) -> int:
        """Nobody asked it to stop: fail the job, and say who failed and why."""
        self.stop_children()
        me = self.me
        self.rundir.write_failure(
            me.rank,
            {
                "rank": me.rank,
                "node": me.node,
                "host": self.topo.hostname,
                "exit_code": code,
                "log": str(self.log),
                "log_tail": log_excerpt(self.log, 25),
                "time": time.time(),
                "reason": what,
            },
        )
        self.say(f"{what}: failing the job")
        self.server.stop()
        return status

    def stop_children(self) -> None:
        """Rank 0's front end and OpenAI API, where it runs them."""
        for child in (self.api, self.frontend):
            if child is not None:
                child.stop()
