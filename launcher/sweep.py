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

Layout of this module: pure planning functions first (server key, point names,
skip/reuse decisions, command lines; tests/integration/test_sweep.py), then the one part with
side effects: the servers (`SlurmServer`, `LocalServer`, `AllocationServer`),
`run_point` (the Hydra task of a point) and `SweepCallback`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from hydra.experimental.callback import Callback  # Hydra instantiates SweepCallback on every run: imports stay light

# Config keys that never change what is measured (where files go, how long to wait).
NOT_MEASURED = ("dry_run", "run_dir", "serve.ready_timeout_s", "serve.drain_timeout_s", "cluster.jobs_dir")
# Config keys the load generator owns: changing only these keeps the server.
CLIENT_KEYS = ("bench",)
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._=+-")
MAX_NAME = 120


def say(msg: str) -> None:
    print(f"llmlaunch sweep: {msg}", file=sys.stderr, flush=True)


# =============================================================================== pure planning
def override_key(override: str) -> str:
    """'+bench.seed=3' -> 'bench.seed'; '~x' -> 'x'."""
    return override.split("=", 1)[0].lstrip("+~")


def is_client_override(override: str) -> bool:
    """True for overrides only the load generator reads (`bench=...`, `bench.*=...`)."""
    key = override_key(override)
    return any(key == k or key.startswith(k + ".") for k in CLIENT_KEYS)


def server_overrides(overrides: Iterable[str]) -> List[str]:
    """The overrides that shape the server (what a server launched on its own would be given)."""
    return [o for o in overrides if not is_client_override(o) and override_key(o) not in ("dry_run", "run_dir")]


