"""Sweeps: `llmlaunch -m ... bench=<profile>` measures every point of a Hydra multirun.

    llmlaunch -m cluster=local_slurm engine=hf replicas=1,2 bench=sharegpt_small bench.concurrency=1,8,32

Each point is one Hydra job. It gets a stable directory under `hydra.sweep.dir`
named from the overrides that vary across the sweep (`bench.concurrency=8,replicas=2`),
launches a server or REUSES the one the previous point left running when only
client-side values (`bench.*`) changed, runs the load generator in the same
allocation (on Slurm `srun --jobid=<job> --overlap ...`, so the client sits on the
cluster next to the server; locally a subprocess against 127.0.0.1), and leaves

    <sweep_dir>/sweep.json                the sweep's overrides and axes (written before the first point)
    <sweep_dir>/<point>/overrides.yaml    what this point changed (the axes), read by llmlaunch-report
    <sweep_dir>/<point>/point.json        every override, the composed config, the server it ran against
    <sweep_dir>/<point>/bench.log         the load generator's output
    <sweep_dir>/<point>/result.json       llmlaunch-bench's result ("llmlaunch-bench/1"), or
    <sweep_dir>/<point>/failure.json      why the point could not be measured (report.write_failure)

A re-run with the same `hydra.sweep.dir` skips points whose result.json was
measured with the same config, and retries failed ones. At the end (Hydra's
`on_multirun_end`, `SweepCallback` below, registered in conf/config.yaml) the
last server is stopped and `llmlaunch-report <sweep_dir>` writes summary.csv and
the plots. `dry_run=true` prints every point's plan and what would be skipped,
reused or launched, and writes nothing.
Layout: the pure planning (server key, point names, skip/reuse decisions, the load generator's
command line) is launcher/sweep_plan.py; this module is the part with side effects: `run_point` (the
Hydra task of a point), the server it launches through the scheduler registry (launcher/schedulers/base.py:
the cluster's scheduler, or "allocation" when the point is its own Slurm allocation), and `SweepCallback`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hydra.experimental.callback import Callback  # Hydra instantiates SweepCallback on every run: imports stay light

from launcher.sweep_plan import (  # noqa: F401  check_sweep: launcher/cli.py validates a multirun through it
    Decision,
    axis_overrides,
    bench_argv,
    bench_problems,
    check_sweep,
    config_changes,
    decide,
    first_token_metrics_url,
    judge_bench,
    measure_key,
    order_advice,
    parse_sweep,
    point_name,
    server_key,
)


def say(msg: str) -> None:
    print(f"llmlaunch sweep: {msg}", file=sys.stderr, flush=True)


@dataclass
class SweepInfo:
    """What on_multirun_start learnt from the command line."""

    sweep_dir: Path
    overrides: List[str]
    axes: List[str]
    total: int
    dry_run: bool = False
    existed: Optional[Path] = None  # the deepest part of sweep_dir that existed before the sweep (dry-run cleanup)
    multirun_yaml: Optional[bytes] = None  # its multirun.yaml before Hydra rewrote it (dry run puts it back)

    def to_json(self) -> str:
        return (
            json.dumps(
                {
                    "format": "llmlaunch-sweep/1",
                    "overrides": self.overrides,
                    "axes": self.axes,
                    "points": self.total,
                    "argv": sys.argv,
                },
                indent=1,
            )
            + "\n"
        )


@dataclass
class Server:
    """A server this sweep launched: its key, the backend that launched it, the endpoint it serves."""

    key: str  # server_key of the points it serves
    backend: Any  # launcher.schedulers.base.Scheduler: the registry entry that launched it
    spec: Any  # the LaunchSpec of its launch
    first_point: str = ""  # the point it was launched for
    endpoint: Any = None  # launcher.schedulers.base.Endpoint, once it serves
    metrics_url: str = ""  # where the bench reads the first-token split (first_token_metrics_url), if any

    @property
    def kind(self) -> str:
        return self.backend.name

    @property
    def url(self) -> str:
        return self.endpoint.url if self.endpoint else ""

    @property
    def job_id(self) -> str:
        return self.endpoint.job_id if self.endpoint else ""

    def describe(self) -> str:
        s = self.spec
        return f"{self.kind} server {self.key} (engine={s.engine.name} tp={s.tp} pp={s.pp} nodes={s.nodes} replicas={s.replicas})"

    def alive(self) -> bool:
        return self.endpoint is not None and self.backend.alive(self.endpoint)

    def stop(self) -> None:
        if self.endpoint is not None:
            self.backend.stop(self.endpoint)


@dataclass
class _State:
    """What lives across the points of one sequential sweep (Hydra's basic launcher: one process)."""

    info: Optional[SweepInfo] = None
    server: Optional[Server] = None
    failed_servers: Dict[str, str] = field(default_factory=dict)  # server key -> why it did not start
    counts: Dict[str, int] = field(default_factory=dict)  # skipped / measured / failed / launches
    dry_key: Optional[str] = None  # dry run: the server a real run would have running now
    dry_first: str = ""  # dry run: the point that would have launched it
    exit_hooked: bool = False


STATE = _State()


def _count(what: str) -> None:
    STATE.counts[what] = STATE.counts.get(what, 0) + 1


def _sweep_info(sweep_dir: Path) -> Tuple[Optional[List[str]], int]:
    """(axes, number of points) of the sweep this job belongs to: from on_multirun_start in this
    process, else from <sweep_dir>/sweep.json (submitit jobs), else unknown (None, 0)."""
    if STATE.info is not None and STATE.info.sweep_dir == sweep_dir:
        return STATE.info.axes, STATE.info.total
    try:
        doc = json.loads((sweep_dir / "sweep.json").read_text())
        return list(doc["axes"]), int(doc.get("points", 0))
    except (OSError, ValueError, KeyError):
        return None, 0


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tokenizer_for(spec) -> str:
    """The model's tokenizer folder when it is readable here (exact token counts), else '' (estimates)."""
    for p in (spec.model.tokenizer, spec.model.path, getattr(spec.engine, "tokenizer_dir", "")):
        if p and any((Path(p) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
            return str(p)
    return ""


def _in_allocation() -> bool:
    """True inside a job hydra-submitit-launcher submitted (submitit's job script exports
    SUBMITIT_EXECUTOR=slurm): the point is its own allocation. A sweep started inside salloc is not."""
    return os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and bool(os.environ.get("SLURM_JOB_ID"))


def _hook_exit() -> None:
    """Stop the running server however this process ends (Ctrl-C, an exception, SIGTERM)."""
    if STATE.exit_hooked:
        return
    import atexit
    import signal

    atexit.register(stop_server)
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))
    STATE.exit_hooked = True


def stop_server() -> None:
    server, STATE.server = STATE.server, None
    if server is not None:
        say(f"stopping {server.describe()}")
        try:
            server.stop()
        except Exception as e:  # never let teardown hide the sweep's own outcome
            say(f"could not stop {server.describe()}: {e}")


def run_point(cfg) -> int:
    """The Hydra task of one sweep point (launcher/cli.py `run` in multirun). Never raises (except on
    Ctrl-C): a point that cannot be measured leaves failure.json and the sweep goes on. Returns 0."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hc = HydraConfig.get()
    sweep_dir = Path(str(hc.sweep.dir)).absolute()
    overrides = [str(o) for o in hc.overrides.task]
    axes, total = _sweep_info(sweep_dir)
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
        _count("failed")
        return 0


def _validate(cfg, config) -> Tuple[Any, List[str]]:
    from launcher.errors import LaunchError
    from launcher.validate import build_spec

    problems = []
    spec = None
    try:
        spec = build_spec(cfg)
        if not config.get("dry_run"):  # what this host sees (paths, a GPU), before a server is launched for it
            from launcher.hostcheck import before_launch

            before_launch(cfg, say)
    except LaunchError as e:
        problems += [f"{w}: {why} (fix: {fix})" for w, why, fix in e.problems]
    problems += bench_problems(config.get("bench", {}))
    return spec, problems


def _run_point(cfg, config, overrides, axes, name, point: Path, number: str) -> int:
    dry = bool(config.get("dry_run"))
    stored = _read_json(point / "point.json") or {}
    has_result = (point / "result.json").exists()
    spec, problems = _validate(cfg, config)
    key, mkey = server_key(config), measure_key(config)
    in_alloc = _in_allocation()  # submitit: this allocation is the point's own, nothing carries over

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
        when = (_read_json(point / "result.json") or {}).get("started_at", "?")
        say(f"{head}: skipped, result.json exists (measured {when}); delete it to measure again")
        _count("skipped")
        return 0
    if has_result:
        changes = "; ".join(config_changes(stored.get("config", {}), config)) or "unknown change"
        say(f"{head}: result.json was measured with another config ({changes}); measuring again")
    elif (point / "failure.json").exists():
        say(f"{head}: failed before ({(_read_json(point / 'failure.json') or {}).get('stage', '?')}); trying again")
    if d.action == "fail":
        say(f"{head}: {'would fail' if dry else 'FAILED'} before starting anything: {d.reason}")
        if dry:
            _count("failed")
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
        _hook_exit()
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
    _count("failed")


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
    _count("launches")
    say(f"{server.describe()} READY at {server.url} in {time.monotonic() - t0:.1f}s (job {server.job_id})")
    return server, ""


def _prepare_point_dir(point: Path, overrides, axes, config, key, mkey, server: Optional[Server]) -> None:
    """A fresh attempt: earlier outcomes step aside (a result measured with another config is kept as
    result.previous.json, out of the report's sight); overrides.yaml and point.json describe this one."""
    import yaml

    point.mkdir(parents=True, exist_ok=True)
    if (point / "result.json").exists():
        os.replace(point / "result.json", point / "result.previous.json")
    for stale in ("failure.json", "result.failed.json"):
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
    import subprocess

    from launcher.paths import PACKAGE_ROOT
    from launcher.triton import log_tail

    _prepare_point_dir(point, overrides, axes, config, key, mkey, server)
    result_path = point / "result.json"
    args = bench_argv(
        bench,
        server.url,
        server.endpoint.model,
        str(result_path),
        _tokenizer_for(server.spec),
        label=point.name,
        server_metrics=server.metrics_url,
    )
    argv = server.backend.client_argv(server.endpoint, args)
    env = dict(os.environ)  # the client imports launcher.bench from this checkout (shared with the nodes)
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log = point / "bench.log"
    say(f"{head}: measuring: {shlex.join(argv)}")
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        try:
            for line in p.stdout:  # the table and errors go to the log and to our stderr
                out.write(line)
                sys.stderr.write(f"  | {line}")
            rc = p.wait()
        finally:  # interrupted (Ctrl-C, SIGTERM): the client does not outlive the sweep
            if p.poll() is None:
                p.terminate()
    result = _read_json(result_path)
    why = judge_bench(rc, result)
    if why is None:
        m = result["metrics"]
        say(
            f"{head}: done in {time.monotonic() - t0:.1f}s: {m.get('completed')}/{m.get('requests')} requests, "
            f"{m.get('output_throughput', 0):.1f} output tokens/s"
            + (f", {m.get('failed')} failed" if m.get("failed") else "")
        )
        _count("measured")
        from launcher.record import add_bench

        add_bench(
            server.endpoint.run,
            {
                "point": str(point),
                "result": str(result_path),
                **{k: m.get(k) for k in ("completed", "requests", "failed", "request_throughput", "output_throughput")},
            },
        )
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
        _count("launches")
    tok = _tokenizer_for(spec) or ("<model tokenizer>" if spec.model.make else "")
    args = bench_argv(bench, "<endpoint url>", spec.model_name, str(point / "result.json"), tok, label=name)
    argv = for_spec(spec).client_argv(
        Endpoint("<endpoint url>", spec.model_name, "<job id>", RunDir("<run dir>"), spec), args
    )
    lines.append(f"load: {shlex.join(argv)}")
    print("\n".join(lines), flush=True)
    _count("measured")
    return 0


# =============================================================================== Hydra callback
class SweepCallback(Callback):
    """conf/config.yaml `hydra.callbacks.llmlaunch_sweep`: set-up before the first point, teardown and
    the report after the last. Does nothing for single runs or for multiruns without a load (bench=none)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        from omegaconf import OmegaConf

        overrides = [str(o) for o in config.hydra.overrides.task]
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        try:
            axes, total = parse_sweep(overrides)
        except Exception:  # Hydra reports bad overrides itself, with its own message
            return
        STATE.__init__()
        if OmegaConf.select(config, "bench.name", default="none") == "none" and "bench" not in axes:
            return  # -m without a load: each point is launched as before (launcher/cli.py), not a sweep
        dry = str(OmegaConf.select(config, "dry_run", default=False)).lower() == "true"
        existed = next((p for p in [sweep_dir, *sweep_dir.parents] if p.exists()), None)
        before = sweep_dir / "multirun.yaml"
        STATE.info = SweepInfo(
            sweep_dir, overrides, axes, total, dry, existed, before.read_bytes() if before.exists() else None
        )
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        if "submitit" in launcher:
            if dry:
                say(
                    "dry_run=true with hydra/launcher=submitit_slurm would submit a job per point to print its plan; "
                    "run the dry run with the default launcher (drop hydra/launcher=...)"
                )
                raise SystemExit(2)
        say(f"{total or '?'} points in {sweep_dir}" + (" (dry run: nothing is written or started)" if dry else ""))
        if "submitit" in launcher:
            say(
                f"hydra/launcher=submitit_slurm: each point runs in its own allocation (no server reuse); "
                f"their logs: {sweep_dir}/.submitit/<job>_<n>/"
            )
        advice = order_advice(overrides, axes)
        if advice and "submitit" not in launcher:
            say(f"note: {advice}")
        if not dry:
            sweep_dir.mkdir(parents=True, exist_ok=True)
            (sweep_dir / "sweep.json").write_text(STATE.info.to_json())

    def on_multirun_end(self, config, **kwargs) -> None:
        info = STATE.info
        stop_server()
        if info is None:
            return
        c = STATE.counts
        if info.dry_run:
            _undo_hydra_dirs(info)
            say(
                f"dry run: {c.get('measured', 0)} points to measure on {c.get('launches', 0)} server launches, "
                f"{c.get('skipped', 0)} skipped (result.json exists), {c.get('failed', 0)} invalid; nothing was written"
            )
            return
        from launcher.bench import report

        points = report.load_points(info.sweep_dir)
        if not points:
            return
        if c:
            say(
                f"{c.get('measured', 0)} points measured, {c.get('skipped', 0)} skipped (done before), "
                f"{c.get('failed', 0)} failed (failure.json); {c.get('launches', 0)} server launches"
            )
        say(f"report: llmlaunch-report {info.sweep_dir}")
        code = report.main([str(info.sweep_dir)])
        if code == 0:
            say(f"summary: {info.sweep_dir / 'summary.csv'}")
            say(
                f"plots: {info.sweep_dir / 'throughput_vs_concurrency.png'}, {info.sweep_dir / 'latency_throughput.png'}"
            )


def _undo_hydra_dirs(info: SweepInfo) -> None:
    """Dry run: Hydra's sweeper made the sweep dir and (re)wrote multirun.yaml; undo both."""
    d = info.sweep_dir
    if info.multirun_yaml is not None:
        (d / "multirun.yaml").write_bytes(info.multirun_yaml)
    else:
        (d / "multirun.yaml").unlink(missing_ok=True)
    while d != info.existed and d.exists():
        try:
            d.rmdir()
        except OSError:  # not empty: something else is there, leave it
            return
        d = d.parent
