"""Composed config -> validated, frozen launch spec: `build_spec(cfg, schedulers)` is the one validation step. Pure: reads nothing,
writes nothing.

It collects every problem it finds (value, why, fix) and raises them together as a `LaunchError`, so a user fixes a
config in one go: each field against the domain launcher/schema.py declares beside it (launcher/domains.py), then
the rules across fields, the scheduler's facts (launcher/schedulers/base.py) and the engine's own check. What only
the launch host can see (paths, GPUs, the model's shape) is launcher/hostcheck.py's.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, List, Mapping, Tuple

from launcher import domains
from launcher.domains import PUBLIC_PORTS, SLURM_TIME, time_minutes
from launcher.engines.registry import ENGINES
from launcher.errors import LaunchError
from launcher.scale_signals import SIGNALS, bounds
from launcher.schema import EngineConfig, LaunchConfig, build
from launcher.spec import LaunchSpec, build_ranks, layout, plain
from launcher.suggest import unknown_key


def typed_config(c: Mapping[str, Any]) -> Tuple[LaunchConfig, List[Tuple[str, str, str]]]:
    """A composed config as plain data -> the schema's dataclasses (the engine's own, by engine.name), and a
    problem for each key no dataclass has, naming the closest one it has (an unknown engine is reported by
    build_spec)."""
    ename = c["engine"].get("name")
    known = ename in ENGINES
    engine, unknown = build(ENGINES[ename].Config if known else EngineConfig, c["engine"], "engine.")
    if not known:
        unknown = []
    launch, more = build(LaunchConfig, {**c, "engine": engine})
    return launch, [unknown_key(k, ename) for k in unknown + more]


def check_walltime(problems, cluster, serve, requeue: bool, scheduler) -> None:
    """The time limit against what must fit in it, and requeue against what the site allows. A job signalled
    serve.walltime_signal_s before its limit has that much less to load in; when that is less than
    serve.ready_timeout_s (how long loading may take) it can be drained before it ever serves."""
    if not scheduler.time_limit:
        if requeue:
            problems.append(
                (
                    "requeue=true",
                    f"cluster={cluster.name} runs without a scheduler's time limit: there is no limit to drain at and no queue to requeue into",
                    "drop requeue, or use a Slurm cluster profile whose cluster.allows_requeue is true",
                )
            )
        return
    lead = serve.walltime_signal_s  # its domain (launcher/schema.py) is checked already
    if lead and lead < serve.drain_timeout_s + 10:
        problems.append(
            (
                f"serve.walltime_signal_s={lead}",
                f"Slurm kills the job at its limit, and draining takes up to serve.drain_timeout_s={serve.drain_timeout_s:g} "
                "plus about 10 s for the ranks to end their servers",
                f"set serve.walltime_signal_s={int(serve.drain_timeout_s) + 10} or more, or lower serve.drain_timeout_s",
            )
        )
    if re.fullmatch(SLURM_TIME, str(cluster.time)):
        limit_s = time_minutes(cluster.time) * 60
        if limit_s - lead < serve.ready_timeout_s:
            need = -(-int(serve.ready_timeout_s + lead) // 60)
            problems.append(
                (
                    f"cluster.time={cluster.time}",
                    f"{limit_s}s minus the drain signal's serve.walltime_signal_s={lead} leaves {limit_s - lead}s, less than "
                    f"serve.ready_timeout_s={serve.ready_timeout_s:g} the model may take to load: the job could be drained before it serves",
                    f"set cluster.time={need // 60:02d}:{need % 60:02d}:00 or more, or lower serve.ready_timeout_s to the model's load time",
                )
            )
    if requeue and not cluster.allows_requeue:
        problems.append(
            (
                "requeue=true",
                f"cluster={cluster.name} does not allow a job to requeue itself (cluster.allows_requeue=false: the site's JobRequeue, "
                "partition or QOS forbid `scontrol requeue`)",
                "drop requeue, or set cluster.allows_requeue=true in the profile once the site allows it",
            )
        )


def kv_routing_problems(ename: str, edef, engine) -> List[Tuple[str, str, str]]:
    """serve.routing=kv keeps its index from the engines' KV-cache events, of their prefix caches (the tokenizer.json
    the front end cuts prompts with is launcher/hostcheck.py's to find)."""
    publishing = sorted(n for n, d in ENGINES.items() if d.kv_events)
    if not edef.kv_events:
        return [
            (
                "serve.routing=kv",
                f"engine={ename} publishes no KV-cache events (engines that do: {', '.join(publishing)})",
                "use serve.routing=prefix, which routes by where prompts were sent",
            )
        ]
    switch = edef.prefix_cache_switch(engine)
    if switch:
        return [
            (
                "serve.routing=kv",
                f"with its prefix cache off, engine={ename} keeps no prefix cache to route to",
                f"set {switch}, or use serve.routing=least_outstanding",
            )
        ]
    return []


