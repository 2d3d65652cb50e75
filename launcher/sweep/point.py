"""One sweep point, the Hydra task of `llmlaunch -m ... bench=<profile>`: validate it, launch or reuse a server, run
the load generator next to it, and leave result.json or failure.json in the point's folder (the layout:
launcher/sweep/__init__.py). Never raises: a point that cannot be measured is recorded and the sweep goes on."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, List, Optional, Tuple

from launcher.sweep.plan import (
    Decision,
    axis_overrides,
    bench_argv,
    bench_problems,
    config_changes,
    decide,
    eval_argv,
    first_token_metrics_url,
    judge_bench,
    measure_key,
    point_name,
    prefill_metrics_url,
    server_key,
)
from launcher.sweep.state import (
    STATE,
    Server,
    count,
    hook_exit,
    in_allocation,
    read_json,
    say,
    stop_server,
    sweep_info,
    tokenizer_for,
)


def run_point(cfg) -> int:
    """The Hydra task of one sweep point (launcher/cli.py `run` in multirun). Never raises (except on
    Ctrl-C): a point that cannot be measured leaves failure.json and the sweep goes on. Returns 0."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hc = HydraConfig.get()
    sweep_dir = Path(str(hc.sweep.dir)).absolute()
    overrides = [str(o) for o in hc.overrides.task]
    axes, total = sweep_info(sweep_dir)
    name = point_name(overrides, axes)
    point = sweep_dir / name
    number = f"{int(hc.job.num) + 1}/{total}" if total else f"#{int(hc.job.num) + 1}"
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
        return _run_point(cfg, config, overrides, axes, name, point, number)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # a bug or an unforeseen failure: recorded, the sweep goes on
        import traceback

        from launcher.bench.report import write_failure

        say(f"point {number} {name}: FAILED (unexpected): {e!r}")
        if not bool(cfg.get("dry_run")):
            write_failure(point, overrides, "sweep", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        count("failed")
        return 0


def _validate(cfg, config) -> Tuple[Any, List[str]]:
    from launcher.errors import LaunchError
    from launcher.schedulers.registry import validated

    problems = []
    spec = None
    try:
        spec = validated(cfg)
        from launcher.hostcheck import before_dry_run, before_launch

        if not config.get("dry_run"):  # what this host sees (paths, a GPU), before a server is launched for it
            before_launch(cfg, say)
        else:  # only the model's shape, as a dry run of one launch checks it
            before_dry_run(cfg)
    except LaunchError as e:
        problems += [f"{w}: {why} (fix: {fix})" for w, why, fix in e.problems]
    problems += bench_problems(config.get("bench", {}))
    return spec, problems


def _run_point(cfg, config, overrides, axes, name, point: Path, number: str) -> int:
    dry = bool(config.get("dry_run"))
    stored = read_json(point / "point.json") or {}
    has_result = (point / "result.json").exists()
    spec, problems = _validate(cfg, config)
    key, mkey = server_key(config), measure_key(config)
    in_alloc = in_allocation()  # submitit: this allocation is the point's own, nothing carries over

    def plan(current):
        return decide(
            has_result=has_result,
            stored_measure_key=stored.get("measure_key"),
            measure_key=mkey,
            problems=problems,
            current_key=current,
            key=key,
            failed_server=STATE.failed_servers.get(key),
        )

    d = plan(None if in_alloc else (STATE.dry_key if dry else (STATE.server.key if STATE.server else None)))
    if d.server == "reuse" and not dry and not STATE.server.alive():
        say(f"{STATE.server.describe()} is no longer running (job ended: time limit?); launching a new one")
        STATE.server = None
        d = plan(None)
    head = f"point {number} {name}"

    if d.action == "skip":
        when = (read_json(point / "result.json") or {}).get("started_at", "?")
        say(f"{head}: skipped, result.json exists (measured {when}); delete it to measure again")
        count("skipped")
        return 0
    if has_result:
        changes = "; ".join(config_changes(stored.get("config", {}), config)) or "unknown change"
        say(f"{head}: result.json was measured with another config ({changes}); measuring again")
    elif (point / "failure.json").exists():
        say(f"{head}: failed before ({(read_json(point / 'failure.json') or {}).get('stage', '?')}); trying again")
    if d.action == "fail":
        say(f"{head}: {'would fail' if dry else 'FAILED'} before starting anything: {d.reason}")
        if dry:
            count("failed")
        else:
            _prepare_point_dir(point, overrides, axes, config, key, mkey, None)
            _record_failure(point, overrides, d.stage, d.reason)
        return 0

    bench = config["bench"]
    if dry:
        return _dry_point(head, d, spec, bench, key, name, point)
    _prepare_point_dir(point, overrides, axes, config, key, mkey, None)
    from launcher.schedulers import registry as scheduler

    if in_alloc:
        server, why = _launch(spec, key, name, head, scheduler.get("allocation"), (config, overrides))
        if server is None:
            _record_failure(point, overrides, "serve", why)
            return 0
        try:
            _measure(server, bench, head, point, overrides, axes, config, key, mkey)
        finally:
            server.stop()
        return 0
    if d.stop_current:
        say(f"{head}: needs a different server; stopping {STATE.server.describe()}")
        stop_server()
    if d.server == "launch":
        hook_exit()
        STATE.server, why = _launch(spec, key, name, head, scheduler.for_spec(spec), (config, overrides))
        if STATE.server is None:
            STATE.failed_servers[key] = why.replace("\n", " ")[:2000]
            _record_failure(point, overrides, "serve", why)
            return 0
    else:
        say(f"{head}: reusing {STATE.server.describe()}, launched for point {STATE.server.first_point}: {d.reason}")
    _measure(STATE.server, bench, head, point, overrides, axes, config, key, mkey)
    return 0


def _record_failure(point, overrides, stage, error, log=None, exit_code=None):
    from launcher.bench.report import write_failure

    write_failure(point, overrides, stage, error, exit_code=exit_code, log=log)
    count("failed")


def _launch(spec, key, name, head, backend, composed=None) -> Tuple[Optional[Server], str]:
    """Start a server for point `name` through `backend` (a launcher/schedulers/base.py entry): (server, "") or
    (None, why it did not start). A server that does not get to serve is not left running. `composed`: the
    point's (config, overrides), for the server's run record."""
    import dataclasses

    from launcher.errors import LaunchError
    from launcher.record import base_record
    from launcher.rundir import default_run_dir

    request = backend.dryrun(spec, default_run_dir(spec))
    if composed is not None:
        request = dataclasses.replace(
            request, record=base_record(composed[0], list(composed[1]), backend.name, request.run_dir)
        )
    server = Server(key, backend, request.spec, first_point=name)
    say(f"{head}: launching {server.describe()}")
    t0 = time.monotonic()
    try:
        server.endpoint = backend.launch(request)
    except (LaunchError, OSError, RuntimeError, ValueError, KeyError) as e:
        why = e.render() if isinstance(e, LaunchError) else f"{type(e).__name__}: {e}"
        say(f"{head}: the server did not start: {why}")
        return None, why
    server.spec = server.endpoint.spec  # its model path resolved: the bench reads its tokenizer
    server.metrics_url = first_token_metrics_url(server.spec, server.endpoint.doc)
    server.prefill_metrics_url = prefill_metrics_url(server.spec, server.endpoint.doc)
    count("launches")
    say(f"{server.describe()} READY at {server.url} in {time.monotonic() - t0:.1f}s (job {server.job_id})")
    return server, ""


def _prepare_point_dir(point: Path, overrides, axes, config, key, mkey, server: Optional[Server]) -> None:
    """A fresh attempt: earlier outcomes step aside (a result measured with another config is kept as
    result.previous.json, out of the report's sight); overrides.yaml and point.json describe this one."""
    import yaml

    point.mkdir(parents=True, exist_ok=True)
    if (point / "result.json").exists():
        os.replace(point / "result.json", point / "result.previous.json")
    for stale in ("failure.json", "result.failed.json", "eval.json"):
        (point / stale).unlink(missing_ok=True)
    (point / "overrides.yaml").write_text(yaml.safe_dump(axis_overrides(overrides, axes), default_flow_style=False))
    doc = {
        "format": "llmlaunch-sweep-point/1",
        "overrides": overrides,
        "server_key": key,
        "measure_key": mkey,
        "server": None,
        "config": config,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if server is not None:
        doc["server"] = {
            "kind": server.kind,
            "job_id": server.job_id,
            "run_dir": str(server.endpoint.run),
            "url": server.url,
            "launched_for": server.first_point,
            # its time to READY (launcher/readiness.py): summary.csv's ready_* columns
            "time_to_ready": (server.endpoint.run.read_record() or {}).get("time_to_ready"),
        }
    (point / "point.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


def _measure(server: Server, bench, head, point: Path, overrides, axes, config, key, mkey) -> None:
    from launcher.logtext import log_tail

    _prepare_point_dir(point, overrides, axes, config, key, mkey, server)
    result_path = point / "result.json"
    args = bench_argv(
        bench,
        server.url,
        server.endpoint.model,
        str(result_path),
        tokenizer_for(server.spec),
        label=point.name,
        server_metrics=server.metrics_url,
        prefill_metrics=server.prefill_metrics_url,
    )
    argv = server.backend.client_argv(server.endpoint, args)
    log = point / "bench.log"
    t0 = time.monotonic()
    rc = _client(argv, log, head)
    result = read_json(result_path)
    why = judge_bench(rc, result)
    if why is None:
        m = result["metrics"]
        say(
            f"{head}: done in {time.monotonic() - t0:.1f}s: {m.get('completed')}/{m.get('requests')} requests, "
            f"{m.get('output_throughput', 0):.1f} output tokens/s"
            + (f", {m.get('failed')} failed" if m.get("failed") else "")
        )
        count("measured")
        from launcher.record import add_bench

        scores, why = _evaluate(server, bench, head, point)
        add_bench(
            server.endpoint.run,
            {
                "point": str(point),
                "result": str(result_path),
                **{k: m.get(k) for k in ("completed", "requests", "failed", "request_throughput", "output_throughput")},
                **({"eval": scores} if scores else {}),
            },
        )
        if why is None:
            return
        say(f"{head}: FAILED: {why}")  # the load's result stays: what failed is the answers
        _record_failure(point, overrides, "eval", why, log="eval.log")
        return
    if result is not None:  # a run with nothing measured is not a result: keep it aside for reading
        result_path.rename(point / "result.failed.json")
    say(f"{head}: FAILED: {why}")
    detail = "" if result is not None else "\n" + log_tail(log, 8)  # no result: the generator's own error message
    _record_failure(point, overrides, "bench", why + detail, log="bench.log", exit_code=rc)
    if not server.alive():
        say(f"{server.describe()} is gone")
        if server is STATE.server:
            STATE.server = None


def _client(argv: List[str], log: Path, head: str) -> int:
    """Run a llmlaunch-bench command of the point (its output to `log` and to our stderr); its exit status."""
    import subprocess

    from launcher.paths import PACKAGE_ROOT

    env = dict(os.environ)  # the client imports launcher.bench from this checkout (shared with the nodes)
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    say(f"{head}: measuring: {shlex.join(argv)}")
    with open(log, "w", encoding="utf-8") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            for line in p.stdout:  # the table and errors go to the log and to our stderr
                out.write(line)
                sys.stderr.write(f"  | {line}")
            return p.wait()
        finally:  # interrupted (Ctrl-C, SIGTERM): the client does not outlive the sweep
            if p.poll() is None:
                p.terminate()


def _evaluate(server: Server, bench, head, point: Path) -> Tuple[Optional[dict], Optional[str]]:
    """bench.eval: llmlaunch-bench --eval against the server's OpenAI API after the load; (its scores by task, why
    the point fails: the model answered nothing, or the check did not run).  (None, None) when not asked."""
    url = server.endpoint.doc.openai_url
    args = eval_argv(bench, url, tokenizer_for(server.spec), str(point / "eval.json"))
    if not args:
        return None, None
    rc = _client(server.backend.client_argv(server.endpoint, args), point / "eval.log", head)
    scores = (read_json(point / "eval.json") or {}).get("tasks")
    if rc == 0 and scores:
        say(f"{head}: answers: " + ", ".join(f"{t} {s['metric']} {s['value']:.3f}" for t, s in scores.items()))
        return scores, None
    if rc == 1 and scores:
        return scores, "the model answered none of the generation items (llmlaunch-bench --eval; see eval.log)"
    return scores, f"llmlaunch-bench --eval exited with status {rc} (see eval.log)"


def _compact_plan(text: str) -> str:
    """The launch plan without the model repository's files (`llmlaunch <overrides> dry_run=true` shows them)."""
    parts = text.rstrip().split("\n===== ")
    kept = [parts[0]] + [p for p in parts[1:] if not p.startswith("file model_repository/")]
    files = len(parts) - len(kept)
    return "\n===== ".join(kept) + (f"\n(+ {files} model repository files, not shown)" if files else "")


def _dry_point(head, d: Decision, spec, bench, key, name, point: Path) -> int:
    from launcher.plan import plan_text
    from launcher.rundir import RunDir, default_run_dir
    from launcher.schedulers.base import Endpoint
    from launcher.schedulers.registry import for_spec

    lines = [f"\n######## {head}  ->  {point}"]
    if d.server == "reuse":
        lines.append(f"server: reuse the one launched for point {STATE.dry_first} (same server-side config, key {key})")
    else:
        if d.stop_current:
            lines.append(f"server: stop the one launched for point {STATE.dry_first}; then launch (key {key}):")
        else:
            lines.append(f"server: launch (key {key}):")
        lines.append(_compact_plan(plan_text(spec, default_run_dir(spec))))
        STATE.dry_key, STATE.dry_first = key, name
        count("launches")
    tok = tokenizer_for(spec) or ("<model tokenizer>" if spec.model.make else "")
    args = bench_argv(bench, "<endpoint url>", spec.model_name, str(point / "result.json"), tok, label=name)
    argv = for_spec(spec).client_argv(
        Endpoint("<endpoint url>", spec.model_name, "<job id>", RunDir("<run dir>"), spec), args
    )
    lines.append(f"load: {shlex.join(argv)}")
    print("\n".join(lines), flush=True)
    count("measured")
    return 0
