"""The members file: the replica set of a front end whose replicas come and go (separate Slurm jobs that register when
ready, drain at a handover, are replaced when they fail).  A controller owns the set and writes it whole
(`write_members`); every front-end process follows it while it serves (`MembersFile`, FrontendConfig.members).

    {"version": 7, "members": [{"slot": 0, "name": "job 1234", "host": "10.0.0.5", "port": 9001,
                                "metrics_url": "http://10.0.0.5:9003/metrics", "kv_events": "", "state": "serving"}]}

A member's slot is its replica index while it is a member (the shared-memory counters, /metrics' `replica` label,
prefix routing's index are all by slot); a freed slot may go to a later replica.  `serving`: routed to; `draining`:
no new request goes to it, its running requests go on to their end, it stays connected until the file leaves it out.
A member the file leaves out (or whose slot names another host:port now) is closed: its running streams end as if
its replica failed (launcher/frontend/session.py moves or ends them).  The version is the controller's count of
changes: /metrics' llmlaunch_frontend_members_version says which one every worker process has applied.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from launcher.frontend.wire import log

SERVING, DRAINING = "serving", "draining"
STATES = (SERVING, DRAINING)
DEFAULT_SLOTS = 16  # FrontendConfig.slots 0: the most replicas at once
MAX_SLOTS = 1024  # a bound on FrontendConfig.slots (the shared counters hold every slot of every worker)
DEFAULT_POLL_S = 0.5  # FrontendConfig.members_poll_s: how often each process looks at the file


@dataclass(frozen=True)
class Member:
    """One replica of the set: where its tritonserver listens, what logs and metrics call it, whether it is routed to."""

    slot: int  # 0 <= slot < FrontendConfig.slots: its stable index while it is a member (reused after it leaves)
    name: str  # what logs and metrics call it, e.g. "job 1234"
    host: str
    port: int  # its tritonserver's gRPC port
    metrics_url: str = ""  # its tritonserver's metrics URL ("" none): /metrics shows its engine's prompt tokens
    kv_events: str = ""  # its engine's KV-cache events endpoint ("" none)
    state: str = SERVING  # serving (routed to) | draining (no new request; running ones go on)

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


_TYPES = {"slot": int, "name": str, "host": str, "port": int, "metrics_url": str, "kv_events": str, "state": str}
_REQUIRED = ("slot", "name", "host", "port")


def write_members(path, members: Sequence[Member], version: int) -> None:
    """Write the set whole: a temporary file in the same folder renamed over `path` (os.replace), so a reader sees the
    old file or the new one, never half of one."""
    path = os.fspath(path)
    folder, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(folder, f".{base}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump({"version": int(version), "members": [asdict(m) for m in members]}, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def read_members(path) -> Tuple[int, List[Member]]:
    """(version, members) of the file at `path`; (0, []) where there is none.  Raises ValueError naming the file and
    what is wrong where it is not a members file (not JSON, a field missing or of another type, an unknown state, two
    members in one slot)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return 0, []
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"members file {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("members", []), list):
        raise ValueError(f'members file {path}: not {{"version": N, "members": [...]}}')
    version = data.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"members file {path}: version must be an integer, got {json.dumps(version)}")
    members = [_member(path, i, entry) for i, entry in enumerate(data.get("members", []))]
    slots = [m.slot for m in members]
    twice = sorted({s for s in slots if slots.count(s) > 1})
    if twice:
        raise ValueError(f"members file {path}: slot(s) {twice} named by more than one member")
    return version, members


def _member(path, i: int, entry) -> Member:
    """Entry `i` of the file's members, checked field by field."""
    where = f"members file {path}: members[{i}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be an object of {sorted(_TYPES)}")
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise ValueError(f"{where} lacks {missing}")
    for key, tp in _TYPES.items():
        value = entry.get(key)
        if key in entry and (not isinstance(value, tp) or isinstance(value, bool)):
            raise ValueError(f"{where}.{key} must be {'an integer' if tp is int else 'a string'}, got {value!r}")
    if entry.get("state", SERVING) not in STATES:
        raise ValueError(f"{where}.state is {entry['state']!r}: one of {', '.join(STATES)}")
    return Member(**{k: v for k, v in entry.items() if k in _TYPES})


class MembersFile:
    """One front-end process's view of the members file: `follow(fe)` looks whether the file changed (its inode, size
    and mtime: one stat while it did not) and applies a change to the Frontend (launcher/frontend/proxy.py), one log
    line per replica that joins, drains, serves again or leaves.  A file that cannot be read is logged and leaves the
    set as it was, a member whose slot is out of range is logged and left out: the front end never fails for the
    file (each is logged once a change of the file, as it is read once a change)."""

    def __init__(self, path: str, slots: int = 0, poll_s: float = DEFAULT_POLL_S):
        self.path = path
        self.slots = slots or DEFAULT_SLOTS
        self.poll_s = poll_s
        self.version = 0  # the version applied
        self.applied: Dict[int, Member] = {}  # slot -> the member applied there (what /metrics labels)
        self._seen: Optional[tuple] = ()  # the file's (inode, size, mtime) when last read; None: there was none

    def poll(self) -> Optional[Tuple[int, Dict[int, Member]]]:
        """(version, slot -> member) where the file changed since the last poll, else None (also where it cannot be
        read: logged, the set stays)."""
        try:
            st = os.stat(self.path)
            seen: Optional[tuple] = (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            seen = None
        if seen == self._seen:
            return None
        self._seen = seen
        try:
            version, members = read_members(self.path)
        except (OSError, ValueError) as e:
            log(f"{e}: the replica set stays as it was")
            return None
        wanted = {}
        for m in members:
            if 0 <= m.slot < self.slots:
                wanted[m.slot] = m
            else:
                log(
                    f"members file {self.path}: {m.name} ({m.addr}) names slot {m.slot}, out of 0..{self.slots - 1} "
                    "(FrontendConfig.slots): ignored; give it a free slot below slots, or raise slots"
                )
        return version, wanted

    def members(self) -> List[Member]:
        """The set as the file says now (for a process that only reads it: the parent of several workers labelling
        their counters)."""
        got = self.poll()
        if got is not None:
            self.version, self.applied = got[0], got[1]
        return [self.applied[s] for s in sorted(self.applied)]

    def follow(self, fe) -> bool:
        """Apply the file to `fe` where it changed; True where it did."""
        got = self.poll()
        if got is None:
            return False
        version, wanted = got
        self.apply(fe, wanted)
        self.version = version
        return True

    def apply(self, fe, wanted: Dict[int, Member]) -> None:
        """Make fe's replicas the members `wanted` (slot -> member)."""
        for rep in list(fe.replicas):
            m = wanted.get(rep.index)
            if m is None:
                fe.remove_replica(rep, f"the members file {self.path} no longer names it")
            elif m.addr != rep.addr:
                fe.remove_replica(rep, f"its slot {rep.index} went to {m.name} {m.addr}")
        for slot in sorted(wanted):
            m = wanted[slot]
            rep = next((r for r in fe.replicas if r.index == slot), None)
            if rep is None:
                fe.add_replica(slot, m.name, m.host, m.port, m.state == DRAINING)
            elif (m.state == DRAINING) != rep.draining:
                fe.set_draining(rep, m.state == DRAINING)
            if rep is not None and m.name != rep.name:
                rep.rename(m.name)
        if not wanted and self.applied:
            log(f"members file {self.path} names no replica: requests are refused until one registers")
        self.applied = wanted
