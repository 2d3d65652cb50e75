"""llmlaunch-logs: the earliest error across ranks is the root cause, later ones its consequences; the archive."""

import tarfile
import time

from launcher.logs import analyse, find_run, report
from launcher.rundir import RunDir
from launcher.triage import Event, line_time, log_time, render, scan_log, triage

T0 = time.mktime((2026, 11, 27, 21, 0, 0, 0, 0, -1))


def rank_line(rank, host, t, msg):
    return f"[llmlaunch rank {rank} {host} {log_time(T0 + t)}] {msg}"


def glog(sev, t, msg):
    lt = time.localtime(T0 + t)
    return f"{sev}{lt.tm_mon:02d}{lt.tm_mday:02d} {time.strftime('%H:%M:%S', lt)}.{int((T0 + t) * 1e6) % 1000000:06d} 4242 model.cc:12] {msg}"


def test_times_of_each_kind_of_line():
    assert line_time(rank_line(0, "node1", 1.25, "READY"), 2026) == T0 + 1.25
    assert abs(line_time(glog("E", 3.5, "x"), 2026) - (T0 + 3.5)) < 1e-3
    assert line_time("slurmstepd: error: *** STEP 7.0 ON node1 CANCELLED AT 2026-11-27T21:00:09 ***", 2026) == T0 + 9
    assert line_time('  File "model.py", line 3', 2026) is None


def test_the_earliest_error_across_ranks_is_the_root_cause():
    rank0 = "\n".join(
        [
            rank_line(0, "node1", 0, "leader of replica 0, gpus none: tritonserver ..."),
            glog("I", 1, "loading: hf_model:1"),
            glog("E", 1.5, "CudaDriverHelper has not been initialized."),
            "Error: Failed to initialize NVML",
            rank_line(0, "node1", 9, "stopped (signal 15), status 0"),
            "srun: error: node2: task 1: Exited with exit code 1",
        ]
    )
    rank1 = "\n".join(
        [
            rank_line(1, "node2", 0.5, "worker of replica 0"),
            glog("I", 4, "loading: hf_model:1"),
            glog("E", 5, "failed to load 'hf_model' version 1: OSError: /nonexistent is not a folder\\nTraceback: ..."),
            rank_line(1, "node2", 6, "FAILED: model hf_model did not load"),
            rank_line(1, "node2", 6.1, "server exited with status 1 unasked: failing the job"),
        ]
    )
    events = scan_log(rank0, source="7_0_log.out", rank=0, year=2026) + scan_log(
        rank1, source="7_1_log.out", rank=1, year=2026
    )
    t = triage(events, ["7_0_log.out", "7_1_log.out"])
    assert t.root.rank == 1 and t.root.host == "node2" and "/nonexistent is not a folder" in t.root.text
    assert t.root.line_no == 3 and t.root.context[t.root.at].startswith("E")
    # the benign CUDA line is no error; the FAILED lines and srun's (untimed, after rank 0's last line) follow
    assert [e.text.split(":")[0] for e in t.consequences] == ["FAILED", "server exited with status 1 unasked", "srun"]
    text = render(t, archive="/x/logs.tar.gz")
    assert text.startswith("root cause: rank 1 on node2 at 2026-11-27 21:00:05.000 (7_1_log.out line 3):"), text
    assert (
        "    > E" in text
        and "consequences (3, in time order):" in text
        and text.endswith("every rank's logs and records: /x/logs.tar.gz")
    )


def test_an_untimed_error_never_beats_a_timed_one():
    early = "\n".join(
        [
            rank_line(0, "node1", 0, "start"),
            "Traceback (most recent call last):",
            '  File "x.py", line 1',
            "ValueError: late",
        ]
    )
    late = rank_line(1, "node2", 5, "FAILED: rendezvous: ranks [2] did not arrive within 60s")
    t = triage(scan_log(early, source="a", rank=0, year=2026) + scan_log(late, source="b", rank=1, year=2026))
    assert t.root.rank == 1 and "ranks [2] did not arrive" in t.root.text
    assert t.consequences[0].text == "ValueError: late" and not t.consequences[0].timed
    assert "after 2026-11-27 21:00:00.000" in render(t)


