"""A replica's server started again in place: when a one-rank replica's tritonserver dies while the job serves, its
rank (launcher/rank/rank.py) starts it again on the same node and ports instead of losing the replica, and rank 0's
front end routes to it again once its health probe answers (launcher/frontend/proxy.py)."""

from __future__ import annotations

import time
from typing import Optional

from launcher.logtext import log_excerpt
from launcher.rank.supervise import signal_text
from launcher.triton import ServerDied


def restart_in_place(rank, code: Optional[int]) -> bool:
    """The server of `rank` (a launcher.rank.rank.Rank, whose attributes say where it stands) died unasked with
    status `code` while the job serves: start it again on the same node and ports (the
    front end's health probe routes to it again once it is ready), up to serve.max_restarts times over the
    job, after 1, 2, 4, ... s.  True once it serves again; False where the replica is lost as before: a copy
    of several ranks (its other ranks' engines cannot follow a new one), a job not serving yet, a stop, or
    its restarts spent (the last failure's log tail goes into the lost record)."""
    spec, me, run = rank.spec, rank.me, rank.rundir
    limit = int(spec.serve.max_restarts)
    one_rank = sum(1 for r in spec.ranks if r.replica == me.replica) == 1
    if not one_rank or not run.serving(rank.ctx.token) or not limit:
        return False
    while rank.restarts < limit and not rank.stopped():
        rank.restarts += 1
        n, backoff = rank.restarts, min(2.0 ** (rank.restarts - 1), 30.0)
        doc = {
            "replica": me.replica,
            "rank": me.rank,
            "host": rank.topo.hostname,
            "restart": n,
            "max_restarts": limit,
            "exit_code": code,
            "reason": f"its server exited with status {signal_text(code)} unasked",
            "log_tail": log_excerpt(rank.log, 25),
            "time": time.time(),
            "ready_s": None,
        }
        run.write_restart(me.replica, n, doc)
        rank.say(f"replica {me.replica}: {doc['reason']}; restart {n} of {limit} in {backoff:.0f}s, same ports")
        deadline = time.monotonic() + backoff
        while time.monotonic() < deadline and not rank.stopped():
            time.sleep(0.1)
        rank.server.stop()  # the dead server's stubs and shm regions
        if rank.stopped():
            return False
        t0 = time.monotonic()
        rank.server = rank.make_server()
        rank.server.start()
        try:
            rank.server.wait_ready()
        except (ServerDied, TimeoutError) as e:
            code = rank.server.returncode()
            rank.say(f"replica {me.replica}: restart {n} did not serve: {e}")
            continue
        doc["ready_s"] = round(time.monotonic() - t0, 2)
        run.write_restart(me.replica, n, doc)
        rank.say(f"replica {me.replica} serves again: restart {n} READY in {doc['ready_s']:.1f}s")
        return True
    if not rank.stopped():
        rank.say(f"replica {me.replica}: serve.max_restarts={limit} spent; it is lost")
    return False
