"""The hand-submittable pair sbatch/tensorrt_llm_triton.{sub,sh} agrees with what llmlaunch renders
for `cluster=luna engine=trtllm tp=8`, in both TensorRT-LLM layouts (LLMLAUNCH_ENGINE=trtllm: the LLM API's,
trtllm-ensemble: the C++ backend's): same Slurm request, same srun MPI type, same per-rank commands."""

import re
import subprocess
from pathlib import Path

from launcher.cli import plan
from launcher.render import sbatch_script, srun_args, tritonserver_argv

ROOT = Path(__file__).resolve().parents[2]
SUB = (ROOT / "sbatch" / "tensorrt_llm_triton.sub").read_text()
SH = (ROOT / "sbatch" / "tensorrt_llm_triton.sh").read_text()


def sbatch_flags(text):
    flags = {}
    for m in re.finditer(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", text, re.M):
        flags[m.group(1)] = (m.group(2) or "true").strip("'")
    return flags


def spec():
    return plan(
        ["cluster=luna", "engine=trtllm", "engine.layout=ensemble", "tp=8", "engine.engine_dir=/e", "model.path=/m"]
    )[1]


def test_pair_passes_bash_n():
    for name in ("tensorrt_llm_triton.sub", "tensorrt_llm_triton.sh"):
        assert subprocess.run(["bash", "-n", str(ROOT / "sbatch" / name)]).returncode == 0


def test_same_slurm_request():
    s = spec()
    rendered = sbatch_flags(sbatch_script(s, "/jobs/run"))
    static = sbatch_flags(SUB)
    for key in ("partition", "account", "nodes", "ntasks-per-node", "exclusive", "job-name"):
        assert static[key] == rendered[key], key
    assert rendered["time"] == "30" and static["time"] == "00:30:00"


def test_same_srun_and_rank_flags():
    s = spec()
    assert f'--mpi="${{LLMLAUNCH_MPI:-{s.cluster.mpi}}}"' in SUB
    assert "--kill-on-bad-exit=1" in SUB and "--kill-on-bad-exit=1" in srun_args(s)
    leader = tritonserver_argv(s, s.ranks[0], job_id="J")
    worker = tritonserver_argv(s, s.ranks[1], job_id="J")
    for flag in ("--disable-auto-complete-config",):
        assert flag in leader and flag in SH
    for flag in worker:
        if flag.startswith(("--allow-", "--model-control-mode")):
            assert flag in SH, flag
    assert "--load-model=tensorrt_llm" in worker and "trtllm-ensemble) WORKER_MODEL=tensorrt_llm" in SH
    # the shm prefix carries the job id and the rank, in the same shape as shm_prefix()
    assert 'shm-region-prefix-name="llm${SLURM_JOB_ID}r${SLURM_PROCID}_"' in SH
    assert "shm-region-prefix-name=llmJr1_" in " ".join(worker)


def test_the_job_ends_with_the_serving_steps_status(tmp_path):
    """The teardown step runs after the serving step whatever it returned, and the script exits with the
    serving step's status (the job's state in sacct), not the teardown's."""
    tail = SUB[SUB.index("\nsrun --mpi=") + 1 :]
    for serving in (0, 1, 137):
        stub = (
            "set -euo pipefail\nCONTAINER=()\nSCRIPT_DIR=/s\nLOG_DIR=/l\nSLURM_JOB_ID=42\n"
            f'srun() {{ case " $* " in *" rm -f "*) echo "teardown: $*"; return 3;; *) return {serving};; esac; }}\n'
        )
        r = subprocess.run(["bash", "-c", stub + tail], capture_output=True, text=True)
        assert r.returncode == serving, (r.stdout, r.stderr)
        assert "teardown: --ntasks-per-node=1 --mpi=none --kill-on-bad-exit=0 rm -f /dev/shm/llm42r*" in r.stdout


def run_rank_script(tmp_path, rank, engine, ntasks=8):
    """tensorrt_llm_triton.sh for one rank, with tritonserver and the launcher replaced by scripts that print
    their command line: what the rank would run."""
    echo = tmp_path / "argv"
    echo.write_text('#!/bin/bash\nprintf "%s\\n" "$(basename "$0")" "$@"\n')
    echo.chmod(0o755)
    launcher, server = tmp_path / "trtllm-llmapi-launch", tmp_path / "tritonserver"
    for link in (launcher, server):
        if not link.exists():
            link.symlink_to(echo)
    env = {
        "PATH": "/usr/bin:/bin",
        "LLMLAUNCH_MODEL_REPO": "/repo",
        "LLMLAUNCH_ENGINE": engine,
        "TRITONSERVER": str(server),
        "TRTLLM_LLMAPI_LAUNCH": str(launcher),
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_JOB_ID": "J",
    }
    r = subprocess.run(
        ["bash", str(ROOT / "sbatch" / "tensorrt_llm_triton.sh")], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split("\n")[:-1]


def test_llmapi_variant_runs_the_rendered_rank_commands(tmp_path):
    """LLMLAUNCH_ENGINE=trtllm: rank 0 runs tritonserver behind trtllm-llmapi-launch with the rendered flags, the
    other ranks the launcher alone (TensorRT-LLM's MPI worker), as launcher.render.rank_command says."""
    from launcher.render import rank_command

    s = plan(["cluster=luna", "engine=trtllm", "tp=8", "model.path=/m"])[1]
    leader, worker = rank_command(s, s.ranks[0], job_id="J"), rank_command(s, s.ranks[1], job_id="J")
    got0, got1 = run_rank_script(tmp_path, 0, "trtllm"), run_rank_script(tmp_path, 1, "trtllm")
    assert [got0[0], Path(got0[1]).name] == leader[:2] == ["trtllm-llmapi-launch", "tritonserver"]
    for flag in (
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=llmJr0_",
        "--grpc-port=8001",
        "--http-port=8000",
        "--metrics-port=8002",
    ):
        assert flag in got0 and flag in leader, flag
    assert got1 == worker == ["trtllm-llmapi-launch"]
    # a one-task job (tp=1) is a plain tritonserver, as rendered
    one = plan(["cluster=luna", "engine=trtllm", "model.path=/m"])[1]
    assert run_rank_script(tmp_path, 0, "trtllm", ntasks=1)[0] == rank_command(one, one.ranks[0])[0] == "tritonserver"
    # the ensemble's workers load the engine model only, as rendered
    e = spec()
    assert "--load-model=tensorrt_llm" in run_rank_script(tmp_path, 1, "trtllm-ensemble")
    assert "--load-model=tensorrt_llm" in rank_command(e, e.ranks[1], job_id="J")