def test_records_are_events_and_a_clean_run_says_so():
    t = triage(
        [
            Event(
                T0 + 2,
                True,
                3,
                "node4",
                "failure_rank3.json",
                0,
                "rank failed: server exited with status -9 unasked",
                ("tail",),
            )
        ]
    )
    assert t.root.rank == 3 and "its log ends:" in render(t)
    assert render(triage([], ["a", "b"])) == "no error found in 2 logs and records"


def test_llmlaunch_logs_reads_a_run_dir_and_archives_it(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    (run.path / "launch.json").write_text("{}")
    (run.path / "9_0_log.out").write_text(rank_line(0, "node1", 1, "stopped (signal 15), status 0") + "\n")
    (run.path / "9_1_log.out").write_text(
        rank_line(1, "node2", 0.5, "FAILED: rendezvous: ranks [0] did not arrive within 5s") + "\n"
    )
    run.write_failure(
        1,
        {
            "rank": 1,
            "node": 1,
            "host": "node2",
            "exit_code": 1,
            "log": "9_1_log.out",
            "log_tail": "",
            "time": T0 + 0.6,
            "reason": "rendezvous: ranks [0] did not arrive within 5s",
        },
    )
    (run.path / "rendezvous" / "9").mkdir(parents=True)
    (run.path / "rendezvous" / "9" / "arrived_1").touch()
    assert find_run(str(run.path)).path == run.path
    t = analyse(run)
    assert t.root.source == "9_1_log.out" and t.root.rank == 1
    assert [e.source for e in t.consequences] == []  # the record says what the log line said
    text, archive = report(run)
    assert text.startswith("root cause: rank 1 on node2") and str(archive) in text
    with tarfile.open(archive) as tar:
        names = sorted(tar.getnames())
    assert names == [
        "run/9_0_log.out",
        "run/9_1_log.out",
        "run/failure_rank1.json",
        "run/launch.json",
        "run/rendezvous/9/arrived_1",
    ]


def test_long_context_lines_are_clipped_in_the_report():
    wide = "| exit_timeout | 30 " + " " * 400 + "|"
    t = triage(scan_log("\n".join([wide, rank_line(0, "node1", 1, "FAILED: x")]), source="a", rank=0, year=2026))
    shown = render(t).splitlines()
    assert max(len(ln) for ln in shown) < 320 and any(ln.endswith(" ...") for ln in shown)


def test_a_rank_whose_own_process_was_killed_is_named_from_sruns_line():
    """SIGKILL (or the OOM killer) on a rank's own process leaves no line of its own: srun's line about its task, in
    the batch script's log (rank 0's), names it, and so does the root cause."""
    rank0 = "\n".join(
        [
            rank_line(0, "node1", 1, "OpenAI API READY on http://127.0.0.1:8003/v1 (2.2s, 1 process(es))"),
            "srun: error: node15: task 14: Killed",
            "srun: launch/slurm: _step_signal: Terminating StepId=822.0",
            "srun: error: node1: tasks 0-13,15: Terminated",
        ]
    )
    t = triage(scan_log(rank0, source="822_0_log.out", rank=0, year=2026))
    assert (t.root.rank, t.root.host, t.root.text) == (14, "node15", "srun: error: node15: task 14: Killed")
    assert render(t).startswith(
        "root cause: rank 14 on node15 at after 2026-11-27 21:00:01.000 (822_0_log.out line 2):"
    )
    assert [(e.rank, e.host) for e in t.consequences] == [(0, "node1")]  # the others' ends: srun's second line


def test_task_deaths_name_each_rank_once_in_the_order_srun_reported_them():
    from launcher.triage import task_deaths

    logs = [
        "x\nsrun: error: node15: task 14: Killed\nsrun: error: node1: tasks 0-13,15: Terminated\n",
        "srun: error: node15: task 14: Killed",
    ]
    assert task_deaths(logs) == [(14, "node15", "Killed"), (0, "node1", "Terminated")]
    assert task_deaths(["srun: error: Unable to allocate resources: Invalid partition name specified"]) == []
