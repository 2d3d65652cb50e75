"""Real Slurm launches on the local multi-node cluster (llmlaunch-localslurm): submitit submission,
one tritonserver per rank under srun --mpi=pmix, rendezvous, endpoint, status, fail-fast, a lost replica, stop."""

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.cli import plan
from launcher.errors import LaunchError
from launcher.rundir import RunDir
from tests.slurm_fixture import NOT_ROOT_REASON

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason=NOT_ROOT_REASON),
    pytest.mark.timeout(600),
]


def launch(tmp_path, *overrides):
    from launcher.schedulers import slurm

    cfg, spec = plan(
        [
            "cluster=local_slurm",
            "engine=hf",
            "model=tiny",
            f"cluster.jobs_dir={tmp_path}",
            "serve.ready_timeout_s=240",
            *overrides,
        ]
    )
    from launcher.models import resolve_model

    spec = resolve_model(spec)
    job, run = slurm.submit(spec, str(tmp_path / f"run{time.monotonic_ns()}"))
    ep = slurm.follow(job.job_id, run, spec, 300)
    return spec, job.job_id, run, ep


def greedy(url, model, prompt="The capital of France is", n=8):

    import numpy as np
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(url.replace("grpc://", ""))
    try:
        inputs = []
        for name, dt, val in (
            ("text_input", "BYTES", np.array([[prompt.encode()]], dtype=object)),
            ("max_tokens", "INT32", np.array([[n]], dtype=np.int32)),
        ):
            t = grpcclient.InferInput(name, [1, 1], dt)
            t.set_data_from_numpy(val)
            inputs.append(t)
        import queue

        q = queue.Queue()
        c.start_stream(callback=lambda result=None, error=None: q.put((result, error)))
        c.async_stream_infer(model, inputs, enable_empty_final_response=True)
        text, counts = "", None
        while True:
            r, e = q.get(timeout=60)
            assert e is None, e
            arr = r.as_numpy("text_output")
            if arr is not None and arr.size:
                text += b"".join(arr.reshape(-1)).decode(errors="replace")
            if r.as_numpy("output_tokens") is not None:
                counts = int(r.as_numpy("output_tokens").reshape(-1)[0])
            if r.get_response().parameters["triton_final_response"].bool_param:
                break
        c.stop_stream()
        return text, counts
    finally:
        c.close()


def stop(job_id):
    from launcher.schedulers import slurm_jobs

    code, msg = slurm_jobs.stop(job_id)
    assert code == 0, msg
    return msg


def stop_drained(job_id):
    """llmlaunch-stop drains the job (no fallback to a plain scancel): it ends COMPLETED 0:0 in sacct."""
    msg = stop(job_id)
    assert "its ranks drained and exited" in msg, msg
    assert sacct_end(job_id) == ("COMPLETED", "0:0")


def prefixes_of(job_id):
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return sorted(
        {
            ln.split("shm-region-prefix-name=")[1].split()[0]
            for ln in out.splitlines()
            if f"shm-region-prefix-name=llm{job_id}r" in ln and "bin/tritonserver" in ln
        }
    )


def assert_shm_gone(job_id, timeout=30):
    """No shm region of the job is left within `timeout` s (the sbatch teardown step removes what killed ranks could not)."""
    deadline = time.monotonic() + timeout
    while glob.glob(f"/dev/shm/llm{job_id}r*") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert glob.glob(f"/dev/shm/llm{job_id}r*") == []


def wait_log(path, *needles, timeout=30):
    """The rank log at `path` holds every one of `needles` within `timeout` s. A rank says what it did only after
    its server has exited and it has cleaned up after it (server.stop), which on a busy 2-core machine comes a
    while after the server left the process table; srun forwards the line later still."""
    deadline = time.monotonic() + timeout
    while True:
        text = path.read_text(errors="replace") if path.exists() else ""
        if all(n in text for n in needles):
            return text
        assert time.monotonic() < deadline, (
            f"{path} lacks {[n for n in needles if n not in text]} after {timeout} s; it ends:\n{text[-3000:]}"
        )
        time.sleep(0.5)


ACTIVE = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")


def sacct_end(job_id, timeout=60):
    """(State, ExitCode) of the job in Slurm's accounting once it has ended: slurmdbd takes the final
    record a few seconds after the job left the queue."""
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode"], capture_output=True, text=True
        ).stdout.strip()
        state, _, code = (out.splitlines() or [""])[0].partition("|")
        state = state.split(" ")[0]  # "CANCELLED by 0"
        if state and state not in ACTIVE:
            return state, code
        assert time.monotonic() < deadline, f"job {job_id}: sacct still says {out!r} after {timeout} s"
        time.sleep(0.5)


