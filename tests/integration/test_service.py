"""A service that outlives its jobs (serve.router=host, launcher/service/) on the local Slurm cluster: the router on
this host, each replica a Slurm job of its own that registers when it serves. One service, started once for the
module with 3-minute replica jobs, so every test here runs while its jobs are handed over to successors; the tests
send real requests through its stable endpoint and assert that none fails while jobs come and go."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from launcher import jobindex
from launcher.client.request import Generation
from launcher.client.stream import generate
from launcher.handoff.registration import Refused, call
from launcher.ports import free_port
from launcher.service.state import ServiceDir
from tests.slurm_fixture import NOT_ROOT_REASON

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason=NOT_ROOT_REASON),
    pytest.mark.timeout(600),
]
BIN = Path(sys.executable).parent


def until(predicate, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class Service:
    """A service started with `llmlaunch ... serve.router=host` as a user starts one, stopped with llmlaunch-stop."""

    def __init__(self, tmp: Path, *overrides: str, router: str = "host"):
        ports = {k: free_port() for k in ("grpc_port", "http_port", "metrics_port", "openai_port", "control_port")}
        argv = [
            str(BIN / "llmlaunch"),
            "cluster=local_slurm",
            "model=tiny",
            f"serve.router={router}",
            f"cluster.jobs_dir={tmp}",
            *(f"serve.{k}={p}" for k, p in ports.items()),
            *overrides,
        ]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=400)
        self.output = out.stdout + out.stderr
        assert out.returncode == 0, self.output
        found = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
        self.id, self.url, self.openai = found["service"], found["endpoint"], found["openai"]
        self.sdir = ServiceDir(jobindex.find(self.id)["run_dir"])
        self.model = self.sdir.run.read_endpoint().model
        self.control = self.sdir.router()["control_url"]

    def status(self) -> dict:
        return self.sdir.status()

    def jobs(self, state: str) -> list:
        return [j for j in self.status()["jobs"] if j["state"] == state]

    def decisions(self, action: str) -> list:
        return [d for d in self.sdir.read_decisions() if d["action"] == action]

    def cli(self, tool: str, *args: str) -> str:
        out = subprocess.run([str(BIN / tool), self.id, *args], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def stream(self, max_tokens: int, k: int = 0):
        gen = Generation(f"Stream {k}: once upon a time", max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        return generate(self.url.removeprefix("grpc://"), self.model, gen, timeout=300)

    def load(self, n: int, max_tokens: int):
        """n clients sending requests one after another until the returned event is set; their records."""
        stop, got = threading.Event(), []

        def client(k):
            while not stop.is_set():
                got.append(self.stream(max_tokens, k))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        return stop, threads, got

    def streams(self, n: int, max_tokens: int) -> tuple:
        """n streams on threads; (threads, results)."""
        got: list = []
        threads = [threading.Thread(target=lambda k=k: got.append(self.stream(max_tokens, k))) for k in range(n)]
        for t in threads:
            t.start()
        return threads, got


@pytest.fixture(scope="module")
def service(local_slurm, tmp_path_factory):
    svc = Service(
        tmp_path_factory.mktemp("service"),
        "cluster.time=00:03:00",
        "serve.walltime_signal_s=45",
        "serve.drain_timeout_s=20",
        "serve.ready_timeout_s=70",
        "serve.handover_margin_s=10",
        "serve.autoscale.max_replicas=3",
        "serve.autoscale.up_at=5",
        "serve.autoscale.down_at=0.5",
        "serve.autoscale.window_s=6",
        "serve.autoscale.up_cooldown_s=5",
        "serve.autoscale.down_cooldown_s=10",
    )
    try:
        yield svc
    finally:
        print(svc.cli("llmlaunch-stop"))
        assert not svc.jobs("serving") and not svc.status()["endpoint"]


def test_it_serves_both_apis_through_one_endpoint_and_status_names_its_jobs(service):
    rec = service.stream(8)
    assert rec.error == "" and rec.output_tokens == 8
    body = json.dumps({"model": service.model, "prompt": "Hello", "max_tokens": 4}).encode()
    req = urllib.request.Request(f"{service.openai}/completions", body, {"Content-Type": "application/json"})
    answer = json.loads(urllib.request.urlopen(req, timeout=60).read())
    assert answer["usage"]["completion_tokens"] == 4
    text = service.cli("llmlaunch-status")
    assert "state: SERVING" in text and "r0 job" in text and "autoscale: 1..3 by in_flight" in text, text
    metrics = urllib.request.urlopen(f"{service.control}/metrics", timeout=10).read().decode()
    assert 'llmlaunch_service_replica_jobs{state="serving"} 1' in metrics, metrics


def test_a_registration_without_the_token_or_from_a_job_it_did_not_submit_is_refused(service, tmp_path):
    from launcher.service.jobs import submit_replica
    from launcher.spec import ServiceLink

    with pytest.raises(Refused, match="401"):
        call(service.control, "not-the-token", "/register", {"name": "r0", "job_id": "1"})
    token = service.sdir.token_file.read_text().strip()
    with pytest.raises(Refused, match="403.*not a replica job this service submitted"):
        call(service.control, token, "/register", {"name": "r0", "job_id": "999999", "host": "x", "grpc_port": 1})
    # a real job that presents the token but is not one the router submitted: its rank 0 fails, naming the refusal
    link = ServiceLink(service.control, str(service.sdir.token_file), "stranger")
    job_id = submit_replica(service.sdir.run.read_spec(), str(tmp_path / "stranger"), link)
    failure = until(
        lambda: next((json.loads(p.read_text()) for p in (tmp_path / "stranger").glob("failure_rank*.json")), None),
        120,
        "the foreign job's rank 0 to fail",
    )
    assert "refused /register (403)" in failure["reason"] and "not part of that service" in failure["reason"]
    assert any(job_id in d["reason"] for d in service.decisions("refused"))
    assert len(service.jobs("serving")) >= 1


def test_load_scales_it_up_and_idling_gives_the_replicas_back_without_a_failed_request(service):
    ups, downs = len(service.decisions("scale_up")), len(service.decisions("scale_down"))
    stop, threads, got = service.load(12, 64)  # 12 in flight on one replica: above up_at=5 for the window
    try:
        until(lambda: len(service.decisions("scale_up")) > ups, 90, "a scale-up decision")
        until(lambda: len(service.jobs("serving")) >= 2, 120, "a second replica job serving")
        time.sleep(3)  # requests on the new replica too
    finally:
        stop.set()
        for t in threads:
            t.join(300)
    assert got and {(r.error, r.output_tokens) for r in got} == {("", 64)}
    until(lambda: len(service.decisions("scale_down")) > downs, 120, "a scale-down decision once idle")
    until(lambda: len(service.jobs("serving")) == 1, 120, "one replica job again")
    up = service.decisions("scale_up")[-1]
    assert "above up_at=5" in up["reason"], up


def test_a_replica_killed_mid_stream_moves_its_streams_and_a_replacement_job_serves(service):
    # a steady load (2 in flight a replica: the autoscaler keeps both) and long streams, some on the victim
    stop, threads, got = service.load(4, 32)
    try:
        service.cli("llmlaunch-scale", "replicas=2")
        until(lambda: len(service.jobs("serving")) == 2, 120, "two replica jobs serving")
        long_threads, long_got = service.streams(4, 400)
        # the newest: the furthest from its handover (3-minute jobs hand over every couple of minutes)
        victim = max(service.jobs("serving"), key=lambda j: j["registered"])
        until(
            lambda: any(j["name"] == victim["name"] and j.get("in_flight", 0) >= 2 for j in service.jobs("serving")),
            60,
            f"streams running on {victim['name']}",
        )
        out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
        pid = next(
            int(ln.split()[0])
            for ln in out.splitlines()
            if f"llm{victim['job_id']}r0_" in ln and "bin/tritonserver" in ln
        )
        os.kill(pid, signal.SIGKILL)
        for t in long_threads:
            t.join(300)
        # a replacement job, or the successor already on its way for a handover takes its place
        name = victim["name"]
        until(
            lambda: (
                any(d["reason"].startswith(f"replacement of {name}") for d in service.decisions("submit"))
                or any(d["reason"].startswith(f"{name} needs no replacement") for d in service.decisions("covered"))
            ),
            60,
            f"a replacement of {name}",
        )
        until(lambda: len(service.jobs("serving")) == 2, 120, "two replica jobs serving again")
    finally:
        stop.set()
        for t in threads:
            t.join(300)
    assert [(r.error, r.output_tokens) for r in long_got] == [("", 400)] * 4
    assert got and {(r.error, r.output_tokens) for r in got} == {("", 32)}
    ended = next(d for d in service.decisions("ended") if d["reason"].startswith(victim["name"]))
    assert "while serving" in ended["reason"]


def test_each_job_is_handed_over_before_its_time_limit_and_no_request_fails(service):
    first = {d["job"] for d in service.decisions("drain") if "handed over" in d["reason"] and "job" in d}
    stop, failed, done = threading.Event(), [], []

    def probe():
        while not stop.is_set():
            rec = service.stream(4)
            (failed if rec.error else done).append(rec.error or time.time())
            time.sleep(0.5)

    t = threading.Thread(target=probe)
    t.start()
    try:
        until(
            lambda: {d["job"] for d in service.decisions("drain") if "handed over" in d["reason"]} - first,
            200,
            "a handover",
            every=1.0,
        )
        time.sleep(5)
    finally:
        stop.set()
        t.join(60)
    assert failed == [] and len(done) > 10
    handed = [d for d in service.decisions("submit") if d["reason"].startswith("handover of")]
    assert handed and "its time limit is in" in handed[-1]["reason"]


def test_a_router_of_its_own_slurm_job_scales_by_time_to_first_token_and_stops_with_its_replicas(local_slurm, tmp_path):
    """serve.router=job: the router runs in a CPU job of its own and submits the replica jobs from there. It scales
    by the p90 of the front end's times to first token (serve.autoscale.signal=ttft_p90): above 30 ms under a load
    one tiny-model replica on two cores answers slower than that, one more; idle (no first token in the window), one
    fewer. The hf engine's KV cache in use (what signal=kv_cache reads) is on each replica's metrics meanwhile."""
    from launcher.python_backend.timings import ENGINE_KV_USAGE, fetch_metrics_text
    from launcher.service.scrape import parse

    svc = Service(
        tmp_path,
        "cluster.router_time=00:10:00",
        "serve.autoscale.max_replicas=2",
        "serve.autoscale.signal=ttft_p90",
        "serve.autoscale.up_at=30",
        "serve.autoscale.window_s=6",
        "serve.autoscale.up_cooldown_s=5",
        "serve.autoscale.down_cooldown_s=10",
        router="job",
    )
    router = svc.sdir.router()
    try:
        assert router["job_id"] and svc.url.startswith(f"grpc://{router['host']}:"), router
        rec = svc.stream(6)
        assert rec.error == "" and rec.output_tokens == 6
        assert f"job {router['job_id']}" in svc.cli("llmlaunch-status")
        stop, threads, got = svc.load(12, 64)
        try:
            (first,) = until(lambda: svc.jobs("serving"), 30, "the replica job serving")
            shares = until(
                lambda: parse(fetch_metrics_text(first["metrics_url"])).get((ENGINE_KV_USAGE, "")),
                30,
                "the replica's KV cache in use under load",
            )
            assert 0 < shares <= 1
            until(lambda: svc.decisions("scale_up"), 90, "a scale-up by time to first token")
            until(lambda: len(svc.jobs("serving")) == 2, 120, "a second replica job serving")
        finally:
            stop.set()
            for t in threads:
                t.join(300)
        assert got and {(r.error, r.output_tokens) for r in got} == {("", 64)}
        up = svc.decisions("scale_up")[0]
        assert up["reason"].startswith("ttft_p90 ") and "above up_at=30" in up["reason"], up
        metrics = urllib.request.urlopen(f"{svc.control}/metrics", timeout=10).read().decode()
        assert 'llmlaunch_service_signal{signal="ttft_p90"}' in metrics, metrics
        until(lambda: svc.decisions("scale_down"), 120, "a scale-down once idle")
        assert "below down_at=15" in svc.decisions("scale_down")[0]["reason"]
        until(lambda: len(svc.jobs("serving")) == 1, 120, "one replica job again")
    finally:
        print(svc.cli("llmlaunch-stop"))
    gone = subprocess.run(["squeue", "-h", "-j", router["job_id"]], capture_output=True, text=True).stdout
    assert gone.strip() == "" and not svc.jobs("serving")
