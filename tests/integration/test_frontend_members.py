"""The front end following a members file (launcher/frontend/members.py) against real tritonservers: replicas join,
drain, leave and give their slot to another server while it serves, in one process and in two worker processes.

The two tritonservers on the fixture models (launcher/testing/models: frontend_marker streams " <tag><i>" tokens,
frontend_echo answers "<tag>:<text>") and the `Front` helper are tests/integration/test_frontend.py's; the front end
starts here with an empty members file and the test writes the file as the service's controller does.
frontend_marker cannot continue a request elsewhere, so a stream of a replica that leaves ends with the replica's
error (as test_frontend.py's dying replicas' do)."""

from __future__ import annotations

import time
import urllib.request

import pytest

from launcher.frontend.members import DRAINING, Member, write_members
from tests.integration import test_frontend as tf
from tests.integration.test_frontend import Front, contract_inputs, submit_all, until

pytestmark = [pytest.mark.triton, pytest.mark.timeout(300)]

backend_pool = tf.backend_pool  # the module's two tritonservers, shared by every test here
backends = tf.backends  # each checked to be running (restarted where one exited) before a test

POLL_S = 0.2  # members_poll_s of these front ends


class Members:
    """The members file as the controller keeps it: each write a new version."""

    def __init__(self, path):
        self.path, self.version = path, 0

    def write(self, *members: Member) -> int:
        self.version += 1
        write_members(self.path, members, self.version)
        return self.version


def member(b, slot: int, state: str = "serving") -> Member:
    return Member(slot, b.name, "127.0.0.1", b.port, state=state)


def members_front(tmp_path, processes: int = 1):
    """(the members file, empty; a Front following it)."""
    file = Members(tmp_path / "members.json")
    file.write()
    fe = Front([], processes, 0.3, members=str(file.path), slots=4, members_poll_s=POLL_S)
    return file, fe


def applied(fe, version: int, up=(), gone=()):
    """Until /metrics says every worker applied `version`, the slots `up` are routed to and the slots `gone` are not
    shown; returns the metrics."""

    def check():
        m = fe.metrics()
        ok = m.get(("llmlaunch_frontend_members_version", None)) == version
        ok = ok and all(m.get(("llmlaunch_frontend_replica_up", s)) == 1 for s in up)
        return m if ok and all(("llmlaunch_frontend_replica_up", s) not in m for s in gone) else None

    return until(check, 10, f"members version {version} applied (slots {list(up)} up, {list(gone)} gone)")


def run(url: str, ids, max_tokens: int = 3, delay_ms: int = 1):
    """frontend_marker requests on one stream, each waited for; their records."""
    stream, recs = submit_all(url, "frontend_marker", ids, max_tokens, {"inter_token_delay_ms": delay_ms})
    for r in recs:
        stream.wait(r, timeout=60)
    stream.close()
    return recs


def long_streams(fe, ids, max_tokens: int):
    """Requests of `max_tokens` tokens 20 ms apart on one stream, returned once each has streamed a few."""
    stream, recs = submit_all(fe.url, "frontend_marker", ids, max_tokens, {"inter_token_delay_ms": 20})
    until(lambda: all(len(r.times) >= 3 for r in recs), 60, "every request to stream")
    return stream, recs


def test_an_empty_members_file_refuses_requests_clearly_until_a_replica_registers(backends, tmp_path):
    import tritonclient.grpc as grpcclient

    file, fe = members_front(tmp_path)
    with fe:
        (rec,) = run(fe.url, ["early"])
        assert rec.error.startswith("no replica is up (no replica has registered yet: the members file "), rec.error
        c = grpcclient.InferenceServerClient(fe.url)
        try:
            assert c.is_server_live() and not c.is_server_ready()
            with pytest.raises(Exception, match="no replica has registered yet"):
                c.infer("frontend_echo", contract_inputs("x", 1)[:1])
            m = fe.metrics()
            assert m[("llmlaunch_frontend_members_version", None)] == 1
            assert m[("llmlaunch_frontend_rejected_total", None)] == 2
            assert not [k for k in m if isinstance(k[1], int)], m  # no slot in use: no replica's lines
            # one replica registers; one naming a slot past `slots` (4) is logged and left out, never a crash
            t0 = time.monotonic()
            file.write(member(backends[0], 0), member(backends[1], 9))
            applied(fe, 2, up=[0], gone=[9])
            assert time.monotonic() - t0 < 4 * POLL_S + 2, "not applied within a couple of poll periods"
            recs = run(fe.url, [f"reg{i}" for i in range(4)])
            assert [(r.error, r.text) for r in recs] == [("", " r00 r01 r02")] * 4
            assert c.is_server_ready() and c.is_model_ready("frontend_echo")
            assert (
                c.infer("frontend_echo", contract_inputs("u", 1)[:1]).as_numpy("text_output").reshape(-1)[0] == b"r0:u"
            )
        finally:
            c.close()