def assert_failed_in_sacct(job_id):
    state, code = sacct_end(job_id)
    assert state == "FAILED" and code.split(":")[0] != "0", (state, code)


def assert_serves_on(ep, job_id, run):
    """After a replica loss: new requests succeed through the front end and the job still runs, with no failure record."""
    from launcher.client.request import Generation
    from launcher.client.stream import generate
    from launcher.schedulers import slurm_jobs

    for i in range(4):
        rec = generate(ep.url, ep.model, Generation(f"Still here {i}", max_tokens=5, ignore_eos=True))
        assert not rec.error and rec.output_tokens == 5, rec.error
    assert slurm_jobs.queue_state(job_id)[0] == "RUNNING" and not list(run.glob("failure_rank*.json"))


def test_tp1_serves_through_rank0_and_stops_clean(local_slurm, tmp_path):
    spec, job_id, run, ep = launch(tmp_path)
    assert ep.url.startswith("grpc://10.") and ep.model == "hf_model"
    text, n = greedy(ep.url, ep.model)
    assert n == 8 and text
    from launcher.schedulers import slurm_jobs

    code, st = slurm_jobs.status(job_id)
    assert code == 0 and "state: RUNNING" in st and ep.url in st
    # the console script: SIGTERM to the serving step only, the batch script runs its teardown and ends the job
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "llmlaunch-stop"), job_id], capture_output=True, text=True, timeout=200
    )
    assert cli.returncode == 0 and f"job {job_id} stopped: its ranks drained and exited" in cli.stdout, (
        cli.stdout + cli.stderr
    )
    assert prefixes_of(job_id) == []
    assert glob.glob(f"/dev/shm/llm{job_id}r*") == []
    assert sacct_end(job_id) == ("COMPLETED", "0:0")


