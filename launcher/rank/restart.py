"""A replica's servers started again in place: when a replica's tritonserver dies while the job serves, its rank
(launcher/rank/rank.py) starts it again on the same node and ports instead of losing the replica, and rank 0's
front end routes to it again once its health probe answers (launcher/frontend/proxy.py).

A copy of several ranks (tp over ranks, with an engine whose ranks meet again: Engine.copy_restarts) restarts as a
whole: the first of its ranks to find its server dead asks for the copy's restart in the run dir
(replica_restart<R>_<K>.json, written once), every other rank of the copy sees the ask within a second, ends its own
server (whose group lost a peer) and joins; each starts its server again after the same backoff, the new servers
form the copy's group again, and the leader's READY is the copy's."""

from __future__ import annotations

import time
from typing import Optional

from launcher.logtext import log_excerpt
from launcher.rank.supervise import signal_text
from launcher.triton import ServerDied


def copy_ranks(rank) -> list:
    """The ranks of `rank`'s replica (its model copy)."""
    return [r.rank for r in rank.spec.ranks if r.replica == rank.me.replica]


# how long a worker whose server ended before the job serves waits for its leader's ask to restart the copy
# (restart_on_fresh_ports): its group breaks as the leader's server exits, which it may see before the leader does
STARTUP_ASK_WAIT_S = 10.0


def restartable(rank) -> bool:
    """Whether `rank`'s replica may restart in place at all: serve.max_restarts allows, it is one rank or a copy
    whose engine meets again (Engine.copy_restarts), and the job serves, or, before it does, the copy's leader
    asked for its restart because a port was taken (`restart_on_fresh_ports`)."""
    spec, whole = rank.spec, len(copy_ranks(rank)) > 1
    if not int(spec.serve.max_restarts) or (whole and not rank.edef.copy_restarts):
        return False
    return rank.rundir.serving(rank.ctx.token) or (whole and _startup_ask(rank))


def _startup_ask(rank) -> bool:
    """Whether the leader of `rank`'s copy asked for its next restart while starting (the ask's `startup`), waiting
    up to STARTUP_ASK_WAIT_S for it."""
    deadline = time.monotonic() + STARTUP_ASK_WAIT_S
    while True:
        doc = rank.rundir.read_restart(rank.me.replica, rank.restarts + 1)
        if doc is not None:
            return bool(doc.get("startup"))
        if time.monotonic() >= deadline or rank.stopped():
            return False
        time.sleep(0.2)


def _backoff(n: int) -> float:
    """Seconds before restart `n` (1, 2, 4, ... up to 30): every rank of a copy waits the same before it starts."""
    return min(2.0 ** (n - 1), 30.0)


def _sleep(rank, seconds: float) -> None:
    """Wait `seconds`, or until `rank` is asked to stop."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not rank.stopped():
        time.sleep(0.1)


def _restart_doc(rank, n: int, code: Optional[int], reason: str) -> dict:
    """The record of restart `n` of `rank`'s replica (replica_restart<R>_<n>.json; its ready_s once it serves)."""
    return {
        "replica": rank.me.replica,
        "rank": rank.me.rank,
        "ranks": copy_ranks(rank),
        "host": rank.topo.hostname,
        "restart": n,
        "max_restarts": int(rank.spec.serve.max_restarts),
        "exit_code": code,
        "reason": reason,
        "log_tail": log_excerpt(rank.log, 25),
        "time": time.time(),
        "ready_s": None,
    }


