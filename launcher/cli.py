"""`llmlaunch`: compose (Hydra, launcher/compose.py) -> validate (launcher/validate.py) -> dry run or launch.

A single launch composes and validates once (`plan`) and hands that spec to `execute`; Hydra's own
entry point runs only what needs it (multirun sweeps, where each point validates itself, and Hydra's
flags such as --cfg or --info). Errors a user can fix are caught here, once: printed to stderr as
value / why / fix, exit status 2, no traceback. Heavy imports (torch, tritonclient, mpi4py,
submitit) happen only on the paths that need them, so `--help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

from launcher.compose import (
    CONF_DIR,
    GROUPS,
    available,
    check_group_choices,
    check_words,
    composed,
    free_mapping_overrides,
    register,
)
from launcher.errors import LaunchError


def plan(overrides: List[str]):
    """Overrides -> (cfg, spec): the one path from a command line to a validated LaunchSpec. Raises LaunchError on any bad value."""
    from launcher.schedulers.registry import validated

    cfg = composed(overrides)
    return cfg, validated(cfg)


def _is_sweep_point(cfg) -> bool:
    """A job of `-m` (Hydra multirun) with bench != none. Without a load, -m launches each point as before."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN and cfg.bench.name != "none"


def run(cfg) -> int:
    """The Hydra task (multirun points, or a launch given Hydra flags): validate, then `execute`."""
    from launcher.schedulers.registry import validated

    # Multirun with a load profile (`llmlaunch -m ... bench=<profile>`): this job is one sweep point.
    # launcher/sweep/point.py validates it, launches or reuses a server, measures, and records result.json
    # or failure.json; it never raises, so one bad point does not end the sweep.
    if _is_sweep_point(cfg):
        from launcher.sweep.point import run_point

        return run_point(cfg)
    from hydra.core.hydra_config import HydraConfig

    overrides = [str(o) for o in HydraConfig.get().overrides.task] if HydraConfig.initialized() else []
    return execute(cfg, validated(cfg), overrides)


def execute(cfg, spec, overrides: Optional[List[str]] = None, from_record: str = "") -> int:
    """Dry run, or the scheduler's launch (local serve / Slurm submit), of a validated spec (`validated(cfg)`).
    `overrides` (the command line that composed `cfg`) and `from_record` go into the run record."""
    import dataclasses

    from omegaconf import OmegaConf

    from launcher.rundir import default_run_dir
    from launcher.schedulers.registry import for_spec

    run_dir = cfg.get("run_dir") or default_run_dir(spec)
    if cfg.dry_run:
        from launcher.hostcheck import before_dry_run
        from launcher.plan import plan_text

        before_dry_run(cfg)  # the model's shape where this host can read it; nothing about this host's GPUs or ports

        if from_record:
            sys.stdout.write(f"from record: {from_record}\noverrides: {' '.join(overrides or []) or '(none)'}\n")
        sys.stdout.write(plan_text(spec, run_dir, OmegaConf.to_yaml(cfg)))  # shows backend.dryrun's request
        return 0
    from launcher.hostcheck import before_launch
    from launcher.readiness import process_start_time
    from launcher.record import base_record

    before_launch(cfg, lambda line: print(line, file=sys.stderr, flush=True))  # paths and GPUs, before anything starts
    backend = for_spec(spec)  # cluster.scheduler's registry entry (launcher/schedulers/registry.py)
    # submitted: when this command started, so its time to READY is the user's wait from the command on
    record = base_record(
        OmegaConf.to_container(cfg, resolve=True),
        list(overrides or []),
        backend.name,
        run_dir,
        from_record=from_record,
        submitted=process_start_time(),
    )
    if spec.service_replicas:  # serve.router=host|job: a router apart from replica jobs (launcher/service/)
        from launcher.service.launch import start

        return start(spec, run_dir, record)
    return backend.serve(dataclasses.replace(backend.dryrun(spec, run_dir), record=record))


def from_record_args(argv: List[str]):
    """`--from-record PATH` (or `--from-record=PATH`) out of argv: (PATH or "", the rest)."""
    rest, path = [], ""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--from-record":
            if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                raise LaunchError(
                    (
                        "--from-record",
                        "needs the path of a run record",
                        "llmlaunch --from-record RUN_DIR/record.json [key=value ...]",
                    )
                )
            path = argv[i + 1]
            i += 2
            continue
        if a.startswith("--from-record="):
            path = a.partition("=")[2]
        else:
            rest.append(a)
        i += 1
    return path, rest


def launch_from_record(path: str, overrides: List[str]) -> int:
    """`llmlaunch --from-record RUN_DIR/record.json [overrides]`: the recorded launch again, the overrides on top."""
    from launcher.compose import config_from_record
    from launcher.record import read_record
    from launcher.schedulers.registry import validated

    record = read_record(path)
    cfg, line, gone = config_from_record(record, overrides)
    for key in gone:
        print(f"llmlaunch: the record's {key} is not a setting of this llmlaunch; left out", file=sys.stderr)
    return execute(cfg, validated(cfg), line, from_record=str(Path(path).absolute()))