def test_a_second_member_takes_its_share_of_the_load(backends, tmp_path):
    file, fe = members_front(tmp_path)
    with fe:
        file.write(member(backends[0], 0))
        applied(fe, 2, up=[0])
        run(fe.url, ["one0", "one1"])
        file.write(member(backends[0], 0), member(backends[1], 2))
        m = applied(fe, 3, up=[0, 2])
        before = [m[("llmlaunch_frontend_requests_total", s)] for s in (0, 2)]
        assert before == [2, 0], before
        # 8 requests in flight together: least outstanding spreads them over both
        recs = run(fe.url, [f"two{i}" for i in range(8)], max_tokens=10, delay_ms=20)
        assert [r.error for r in recs if r.error] == []
        assert {r.text[:3] for r in recs} == {" r0", " r1"}
        m = fe.metrics()
        assert [m[("llmlaunch_frontend_requests_total", s)] for s in (0, 2)] == [6, 4]
        text = urllib.request.urlopen(f"http://127.0.0.1:{fe.metrics_port}/metrics", timeout=10).read().decode()
        assert f'llmlaunch_frontend_in_flight{{replica="2",name="r1",addr="127.0.0.1:{backends[1].port}"}} 0' in text
        assert 'llmlaunch_frontend_replica_draining{replica="0",name="r0",' in text
        # what a service's router reads each second: the same counters, no replica's engine asked
        own = urllib.request.urlopen(f"http://127.0.0.1:{fe.metrics_port}/metrics/frontend", timeout=10).read()
        assert f'llmlaunch_frontend_in_flight{{replica="2",name="r1",addr="127.0.0.1:{backends[1].port}"}} 0' in (
            own.decode()
        )
        assert set(own.decode().splitlines()) <= set(text.splitlines())


def test_a_draining_member_finishes_its_streams_and_gets_no_new_request(backends, tmp_path):
    file, fe = members_front(tmp_path)
    with fe:
        file.write(member(backends[0], 0), member(backends[1], 1))
        applied(fe, 2, up=[0, 1])
        ids = [f"drain{i}" for i in range(8)]
        stream, recs = long_streams(fe, ids, 80)
        on = backends[1].marked("start") & set(ids)
        assert len(on) == 4, on
        file.write(member(backends[0], 0), member(backends[1], 1, DRAINING))
        m = applied(fe, 3, up=[0, 1])
        assert m[("llmlaunch_frontend_replica_draining", 1)] == 1 and m[("llmlaunch_frontend_in_flight", 1)] == 4
        # new requests, while the drained one's streams run: all on the other
        later = run(fe.url, [f"after{i}" for i in range(6)])
        assert [(r.error, r.text[:3]) for r in later] == [("", " r0")] * 6
        assert not backends[1].marked("start") & {f"after{i}" for i in range(6)}
        for r in recs:
            stream.wait(r, timeout=60)
        stream.close()
        assert [(r.error, r.output_tokens) for r in recs] == [("", 80)] * 8  # each stream whole, every token
        until(lambda: fe.metrics()[("llmlaunch_frontend_in_flight", 1)] == 0, 10, "the draining replica to be idle")
        m = fe.metrics()
        assert m[("llmlaunch_frontend_requests_total", 1)] == 4 and m[("llmlaunch_frontend_errors_total", 1)] == 0
        assert m[("llmlaunch_frontend_replica_failures_total", 1)] == 0 and m[("llmlaunch_frontend_replica_up", 1)] == 1
        assert m[("llmlaunch_frontend_replica_draining", 1)] == 1 and m[("llmlaunch_frontend_replica_draining", 0)] == 0
        time.sleep(0.7)  # two health probes later it is still out of routing
        assert {r.text[:3] for r in run(fe.url, ["late0", "late1"])} == {" r0"}


