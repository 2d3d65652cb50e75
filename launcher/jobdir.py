"""Materialise a plan into a run dir: the one place that writes a job's files.

    <run_dir>/launch.json          the frozen spec every rank reads
    <run_dir>/model_repository/    the rendered Triton repository
    <run_dir>/submission.sh        (Slurm) the sbatch text, as submitted through submitit
    <run_dir>/endpoint.json        written by rank 0 once it really serves
    <run_dir>/ready_rank<N>.json   written by each leader once it serves, with the ports its server bound
                                   (both carry the rendezvous's token: an earlier run's file never counts)
    <run_dir>/failure_rank<N>.json written by a rank whose server died unasked
    <run_dir>/<job>_<rank>_log.out one log per rank (Slurm); logs/rank<N>.log locally
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from launcher.render import repository_files
from launcher.spec import LaunchSpec


def resolve_model(spec: LaunchSpec, say=lambda m: print(m, file=sys.stderr, flush=True)) -> LaunchSpec:
    """Fill model.path for `make: tiny` (built once, then cached) so every rank loads a folder."""
    if spec.model.path or spec.model.make != "tiny":
        return spec
    from launcher.tiny import default_cache_dir, ensure_tiny_model

    say(f"model: tiny (random-weight Llama + locally trained tokenizer), cache {default_cache_dir()}")
    path = str(ensure_tiny_model())
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, path=path, tokenizer=spec.model.tokenizer or path))


def write_run_dir(spec: LaunchSpec, run_dir: str) -> Path:
    run = Path(run_dir)
    (run / "model_repository").mkdir(parents=True, exist_ok=True)
    (run / "logs").mkdir(exist_ok=True)
    for rel, text in repository_files(spec).items():
        dst = run / "model_repository" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text)
    (run / "launch.json").write_text(spec.to_json())
    return run
