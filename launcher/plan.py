"""The dry run's plan: everything a launch would write and run, as one readable text.

The pieces are launcher/render.py's pure functions; the scheduler of cluster.scheduler adds what it would submit
(an sbatch script, a step script) through its `dryrun`, the same text a launch submits.
"""

from __future__ import annotations

from typing import List

from launcher.engines.registry import ENGINES
from launcher.render import copied_files, layout_table, plan_overrides, rank_commands, repository_files
from launcher.schedulers.registry import for_spec
from launcher.spec import LaunchSpec


def plan_text(spec: LaunchSpec, run_dir: str, composed_yaml: str = "") -> str:
    """Everything that would be written and run, as one readable text."""
    out: List[str] = []
    sec = lambda title: out.append(f"\n===== {title} =====")  # noqa: E731
    out.append(f"llmlaunch plan: {plan_overrides(spec)}")
    out.append(f"run dir: {run_dir}")
    if composed_yaml:
        sec("composed config")
        out.append(composed_yaml.rstrip())
    if spec.service_replicas:
        from launcher.service.launch import service_text

        sec(f"service (serve.router={spec.serve.router}): a router apart from its replica jobs")
        out.append(service_text(spec, run_dir))
    sec("rank layout" + (" (of each replica job)" if spec.service_replicas else ""))
    out.append(
        f"nodes={spec.nodes} tasks_per_node={spec.tasks_per_node} gpus_per_rank={spec.gpus_per_task} "
        f"world_size={spec.world_size} tp={spec.tp} pp={spec.pp} replicas={spec.replicas}"
    )
    out.append(f"gRPC endpoint: rank 0, {spec.host}:{spec.serve.grpc_port}, model {spec.model_name}")
    out.append(
        f"OpenAI API: rank 0, http://{spec.host}:{spec.serve.openai_port}/v1 (completions, chat/completions, "
        f"models), launcher/openai_api in front of that gRPC endpoint"
    )
    out.append(layout_table(spec))
    if spec.prefill_replicas:
        roles = [(r, spec.role(r)) for r in range(spec.replicas)]
        out.append(
            "disaggregated: "
            + ", ".join(f"replica {r} {role}" for r, role in roles)
            + ". Rank 0's front end sends each request's prompt to a prefill replica (one token, kv_export; "
            "serve.routing picks which), then the request to a decode replica (serve.routing over those) with kv_from: "
            + ENGINES[spec.engine.name].kv_transfer
            + "; the decode replica computes only the rest of the prompt (all of it where the blocks cannot be had)"
        )
    copied = copied_files(spec)
    for rel, text in repository_files(spec).items():
        sec(f"file model_repository/{rel}")
        out.append("(copied from the checkout's model_repository/)" if rel in copied else text.rstrip() or "(empty)")
    scheduler = for_spec(spec)
    request = scheduler.dryrun(spec, run_dir)
    if request.title:  # what is submitted (the local scheduler runs the per-rank commands below)
        sec(
            request.title
            + (" (one replica job's; the router submits each into replicas/r<K>/)" if spec.service_replicas else "")
        )
        out.append(request.text.rstrip())
    sec("per-rank commands (started by `python -m launcher.rank`, ports chosen at start when taken)")
    out.append(rank_commands(spec, run_dir, scheduler.job_placeholder))
    return "\n".join(out) + "\n"