def test_a_member_removed_with_running_streams_ends_them_naming_it_and_the_other_serves_on(backends, tmp_path):
    file, fe = members_front(tmp_path)
    gone = backends[1]
    with fe:
        file.write(member(backends[0], 0), member(gone, 1))
        applied(fe, 2, up=[0, 1])
        ids = [f"rm{i}" for i in range(8)]
        stream, recs = long_streams(fe, ids, 150)
        on = gone.marked("start") & set(ids)
        assert len(on) == 4, on
        file.write(member(backends[0], 0))
        until(lambda: all(r.done for r in recs if r.request_id in on), 10, "the removed replica's streams to end")
        failed = {r.request_id: r.error for r in recs if r.error}
        assert set(failed) == on, failed
        for err in failed.values():  # its failure, and why the request could not move (the fixture cannot continue)
            assert err.startswith(f"replica 1 (r1 127.0.0.1:{gone.port}) failed: it left the service (the members "), (
                err
            )
            assert "could not move to another replica" in err, err
        # the backend streams were cancelled: the replica's model saw each of its requests cancelled
        until(lambda: gone.marked("cancelled") >= on, 30, "the removed replica's models to see the cancellation")
        m = applied(fe, 3, up=[0], gone=[1])
        assert m[("llmlaunch_frontend_replica_failures_total", 0)] == 0
        for r in recs:
            stream.wait(r, timeout=60)
        stream.close()
        assert all(r.output_tokens == 150 for r in recs if r.request_id not in on)
        later = run(fe.url, [f"rest{i}" for i in range(4)])
        assert [(r.error, r.text[:3]) for r in later] == [("", " r0")] * 4


def test_a_slot_given_to_another_server_routes_there_on_the_same_client_stream(backends, tmp_path):
    from launcher.client.request import Generation, build_request
    from launcher.client.stream import TritonStream

    file, fe = members_front(tmp_path)
    with fe:
        file.write(member(backends[0], 0))
        applied(fe, 2, up=[0])
        stream = TritonStream(fe.url)
        first = stream.submit(
            build_request("frontend_marker", Generation("x", max_tokens=400), "reuse0", {"inter_token_delay_ms": 20})
        )
        until(lambda: len(first.times) >= 3, 60, "the first request to stream")
        file.write(member(backends[1], 0))  # slot 0: the other server now
        stream.wait(first, timeout=30)
        assert first.error.startswith(
            f"replica 0 (r0 127.0.0.1:{backends[0].port}) failed: it left the service "
            f"(its slot 0 went to r1 127.0.0.1:{backends[1].port})"
        ), first.error
        m = applied(fe, 3, up=[0])
        assert m[("llmlaunch_frontend_requests_total", 0)] == 0  # the slot's counters are the new replica's
        # the same client stream (its backend stream to slot 0 was the old server's): a fresh one to the new server
        second = stream.submit(build_request("frontend_marker", Generation("x", max_tokens=3), "reuse1"))
        stream.wait(second, timeout=30)
        stream.close()
        assert (second.error, second.text) == ("", " r10 r11 r12")
        text = urllib.request.urlopen(f"http://127.0.0.1:{fe.metrics_port}/metrics", timeout=10).read().decode()
        assert (
            f'llmlaunch_frontend_requests_total{{replica="0",name="r1",addr="127.0.0.1:{backends[1].port}"}} 1' in text
        )


def test_two_worker_processes_each_follow_the_file(backends, tmp_path):
    import subprocess
    import sys

    file, fe = members_front(tmp_path, processes=2)
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "import tritonclient.grpc as g, numpy as np\n"
        "c = g.InferenceServerClient(sys.argv[1])\n"
        "t = g.InferInput('text_input', [1, 1], 'BYTES'); t.set_data_from_numpy(np.array([[b'u']], dtype=object))\n"
        "print(' '.join(c.infer('frontend_echo', [t]).as_numpy('text_output').reshape(-1)[0].decode()[:2] for _ in range(4)))\n"
    ) % (str(tf.ROOT),)

    def tags() -> set:
        """What 6 client processes (connections the kernel spreads over the workers) were answered by."""
        procs = [subprocess.Popen([sys.executable, "-c", code, fe.url], stdout=subprocess.PIPE) for _ in range(6)]
        outs = [p.communicate(timeout=120)[0].decode().split() for p in procs]
        assert [p.returncode for p in procs] == [0] * 6
        return set().union(*outs)

    with fe:
        file.write(member(backends[0], 0), member(backends[1], 3))
        m = applied(fe, 2, up=[0, 3])  # the lowest version any worker applied: both did
        assert m[("llmlaunch_frontend_processes", None)] == 2
        assert tags() == {"r0", "r1"}
        file.write(member(backends[0], 0), member(backends[1], 3, DRAINING))
        m = applied(fe, 3)  # each worker publishes its version and its draining gauge together
        assert m[("llmlaunch_frontend_replica_draining", 3)] == 1 and m[("llmlaunch_frontend_replica_up", 3)] == 1
        assert tags() == {"r0"}
        m = fe.metrics_counting(48, (0, 3))
        assert m[("llmlaunch_frontend_replica_failures_total", 3)] == 0
