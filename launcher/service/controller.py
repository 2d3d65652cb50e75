"""The router of a service (serve.router=host|job): `python -m launcher.service RUN_DIR` runs `Controller(run).main()`.

It serves the stable endpoint (the front end and the OpenAI API, launcher/frontend and launcher/openai_api, on the
launch's public ports) and keeps the replica jobs behind it: it submits them, takes each into the front end's
members file when it registers (launcher/service/api.py: only with the service's token, only a job it submitted),
hands each over to a successor before its time limit, replaces one that fails, and scales their number by load
(launcher/service/policy.py). A replica it gives back is drained in the front end first (no new requests; running
ones finish, or move mid-stream at the drain's end), then its job is stopped. Every decision goes to
service/decisions.jsonl with its reason; service/status.json is its view each second (llmlaunch-status)."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import socket
import sys
import time
from typing import Dict, List, Optional

from launcher.frontend import first_tokens
from launcher.frontend.members import Member, write_members
from launcher.scale_signals import SIGNALS, bounds
from launcher.service import scrape
from launcher.service.api import serve_control
from launcher.service.jobs import LIVE, ReplicaJob, last_state, queue, submit_replica
from launcher.service.policy import DRAIN_SLACK_S, Scaling, expected, handover_at, scale
from launcher.service.report import metrics_text, write_status
from launcher.service.signals import READERS, Reading
from launcher.service.state import ServiceDir
from launcher.spec import ServiceLink

TICK_S = 1.0  # how often the controller looks at Slurm, the front end and the clock
DEFAULT_QUEUE_S = 30.0  # a replica job's queue wait before the service measured one
DEFAULT_READY_S = 120.0  # its time to READY in its allocation before the service measured one


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} router: {msg}", flush=True)


class Controller:
    """The service's state (its replica jobs, target, members) and the loop that keeps it."""

    def __init__(self, run_dir: str):
        self.sdir = ServiceDir(run_dir)
        self.spec = self.sdir.run.read_spec()  # one replica job's spec (replicas=1)
        self.token = self.sdir.make_token()
        serve = self.spec.serve
        self.auto = serve.autoscale
        up_at, down_at = bounds(self.auto.signal, self.auto.up_at, self.auto.down_at)
        self.signal = SIGNALS[self.auto.signal]
        self.rule = Scaling(
            self.auto.min_replicas,
            self.auto.max_replicas,
            up_at or 0.0,  # validation refused a signal without one
            down_at,
            self.auto.window_s,
            self.auto.up_cooldown_s,
            self.auto.down_cooldown_s,
            self.auto.signal,
            self.signal.shared,
        )
        self.target = self.spec.service_replicas
        self.slots = 2 * max(self.target, self.auto.max_replicas) + 2  # room for every successor beside its job
        self.jobs: Dict[str, ReplicaJob] = {}
        self.count = 0  # replica jobs submitted, the next one's name
        self.replacements = 0
        self.samples: collections.deque = collections.deque(maxlen=4096)  # (time, the signal's value, serving)
        self.first_tokens: collections.deque = collections.deque(maxlen=4096)  # (time, the front end's TTFT buckets)
        self.in_flight = 0  # requests in flight through the front end, last read
        self.signal_now: Optional[float] = None  # the signal as last measured (per replica where it is shared)
        self.last_up = self.last_down = float("-inf")
        self.version = 0  # of the members file
        self.applied = 0  # the members version every front-end process applied (its /metrics)
        self.counts: Dict[str, int] = collections.Counter()  # decisions by action
        self.host = socket.gethostname()
        self.frontend = None
        self.api = None
        self.serving_since: Optional[float] = None  # endpoint.json written
        self.stopping = False

    # ------------------------------------------------------------------------------------------ decisions
    def decide(self, action: str, reason: str, **facts) -> None:
        """One decision: logged, counted (/metrics) and appended to decisions.jsonl."""
        self.counts[action] += 1
        doc = {"time": time.time(), "action": action, "reason": reason, "target": self.target, **facts}
        self.sdir.add_decision(doc)
        log(f"{action}: {reason}" + "".join(f"; {k} {v}" for k, v in facts.items()))

    def submit(self, why: str) -> Optional[ReplicaJob]:
        """One more replica job; None (and a decision saying why) where Slurm refused it."""
        from launcher.errors import LaunchError

        name = f"r{self.count}"
        self.count += 1
        run_dir = str(self.sdir.replica_dir(name))
        link = ServiceLink(self.control_url, str(self.sdir.token_file), name)
        try:
            job_id = submit_replica(self.spec, run_dir, link)
        except LaunchError as e:
            self.decide("submit_failed", f"{name} for {why}: {e.render()}")
            return None
        job = self.jobs[name] = ReplicaJob(name, job_id, run_dir, time.time(), why)
        self.decide("submit", why, job=name, job_id=job_id)
        return job

    def live(self) -> List[ReplicaJob]:
        """Jobs pending, starting or serving that the router has not asked to end (a cancel takes a moment)."""
        return [j for j in self.jobs.values() if j.state in LIVE and not j.asked_to_end]

    def capacity(self) -> List[ReplicaJob]:
        """The live jobs that count toward the target: a job being handed over counts through its successor."""
        live = self.live()
        return [j for j in live if not (j.successor and self.jobs[j.successor] in live)]

    # ------------------------------------------------------------------------------------------ registration
    async def on_register(self, body: Dict):
        name, job_id = str(body.get("name", "")), str(body.get("job_id", ""))
        job = self.jobs.get(name)
        if job is None or job.job_id != job_id:
            why = f"job {job_id or '?'} ({name or 'no name'}) is not a replica job this service submitted"
            self.decide("refused", why, addr=f"{body.get('host')}:{body.get('grpc_port')}")
            return 403, {"error": why}
        if job.state not in ("pending", "starting"):
            return 409, {"error": f"{name} (job {job_id}) is {job.state}: it cannot register now"}
        now = time.time()
        job.started = job.started or now
        job.registered, job.state = now, "serving"
        job.host, job.grpc_port = str(body["host"]), int(body["grpc_port"])
        job.metrics_url, job.facts = str(body.get("metrics_url", "")), body
        job.slot = min(set(range(self.slots)) - {j.slot for j in self.jobs.values() if j.slot >= 0})
        self.decide("join", f"{name} serves at {job.host}:{job.grpc_port}", job=name, slot=job.slot)
        for old in self.jobs.values():
            if old.successor == name and old.state == "serving":
                self.drain(old, f"handed over to {name}")
        self.publish_members()
        return 200, {"slot": job.slot, "service": self.sdir.path.name}

    async def on_deregister(self, body: Dict):
        job = self.jobs.get(str(body.get("name", "")))
        if job is None or job.job_id != str(body.get("job_id", "")):
            return 403, {"error": "not a replica job of this service"}
        if job.state == "serving":
            job.asked_to_end = True  # it drains on its own (its time limit, a stop): not a failure
            self.drain(job, f"its job drains: {body.get('reason', 'asked')}", stop=False)
        return 200, {}

    async def on_ending(self, body: Dict):
        """A replica job's time-limit signal came (launcher/rank/join.py): it serves on until its successor does, or
        until it must drain; its successor is due now if it was not submitted yet."""
        job = self.jobs.get(str(body.get("name", "")))
        if job is None or job.job_id != str(body.get("job_id", "")):
            return 403, {"error": "not a replica job of this service"}
        job.ending = str(body.get("reason", "its time-limit signal came"))
        log(f"{job.name}: {job.ending}")
        return 200, {}

    async def on_scale(self, body: Dict):
        try:
            n = int(body["replicas"])
        except (KeyError, TypeError, ValueError):
            return 400, {"error": "give replicas=N, a whole number"}
        low, high = (self.auto.min_replicas, self.auto.max_replicas) if self.auto.max_replicas else (1, 10**6)
        if not low <= n <= high:
            return 400, {"error": f"replicas={n} is outside serve.autoscale's {low}..{high}"}
        old, self.target = self.target, n
        self.last_up = self.last_down = time.time()  # the autoscaler waits out its cool-downs from the user's word
        self.decide("scale_by_hand", f"llmlaunch-scale: {old} -> {n} replicas")
        return 200, {"target": n}

    # ------------------------------------------------------------------------------------------ members
    def drain(self, job: ReplicaJob, why: str, stop: bool = True) -> None:
        """No new requests to `job`; it leaves the members (and is stopped, with `stop`) once its requests are done
        or serve.drain_timeout_s passed."""
        job.state, job.draining_since, job.drain_why = "draining", time.time(), why
        job.asked_to_end = job.asked_to_end or stop
        self.decide("drain", f"{job.name}: {why}", job=job.name)
        self.publish_members()

    def publish_members(self) -> None:
        members = [
            Member(j.slot, f"{j.name} (job {j.job_id})", j.host, j.grpc_port, j.metrics_url, "", j.state)
            for j in self.jobs.values()
            if j.slot >= 0 and j.state in ("serving", "draining")
        ]
        self.version += 1
        write_members(self.sdir.members, members, self.version)

    def leave(self, job: ReplicaJob) -> None:
        """Out of the members file: the front end closes it (requests still on it move or end)."""
        if job.slot >= 0:
            job.slot = -1
            self.publish_members()

    @property
    def control_url(self) -> str:
        return f"http://{self.host}:{self.spec.serve.control_port}"

    # ------------------------------------------------------------------------------------------ the loop
    async def tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = time.time()
        seen = await loop.run_in_executor(None, queue, [j.job_id for j in self.jobs.values() if j.state != "ended"])
        for job in list(self.jobs.values()):
            if job.state != "ended":
                await self.follow(job, seen.get(job.job_id), now)
        await self.measure(now)
        if not self.stopping:
            self.handovers(now)
            self.autoscale(now)
            self.reconcile()
        await self.finish_drains(now)
        write_status(self)

    async def follow(self, job: ReplicaJob, queued, now: float) -> None:
        """What Slurm says of `job`: started, its end time, or gone (then replaced, unless the router ended it)."""
        if queued is None:
            job.ended_as = await asyncio.get_running_loop().run_in_executor(None, last_state, job.job_id)
            was = job.state
            job.state = "ended"
            self.leave(job)
            for old in self.jobs.values():
                if old.successor == job.name:
                    old.successor = ""  # its successor never served: its handover is due again
            if not job.asked_to_end and not self.stopping:
                self.decide("ended", f"{job.name} (job {job.job_id}) ended {job.ended_as or 'unasked'} while {was}")
                self.replace(job)
            return
        state, end_time, reason = queued
        job.end_time = end_time
        if state == "RUNNING" and job.started is None:
            job.started = now
            if job.state == "pending":
                job.state = "starting"
        if job.state == "pending" and now - job.submitted > self.auto.pending_deadline_s:
            self.decide(
                "pending_deadline",
                f"{job.name} (job {job.job_id}) still PENDING ({reason}) after {now - job.submitted:.0f}s: cancelled",
            )
            job.asked_to_end = True
            await self.stop_job(job)

    def replace(self, job: ReplicaJob) -> None:
        """A replica job that ended unasked: a new one, within serve.max_replacements."""
        limit = self.spec.serve.max_replacements
        if self.replacements >= limit:
            self.decide("not_replaced", f"{job.name}: serve.max_replacements={limit} spent")
            self.target = min(self.target, len(self.capacity()))  # else reconcile would submit it anyway
            return
        if len(self.capacity()) < self.target:
            self.replacements += 1
            self.submit(f"replacement of {job.name} ({self.replacements} of {limit})")
        else:
            covering = ", ".join(j.name for j in self.capacity())
            self.decide("covered", f"{job.name} needs no replacement: {covering} make the target {self.target}")

    def handovers(self, now: float) -> None:
        """Each serving job whose time limit nears gets its successor, early by the measured queue wait and time to
        READY plus serve.handover_margin_s."""
        waits = [j.queue_wait_s for j in self.jobs.values() if j.queue_wait_s is not None]
        readies = [j.ready_s for j in self.jobs.values() if j.ready_s is not None]
        wait, ready = expected(waits, DEFAULT_QUEUE_S), expected(readies, DEFAULT_READY_S)
        for job in list(self.jobs.values()):
            if job.state != "serving" or job.end_time is None or job.successor:
                continue
            serve = self.spec.serve
            drain = serve.drain_timeout_s + DRAIN_SLACK_S
            if now >= handover_at(job.end_time, wait, ready, serve.handover_margin_s, drain) or job.ending:
                new = self.submit(
                    f"handover of {job.name}: its time limit is in {job.end_time - now:.0f}s (drain {drain:g}s + "
                    f"queue {wait:.0f}s + READY {ready:.0f}s + margin {serve.handover_margin_s:g}s)"
                    + (f"; {job.ending}" if job.ending else "")
                )
                if new is not None:
                    job.successor = new.name

    def autoscale(self, now: float) -> None:
        if not self.auto.max_replicas:
            return
        d = scale(self.rule, self.target, list(self.samples), now, self.last_up, self.last_down)
        if d is None:
            return
        up = d.target > self.target
        self.target = d.target
        if up:
            self.last_up = now
        else:
            self.last_down = now
        self.decide("scale_up" if up else "scale_down", d.reason, replicas=d.target)

    def reconcile(self) -> None:
        """Replica jobs to the target: more submitted; or fewer: the newest not serving yet cancelled first, then the
        least loaded serving ones drained, and last a job being handed over (its successor cancelled with it: the
        two count as one)."""
        have = self.capacity()
        for _ in range(self.target - len(have)):
            self.submit("scale up" if self.serving_since else "start")
        extra = len(have) - self.target
        if extra <= 0:
            return
        handing = {j.successor: j for j in self.live() if j.successor}  # successor's name -> the job it replaces
        waiting = sorted(
            (j for j in have if j.state != "serving" and j.name not in handing), key=lambda j: -j.submitted
        )
        serving = sorted((j for j in have if j.state == "serving"), key=lambda j: (j.in_flight, -j.submitted))
        pairs = [j for j in have if j.name in handing]
        why = f"scaled down to {self.target}"
        for job in (waiting + serving + pairs)[:extra]:
            if job.state == "serving":
                self.drain(job, why)
                continue
            self.cancel(job, why)
            old = handing.get(job.name)
            if old is not None:  # the job it was to replace goes too
                old.successor = ""
                self.drain(old, why)

    def cancel(self, job: ReplicaJob, why: str) -> None:
        job.asked_to_end = True
        self.decide("cancel", f"{job.name} (job {job.job_id}): {why} before it served")
        asyncio.get_running_loop().create_task(self.stop_job(job))

    async def measure(self, now: float) -> None:
        """The front end's counters (each replica's requests in flight, the members version every front-end process
        applied, its first-token histogram) and the signal serve.autoscale scales by."""
        if self.frontend is None:
            return
        page = await scrape.fetch(f"http://127.0.0.1:{self.frontend.cfg.metrics_port}/metrics/frontend")
        if page is None:
            return
        seen = scrape.parse(page)
        self.applied = int(seen.get(("llmlaunch_frontend_members_version", ""), 0))
        total = 0
        for job in self.jobs.values():
            if job.slot >= 0:
                job.in_flight = int(seen.get(("llmlaunch_frontend_in_flight", str(job.slot)), 0))
                total += job.in_flight
        self.in_flight = total
        serving = [j for j in self.jobs.values() if j.state == "serving"]
        buckets = first_tokens.buckets(seen)
        if buckets is not None:
            self.first_tokens.append((now, buckets))
        if not self.auto.max_replicas:
            return
        reading = Reading(
            now, total, len(serving), [j.metrics_url for j in serving if j.metrics_url], self.first_tokens,
            self.auto.window_s,
        )  # fmt: skip
        value = await READERS[self.auto.signal](reading)
        if value is None:
            return
        self.signal_now = value / max(len(serving), 1) if self.signal.shared else value
        self.samples.append((now, value, len(serving)))

    async def finish_drains(self, now: float) -> None:
        """A draining job leaves the members once every front-end process stopped sending it requests and none runs
        there, or at serve.drain_timeout_s (what still runs then moves mid-stream); then its job is stopped."""
        for job in self.jobs.values():
            if job.state != "draining" or job.slot < 0:
                continue
            idle = self.applied >= self.version and job.in_flight == 0
            if job.slot >= 0 and (idle or now - job.draining_since > self.spec.serve.drain_timeout_s):
                self.decide("leave", f"{job.name}: " + ("drained" if idle else "drain timeout, its streams move"))
                self.leave(job)
                if job.asked_to_end:
                    asyncio.get_running_loop().create_task(self.stop_job(job))

    async def stop_job(self, job: ReplicaJob) -> None:
        """Stop `job` (drained already, or not serving yet): SIGTERM to its steps, scancel if it does not end; once."""
        from launcher.schedulers.slurm_jobs import stop

        if job.stop_sent:
            return
        job.stop_sent = True
        code, text = await asyncio.get_running_loop().run_in_executor(None, lambda: stop(job.job_id, drain_s=15.0))
        log(text)

    # ------------------------------------------------------------------------------------------ lifetime
    async def main(self) -> int:
        from launcher.service.endpoint import Endpoint

        self.sdir.write_json(
            self.sdir.router_file,
            {
                "pid": os.getpid(),
                "host": self.host,
                "control_url": self.control_url,
                "job_id": os.environ.get("SLURM_JOB_ID", ""),
            },
        )
        server = await serve_control(
            "0.0.0.0",
            self.spec.serve.control_port,
            self.token,
            {
                "/register": self.on_register,
                "/deregister": self.on_deregister,
                "/ending": self.on_ending,
                "/scale": self.on_scale,
            },
            {"/metrics": lambda: metrics_text(self)},
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for s in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(s, stop.set)
        endpoint = Endpoint(self)
        endpoint.start_frontend()
        log(f"control API {self.control_url}; starting {self.target} replica job(s)")
        try:
            while not stop.is_set():
                await self.tick()
                if not self.serving_since and any(j.state == "serving" for j in self.jobs.values()):
                    await endpoint.publish()
                try:
                    await asyncio.wait_for(stop.wait(), TICK_S)
                except asyncio.TimeoutError:
                    pass
            await self.shutdown()
        finally:
            endpoint.stop()
            server.close()
        return 0

    async def shutdown(self) -> None:
        """llmlaunch-stop: every replica drained (running requests finish, up to serve.drain_timeout_s), then their
        jobs stopped; the endpoint is withdrawn first."""
        self.stopping = True
        self.serving_since = None
        self.sdir.run.clear_endpoint()
        log("stopping: draining every replica")
        for job in self.jobs.values():
            if job.state == "serving":
                self.drain(job, "the service stops")
            job.asked_to_end = True
        deadline = time.time() + self.spec.serve.drain_timeout_s + 5
        while any(j.state == "draining" and j.slot >= 0 for j in self.jobs.values()) and time.time() < deadline:
            await self.tick()
            await asyncio.sleep(TICK_S)
        live = [j for j in self.jobs.values() if j.state != "ended"]
        await asyncio.gather(*(self.stop_job(j) for j in live))
        write_status(self)
        log("stopped")


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m launcher.service RUN_DIR", file=sys.stderr)
        return 2
    return asyncio.run(Controller(argv[0]).main())