def _hydra_entry():
    import hydra

    register()

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def _main(cfg) -> None:
        code = _exit_on_launch_error(run, cfg)
        if code:
            sys.exit(code)

    _main()


def usage() -> str:
    """Our own --help: no Hydra import, so it answers at once (Hydra's is `--hydra-help`)."""
    groups = "\n".join(f"  {g:<8} {', '.join(available(g))}" for g in GROUPS)
    return f"""usage: llmlaunch [group=option ...] [key=value ...] [-m]

Compose a cluster, an engine, a model and the parallelism; validate; render a Triton model
repository and a job; then serve locally (cluster=local) or submit to Slurm.

config groups (defaults first in conf/config.yaml):
{groups}

common keys:
  tp=N pp=N nodes=N replicas=N     parallelism (tp dividing the model's heads; a power of two for some engines)
  dry_run=true                     print the plan (config, ranks, files, sbatch, commands); touch nothing
  --from-record RUN_DIR/record.json [key=value ...]
                                   launch a recorded run again (its composed config), overrides on top
  serve.grpc_port=P serve.host=H   where rank 0 listens (also serve.http_port, serve.metrics_port)
  model.path=DIR                   weights (HF folder; trtllm engine.layout=ensemble: engine.engine_dir)
  -m ... bench=<profile>           a sweep (Hydra multirun); llmlaunch-report summarises it

more: llmlaunch --cfg job (the composed config), --hydra-help, README.md, launcher/schema.py
related: llmlaunch-status JOB, llmlaunch-stop JOB, llmlaunch-bench, llmlaunch-report, llmlaunch-localslurm
"""


def _exit_on_launch_error(fn, *args) -> int:
    """fn(*args), with a LaunchError printed as value / why / fix and exit status 2."""
    try:
        return fn(*args)
    except LaunchError as e:
        print(e.render(), file=sys.stderr)
        sys.exit(2)


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(usage())
        return
    record_path, argv = _exit_on_launch_error(from_record_args, argv)
    argv = free_mapping_overrides(argv)  # also what Hydra's entry point is given (multirun, Hydra flags)
    if record_path:
        if any(a.startswith("-") for a in argv):
            print(
                f"error: --from-record {record_path}: only key=value overrides can go with it (got {' '.join(a for a in argv if a.startswith('-'))})\n"
                "  fix: launch one run from a record, without -m or Hydra flags",
                file=sys.stderr,
            )
            sys.exit(2)
        code = _exit_on_launch_error(launch_from_record, record_path, argv)
        if code:
            sys.exit(code)
        return
    multirun = any(a in ("-m", "--multirun") for a in argv)
    wants_help = any(a in ("-h", "--help", "--hydra-help", "--info") or a.startswith(("--cfg", "-c")) for a in argv)
    overrides = [a for a in argv if not a.startswith("-") and not a.startswith("hydra")]
    if not wants_help and overrides == argv:
        # A plain launch: compose and validate once, run that spec; Hydra's entry point adds nothing here
        # (conf/config.yaml: no output folder, no chdir, no logging setup).
        cfg, spec = _exit_on_launch_error(plan, overrides)
        code = _exit_on_launch_error(execute, cfg, spec, overrides)
        if code:
            sys.exit(code)
        return
    if not wants_help:
        _exit_on_launch_error(check_composes, argv, overrides, multirun)
    elif not any(a == "--hydra-help" or a.startswith(_OTHER_CONFIG) for a in argv):
        # --cfg / --info compose the config too: a misspelled key or a bad value is ours to report, not Hydra's
        _exit_on_launch_error(check_composes, argv, [a for a in overrides if "=" in a], multirun)
    sys.argv = [sys.argv[0]] + argv
    _hydra_entry()


# Hydra's flags that compose another config than conf/config.yaml: what they compose is not ours to check
_OTHER_CONFIG = ("-cn", "-cp", "-cd", "--config-name", "--config-path", "--config-dir")


def check_composes(argv: List[str], overrides: List[str], multirun: bool) -> None:
    """Before Hydra's entry point: every word is an override, every group choice exists, and the overrides compose
    (a value that does not, or a key the config has no place for, raises LaunchError with our message, before
    Hydra prints its own)."""
    check_words(argv)
    check_group_choices(argv)
    if not multirun:
        # Hydra flags or hydra.* overrides: Hydra composes and `run` validates.
        composed(overrides)
    else:
        # Multirun: only check that each swept value composes (same message, exit 2, nothing run).
        # Validation is per point (launcher/sweep/point.py): an invalid point becomes its failure.json.
        from launcher.sweep.plan import check_sweep

        check_sweep(overrides)


if __name__ == "__main__":
    main()
