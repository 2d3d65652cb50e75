"""A replica job of a service (serve.router=host|job, launcher/service/): its rank 0 registers with the router once
it serves, and deregisters when it drains, so the router stops sending it requests before its server goes. The
router refuses a job it did not submit, or one without the service's token: the rank then fails, naming the
router's reason.

Slurm's time-limit signal (serve.walltime_signal_s ahead, and up to a minute earlier than asked) does not drain such a
job at once: the router hands it over to a successor first and then stops it (SIGTERM, which drains at once), so
every rank keeps serving until the latest moment a drain still ends before the limit (`ServiceDrain`); rank 0 tells
the router that the signal came."""

from __future__ import annotations

import threading
import time

from launcher.handoff.registration import Refused, call, read_token, register
from launcher.ports import metrics_url
from launcher.service.policy import DRAIN_SLACK_S


class JoinRefused(RuntimeError):
    """The router refused this job, or could not be reached to register with: the job fails naming why."""


def join_service(rank) -> None:
    """Rank 0, serving: register with the router (raises where it refuses, or cannot be reached)."""
    link, ctx = rank.spec.service, rank.ctx
    body = {
        "name": link.name,
        "job_id": ctx.job_id,
        "host": rank.host,
        "grpc_port": int(ctx.ports["grpc_port"]),
        "metrics_url": metrics_url(rank.host, ctx.ports.get("metrics_port")),
        "ready_s": round(rank.waited, 2),
        "openai_port": rank.api.cfg.port if rank.api is not None else 0,
    }
    try:
        answer = register(link.url, link.token_file, body, say=rank.say)
    except Refused as e:
        raise JoinRefused(f"{e}; this job is not part of that service") from None
    except OSError as e:
        raise JoinRefused(f"the router at {link.url} cannot be reached to register: {e}") from None
    rank.say(f"registered with the router at {link.url} as {link.name}, slot {answer.get('slot')}")


def leave_service(rank, reason: str, wait: bool = False) -> None:
    """Rank 0 drains: tell the router, once. In the background from a signal handler (it must not wait on the
    network; the router also sees the job leave Slurm's queue); with `wait`, before the drain, and then long enough
    for the router's front end to stop routing here (SETTLE_S), so no request meets a server that stopped taking
    them."""
    if getattr(rank, "_left_service", False):
        return
    rank._left_service = True
    link = rank.spec.service

    def post() -> None:
        try:
            body = {"name": link.name, "job_id": rank.ctx.job_id, "reason": reason}
            call(link.url, read_token(link.token_file), "/deregister", body, 3.0)
            if wait:
                time.sleep(SETTLE_S)
        except (OSError, Refused) as e:
            rank.say(f"could not deregister from the router ({e}); it finds the job gone")

    if wait:
        post()
    else:
        threading.Thread(target=post, name="deregister", daemon=True).start()


# the router's front end follows its members file every 0.5 s (launcher/frontend/members.py): after a deregistration
# this long covers its polls and a request already on its way
SETTLE_S = 1.5


class ServiceDrain:
    """The time-limit signal of a service's replica job, deferred: each rank drains at its job's end less
    serve.drain_timeout_s (and DRAIN_SLACK_S), unless the router stopped it first."""

    @staticmethod
    def defers(rank, signum) -> bool:
        """True where `signum` is the time-limit signal and this rank now waits (a timer drains it later); any other
        signal cancels a waiting drain and is handled at once."""
        from launcher.procs.drain import DRAIN_SIGNAL

        timer = getattr(rank, "_drain_timer", None)
        if signum != DRAIN_SIGNAL:
            if timer is not None:
                timer.cancel()
            return False
        if timer is not None:  # the signal again while waiting: still waiting; the timer's own call: drain now
            return not getattr(rank, "_drain_now", False)
        wait = ServiceDrain.wait_s(rank)
        if wait <= 0:
            return False
        rank.say(f"the time-limit signal came: serving on for {wait:.0f}s while the router hands this job over")
        if rank.me.rank == 0:
            notify_router(rank, f"its time-limit signal came; it drains in {wait:.0f}s at the latest")

        def drain_now() -> None:
            rank._drain_now = True
            if rank.me.rank == 0:
                leave_service(rank, "its time limit nears", wait=True)
            else:
                time.sleep(SETTLE_S)  # rank 0's server stops taking requests first
            rank.on_signal(signum, None)

        rank._drain_timer = threading.Timer(wait, drain_now)
        rank._drain_timer.daemon = True
        rank._drain_timer.start()
        return True

    @staticmethod
    def wait_s(rank) -> float:
        """Seconds this rank may still serve: to its job's end (Slurm's EndTime) less the drain; where Slurm does not
        say, to the earliest the end can be (serve.walltime_signal_s after the signal) less the drain."""
        from launcher.readiness import slurm_time
        from launcher.schedulers.slurm_jobs import run_quiet

        serve = rank.spec.serve
        rc, out, _ = run_quiet(["squeue", "-h", "-j", str(rank.ctx.job_id), "-o", "%e"], timeout=5)
        end = slurm_time(out.strip().splitlines()[0]) if rc == 0 and out.strip() else None
        left = (end - time.time()) if end else float(serve.walltime_signal_s)
        return left - float(serve.drain_timeout_s) - DRAIN_SLACK_S


def notify_router(rank, reason: str) -> None:
    """Tell the router, in the background, that this job's time-limit signal came (its successor is due now)."""
    link = rank.spec.service

    def post() -> None:
        try:
            body = {"name": link.name, "job_id": rank.ctx.job_id, "reason": reason}
            call(link.url, read_token(link.token_file), "/ending", body, 3.0)
        except (OSError, Refused) as e:
            rank.say(f"could not tell the router ({e})")

    threading.Thread(target=post, name="ending", daemon=True).start()
