"""A job at its Slurm time limit on the local cluster (a two-minute limit): Slurm signals it ahead, the front ends
refuse new requests naming why (gRPC UNAVAILABLE, HTTP 503) while those in flight finish, every rank exits 0, and
with requeue=true the job serves again in a new allocation, where llmlaunch-status finds it; and again at the next limit."""

import json
import os
import time
import urllib.error
import urllib.request

import pytest

from launcher.cli import plan
from launcher.rundir import RunDir
from launcher.schedulers import slurm_jobs
from tests.integration.test_slurm_launch import assert_shm_gone, greedy, sacct_end, stop
from tests.slurm_fixture import NOT_ROOT_REASON

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason=NOT_ROOT_REASON),
    pytest.mark.timeout(900),
]

REASON = "is draining at its Slurm time limit"


def openai_completion(url, model):
    """(HTTP status, body) of one small completion through the OpenAI API."""
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4}).encode()
    req = urllib.request.Request(url + "/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def serving_again(run, job_id, token, timeout_s=300):
    """The endpoint a requeued job's next allocation serves at (its rendezvous token is a new one)."""
    deadline = time.monotonic() + timeout_s
    while True:
        again = run.read_endpoint()
        if again is not None and again.token != token:
            return again
        assert time.monotonic() < deadline, f"not serving again; {slurm_jobs.status(job_id)[1]}"
        time.sleep(1)


def test_a_job_at_its_time_limit_drains_requeues_and_serves_again(local_slurm, tmp_path):
    from launcher.client.connection import ClientError
    from launcher.client.request import Generation, build_request
    from launcher.client.response import StreamRecord
    from launcher.client.stream import TritonStream, generate
    from launcher.models import resolve_model
    from launcher.schedulers import slurm

    cfg, spec = plan(
        [
            "cluster=local_slurm",
            "engine=hf",
            "model=tiny",
            f"cluster.jobs_dir={tmp_path}",
            "replicas=2",
            "nodes=2",
            "cluster.time=00:02:00",
            "serve.walltime_signal_s=45",
            "serve.drain_timeout_s=30",
            "serve.ready_timeout_s=70",
            "requeue=true",
        ]
    )
    spec = resolve_model(spec)
    job, run = slurm.submit(spec, str(tmp_path / f"run{time.monotonic_ns()}"))
    job_id, run = job.job_id, RunDir(run)
    try:
        ep = slurm.follow(job_id, run.path, spec, 300)
        # requests all along, on one open stream through the front end, until the drain has begun
        stream = TritonStream(ep.url)
        sent = []  # (time sent, record)
        n = 0
        deadline = time.monotonic() + 200
        while not run.walltime_records():
            assert time.monotonic() < deadline, "no drain record: Slurm's signal never came"
            rec = StreamRecord(f"r{n}")
            sent.append((time.time(), rec))
            stream.submit(
                build_request(ep.model, Generation(f"Tick {n}", max_tokens=48, ignore_eos=True), f"r{n}"), rec
            )
            n += 1
            time.sleep(0.5)
        drained_at = run.walltime_records()[0]["time"]
        assert not run.has_endpoint()  # nothing new goes to the old endpoint
        # new requests are refused naming why: on the open stream, on a new stream (UNAVAILABLE), over HTTP (503)
        # a new stream is refused whole (the front end takes the rank's notice on its own event loop, a moment
        # after the record: on this loaded machine the first try may come before it). The refusal is raised by
        # submit() when it came first, or is the request's error when the request was already queued: both count.
        fresh, deadline = "", time.monotonic() + 20
        while not fresh:
            assert time.monotonic() < deadline, "a new stream was still accepted 20 s into the drain"
            try:
                fresh = generate(ep.url, ep.model, Generation("Too late too", max_tokens=4), timeout=60).error
            except ClientError as e:
                fresh = str(e)
            if not fresh:
                time.sleep(0.2)
        late = StreamRecord("late")  # the open stream, once the front end refuses: a new request gets the reason
        stream.submit(build_request(ep.model, Generation("Too late", max_tokens=4), "late"), late)
        status, body = openai_completion(ep.openai_url, ep.model)
        while status != 503 and time.monotonic() < deadline:  # the API takes the notice on its own, too
            time.sleep(0.2)
            status, body = openai_completion(ep.openai_url, ep.model)
        for rec, _ in [(late, 0)] + [(r, 0) for t, r in sent if t > drained_at + 1]:
            stream.wait(rec, timeout=120)
        assert REASON in (late.error or "") and job_id in late.error, late.error
        assert REASON in fresh and "UNAVAILABLE" in fresh, fresh
        assert status == 503 and REASON in body, (status, body)
        # the requests sent before the drain finished whole
        for t, rec in sent:
            if t < drained_at - 2:
                stream.wait(rec, timeout=120)
                assert not rec.error and rec.output_tokens == 48, (rec.request_id, rec.error, rec.output_tokens)
        stream.close()
        # every rank of the first allocation exits 0, then the batch script requeues the job: a new endpoint
        again = serving_again(run, job_id, ep.token)
        for rank in (
            0,
            1,
        ):  # every rank of the first allocation drained and exited 0 (the logs append across allocations)
            assert "stopped (signal 12), status 0" in run.slurm_rank_log(job_id, rank).read_text(errors="replace"), rank
        code, st = slurm_jobs.status(job_id)
        assert code == 0 and "state: RUNNING" in st and f"endpoint: {again.url}" in st, st
        assert "allocation 0 drained at its time limit at " in st, st
        assert "requeued; serving again at the endpoint above" in st, st
        assert greedy(again.url, again.model)[1] == 8
        # the second allocation reaches its time limit too: it drains under its own record and is requeued again
        third = serving_again(run, job_id, again.token)
        assert [w["attempt"] for w in run.walltime_records()] == [0, 1]
        code, st = slurm_jobs.status(job_id)
        assert code == 0 and f"endpoint: {third.url}" in st and "allocation 1 drained at its time limit at " in st, st
        assert greedy(third.url, third.model)[1] == 8
        stop(job_id)  # drained by llmlaunch-stop: no walltime record for this allocation, so no requeue
        assert sacct_end(job_id) == ("COMPLETED", "0:0")
        assert [w["attempt"] for w in run.walltime_records()] == [0, 1]
    finally:
        stop(job_id)
    assert_shm_gone(job_id)
