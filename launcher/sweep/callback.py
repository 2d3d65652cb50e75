"""`SweepCallback` (conf/config.yaml `hydra.callbacks.llmlaunch_sweep`): Hydra instantiates it on every run, so its
imports stay light; it acts only for a multirun with a load (bench != none)."""

from __future__ import annotations

from pathlib import Path

from hydra.experimental.callback import Callback

from launcher.sweep.plan import order_advice, parse_sweep
from launcher.sweep.state import STATE, SweepInfo, say, stop_server


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
