"""Sweep planning: pure functions of overrides and composed configs (no files, no processes).

Which overrides shape the server and which only the load generator (`bench.*`); the keys that say
whether two points can share a server or a stored result is current; point names; the skip / reuse /
launch decision of a point; the load generator's arguments and the judgement of its run.
launcher/sweep/point.py runs the points with these; tests/unit/test_sweep_planning.py checks them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from launcher.handoff.endpoint import EndpointRecord

# Config keys that never change what is measured (where files go, how long to wait).
NOT_MEASURED = ("dry_run", "run_dir", "serve.ready_timeout_s", "serve.drain_timeout_s", "cluster.jobs_dir")
# Config keys the load generator owns: changing only these keeps the server.
CLIENT_KEYS = ("bench",)
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._=+-")
MAX_NAME = 120


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
    from launcher.compose import compose, hydra_problem
    from launcher.errors import LaunchError

    try:
        lists = value_overrides(overrides)
    except Exception as e:
        raise LaunchError(hydra_problem(e)) from None
    problems = []
    for ovs in lists:
        try:
            compose(ovs)
        except Exception as e:
            problem = hydra_problem(e)
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
        return (
            "a client-side axis comes before a server-side one, so consecutive points would change servers "
            f"and each server would be launched several times; list server-side axes first: {' '.join(better)}"
        )
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
        name = f"{name[: MAX_NAME - 13]}-{hashlib.sha1(name.encode()).hexdigest()[:12]}"
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


def decide(
    *,
    has_result: bool,
    stored_measure_key: Optional[str],
    measure_key: str,
    problems: Sequence[str],
    current_key: Optional[str],
    key: str,
    failed_server: Optional[str] = None,
) -> Decision:
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
        return Decision(
            "fail", reason=f"its server failed to start for an earlier point: {failed_server}", stage="serve"
        )
    why = "measured with a different config" if has_result else "not measured yet"
    return Decision("measure", "launch", current_key is not None, why)


def bench_problems(bench: Mapping[str, Any]) -> List[str]:
    """Load settings the generator would refuse, found before any server is started for them: the rules across
    bench's fields (each field's own domain, e.g. bench.dataset's form, is checked by build_spec with every field)."""
    out = []
    if bench.get("name") in (None, "", "none"):
        out.append("bench=none: nothing to measure; choose a load profile, e.g. bench=sharegpt_small")
    rate = float(bench.get("request_rate") or 0)
    if rate == 0 and int(bench.get("concurrency") or 0) < 1:
        out.append(f"bench.concurrency={bench.get('concurrency')}: must be >= 1 (requests in flight)")
    processes = int(bench.get("processes", 1))
    if rate == 0 and processes > int(bench.get("concurrency") or 0) >= 1:
        out.append(
            f"bench.processes={processes}: more client processes than bench.concurrency={bench.get('concurrency')} "
            f"requests in flight; set bench.processes <= bench.concurrency"
        )
    return out


def first_token_metrics_url(spec, endpoint: EndpointRecord) -> str:
    """Metrics URL of the tritonserver holding a model that reports the first-token split the bench shows
    (Engine.first_token_split; launcher/python_backend/timings.py): rank 0's with one replica; with replicas, every
    replica leader's (endpoint.json's replicas, comma-separated: the bench sums them; the public metrics port is the
    front end's).  "" for engines with no split, or where a replica's URL is unknown."""
    from launcher.engines.registry import ENGINES

    if not ENGINES[spec.engine.name].first_token_split:
        return ""
    if spec.replicas > 1:
        urls = [r.metrics_url for r in endpoint.replicas]
        return ",".join(urls) if urls and all(urls) else ""
    return endpoint.metrics_url


def prefill_metrics_url(spec, endpoint: EndpointRecord) -> str:
    """The prefill replicas' leaders' metrics URLs among first_token_metrics_url's (disagg: the bench shows their
    first-token split beside the decode replicas'); "" without prefill replicas or where that URL is ""."""
    if not spec.prefill_replicas or not first_token_metrics_url(spec, endpoint):
        return ""
    return ",".join(r.metrics_url for r in endpoint.replicas if spec.role(r.replica) == "prefill")


def bench_argv(
    bench: Mapping[str, Any],
    url: str,
    model: str,
    result_json: str,
    tokenizer: str = "",
    label: str = "",
    server_metrics: str = "",
    prefill_metrics: str = "",
) -> List[str]:
    """`llmlaunch-bench` arguments for a BenchConfig (launcher/schema.py) against one endpoint."""
    kind, _, path = str(bench.get("dataset", "synthetic")).partition(":")
    argv = ["--url", url, "--model", model, "--dataset-name", kind]
    if path:
        argv += ["--dataset", path]
    argv += [
        "--num-prompts",
        str(int(bench["num_prompts"])),
        "--input-len",
        str(int(bench["input_len"])),
        "--output-len",
        str(int(bench["output_len"])),
        "--seed",
        str(int(bench.get("seed", 0))),
        "--warmup",
        str(int(bench.get("warmup", 0))),
    ]
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
    if prefill_metrics:
        argv += ["--prefill-metrics", prefill_metrics]
    return argv + ["--no-progress", "--result-json", result_json]


def eval_argv(bench: Mapping[str, Any], openai_url: str, tokenizer: str, result_json: str) -> List[str]:
    """`llmlaunch-bench --eval` arguments for bench.eval's tasks against a server's OpenAI API; [] when not asked."""
    tasks = ",".join(bench.get("eval") or ())
    if not tasks:
        return []
    argv = ["--eval", "--url", openai_url, "--tokenizer", tokenizer, "--tasks", tasks, "--result-json", result_json]
    if int(bench.get("eval_limit") or 0):
        argv += ["--limit", str(int(bench["eval_limit"]))]
    return argv


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
