"""The members file (launcher/frontend/members.py) and what the front end does with it, without servers: the file
read and written whole, a change seen by one stat, the replica set applied to a Frontend (its replicas' channels
point at ports nothing listens on, so none becomes ready), prefix routing forgetting a slot, the /metrics text by slot,
the config's checks.  Against real tritonservers: tests/integration/test_frontend_members.py."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from launcher.frontend.members import (
    DEFAULT_SLOTS,
    DRAINING,
    MAX_SLOTS,
    Member,
    MembersFile,
    read_members,
    write_members,
)
from launcher.frontend.metrics import REPLICA_KEYS, members_text, metrics_text
from launcher.frontend.proxy import Frontend
from launcher.frontend.replica import Replica
from launcher.frontend.routing import PrefixRouting
from launcher.frontend.server import FrontendConfig
from launcher.frontend.workers import HEAD, _slot_index, _sum_shared, _width
from launcher.ports import free_port


def test_a_members_file_comes_back_as_written_and_a_missing_one_is_empty(tmp_path):
    path = tmp_path / "members.json"
    assert read_members(path) == (0, [])
    ms = [
        Member(0, "job 1", "10.0.0.1", 9001, "http://10.0.0.1:9003/metrics"),
        Member(3, "job 2", "10.0.0.2", 9001, state=DRAINING),
    ]
    write_members(path, ms, 7)
    assert read_members(path) == (7, ms)
    doc = json.loads(path.read_text())
    assert doc["version"] == 7 and doc["members"][1] == {
        "slot": 3,
        "name": "job 2",
        "host": "10.0.0.2",
        "port": 9001,
        "metrics_url": "",
        "kv_events": "",
        "state": "draining",
    }
    assert os.listdir(tmp_path) == ["members.json"]  # written whole: no temporary file left


@pytest.mark.parametrize(
    "text, named",
    [
        ("{", "not JSON"),
        ('{"version": "1", "members": []}', "version must be an integer"),
        ('{"members": [{"slot": 0, "name": "a", "host": "h"}]}', "members[0] lacks ['port']"),
        ('{"members": [{"slot": 0, "name": "a", "host": "h", "port": "1"}]}', "members[0].port must be an integer"),
        ('{"members": [{"slot": 0, "name": "a", "host": "h", "port": 1, "state": "gone"}]}', "state is 'gone'"),
        (
            '{"members": [{"slot": 1, "name": "a", "host": "h", "port": 1}, {"slot": 1, "name": "b", "host": "h", '
            '"port": 2}]}',
            "slot(s) [1] named by more than one member",
        ),
    ],
)
def test_a_wrong_members_file_is_refused_naming_what(tmp_path, text, named):
    path = tmp_path / "members.json"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        read_members(path)
    assert str(e.value).startswith(f"members file {path}: ") and named in str(e.value), str(e.value)


def test_a_follower_reads_the_file_once_a_change_and_keeps_the_set_where_it_cannot(tmp_path, capsys):
    path = tmp_path / "members.json"
    follower = MembersFile(str(path), slots=4)
    assert follower.poll() == (0, {})  # none yet
    assert follower.poll() is None  # unchanged: one stat
    write_members(path, [Member(0, "a", "h", 1), Member(4, "past", "h", 2)], 1)
    assert follower.poll() == (1, {0: Member(0, "a", "h", 1)})  # slot 4 of 4 slots: left out, said
    assert "past (h:2) names slot 4, out of 0..3 (FrontendConfig.slots): ignored" in capsys.readouterr().err
    assert follower.poll() is None
    path.write_text("{not json")
    assert follower.poll() is None
    said = capsys.readouterr().err
    assert "not JSON" in said and "the replica set stays as it was" in said, said


def test_the_front_end_applies_joins_drains_and_leaves_by_slot(tmp_path):
    """Replicas whose ports nobody listens on: they join (never ready), drain, leave, their slot reused; routing
    picks only from the serving ones, the message of a refusal says why of each, the snapshot is by slot."""
    path = tmp_path / "members.json"
    ports = [free_port() for _ in range(3)]

    async def main():
        fe = Frontend([], probe_interval_s=0, routing="prefix", members=MembersFile(str(path), 4, 0.05))
        await fe.start()
        try:
            assert fe.replicas == [] and fe.pick() is None
            assert fe.no_replica_message().startswith("no replica is up (no replica has registered yet: the members")
            write_members(path, [Member(1, "a", "127.0.0.1", ports[0]), Member(2, "b", "127.0.0.1", ports[1])], 1)
            assert fe.members.follow(fe) and fe.members.version == 1
            a, b = fe.replicas
            assert (a.index, a.label, a.up, a.joining) == (1, f"replica 1 (a 127.0.0.1:{ports[0]})", False, True)
            await asyncio.sleep(0.2)  # its first probe fails: not ready yet, no failure counted
            assert a.failures == 0 and "is not ready yet" in fe.no_replica_message()
            for r in (a, b):  # as if they had answered (nothing listens there): routed to
                r.up, r.joining, r.reason = True, False, ""
            assert fe.pick() in (a, b)
            fe.routing.sessions["s"] = 2
            write_members(
                path, [Member(1, "a", "127.0.0.1", ports[0], state=DRAINING), Member(2, "b", "127.0.0.1", ports[1])], 2
            )
            fe.members.follow(fe)
            assert a.draining and a.up and a.failures == 0 and fe.routed == [b]
            assert {fe.pick() for _ in range(4)} == {b}
            write_members(
                path, [Member(1, "a", "127.0.0.1", ports[0], state=DRAINING), Member(2, "c", "127.0.0.1", ports[2])], 3
            )
            fe.members.follow(fe)  # slot 2 to another server: b leaves, c joins there
            assert b.left and not b.up and b.failures == 0 and "s" not in fe.routing.sessions
            c = fe.replicas[1]
            assert (c.index, c.addr, c.joining) == (2, f"127.0.0.1:{ports[2]}", True)
            assert fe.pick() is a  # none else up: the draining one rather than an error
            a.mark_down("gone")
            assert fe.pick() is None
            snap = fe.snapshot()
            assert snap["members_version"] == 3 and len(snap["replicas"]) == 4
            assert snap["replicas"][1]["draining"] == 1 and snap["replicas"][0] == dict.fromkeys(REPLICA_KEYS, 0)
        finally:
            await fe.close()

    asyncio.run(main())


def test_a_request_with_no_replica_up_waits_for_one_that_joined_and_not_for_none(tmp_path):
    """A successor registers once READY: its first ready probe is a poll away, so a request that finds no replica up
    then waits for it (JOIN_WAIT_S at most) rather than failing; with none joining it is refused at once."""
    path = tmp_path / "members.json"

    async def main():
        fe = Frontend([], probe_interval_s=0, members=MembersFile(str(path), 2, 0.05))
        await fe.start()
        try:
            t0 = time.monotonic()
            assert await fe.pick_waiting(None) is None and time.monotonic() - t0 < 0.5  # none joining: at once
            write_members(path, [Member(0, "a", "127.0.0.1", free_port())], 1)
            fe.members.follow(fe)
            (a,) = fe.replicas
            waiting = asyncio.ensure_future(fe.pick_waiting(None))
            await asyncio.sleep(0.3)
            assert not waiting.done() and a.joining
            a.up, a.joining, a.reason = True, False, ""  # as if it answered its probe now (nothing listens there)
            assert await asyncio.wait_for(waiting, 2) is a
        finally:
            await fe.close()

    asyncio.run(main())


def test_prefix_routing_forgets_a_slot():
    reps = [Replica(i, "127.0.0.1", 9000 + i) for i in range(3)]
    policy = PrefixRouting()
    prompt = b"x" * 2048
    first = policy.pick(reps, (), prompt, "conv")
    assert all(mask == 1 << first.index for mask in policy.index.values()) and policy.sessions["conv"] == first.index
    policy._remember(list(policy.index)[:2], (first.index + 1) % 3)
    policy.forget(first.index)
    assert "conv" not in policy.sessions
    assert list(policy.index.values()) == [1 << (first.index + 1) % 3] * 2


def test_the_metrics_of_a_members_file_are_by_slot_with_names_and_the_fixed_list_text_is_unchanged():
    row = dict.fromkeys(REPLICA_KEYS, 0)
    snap = {"streams_active": 1, "rejected": 2, "members_version": 5, "replicas": [dict(row) for _ in range(4)]}
    snap["replicas"][2].update(in_flight=3, draining=1, up=1)
    text = members_text(snap, [Member(2, 'job "7"', "h", 1), Member(9, "past", "h", 2)])
    assert 'llmlaunch_frontend_in_flight{replica="2",name="job \\"7\\"",addr="h:1"} 3' in text
    assert 'llmlaunch_frontend_replica_draining{replica="2",name="job \\"7\\"",addr="h:1"} 1' in text
    assert "llmlaunch_frontend_members_version 5" in text and "past" not in text
    fixed = metrics_text({"streams_active": 0, "rejected": 0, "replicas": [row]}, ["h:1"])
    assert "draining" not in fixed and "members_version" not in fixed
    assert 'llmlaunch_frontend_replica_up{replica="0",addr="h:1"} 0' in fixed


def test_several_workers_counters_sum_but_version_and_draining_are_the_least():
    n, processes = 2, 2
    shared = [0] * (_width(n) * processes)
    for w, (version, draining) in enumerate([(4, 1), (3, 0)]):
        shared[w * _width(n) + HEAD.index("members_version")] = version
        shared[_slot_index(w, 1, "draining", n)] = draining
        shared[_slot_index(w, 1, "requests", n)] = 10
        shared[_slot_index(w, 1, "up", n)] = 1
    snap = _sum_shared(shared, processes, n)
    assert snap["members_version"] == 3 and snap["replicas"][1]["draining"] == 0
    assert snap["replicas"][1]["requests"] == 20 and snap["replicas"][1]["up"] == 1 and snap["replicas"][0]["up"] == 0


@pytest.mark.parametrize(
    "options, named",
    [
        (
            dict(replicas=[("h", 1)], slots=4),
            "FrontendConfig.slots is 4 without members: slots bounds a members file's replica set",
        ),
        (dict(members="m.json", slots=-1), "FrontendConfig.slots is -1: the members file's replicas take slots"),
        (
            dict(members="m.json", slots=MAX_SLOTS + 1),
            f"FrontendConfig.slots is {MAX_SLOTS + 1}: the members file's replicas take slots 0..slots-1, and the worker processes' shared counters hold every slot; give 1 to {MAX_SLOTS} (0 = {DEFAULT_SLOTS})",
        ),
        (dict(members="m.json", members_poll_s=0.0), "FrontendConfig.members_poll_s is 0.0"),
        (dict(members="m.json", routing="kv", tokenizer="t"), "FrontendConfig.routing is 'kv' with members"),
    ],
)
def test_the_config_checks_the_members_options(options, named):
    with pytest.raises(ValueError) as e:
        FrontendConfig(**{"replicas": [], **options})
    assert str(e.value).startswith(named), str(e.value)


def test_a_config_with_members_needs_no_replicas_and_sizes_by_slots():
    cfg = FrontendConfig([], members="m.json")
    assert cfg.slot_count == DEFAULT_SLOTS and FrontendConfig([], members="m.json", slots=3).slot_count == 3
    assert FrontendConfig.from_json(cfg.to_json()) == cfg
    assert FrontendConfig([("h", 1), ("h", 2)]).slot_count == 2
    with pytest.raises(ValueError, match="FrontendConfig.replicas is empty"):
        FrontendConfig([])