def _drop(config: Mapping[str, Any], dotted: Iterable[str]) -> Dict[str, Any]:
    out = json.loads(json.dumps(config, default=str))  # deep copy, plain types
    for key in dotted:
        node = out
        *parents, last = key.split(".")
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
            if node is None:
                break
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def _digest(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def server_key(config: Mapping[str, Any]) -> str:
    """Identity of the server a composed config (plain dict, no `hydra`) asks for: equal keys = reusable."""
    return _digest(_drop(config, NOT_MEASURED + CLIENT_KEYS))


def measure_key(config: Mapping[str, Any]) -> str:
    """Identity of a measurement: the whole config except where files go and timeouts."""
    return _digest(_drop(config, NOT_MEASURED))


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 6) -> List[str]:
    """'key: old -> new' for leaves that differ (to say why a point is measured again)."""

    def flat(d, prefix=""):
        out = {}
        for k, v in (d or {}).items():
            if isinstance(v, dict):
                out.update(flat(v, f"{prefix}{k}."))
            else:
                out[f"{prefix}{k}"] = v
        return out

    a, b = flat(_drop(old, NOT_MEASURED)), flat(_drop(new, NOT_MEASURED))
    diffs = [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return diffs[:limit] + ([f"... and {len(diffs) - limit} more"] if len(diffs) > limit else [])


def parse_sweep(overrides: Sequence[str]) -> Tuple[List[str], int]:
    """Command-line overrides of a multirun -> (axes: keys that take several values, number of points)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    axes, total = [], 1
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        if o.is_sweep_override():
            axes.append(override_key(o.get_key_element()))
            if o.is_discrete_sweep():
                total *= len(list(o.sweep_string_iterator()))
    return axes, total


def value_overrides(overrides: Sequence[str]) -> List[List[str]]:
    """One override list per swept value, the other axes at their first value. Composing these finds
    every value Hydra would refuse (a type error, an unknown key) without composing the whole product."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    options = []
    for text, o in zip(overrides, parsed):
        if o.is_sweep_override() and o.is_discrete_sweep():
            options.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
        else:
            options.append([text])
    lists = [[opts[0] for opts in options]]
    for i, opts in enumerate(options):
        for value in opts[1:]:
            lists.append([value if j == i else first[0] for j, first in enumerate(options)])
    return lists


def check_sweep(overrides: Sequence[str]) -> None:
    """Before Hydra runs a multirun: raise LaunchError naming each swept value that does not compose.
    (Hydra composes every point first and stops the whole sweep on one bad value, with its own message;
    values that compose but are invalid, e.g. tp=3, become that point's failure.json instead.)"""
    from launcher.cli import _hydra_problem, compose
    from launcher.errors import LaunchError

    try:
        lists = value_overrides(overrides)
    except Exception as e:
        raise LaunchError(_hydra_problem(e)) from None
    problems = []
    for ovs in lists:
        try:
            compose(ovs)
        except Exception as e:
            problem = _hydra_problem(e)
            if problem not in problems:
                problems.append(problem)
    if problems:
        raise LaunchError(problems)


def order_advice(overrides: Sequence[str], axes: Sequence[str]) -> Optional[str]:
    """Hydra's basic sweeper varies the LAST override fastest. A client-side axis (bench.*) listed
    before a server-side one makes consecutive points change servers: say how to order them."""
    swept = [o for o in overrides if override_key(o) in axes]
    kinds = [is_client_override(o) for o in swept]
    if any(kinds[i] and not kinds[j] for i in range(len(kinds)) for j in range(i + 1, len(kinds))):
        better = [o for o in swept if not is_client_override(o)] + [o for o in swept if is_client_override(o)]
        return ("a client-side axis comes before a server-side one, so consecutive points would change servers "
                f"and each server would be launched several times; list server-side axes first: {' '.join(better)}")
    return None


def _clean(text: str) -> str:
    return "".join(c if c in _NAME_CHARS else "_" for c in text)


def point_name(overrides: Sequence[str], axes: Optional[Sequence[str]] = None) -> str:
    """Directory name of a point: its swept overrides (all of them when the axes are unknown),
    sorted, unsafe characters as '_', joined by ','. Stable across re-runs of the same sweep,
    whatever order the overrides were given in; very long names end in a hash of the full one."""
    chosen = [o for o in overrides if axes is None or override_key(o) in axes]
    if not chosen:
        return "default"
    name = ",".join(_clean(o.lstrip("+")) for o in sorted(chosen, key=lambda o: (override_key(o), o)))
    if len(name) > MAX_NAME:
        name = f"{name[:MAX_NAME - 13]}-{hashlib.sha1(name.encode()).hexdigest()[:12]}"
    return name


def axis_overrides(overrides: Sequence[str], axes: Optional[Sequence[str]]) -> List[str]:
    """What the point changed within its sweep (its overrides.yaml, the report's labels)."""
    return [o for o in overrides if axes is None or override_key(o) in axes]


@dataclass(frozen=True)
class Decision:
    """What to do for one point."""

    action: str  # skip (result.json is current) | fail (invalid, nothing started) | measure
    server: str = "none"  # none | reuse (the running one) | launch
    stop_current: bool = False  # stop the running server first (it is not the one this point needs)
    reason: str = ""  # one line for the log
    stage: str = ""  # fail: where it failed, for failure.json (validate | serve)


def decide(*, has_result: bool, stored_measure_key: Optional[str], measure_key: str, problems: Sequence[str],
           current_key: Optional[str], key: str, failed_server: Optional[str] = None) -> Decision:
    """Skip / fail / measure, and which server. Pure: the caller reads the point dir and tracks the server.

    has_result: the point dir has a result.json; stored_measure_key: the measure key in its point.json
    (None: unknown, e.g. written by hand: trusted); problems: validation errors of this point;
    current_key: the server key of the running server (None: none); failed_server: why launching
    this key's server already failed in this sweep (then it is not tried again)."""
    if has_result and (stored_measure_key is None or stored_measure_key == measure_key):
        return Decision("skip", reason="result.json exists")
    if problems:
        return Decision("fail", reason="; ".join(problems), stage="validate")
    if key == current_key:
        return Decision("measure", "reuse", False, "same server-side config as the running server")
    if failed_server is not None:
        return Decision("fail", reason=f"its server failed to start for an earlier point: {failed_server}", stage="serve")
    why = "measured with a different config" if has_result else "not measured yet"
    return Decision("measure", "launch", current_key is not None, why)


def bench_problems(bench: Mapping[str, Any]) -> List[str]:
    """Load settings the generator would refuse, found before any server is started for them."""
    out = []
    if bench.get("name") in (None, "", "none"):
        out.append("bench=none: nothing to measure; choose a load profile, e.g. bench=sharegpt_small")
    dataset = str(bench.get("dataset", "synthetic"))
    kind, _, path = dataset.partition(":")
    if kind not in ("synthetic", "sharegpt", "cnn", "prompts") or (kind != "synthetic" and not path):
        out.append(f"bench.dataset={dataset!r}: use synthetic, sharegpt:<path>, cnn:<path> or prompts:<path>")
    rate = float(bench.get("request_rate") or 0)
    if rate < 0:
        out.append(f"bench.request_rate={rate:g}: must be > 0 (requests/s), or 0 for fixed concurrency")
    if rate == 0 and int(bench.get("concurrency") or 0) < 1:
        out.append(f"bench.concurrency={bench.get('concurrency')}: must be >= 1 (requests in flight)")
    for k in ("num_prompts", "output_len", "input_len"):
        if int(bench.get(k) or 0) < 1:
            out.append(f"bench.{k}={bench.get(k)}: must be >= 1")
    if int(bench.get("warmup") or 0) < 0:
        out.append(f"bench.warmup={bench.get('warmup')}: must be >= 0")
    for k in ("processes", "streams"):
        if int(bench.get(k, 1)) < 1:
            out.append(f"bench.{k}={bench.get(k)}: must be >= 1")
    processes = int(bench.get("processes", 1))
    if rate == 0 and processes > int(bench.get("concurrency") or 0) >= 1:
        out.append(f"bench.processes={processes}: more client processes than bench.concurrency={bench.get('concurrency')} "
                   f"requests in flight; set bench.processes <= bench.concurrency")
    return out


def first_token_metrics_url(spec, endpoint: Mapping[str, Any]) -> str:
    """Metrics URL of the tritonserver holding a model that reports the first-token split the bench shows
    (EngineDef.first_token_split; launcher/serving/timings.py): rank 0's with one replica.  "" otherwise: other
    engines have no split, and with replicas the public metrics port is the front end's."""
    from launcher.engines.registry import ENGINES

    if not ENGINES[spec.engine.name].first_token_split or spec.replicas != 1 or not endpoint.get("metrics_port"):
        return ""
    host = urlsplit(endpoint["url"]).hostname or ""
    return f"http://{f'[{host}]' if ':' in host else host}:{int(endpoint['metrics_port'])}/metrics"


def bench_argv(bench: Mapping[str, Any], url: str, model: str, result_json: str, tokenizer: str = "",
               label: str = "", server_metrics: str = "") -> List[str]:
    """`llmlaunch-bench` arguments for a BenchConfig (launcher/schema.py) against one endpoint."""
    kind, _, path = str(bench.get("dataset", "synthetic")).partition(":")
    argv = ["--url", url, "--model", model, "--dataset-name", kind]
    if path:
        argv += ["--dataset", path]
    argv += ["--num-prompts", str(int(bench["num_prompts"])), "--input-len", str(int(bench["input_len"])),
             "--output-len", str(int(bench["output_len"])), "--seed", str(int(bench.get("seed", 0))),
             "--warmup", str(int(bench.get("warmup", 0)))]
    rate = float(bench.get("request_rate") or 0)
    if rate > 0:
        argv += ["--request-rate", f"{rate:g}"]  # open loop: arrivals paced, no concurrency cap
    else:
        argv += ["--concurrency", str(int(bench["concurrency"]))]
    for k in ("processes", "streams"):  # the client's own CPU must not be what a sweep point measures
        if int(bench.get(k) or 1) > 1:
            argv += [f"--{k}", str(int(bench[k]))]
    if bench.get("ignore_eos", True):
        argv.append("--ignore-eos")
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    if label:
        argv += ["--label", label]
    if server_metrics:
        argv += ["--server-metrics", server_metrics]
    return argv + ["--no-progress", "--result-json", result_json]


def client_argv(python: str, bench_args: Sequence[str], job_id: Optional[str] = None,
                container_args: Sequence[str] = ()) -> List[str]:
    """The load generator's command: inside the server's Slurm allocation (one task on the job's first
    node, the one rank 0 serves from, sharing its resources) when job_id is given, else here."""
    prefix: List[str] = []
    if job_id:
        prefix = ["srun", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1", "--mpi=none", *container_args]
    return [*prefix, python, "-m", "launcher.bench.cli", *bench_args]


def allocation_problems(nodes: int, tasks_per_node: int, cpus_per_task: int, gpus_per_node: int,
                        env: Mapping[str, str]) -> List[Tuple[str, str, str]]:
    """hydra/launcher=submitit_slurm: does this allocation (its SLURM_* variables) hold the point's ranks?
    (what, why, fix) for each shortfall; the fix names the hydra.launcher.* value to raise."""
    out = []
    have = int(env.get("SLURM_JOB_NUM_NODES") or 1)
    if have < nodes:
        out.append((f"{have} node(s) in the allocation", f"the server needs {nodes}", f"set hydra.launcher.nodes={nodes}"))
    have = int(env.get("SLURM_CPUS_ON_NODE") or 1)
    if have < tasks_per_node * cpus_per_task:
        out.append((f"{have} CPU(s) per node in the allocation", f"the server runs {tasks_per_node} rank(s) x {cpus_per_task} CPU(s) per node",
                    f"set hydra.launcher.cpus_per_task={tasks_per_node * cpus_per_task}"))
    have = int(env.get("SLURM_GPUS_ON_NODE") or 0)
    if have < gpus_per_node:
        out.append((f"{have} GPU(s) per node in the allocation", f"the server needs {gpus_per_node}", f"set hydra.launcher.gpus_per_node={gpus_per_node}"))
    return out


def judge_bench(returncode: int, result: Optional[Mapping[str, Any]]) -> Optional[str]:
    """None when the run is a measurement (result.json kept; some failed requests are data), else why not."""
    if result is None:
        return f"llmlaunch-bench exited with status {returncode} and wrote no result.json"
    m = result.get("metrics", {})
    if returncode not in (0, 1):
        return f"llmlaunch-bench exited with status {returncode}"
    if not m.get("completed"):
        first = next((r.get("error") for r in result.get("requests", []) if r.get("error")), "")
        return f"no request completed ({m.get('failed', '?')} failed); first error: {first or 'none recorded'}"
    return None


# =============================================================================== side effects
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
        return json.dumps({"format": "llmlaunch-sweep/1", "overrides": self.overrides, "axes": self.axes,
                           "points": self.total, "argv": sys.argv}, indent=1) + "\n"


class Server:
    """A running server: its key, endpoint, how to run a client next to it, how to stop it."""

    kind = "?"

    def __init__(self, key: str, spec, run_dir: Path):
        self.key, self.spec, self.run_dir = key, spec, run_dir
        self.url, self.model, self.job_id = "", "", ""
        self.metrics_url = ""  # where the bench reads the first-token split (first_token_metrics_url), if any
        self.first_point = ""  # the point it was launched for
        self.proc = None  # the child process, for the kinds that have one

    def _serving(self, endpoint: Mapping[str, Any]) -> None:
        """Record the endpoint file rank 0 wrote (launcher/rank.py)."""
        self.url, self.model = endpoint["url"], endpoint["model"]
        self.metrics_url = first_token_metrics_url(self.spec, endpoint)

    def describe(self) -> str:
        s = self.spec
        return f"{self.kind} server {self.key} (engine={s.engine.name} tp={s.tp} pp={s.pp} nodes={s.nodes} replicas={s.replicas})"

    def client(self, bench_args: Sequence[str]) -> List[str]:
        return client_argv(sys.executable, bench_args)

    def alive(self) -> bool:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class SlurmServer(Server):
    """One Slurm job per server, submitted and followed exactly as `llmlaunch` alone does."""

    kind = "slurm"

    def start(self) -> "SlurmServer":
        from launcher import slurm
        from launcher.jobdir import resolve_model

        slurm._slurm_env(self.spec.cluster.slurm_conf)
        self.spec = resolve_model(self.spec, say)
        job, run = slurm.submit(self.spec, str(self.run_dir))
        self.job_id, self.run_dir = job.job_id, Path(run)
        say(f"submitted job {self.job_id}; run dir {self.run_dir}")
        try:
            ep = slurm.follow(self.job_id, self.run_dir, self.spec, float(self.spec.serve.ready_timeout_s) + 600)
        except BaseException:
            self.stop()
            raise
        self._serving(ep)
        return self

    def client(self, bench_args: Sequence[str]) -> List[str]:
        from launcher.render import python_for, srun_args

        container = [a for a in srun_args(self.spec) if a.startswith("--container")]
        return client_argv(python_for(self.spec), bench_args, job_id=self.job_id, container_args=container)

    def alive(self) -> bool:
        from launcher import slurm

        return slurm.queue_state(self.job_id)[0] == "RUNNING" and not slurm.failures(self.run_dir)

    def stop(self) -> None:
        from launcher import slurm

        if self.job_id:
            code, msg = slurm.stop(self.job_id)
            say(msg)


class LocalServer(Server):
    """`llmlaunch <server overrides> run_dir=...` in a child process group: the foreground server of
    cluster=local, stopped with SIGTERM (it drains), SIGKILL after serve.drain_timeout_s + 20 s."""

    kind = "local"

    def __init__(self, key, spec, run_dir, overrides: Sequence[str]):
        super().__init__(key, spec, run_dir)
        self.overrides = list(overrides)

    def start(self) -> "LocalServer":
        import subprocess

        from launcher.errors import LaunchError
        from launcher.jobdir import resolve_model
        from launcher.triton import log_excerpt

        self.spec = resolve_model(self.spec, say)  # the child finds the same cached model; we learn its tokenizer
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = self.run_dir / "llmlaunch.log"
        argv = [sys.executable, "-m", "launcher.cli", *self.overrides, f"run_dir={self.run_dir}"]
        say(f"starting: {shlex.join(argv)}; log {log}")
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        endpoint = self.run_dir / "endpoint.json"
        deadline = time.monotonic() + float(self.spec.serve.ready_timeout_s) + 60
        while not endpoint.exists():
            if self.proc.poll() is not None:
                raise LaunchError(("server", f"exited with status {self.proc.returncode} before serving; {log}:\n{log_excerpt(log, 15)}", f"read {log}"))
            if time.monotonic() > deadline:
                self.stop()
                raise LaunchError(("server", f"not serving after serve.ready_timeout_s={self.spec.serve.ready_timeout_s}", f"read {log}"))
            time.sleep(0.2)
        ep = json.loads(endpoint.read_text())
        self._serving(ep)
        self.job_id = str(self.proc.pid)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        from launcher.triton import stop_group

        if self.proc is None or self.proc.poll() is not None:
            return
        stop_group(self.proc, float(self.spec.serve.drain_timeout_s) + 20)
        say(f"stopped local server (pid {self.proc.pid}, status {self.proc.returncode})")


class AllocationServer(Server):
    """hydra/launcher=submitit_slurm: this Hydra job IS a Slurm allocation; start the ranks in it with
    one `srun` step (what the sbatch script llmlaunch submits would run), stop them with SIGTERM."""

    kind = "allocation"

    def start(self) -> "AllocationServer":
        import subprocess

        from launcher.errors import LaunchError
        from launcher.jobdir import resolve_model, write_run_dir
        from launcher.render import python_for, setup_lines, srun_args
        from launcher.triton import log_excerpt

        s = self.spec
        cpus = int(s.cluster.cpus_per_task or 1)
        gpus = s.gpus_per_node_used if s.cluster.gpu_request != "none" else 0
        problems = allocation_problems(s.nodes, s.tasks_per_node, cpus, gpus, os.environ)
        if problems:
            raise LaunchError(problems)
        # Array tasks of one sweep start together and may share a node; rank 0 keeps a configured port
        # when it looks free, and two of them checking at once would both take 8001. Give each task
        # its own preferred ports (rank 0 still moves to free ones when these are taken).
        keys = ("grpc_port", "http_port", "metrics_port")
        shift = 3 * (int(os.environ.get("SLURM_ARRAY_TASK_ID") or 0) % 1000)
        shift = shift if max(int(getattr(s.serve, k)) for k in keys) + shift <= 65535 else 0
        serve = dataclasses.replace(s.serve, **{k: int(getattr(s.serve, k)) + shift for k in keys})
        self.spec = s = resolve_model(dataclasses.replace(s, serve=serve), say)
        run = write_run_dir(s, str(self.run_dir))
        self.job_id = os.environ["SLURM_JOB_ID"]
        # The step's own sizes: the Hydra task's SLURM_CPUS_PER_TASK / SLURM_NTASKS must not leak into it.
        step = ["srun", *srun_args(s), "--overlap", f"--nodes={s.nodes}", f"--ntasks-per-node={s.tasks_per_node}",
                f"--ntasks={s.world_size}", f"--cpus-per-task={cpus}"]
        if gpus:
            step.append(f"--gpus-per-node={gpus}")
        step += [python_for(s), "-m", "launcher.rank", str(run)]
        script = "\n".join([*setup_lines(self.spec, str(run)), "exec " + shlex.join(step)])
        (run / "step.sh").write_text(script + "\n")
        log = run / "ranks.log"
        say(f"starting the ranks in allocation {self.job_id}: {shlex.join(step)}; log {log}")
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(["bash", str(run / "step.sh")], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        endpoint = run / "endpoint.json"
        deadline = time.monotonic() + float(self.spec.serve.ready_timeout_s) + 60
        while not endpoint.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise LaunchError(("ranks", f"not serving (srun status {self.proc.returncode}); {log}:\n{log_excerpt(log, 15)}", f"read {log}"))
            time.sleep(0.2)
        ep = json.loads(endpoint.read_text())
        self._serving(ep)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        from launcher.triton import stop_group

        if self.proc is None or self.proc.poll() is not None:
            return
        stop_group(self.proc, float(self.spec.serve.drain_timeout_s) + 30)  # SIGTERM: srun forwards it to every rank, Triton drains
        say(f"stopped the ranks (srun status {self.proc.returncode})")


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
    from launcher.spec import build_spec

    problems = []
    spec = None
    try:
        spec = build_spec(cfg)
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
        return decide(has_result=has_result, stored_measure_key=stored.get("measure_key"), measure_key=mkey,
                      problems=problems, current_key=current, key=key, failed_server=STATE.failed_servers.get(key))

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
    if in_alloc:
        server, why = _launch(spec, key, overrides, name, head, AllocationServer)
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
        cls = SlurmServer if spec.cluster.scheduler == "slurm" else LocalServer
        STATE.server, why = _launch(spec, key, overrides, name, head, cls)
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


def _launch(spec, key, overrides, name, head, cls) -> Tuple[Optional[Server], str]:
    """Start a server for point `name`: (server, "") or (None, why it did not start)."""
    from launcher.cli import default_run_dir
    from launcher.errors import LaunchError

    run_dir = Path(default_run_dir(spec))
    server = cls(key, spec, run_dir, server_overrides(overrides)) if cls is LocalServer else cls(key, spec, run_dir)
    server.first_point = name
    say(f"{head}: launching {server.describe()}")
    t0 = time.monotonic()
    try:
        server.start()
    except (LaunchError, OSError, RuntimeError, ValueError, KeyError) as e:
        why = e.render() if isinstance(e, LaunchError) else f"{type(e).__name__}: {e}"
        say(f"{head}: the server did not start: {why}")
        return None, why
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
    doc = {"format": "llmlaunch-sweep-point/1", "overrides": overrides, "server_key": key, "measure_key": mkey,
           "server": None, "config": config, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if server is not None:
        doc["server"] = {"kind": server.kind, "job_id": server.job_id, "run_dir": str(server.run_dir), "url": server.url,
                         "launched_for": server.first_point}
    (point / "point.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


def _measure(server: Server, bench, head, point: Path, overrides, axes, config, key, mkey) -> None:
    import subprocess

    from launcher.render import PACKAGE_ROOT
    from launcher.triton import log_tail

    _prepare_point_dir(point, overrides, axes, config, key, mkey, server)
    result_path = point / "result.json"
    args = bench_argv(bench, server.url, server.model, str(result_path), _tokenizer_for(server.spec), label=point.name,
                      server_metrics=server.metrics_url)
    argv = server.client(args)
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
        say(f"{head}: done in {time.monotonic() - t0:.1f}s: {m.get('completed')}/{m.get('requests')} requests, "
            f"{m.get('output_throughput', 0):.1f} output tokens/s" + (f", {m.get('failed')} failed" if m.get("failed") else ""))
        _count("measured")
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
    from launcher.cli import default_run_dir
    from launcher.render import plan_text

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
    if spec.cluster.scheduler == "slurm":
        from launcher.render import python_for

        argv = client_argv(python_for(spec), args, job_id="<job id>")
    else:
        argv = client_argv(sys.executable, args)
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
        STATE.info = SweepInfo(sweep_dir, overrides, axes, total, dry, existed, before.read_bytes() if before.exists() else None)
        launcher = str(OmegaConf.select(config, "hydra.launcher._target_", default=""))
        if "submitit" in launcher:
            if dry:
                say("dry_run=true with hydra/launcher=submitit_slurm would submit a job per point to print its plan; "
                    "run the dry run with the default launcher (drop hydra/launcher=...)")
                raise SystemExit(2)
        say(f"{total or '?'} points in {sweep_dir}" + (" (dry run: nothing is written or started)" if dry else ""))
        if "submitit" in launcher:
            say(f"hydra/launcher=submitit_slurm: each point runs in its own allocation (no server reuse); "
                f"their logs: {sweep_dir}/.submitit/<job>_<n>/")
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
            say(f"dry run: {c.get('measured', 0)} points to measure on {c.get('launches', 0)} server launches, "
                f"{c.get('skipped', 0)} skipped (result.json exists), {c.get('failed', 0)} invalid; nothing was written")
            return
        from launcher.bench import report

        points = report.load_points(info.sweep_dir)
        if not points:
            return
        if c:
            say(f"{c.get('measured', 0)} points measured, {c.get('skipped', 0)} skipped (done before), "
                f"{c.get('failed', 0)} failed (failure.json); {c.get('launches', 0)} server launches")
        say(f"report: llmlaunch-report {info.sweep_dir}")
        code = report.main([str(info.sweep_dir)])
        if code == 0:
            say(f"summary: {info.sweep_dir / 'summary.csv'}")
            say(f"plots: {info.sweep_dir / 'throughput_vs_concurrency.png'}, {info.sweep_dir / 'latency_throughput.png'}")


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
