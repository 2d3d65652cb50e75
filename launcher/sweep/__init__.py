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

    plan.py      pure: server keys, point names, skip / reuse decisions, the load generator's command line
    state.py     what lives across the points of one sweep (its servers, counts) and stopping the last server
    point.py     `run_point`, the Hydra task of a point: validate, launch or reuse a server through the scheduler
                 registry (the cluster's scheduler, or "allocation" when the point is its own Slurm allocation),
                 measure, record
    callback.py  `SweepCallback`: set-up before the first point, teardown and the report after the last
"""