def build_spec(cfg, schedulers: Mapping[str, Any]) -> LaunchSpec:
    """Validate a composed config (OmegaConf or plain dict) and return the frozen spec. `schedulers`: the choices of
    cluster.scheduler, name -> the scheduler's class, whose facts (launcher/schedulers/base.py) the rules read; the
    launch layer hands them in (launcher.schedulers.registry.validated), so validating needs nothing that launches."""
    c, problems = typed_config(plain(cfg))
    # --- every field against the domain launcher/schema.py declares beside it (launcher/domains.py); the registries
    # are engine.name's and cluster.scheduler's
    problems += domains.problems(c)
    if c.engine.name not in ENGINES:
        problems += domains.Choice(tuple(sorted(ENGINES))).problems("engine.name", c.engine.name)
    scheduler = schedulers.get(c.cluster.scheduler)
    if scheduler is None:
        problems += domains.Choice(tuple(sorted(schedulers))).problems("cluster.scheduler", c.cluster.scheduler)
        raise LaunchError(problems)
    # --- rules across fields
    if c.disagg.prefill or c.disagg.decode:
        problems += disagg_problems(c)
        if not problems:  # the replicas are the prefill ones, then the decode ones
            c = dataclasses.replace(c, replicas=c.disagg.prefill + c.disagg.decode)
    problems += cluster_problems(c, scheduler)
    jobs = 1
    if c.serve.router != "in_job":
        problems += service_problems(c, scheduler)
        if not problems:  # a service's spec is one replica job's: its layout is one copy on its share of the nodes
            c, jobs = dataclasses.replace(c, replicas=1, nodes=c.nodes // c.replicas), c.replicas
    lay = None
    edef = ENGINES.get(c.engine.name)
    if edef is not None:
        lay = engine_problems(c, edef, scheduler, problems)
    if problems:
        raise LaunchError(problems)
    spec = make_spec(c, edef, scheduler, lay)
    return dataclasses.replace(spec, service_replicas=jobs) if c.serve.router != "in_job" else spec


def service_problems(c: LaunchConfig, scheduler) -> List[Tuple[str, str, str]]:
    """serve.router=host|job (launcher/service/): replicas are Slurm jobs of their own, each one copy on
    nodes/replicas nodes, that the router hands over before their time limits and scales by load."""
    serve, scale, problems = c.serve, c.serve.autoscale, []
    router = f"serve.router={serve.router}"
    if not scheduler.replica_jobs:
        return [
            (
                f"{router} with cluster={c.cluster.name}",
                f"its replicas are Slurm jobs of their own; cluster.scheduler={c.cluster.scheduler} runs one job",
                "use a Slurm cluster profile (cluster=local_slurm, cluster=slurm), or serve.router=in_job",
            )
        ]
    if c.nodes % c.replicas:
        problems.append(
            (
                f"nodes={c.nodes} replicas={c.replicas}",
                f"with {router} each replica job takes nodes/replicas nodes, and {c.replicas} does not divide {c.nodes}",
                f"give nodes a multiple of replicas (nodes={c.replicas * max(1, c.nodes // c.replicas)})",
            )
        )
    if c.requeue:
        problems.append(
            (
                f"requeue=true with {router}",
                "the router hands a replica job over to a successor before its time limit: nothing is requeued",
                "drop requeue=true (or use serve.router=in_job)",
            )
        )
    if scale.max_replicas and not scale.min_replicas <= c.replicas <= scale.max_replicas:
        problems.append(
            (
                f"replicas={c.replicas} serve.autoscale.min_replicas={scale.min_replicas} "
                f"serve.autoscale.max_replicas={scale.max_replicas}",
                "the service starts with `replicas` replica jobs and scales between min_replicas and max_replicas",
                "give min_replicas <= replicas <= max_replicas",
            )
        )
    if scale.max_replicas:
        problems += signal_problems(c)
    if serve.routing == "kv":
        problems.append(
            (
                f"serve.routing=kv with {router}",
                "kv routing subscribes to a fixed set of replicas' KV-cache events; a service's replicas come and go",
                "use serve.routing=prefix (routes by where prompts were sent) or least_outstanding",
            )
        )
    taken = {getattr(serve, k): k for k in PUBLIC_PORTS}
    if serve.control_port in taken:
        problems.append(
            (
                f"serve.control_port={serve.control_port}",
                f"the same port as serve.{taken[serve.control_port]}",
                "give serve.control_port its own port",
            )
        )
    return problems


def disagg_problems(c: LaunchConfig) -> List[Tuple[str, str, str]]:
    """disagg.prefill/decode (launcher/frontend/disagg.py): both roles, the replicas they make, an engine that moves
    a prompt's keys and values, one pipeline stage, one job (the engine's own rules: its check)."""
    p, d = c.disagg.prefill, c.disagg.decode
    key = f"disagg.prefill={p} disagg.decode={d}"
    if not p or not d:
        return [
            (
                key,
                "disaggregated serving needs both roles: prefill replicas compute the prompts, decode replicas "
                "generate from what those computed",
                "give both at least 1 (e.g. disagg.prefill=1 disagg.decode=1), or both 0 to serve whole requests",
            )
        ]
    problems = []
    if c.replicas not in (1, p + d):
        problems.append(
            (
                f"replicas={c.replicas} {key}",
                f"the replicas are the prefill and the decode ones: {p + d}",
                f"leave replicas out (it becomes {p + d}), or give replicas={p + d}",
            )
        )
    edef = ENGINES.get(c.engine.name)
    if edef is not None and not edef.kv_transfer:
        able = ", ".join(sorted(n for n, e in ENGINES.items() if e.kv_transfer))
        problems.append(
            (
                f"{key} with engine={c.engine.name}",
                f"engine={c.engine.name} cannot move a prompt's keys and values from one replica to another",
                f"use an engine that does ({able}), or serve whole requests (disagg.prefill=0 disagg.decode=0)",
            )
        )
    if c.pp != 1:
        problems.append(
            (
                f"pp={c.pp} {key}",
                "keys and values move between replicas of one pipeline stage",
                "use pp=1 (tp, where the engine allows it, or more prefill or decode replicas for more GPUs)",
            )
        )
    if c.serve.router != "in_job":
        problems.append(
            (
                f"serve.router={c.serve.router} {key}",
                "a service's replica jobs come and go, while prefill and decode roles are fixed in one job",
                "use serve.router=in_job (the default) with disagg",
            )
        )
    return problems


def signal_problems(c: LaunchConfig) -> List[Tuple[str, str, str]]:
    """serve.autoscale's signal and its bounds (launcher/service/signals.py): one the engine reports, bounds in its
    unit, down_at below up_at."""
    scale = c.serve.autoscale
    sig = SIGNALS[scale.signal]
    key = f"serve.autoscale.signal={scale.signal}"
    edef = ENGINES[c.engine.name]
    if sig.engine_fact and not getattr(edef, sig.engine_fact):
        able = ", ".join(sorted(n for n, d in ENGINES.items() if getattr(d, sig.engine_fact)))
        return [
            (
                f"{key} with engine={c.engine.name}",
                f"its served model does not report what {scale.signal} reads ({sig.unit})",
                f"use an engine that does ({able}), or serve.autoscale.signal=in_flight",
            )
        ]
    up, down = bounds(scale.signal, scale.up_at, scale.down_at)
    if up is None:
        return [
            (
                f"{key} serve.autoscale.up_at=0",
                f"{scale.signal} has no bound of its own to scale up at: it is {sig.unit}",
                "give serve.autoscale.up_at, your target (e.g. serve.autoscale.up_at=500; down_at is half unless given)",
            )
        ]
    problems = []
    if sig.most is not None and up > sig.most:
        problems.append(
            (
                f"{key} serve.autoscale.up_at={up:g}",
                f"{scale.signal} is {sig.unit}: a bound above {sig.most:g} is never reached",
                f"give up_at and down_at in its unit (e.g. up_at={sig.up_at:g} down_at={sig.up_at * sig.down_share:g})",
            )
        )
    if down >= up:
        problems.append(
            (
                f"serve.autoscale.down_at={down:g} serve.autoscale.up_at={up:g}",
                "a signal between the bounds must hold the replicas as they are; with down_at >= up_at it would scale "
                "up and down in turn",
                f"give down_at below up_at (e.g. down_at={up / 2:g}), or leave it 0 (half of up_at)",
            )
        )
    return problems


def cluster_problems(c: LaunchConfig, scheduler) -> List[Tuple[str, str, str]]:
    """The cluster's rules: what its scheduler starts, its container, its nodes, the ports rank 0 offers, its time
    limit."""
    cluster, serve, problems = c.cluster, c.serve, []
    if scheduler.starts_mpi_world and cluster.mpi == "none":
        problems.append(
            (
                "cluster.mpi='none'",
                "ranks rendezvous through MPI (mpi4py); srun must start them with PMIx or PMI2",
                "set cluster.mpi=pmix (or pmi2)",
            )
        )
    if cluster.container.runtime == "pyxis" and not cluster.container.image:
        problems.append(
            (
                "cluster.container.image=''",
                "pyxis needs an image",
                "set cluster.container.image=<registry#image:tag> or cluster.container.runtime=none",
            )
        )
    if scheduler.on_this_machine and c.nodes != 1:
        problems.append(
            (
                f"nodes={c.nodes}",
                f"cluster={cluster.name} runs on this one machine",
                "use nodes=1, or a Slurm cluster profile (cluster=local_slurm, cluster=slurm)",
            )
        )
    seen: Dict[int, str] = {}
    for k in PUBLIC_PORTS:
        p = getattr(serve, k)
        if p in seen:
            problems.append((f"serve.{k}={p}", f"the same port as serve.{seen[p]}", f"give serve.{k} its own port"))
        seen.setdefault(p, k)
    check_walltime(problems, cluster, serve, bool(c.requeue), scheduler)
    return problems


def engine_problems(c: LaunchConfig, edef, scheduler, problems: List[Tuple[str, str, str]]):
    """The engine's rules (appended to `problems`): tp as the engine takes it, the rank layout, a copy over nodes,
    the engine's own check, kv routing. Returns the layout (launcher.spec.layout), None where it was not placed."""
    engine, tp, pp = c.engine, c.tp, c.pp
    if not edef.tp_any_divisor and isinstance(tp, int) and tp >= 1 and tp & (tp - 1):
        problems.append(
            (
                f"tp={tp}",
                f"engine={engine.name} takes tp as a power of two: the GPU counts its tensor-parallel "
                "kernels and all-reduce are built for (vLLM and the hf engine take any tp that divides the model's heads)",
                "use tp=1, 2, 4 or 8",
            )
        )
    lay = None
    if not any(p[0].startswith(("tp=", "pp=", "nodes=", "replicas=", "cluster.gpus_per_node")) for p in problems):
        lay = layout(edef.layout, tp, pp, c.replicas, c.nodes, c.cluster.gpus_per_node, problems)
        if lay is not None and lay[3] > 1 and not edef.spans_nodes(engine):
            problems.append(
                (
                    f"engine={engine.name} with tp*pp={tp * pp} over {lay[3]} nodes",
                    edef.why_single_node(engine),
                    f"keep a model copy on one node: tp*pp <= {lay[2]} GPUs per node (use replicas for more nodes)",
                )
            )
    problems.extend(edef.check(c, scheduler))
    if c.serve.routing == "kv":
        problems.extend(kv_routing_problems(engine.name, edef, engine))
    return lay


def make_spec(c: LaunchConfig, edef, scheduler, lay) -> LaunchSpec:
    """The frozen spec of a config with no problems: its ranks placed by the layout."""
    tasks_per_node, gpus_per_task, used, _ = lay
    ranks = build_ranks(edef.workers_load(c.engine), c.tp, c.pp, c.replicas, c.nodes, tasks_per_node, gpus_per_task)
    return LaunchSpec(
        job_name=c.job_name,
        cluster=c.cluster,
        engine=c.engine,
        model=c.model,
        serve=c.serve,
        bench=c.bench,
        tp=c.tp,
        pp=c.pp,
        nodes=c.nodes,
        replicas=c.replicas,
        prefill_replicas=c.disagg.prefill,
        tasks_per_node=tasks_per_node,
        gpus_per_task=gpus_per_task,
        gpus_per_node_used=used,
        model_name=edef.model_name(c.engine),
        host=c.serve.host or ("127.0.0.1" if scheduler.on_this_machine else "0.0.0.0"),
        ranks=ranks,
        requeue=bool(c.requeue),
        loopback=scheduler.on_this_machine,
    )