def test_two_nodes_two_tasks_four_servers_distinct_prefixes(local_slurm, tmp_path):
    spec, job_id, run, ep = launch(tmp_path, "replicas=4", "nodes=2")
    try:
        deadline = time.monotonic() + 120
        while len(list(run.glob("ready_rank*.json"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        ready = [json.loads(p.read_text()) for p in run.glob("ready_rank*.json")]
        assert len(ready) == 4
        assert len({r["addr"] for r in ready}) == 2  # two nodes
        assert prefixes_of(job_id) == [f"llm{job_id}r{i}_" for i in range(4)]
        for rep in ep.replicas:
            text, n = greedy(f"{rep.addr}:{rep.grpc_port}", ep.model)
            assert n == 8
        stop_drained(job_id)
    finally:
        stop(job_id)


def test_two_jobs_on_one_node_both_serve(local_slurm, tmp_path):
    a = launch(tmp_path, "cluster.extra_sbatch=['--nodelist=node3']", "job_name=joba")
    b = launch(tmp_path, "cluster.extra_sbatch=['--nodelist=node3']", "job_name=jobb")
    try:
        assert a[3].host == b[3].host
        assert a[3].grpc_port != b[3].grpc_port  # the second found 8001 taken and picked another
        for _, _, _, ep in (a, b):
            assert greedy(ep.url, ep.model)[1] == 8
    finally:
        stop(a[1])
        stop(b[1])


def server_pid(job_id, rank):
    """The pid of one rank's tritonserver: its argv names the job's and rank's shm prefix."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return next(
        int(ln.split()[0])
        for ln in out.splitlines()
        if f"shm-region-prefix-name=llm{job_id}r{rank}_" in ln and "bin/tritonserver" in ln
    )


def test_killing_a_nonzero_rank_fails_the_job_naming_it(local_slurm, tmp_path):
    """One model copy (tp=2 over two nodes; rank 1 is its worker on node2): fail fast."""
    from launcher.schedulers import slurm_jobs

    spec, job_id, run, ep = launch(tmp_path, "tp=2", "nodes=2")
    assert spec.replicas == 1 and spec.ranks[1].node == 1
    os.kill(server_pid(job_id, 1), signal.SIGKILL)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:
        state, _, _ = slurm_jobs.queue_state(job_id)
        if state not in ("RUNNING", "COMPLETING", "PENDING") and RunDir(run).failures():
            break
        time.sleep(0.5)
    took = time.monotonic() - t0
    assert took < 30, f"job still {state} after 30 s"
    code, st = slurm_jobs.status(job_id)
    assert code == 1 and "FAILED rank 1 on node node2" in st
    assert "state: FAILED (rank 1 failed)" in st and "COMPLETED" not in st and "RUNNING" not in st, st
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "llmlaunch-status"), job_id], capture_output=True, text=True
    )
    assert cli.returncode == 1 and "state: FAILED" in cli.stdout, cli.stdout + cli.stderr
    assert prefixes_of(job_id) == []
    # the sbatch teardown step removes what killed ranks could not (nodes share /dev/shm here)
    assert_shm_gone(job_id)
    # and the batch script ends with the serving step's status, not the teardown step's
    assert_failed_in_sacct(job_id)


def test_a_rank_whose_own_process_is_killed_fails_the_job_naming_it(local_slurm, tmp_path):
    """replicas=2 serving, rank 1's own process (the parent of its tritonserver) SIGKILLed, as the OOM killer would:
    it writes no failure record, yet srun ends the step, the job fails within 30 s, and llmlaunch-status and
    llmlaunch-logs name rank 1 on node2 (from srun's line, which is in rank 0's log)."""
    from launcher.logs import report
    from launcher.schedulers import slurm_jobs

    spec, job_id, run, ep = launch(tmp_path, "replicas=2", "nodes=2")
    try:
        rank1 = int(
            subprocess.run(
                ["ps", "-o", "ppid=", "-p", str(server_pid(job_id, 1))], capture_output=True, text=True
            ).stdout
        )
        os.kill(rank1, signal.SIGKILL)
        t0 = time.monotonic()
        while slurm_jobs.queue_state(job_id)[0] in ACTIVE and time.monotonic() - t0 < 30:
            time.sleep(0.5)
        assert slurm_jobs.queue_state(job_id)[0] == "FAILED", (
            f"job still {slurm_jobs.queue_state(job_id)[0]} after 30 s"
        )
        assert not list(run.glob("failure_rank*.json"))  # the rank could not write one
        wait_log(run / f"{job_id}_0_log.out", "srun: error: node2: task 1: Killed")
        code, st = slurm_jobs.status(job_id)
        assert code == 1 and "state: FAILED (rank 1 on node2: Killed, says srun)" in st, st
        text = report(RunDir(run))[0]
        assert text.startswith("root cause: rank 1 on node2 at "), text
    finally:
        stop(job_id)
    assert_shm_gone(job_id)


def metric(url, name, replica):
    import urllib.request

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return next(
        float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(f'{name}{{replica="{replica}"')
    )


def kill_once_streams_started(ep, gen, job_id, rank, in_flight, what, streams=4):
    """Send `gen` through the front end at `ep` on `streams` threads at once, then SIGKILL the tritonserver of `rank`
    as soon as replica 1 runs `in_flight` of them and has sent 10 responses since they began (a few tokens each): not
    after a fixed wait, which a fast run outlasts.  Returns each stream's Generation result once all have ended."""
    import threading

    from launcher.client.stream import generate

    got: list = []
    threads = [threading.Thread(target=lambda: got.append(generate(ep.url, ep.model, gen))) for _ in range(streams)]
    sent = metric(ep.metrics_url, "llmlaunch_frontend_responses_total", 1)
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while (
        metric(ep.metrics_url, "llmlaunch_frontend_in_flight", 1) < in_flight
        or metric(ep.metrics_url, "llmlaunch_frontend_responses_total", 1) < sent + 10
    ):
        assert time.monotonic() < deadline, f"{what} never started"
        time.sleep(0.05)
    os.kill(server_pid(job_id, rank), signal.SIGKILL)
    for t in threads:
        t.join(300)
    return got


def test_losing_replica_1_keeps_the_job_serving_on_replica_0(local_slurm, tmp_path):
    """replicas=2 over two nodes, 16 long streams through the front end, replica 1's tritonserver killed
    mid-run, with moving streams and restarting servers off (serve.max_migrations=0, serve.max_restarts=0: the rule
    underneath them; test_frontend.py has them on): its requests fail naming it, replica 0's complete, later
    requests all succeed, the job stays RUNNING with the loss recorded and shown; then it stops clean."""
    from launcher.client.request import Generation, build_request
    from launcher.client.stream import TritonStream
    from launcher.schedulers import slurm_jobs

    spec, job_id, run, ep = launch(tmp_path, "replicas=2", "nodes=2", "serve.max_migrations=0", "serve.max_restarts=0")
    try:
        rep1 = next(r for r in ep.replicas if r.replica == 1)
        long_tokens = 600
        stream = TritonStream(ep.url)
        recs = [
            stream.submit(
                build_request(
                    ep.model,
                    Generation(f"Once upon a time {i}", max_tokens=long_tokens, ignore_eos=True),
                    f"long{i}",
                )
            )
            for i in range(16)
        ]
        deadline = time.monotonic() + 120
        while not all(len(r.times) >= 2 for r in recs):
            assert time.monotonic() < deadline and not any(r.done for r in recs), [
                (r.request_id, len(r.times), r.error) for r in recs
            ]
            time.sleep(0.05)
        on_replica1 = metric(ep.metrics_url, "llmlaunch_frontend_requests_total", 1)
        assert on_replica1 == 8  # least outstanding: 8 each
        os.kill(server_pid(job_id, 1), signal.SIGKILL)
        for r in recs:
            stream.wait(r, timeout=400)
        stream.close()
        failed = {r.request_id: r.error for r in recs if r.error}
        assert len(failed) == on_replica1, failed
        for err in failed.values():
            assert err.startswith(f"replica 1 ({rep1.addr}:{rep1.grpc_port}) failed: "), err
        done = [r for r in recs if not r.error]
        assert len(done) == 8 and all(r.output_tokens == long_tokens for r in done), [
            (r.request_id, r.output_tokens) for r in done
        ]
        # the ranks of replica 1 record the loss and exit 0; the job goes on
        deadline = time.monotonic() + 60
        while not (run / "replica_lost1.json").exists():
            assert time.monotonic() < deadline, "no replica_lost1.json"
            time.sleep(0.5)
        lost = json.loads((run / "replica_lost1.json").read_text())
        assert (lost["replica"], lost["ranks"], lost["host"]) == (1, [1], "node2")
        assert "exited with status -9 (SIGKILL) unasked" in lost["reason"], lost
        # every later request succeeds, on replica 0
        stream = TritonStream(ep.url)
        recs = [
            stream.submit(
                build_request(ep.model, Generation(f"Afterwards {i}", max_tokens=8, ignore_eos=True), f"after{i}")
            )
            for i in range(16)
        ]
        for r in recs:
            stream.wait(r, timeout=120)
        stream.close()
        assert [r.error for r in recs if r.error] == [] and all(r.output_tokens == 8 for r in recs)
        assert metric(ep.metrics_url, "llmlaunch_frontend_replica_up", 1) == 0
        time.sleep(2)  # rank 1 has exited by now (srun would have ended the step for a non-zero exit)
        assert slurm_jobs.queue_state(job_id)[0] == "RUNNING"
        assert not list(run.glob("failure_rank*.json"))
        assert prefixes_of(job_id) == [f"llm{job_id}r0_"]  # replica 1's server (and its stubs) is gone
        code, st = slurm_jobs.status(job_id)
        assert code == 0 and "state: RUNNING" in st and "replicas: 1 of 2 serving" in st, st
        cli = subprocess.run(
            [str(Path(sys.executable).parent / "llmlaunch-status"), job_id], capture_output=True, text=True
        )  # the console script
        assert cli.returncode == 0, cli.stdout + cli.stderr
        line = next(ln for ln in cli.stdout.splitlines() if ln.startswith("replica 1 lost at "))
        assert " on node2: the server of rank 1 (leader) exited with status -9 (SIGKILL) unasked" in line, cli.stdout
        # llmlaunch-stop: replica 0 drains and exits 0; replica 1's rank exited 0 when it was lost, so the
        # serving step and the job end with status 0
        stop_drained(job_id)
    finally:
        stop(job_id)
    time.sleep(1)
    assert prefixes_of(job_id) == []  # no tritonserver of the job is left
    assert_shm_gone(job_id)


@pytest.mark.parametrize("routing", ["prefix", "kv"])
def test_prefix_routing_over_two_nodes_keeps_a_conversation_on_one_replica(
    local_slurm, tmp_path, tiny_model_dir, routing
):
    """`replicas=2 nodes=2 serve.routing=prefix|kv` on the Slurm cluster, one replica a node: tests/prefix_routing.py
    says what is checked (a conversation on one replica that prefills only its new tokens, sessions; kv: the engines'
    KV-cache events over TCP from the other node)."""
    from tests.prefix_routing import check_kv_routing, check_prefix_routing

    small = ["engine.kv_cache_memory=0.004"] if routing == "kv" else []
    spec, job_id, run, ep = launch(tmp_path, "replicas=2", "nodes=2", f"serve.routing={routing}", *small)
    try:
        ready = sorted(RunDir(run).ready_records(), key=lambda r: r["rank"])
        (check_kv_routing if routing == "kv" else check_prefix_routing)(ep, ready, tiny_model_dir)
        stop_drained(job_id)
    finally:
        stop(job_id)


def test_rank0_keeps_the_front_end_after_its_replica_and_the_job_fails_with_the_last(local_slurm, tmp_path):
    """replicas=2, restarting servers off (serve.max_restarts=0): rank 0's own tritonserver killed -> its front end
    serves on with replica 1; then replica 1 killed -> no replica is left, and the job fails naming the rank that
    lost the last one."""
    from launcher.schedulers import slurm_jobs

    spec, job_id, run, ep = launch(tmp_path, "replicas=2", "nodes=2", "serve.max_restarts=0")
    try:
        os.kill(server_pid(job_id, 0), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not (
            (run / "replica_lost0.json").exists() and metric(ep.metrics_url, "llmlaunch_frontend_replica_up", 0) == 0
        ):
            assert time.monotonic() < deadline, "replica 0 not recorded lost / not marked down"
            time.sleep(0.5)
        assert_serves_on(ep, job_id, run)
        code, st = slurm_jobs.status(job_id)
        assert (
            code == 0
            and "replicas: 1 of 2 serving" in st
            and "replica 0 lost at " in st
            and " on node1: the server of rank 0 (leader)" in st
        ), st
        wait_log(run / f"{job_id}_0_log.out", "rank 0 keeps the front end up")
        # the last replica: the job fails (fail fast), naming it
        os.kill(server_pid(job_id, 1), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while slurm_jobs.queue_state(job_id)[0] in ("RUNNING", "COMPLETING", "PENDING"):
            assert time.monotonic() < deadline, "the job still runs with no replica left"
            time.sleep(0.5)
        code, st = slurm_jobs.status(job_id)
        assert (
            code == 1
            and "FAILED rank 1 on node node2 (node index 1) failed: no replica is left (replicas [0, 1] lost)" in st
        ), st
        assert (run / "replica_lost1.json").exists()
        assert_failed_in_sacct(job_id)
    finally:
        stop(job_id)
    assert prefixes_of(job_id) == []
    assert_shm_gone(job_id)


def test_a_tp_copy_whose_worker_dies_restarts_as_a_whole_and_no_stream_fails(local_slurm, tmp_path):
    """replicas=2 tp=2 (one copy per node), four greedy streams through the front end on both copies: replica 1's
    worker (rank 3) killed -> its rank asks for the copy's restart, the leader (rank 2) ends its own server (its
    group lost a peer) and joins, both start again on their ports and form the group again, the leader's READY brings
    the copy back into routing; every stream finishes with the undisturbed text (those on replica 1 moved)."""
    from launcher.client.request import Generation
    from launcher.client.stream import generate

    spec, job_id, run, ep = launch(tmp_path, "replicas=2", "tp=2", "nodes=2")
    try:
        gen = Generation("Once upon a time, in a kingdom by the sea,", max_tokens=300, ignore_eos=True)
        want = generate(ep.url, ep.model, gen)
        # replica 1's worker (rank 3) killed as soon as its streams have started (10 of 300 tokens)
        got = kill_once_streams_started(ep, gen, job_id, 3, 1, "replica 1's streams")
        assert [(r.error, r.text, r.output_tokens) for r in got] == [("", want.text, 300)] * 4
        # rank 3's rank asks for the restart; the leader's engine may find its peer gone and end its own server
        # first, and then the leader asks: either way both restart once, together
        asked = "replica 1 (ranks [2, 3], as a whole): the server of rank "
        wait_log(run / f"{job_id}_3_log.out", asked, "restart 1 of 3 in 1s, same ports", timeout=60)
        wait_log(run / f"{job_id}_2_log.out", asked, "replica 1 serves again: restart 1 READY in", timeout=240)
        deadline = time.monotonic() + 60
        while metric(ep.metrics_url, "llmlaunch_frontend_replica_recoveries_total", 1) < 1:
            assert time.monotonic() < deadline, "replica 1 not taken back"
            time.sleep(0.5)
        doc = json.loads((run / "replica_restart1_1.json").read_text())
        assert (doc["ranks"], doc["restart"]) == ([2, 3], 1) and doc["rank"] in (2, 3) and doc["ready_s"] > 0, doc
        assert not (run / "replica_lost1.json").exists()
        assert_serves_on(ep, job_id, run)
        stop_drained(job_id)
    finally:
        stop(job_id)
    assert prefixes_of(job_id) == []


def test_a_dead_tp_rank_takes_its_replica_down_and_the_job_goes_on(local_slurm, tmp_path):
    """replicas=2 tp=2 (one copy per node), restarts off (serve.max_restarts=0: the rule underneath them): replica
    1's leader (rank 2) killed -> its rank records the loss, the worker sees the record, ends its server and exits 0
    (a worker must not wait out its collective timeout); replica 0 serves on."""
    killed, other = 2, 3
    spec, job_id, run, ep = launch(tmp_path, "replicas=2", "tp=2", "nodes=2", "serve.max_restarts=0")
    try:
        assert [(r.replica, r.role, r.node) for r in spec.ranks] == [
            (0, "leader", 0),
            (0, "worker", 0),
            (1, "leader", 1),
            (1, "worker", 1),
        ]
        os.kill(server_pid(job_id, killed), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while prefixes_of(job_id) != [
            f"llm{job_id}r0_",
            f"llm{job_id}r1_",
        ]:  # the other's server goes too, well before its tp timeout
            assert time.monotonic() < deadline, prefixes_of(job_id)
            time.sleep(0.5)
        lost = json.loads((run / "replica_lost1.json").read_text())
        assert (lost["replica"], lost["ranks"], lost["rank"]) == (1, [2, 3], killed), lost
        wait_log(
            run / f"{job_id}_{other}_log.out",
            f"replica 1 LOST: rank {other} stopped its server",
            "this rank exits 0 so the job goes on",
        )
        deadline = time.monotonic() + 30
        while metric(ep.metrics_url, "llmlaunch_frontend_replica_up", 1) != 0:
            assert time.monotonic() < deadline, "replica 1 not marked down"
            time.sleep(0.5)
        assert_serves_on(ep, job_id, run)
        stop_drained(job_id)  # a lost replica the job survived, then a stop: COMPLETED 0:0
    finally:
        stop(job_id)
    assert prefixes_of(job_id) == []


def plain_job(tmp_path, body, *sbatch_args):
    """A batch job running `body` (no model, seconds to start) with an llmlaunch record, so that
    llmlaunch-stop takes it; the job's steps and its batch script are what each stop path meets."""
    from launcher import jobindex

    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrap 'echo batch script got SIGTERM' TERM\n" + body)
    out = subprocess.run(
        ["sbatch", "--parsable", "-N1", "-n1", "-D", str(tmp_path), "-o", "%j.out", *sbatch_args, str(script)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    job_id = out.strip().split(";")[0]
    jobindex.add({"job_id": job_id, "run_dir": str(tmp_path), "slurm_conf": ""})
    return job_id


def wait_steps(job_id, want, ready=None, timeout=60):
    """Until `squeue -s` lists the job's step `want` ("0": the srun, "batch": the script) and the file
    `ready` exists (the step's task has set its trap: a signal before it kills the task, or is lost)."""
    deadline = time.monotonic() + timeout
    while f"{job_id}.{want}" not in subprocess.run(
        ["squeue", "-h", "-s", "-j", job_id, "-o", "%i"], capture_output=True, text=True
    ).stdout.split() or (ready and not ready.exists()):
        assert time.monotonic() < deadline, f"job {job_id}: no step {want} (or no {ready}) after {timeout} s"
        time.sleep(0.3)


SERVING_STEP = (
    "srun bash -c '{trap}; touch step_ready; sleep 300 & wait'\nstatus=$?\necho \"step status $status\"\nexit $status\n"
)


@pytest.mark.parametrize(
    "body,args,step,drain_s,said,ends",
    [
        # a step that drains on SIGTERM: only it is signalled (the batch script's trap never fires), the script exits 0
        (SERVING_STEP.format(trap='trap "exit 0" TERM'), [], "0", 30, "its ranks drained and exited", "COMPLETED"),
        # a step that ignores SIGTERM (a rank before its handlers): a plain scancel once the drain window is over
        (
            SERVING_STEP.format(trap='trap "" TERM'),
            [],
            "0",
            2,
            "still RUNNING 2s after SIGTERM to its steps",
            "CANCELLED",
        ),
        # no serving step yet (the batch script's setup) or not started at all: nothing to drain, cancelled at once
        (
            "sleep 300\n",
            [],
            "batch",
            30,
            "its batch script had not started the serving step yet: cancelled (scancel)",
            "CANCELLED",
        ),
        (
            "sleep 300\n",
            ["--begin=now+600"],
            None,
            30,
            "it was PENDING, nothing to drain: cancelled (scancel)",
            "CANCELLED",
        ),
    ],
    ids=["drains", "ignores-sigterm", "no-step-yet", "pending"],
)
def test_stop_drains_the_serving_step_or_cancels(local_slurm, tmp_path, body, args, step, drain_s, said, ends):
    from launcher import jobindex
    from launcher.schedulers import slurm_jobs

    job_id = plain_job(tmp_path, body, *args)
    try:
        if step:
            wait_steps(job_id, step, tmp_path / "step_ready" if step == "0" else None)
        t0 = time.monotonic()
        code, msg = slurm_jobs.stop(job_id, drain_s=drain_s)
        took = time.monotonic() - t0
        assert code == 0 and said in msg, msg
        assert took < 25, (took, msg)  # no 30 s window waited out where nothing drains
        state, exit_code = sacct_end(job_id)
        assert state == ends and (ends != "COMPLETED" or exit_code == "0:0"), (state, exit_code)
        if (
            ends == "COMPLETED"
        ):  # the batch script was not signalled: it went on after the step and exited with its status
            text = (tmp_path / f"{job_id}.out").read_text()
            assert "step status 0" in text and "batch script got SIGTERM" not in text, text
    finally:
        subprocess.run(["scancel", job_id])
        (jobindex.index_dir() / f"{job_id}.json").unlink(missing_ok=True)


@pytest.mark.parametrize(
    "override,needle",
    [("cluster.partition=nope", "invalid partition"), ("replicas=8", "Requested node configuration is not available")],
)
def test_bad_profile_fails_at_submission_with_slurms_reason(local_slurm, tmp_path, override, needle):
    extra = [override] + (["cluster.gpus_per_node=8"] if override == "replicas=8" else [])
    with pytest.raises(LaunchError) as e:
        launch(tmp_path, *extra)
    assert needle in e.value.render()
    assert list(tmp_path.iterdir()) == []  # nothing half-submitted


def test_static_sbatch_pair_serves_hf_on_the_local_cluster(local_slurm, tmp_path):
    """`sbatch sbatch/tensorrt_llm_triton.sub` as people submit it by hand; environment variables select
    the engine (hf) and the paths; #SBATCH lines overridden on the command line for this cluster."""
    from launcher.models import resolve_model
    from launcher.ports import free_port
    from launcher.render import PACKAGE_ROOT
    from launcher.triton import probe_request
    from launcher.triton_install import resolve_tritonserver, server_env

    cfg, spec = plan(["cluster=local_slurm", "engine=hf", "model=tiny"])
    spec = resolve_model(spec)
    run = RunDir(tmp_path / "run").write_spec(spec).path
    install = resolve_tritonserver()
    port = free_port()
    env = server_env(install)
    env.update(
        {
            "LLMLAUNCH_MODEL_REPO": str(run / "model_repository"),
            "LLMLAUNCH_ENGINE": "hf",
            "TRITONSERVER": install.binary,
            "TRITON_BACKEND_DIR": install.backend_directory,
            "LLMLAUNCH_SCRIPT_DIR": str(PACKAGE_ROOT / "sbatch"),
            "LLMLAUNCH_LOG_DIR": str(tmp_path / "logs"),
            "GRPC_PORT": str(port),
            "HTTP_PORT": str(free_port()),
            "METRICS_PORT": str(free_port()),
        }
    )
    sub = str(PACKAGE_ROOT / "sbatch" / "tensorrt_llm_triton.sub")
    r = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "local",
            "--ntasks-per-node=1",
            "--nodelist=node4",
            "-o",
            str(tmp_path / "job_%j.out"),
            sub,
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip().split(";")[0]
    try:
        url = f"{local_slurm.node_addrs['node4']}:{port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                probe_request(url, "hf_model", timeout_s=20)
                break
            except Exception:
                assert time.monotonic() < deadline, (tmp_path / "logs").glob("*")
                time.sleep(1)
        assert greedy(url, "hf_model")[1] == 8
        assert prefixes_of(job_id) == [f"llm{job_id}r0_"]  # the job id AND rank prefix from the .sh
        # a rank killed: the job ends FAILED with a non-zero exit code, after its teardown step ran
        os.kill(server_pid(job_id, 0), signal.SIGKILL)
        assert_failed_in_sacct(job_id)
        assert_shm_gone(job_id)
    finally:
        subprocess.run(["scancel", job_id])


def test_trtllm_llmapi_mpi_world_serves_through_rank0_on_the_local_cluster(local_slurm, tmp_path):
    """engine=trtllm (the LLM API layout) with tp=2, API-tested only: the stand-in tensorrt_llm package and
    trtllm-llmapi-launch (tests/standins) on the ranks' paths. Both tasks start under srun --mpi=pmix through the
    launcher; rank 0's tritonserver serves the job's endpoint with the model built from the rendered model.yaml,
    outside the task's MPI identity; rank 1 is the MPI worker and runs no tritonserver; the job stops drained."""
    import dataclasses

    from launcher.schedulers import slurm
    from tests.standins.server import STANDINS

    calls = tmp_path / "calls.jsonl"
    _, spec = plan(
        [
            "cluster=local_slurm",
            "engine=trtllm",
            "tp=2",
            "model.path=/models/standin-llm",
            f"cluster.jobs_dir={tmp_path}",
            "serve.ready_timeout_s=240",
        ]
    )
    cluster = dataclasses.replace(
        spec.cluster,
        env={**spec.cluster.env, "LLMLAUNCH_STANDIN_LOG": str(calls)},
        setup=[f"export PATH={STANDINS / 'bin'}:$PATH", f"export PYTHONPATH=$PYTHONPATH:{STANDINS}"],
    )
    spec = dataclasses.replace(spec, cluster=cluster)
    job, run = slurm.submit(spec, str(tmp_path / "run"))
    try:
        ep = slurm.follow(job.job_id, run, spec, 300)
        assert ep.model == "tensorrt_llm"
        text, n = greedy(ep.url, ep.model)
        assert (text, n) == (" t0 t1 t2 t3 t4", 5)
        rows = [json.loads(line) for line in calls.read_text().splitlines() if line.strip()]
        launched = sorted((r["event"], r["rank"], r["world"]) for r in rows if r["event"].startswith("launch_"))
        assert launched == [("launch_leader", 0, 2), ("launch_worker", 1, 2)]
        (init,) = [r for r in rows if r["event"] == "init"]
        assert (
            init["args"]["tensor_parallel_size"],
            init["args"]["gpus_per_node"],
            init["mpi_env"],
            init["proxy"],
        ) == (2, 2, [], "1")
        assert prefixes_of(job.job_id) == [f"llm{job.job_id}r0_"]  # one tritonserver, rank 0's
        stop_drained(job.job_id)
        assert any(
            r["event"] == "shutdown" for r in (json.loads(ln) for ln in calls.read_text().splitlines() if ln.strip())
        )
    finally:
        subprocess.run(["scancel", job.job_id])


def test_time_to_ready_is_broken_down_into_the_run_record_and_shown_by_status(local_slurm, tmp_path):
    """The launch `llmlaunch cluster=local_slurm` makes (the scheduler's launch, with the record's launching part):
    at READY the record holds Slurm's queue wait with its reason (the job may start 8 s after submission: BeginTime)
    and every phase, measured from what rank 0 wrote, the nodes, the versions the ranks saw; llmlaunch-status shows
    the breakdown."""
    import dataclasses

    from omegaconf import OmegaConf

    from launcher.readiness import process_start_time
    from launcher.record import base_record
    from launcher.schedulers import registry as scheduler, slurm_jobs

    overrides = [
        "cluster=local_slurm",
        "engine=hf",
        "model=tiny",
        f"cluster.jobs_dir={tmp_path}",
        "serve.ready_timeout_s=240",
        "replicas=2",
        "nodes=2",
        "cluster.extra_sbatch=['--begin=now+8']",
    ]
    cfg, spec = plan(overrides)
    backend = scheduler.get("slurm")
    run_dir = str(tmp_path / "run")
    record = base_record(
        OmegaConf.to_container(cfg, resolve=True), overrides, backend.name, run_dir, submitted=process_start_time()
    )
    ep = backend.launch(dataclasses.replace(backend.dryrun(spec, run_dir), record=record))
    try:
        rec = json.loads((Path(run_dir) / "record.json").read_text())
        b = rec["time_to_ready"]
        phases = ("queue_s", "ranks_s", "server_s", "load_s", "endpoint_s", "first_token_s", "frontend_s")
        assert all(b[k] >= 0 for k in phases) and b["load_s"] > 0 and b["ranks_s"] > 0, b
        assert abs(sum(b[k] for k in phases) - b["total_s"]) < 0.05, b
        assert b["queue_s"] >= 6 and "BeginTime" in b["queue_reason"], b  # Slurm's Start is in whole seconds
        assert [name for name, _ in b["load_phases"]] == ["weights", "compile", "graphs"], b
        assert rec["job_id"] == ep.job_id and len(rec["nodes"]) == spec.world_size == 2 and len(set(rec["nodes"])) == 2
        assert rec["versions"]["tritonserver"] and rec["versions"]["torch"] and rec["config"]["replicas"] == 2
        code, st = slurm_jobs.status(ep.job_id)
        assert code == 0 and "time to READY" in st and "(BeginTime" in st and f"record: {run_dir}/record.json" in st, st
    finally:
        stop(ep.job_id)