def restart_on_fresh_ports(rank, why: str) -> None:
    """A leader whose server could not bind a port while starting (Rank.wait_ready), its ports picked again: its
    server starts again on them.  In a copy of several ranks its engine's group breaks with it, so the leader asks
    for the copy's restart first (the ask's `startup`: the job does not serve yet), and its workers join as they do
    at serving time (`restart_in_place`); a copy that cannot restart (Engine.copy_restarts, serve.max_restarts=0,
    or the job's only replica: one-replica jobs restart nothing in place) fails as its workers find their group
    gone."""
    me, ranks, spec = rank.me, copy_ranks(rank), rank.spec
    whole = len(ranks) > 1 and spec.replicas > 1 and rank.edef.copy_restarts and rank.restarts < spec.serve.max_restarts
    backoff = 0.0
    if whole:
        rank.restarts += 1
        n, backoff = rank.restarts, _backoff(rank.restarts)
        doc = {**_restart_doc(rank, n, rank.server.returncode(), why), "startup": True}
        rank.rundir.claim_restart(me.replica, n, doc)
        why = f"replica {me.replica} (ranks {ranks}, as a whole): {why}; restart {n} in {backoff:.0f}s"
    rank.say(why)
    rank.server.stop()
    _sleep(rank, backoff)  # the workers start their servers after the same backoff
    rank.server = rank.make_server()
    rank.server.start()


def restart_in_place(rank, code: Optional[int], asked: bool = False) -> bool:
    """The server of `rank` (a launcher.rank.rank.Rank, whose attributes say where it stands) died unasked with
    status `code` while the job serves, or (`asked`) another rank of its copy asked for the copy's restart and this
    rank ended its server: start it again on the same node and ports (the front end's health probe routes to it
    again once it is ready), up to serve.max_restarts times over the job, after 1, 2, 4, ... s.  True once it serves
    again; False where the replica is lost as before: a copy whose engine cannot meet again, a job not serving yet
    (unless the copy's leader asked while starting: `restart_on_fresh_ports`), a stop, or its restarts spent (the
    last failure's log tail goes into the lost record).  A one-rank replica tries again while restarts are left; a
    copy tries once a failure (its ranks would have to agree on each try)."""
    spec, me, run = rank.spec, rank.me, rank.rundir
    limit = int(spec.serve.max_restarts)
    if not restartable(rank):
        return False
    ranks = copy_ranks(rank)
    whole = len(ranks) > 1
    while rank.restarts < limit and not rank.stopped():
        rank.restarts += 1
        n, backoff = rank.restarts, _backoff(rank.restarts)
        doc = _restart_doc(
            rank, n, code, f"the server of rank {me.rank} exited with status {signal_text(code)} unasked"
        )
        joins = ""
        if whole:
            if asked or not run.claim_restart(me.replica, n, doc):  # another rank of the copy asked first
                doc = run.read_restart(me.replica, n) or doc
                joins = f"; rank {me.rank} joins"
        else:
            run.write_restart(me.replica, n, doc)
        what = f"replica {me.replica}" + (f" (ranks {ranks}, as a whole)" if whole else "")
        rank.say(f"{what}: {doc['reason']}{joins}; restart {n} of {limit} in {backoff:.0f}s, same ports")
        _sleep(rank, backoff)
        rank.server.stop()  # the dead server's stubs and shm regions (a joining rank's ended server's)
        if rank.stopped():
            return False
        t0 = time.monotonic()
        rank.server = rank.make_server()
        rank.server.start()
        if me.role != "leader":  # a worker's server serves its leader; the leader's READY is the copy's
            rank.say(f"replica {me.replica}: restart {n} started; its leader's READY says the copy serves")
            return True
        try:
            rank.server.wait_ready()
        except (ServerDied, TimeoutError) as e:
            code = rank.server.returncode()
            rank.say(f"replica {me.replica}: restart {n} did not serve: {e}")
            if whole:
                return False
            continue
        doc["ready_s"] = round(time.monotonic() - t0, 2)
        run.write_restart(me.replica, n, doc)
        rank.say(f"replica {me.replica} serves again: restart {n} READY in {doc['ready_s']:.1f}s")
        return True
    if not rank.stopped():
        rank.say(f"replica {me.replica}: serve.max_restarts={limit} spent; it is lost")
    return False
