"""Rendering: every engine x cluster plan matches its checked-in expected file; scripts pass `bash -n`;
config files parse back as ModelConfig; config values never escape shell quoting."""

import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from launcher import pbtxt
from launcher.cli import plan
from launcher.paths import PACKAGE_ROOT
from launcher.plan import plan_text
from launcher.render import allocation_step, copied_files, rank_command, repository_files, sbatch_script

EXPECTED = Path(__file__).resolve().parents[1] / "expected"
REGEN = os.environ.get("LLMLAUNCH_REGEN") == "1"
# trtllm: the C++ backend's ensemble; trtllm_llmapi: TensorRT-LLM's default layout (its LLM API in our model)
ENGINES = ["hf", "trtllm", "trtllm_llmapi", "vllm", "sglang", "lmdeploy"]
CLUSTERS = ["local", "local_slurm", "luna", "slurm"]
RUN_DIR = "/jobs/run"


def overrides_for(engine, cluster, extra=()):
    # hf: the random tiny model (made on the spot, so the plan names no folder); the others load a real one
    o = [f"engine={engine.split('_')[0]}", f"cluster={cluster}", "model=tiny" if engine == "hf" else "model=llama3_8b"]
    if engine == "trtllm":
        o += [
            "engine.layout=ensemble",
            "engine.engine_dir=/models/engines/llama3-8b/tp1",
            "model.tokenizer=/models/llama3-8b",
        ]
    return o + list(extra)


def normalise(text: str) -> str:
    """Machine-specific paths (checkout, interpreter, home) become placeholders."""
    text = text.replace(sys.executable, "<python>").replace(str(PACKAGE_ROOT), "<root>")
    return text.replace(str(Path.home()), "<home>")


def check_expected(name: str, text: str) -> None:
    path = EXPECTED / name
    if REGEN or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if not REGEN:
            pytest.fail(f"{path} did not exist; written now — review it and commit it")
    assert text == path.read_text(), (
        f"{name} differs from {path}; if the change is intended, regenerate with: LLMLAUNCH_REGEN=1 pytest tests/unit/test_render.py"
    )


@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("engine", ENGINES)
def test_plan_matches_expected(engine, cluster):
    cfg, spec = plan(overrides_for(engine, cluster))
    check_expected(f"plan_{engine}_{cluster}.txt", normalise(plan_text(spec, RUN_DIR)))


@pytest.mark.parametrize("engine", ENGINES)
def test_launch_json_round_trips_to_the_same_typed_spec(engine):
    """launch.json (what the ranks read) is the spec as plain JSON; reading it gives back the schema's dataclasses."""
    import dataclasses
    import json

    from launcher.engines.registry import schemas
    from launcher.schema import ClusterConfig, ServeConfig
    from launcher.spec import LaunchSpec

    _, spec = plan(overrides_for(engine, "slurm", ["replicas=2", "nodes=2"]))
    back = LaunchSpec.from_json(spec.to_json())
    assert back == spec and back.to_json() == spec.to_json()
    assert (
        type(back.engine) is schemas()[engine.split("_")[0]]
        and type(back.cluster) is ClusterConfig
        and type(back.serve) is ServeConfig
    )
    assert back.ranks == spec.ranks and isinstance(back.ranks[0].gpus, tuple)
    data = dataclasses.asdict(spec)
    data["engine"]["gone"] = 1
    with pytest.raises(ValueError, match="engine.gone"):
        LaunchSpec.from_json(json.dumps(data))


@pytest.mark.parametrize("engine,tp,nodes", [(e, tp, n) for e in ENGINES for tp, n in ((1, 1), (2, 1), (8, 1), (8, 2))])
def test_engine_repositories_at_tp_and_nodes(engine, tp, nodes):
    """Every engine's repository and per-rank commands at tp 1/2/8 and nodes 1/2 (replicas fill the nodes)."""
    replicas = 2 if (nodes == 2 and tp == 8 and engine == "lmdeploy") else 1
    extra = [f"tp={tp}", f"nodes={nodes}", f"replicas={replicas}"]
    if engine == "lmdeploy" and nodes == 2:
        extra = [f"tp={tp}", "nodes=2", "replicas=2"]
    if engine == "hf":  # same GPU counts as data-parallel copies (hf tp ranks: tests/integration/test_hf_tp.py)
        extra = [f"replicas={tp}", f"nodes={nodes}"]
    cfg, spec = plan(overrides_for(engine, "luna", extra))
    files, copied = repository_files(spec), copied_files(spec)
    text = "".join(f"### {k}\n{'(source)' if k in copied else v}\n" for k, v in files.items())
    cmds = "\n".join(shlex.join(rank_command(spec, r, job_id="J")) for r in spec.ranks)
    check_expected(f"repo_{engine}_tp{tp}_nodes{nodes}.txt", normalise(text + "### commands\n" + cmds + "\n"))


def test_hf_response_processes_are_model_instances():
    """engine.response_processes=N renders N instances of the hf model (they share one engine process)."""
    cfg, spec = plan(overrides_for("hf", "local", ["engine.response_processes=4"]))
    configs = [text for rel, text in repository_files(spec).items() if rel.endswith("config.pbtxt")]
    assert len(configs) == 1
    msg = pbtxt.parse(configs[0])
    assert [(g.count, pbtxt._pb().ModelInstanceGroup.Kind.Name(g.kind)) for g in msg.instance_group] == [
        (4, "KIND_CPU")
    ]


@pytest.mark.parametrize("engine", ENGINES)
def test_config_pbtxt_parses_back(engine):
    cfg, spec = plan(overrides_for(engine, "luna", ["replicas=8"] if engine == "hf" else ["tp=8"]))
    for rel, text in repository_files(spec).items():
        if rel.endswith("config.pbtxt"):
            msg = pbtxt.parse(text)
            assert msg.name == rel.split("/")[0]


@pytest.mark.parametrize("cluster", ["local_slurm", "luna", "slurm"])
@pytest.mark.parametrize("engine", ENGINES)
def test_sbatch_passes_bash_n(engine, cluster, tmp_path):
    cfg, spec = plan(overrides_for(engine, cluster))
    script = tmp_path / "s.sh"
    script.write_text(sbatch_script(spec, RUN_DIR))
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("cluster,extra", [("local_slurm", []), ("luna", ["replicas=2", "nodes=2"])])
def test_allocation_step_matches_expected(cluster, extra, tmp_path):
    """A sweep point that is its own allocation (hydra/launcher=submitit_slurm) starts its ranks with this script."""
    cfg, spec = plan(overrides_for("hf", cluster, extra))
    text = allocation_step(spec, RUN_DIR)
    check_expected(f"step_hf_{cluster}.txt", normalise(text))
    script = tmp_path / "step.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_luna_trtllm_tp8_plan():
    """One node x 8 tasks, --mpi=pmix, 8 distinct shm-region prefixes."""
    cfg, spec = plan(
        ["cluster=luna", "engine=trtllm", "engine.layout=ensemble", "tp=8", "engine.engine_dir=/e", "model.path=/m"]
    )
    text = plan_text(spec, RUN_DIR)
    assert "#SBATCH --nodes=1" in text and "#SBATCH --ntasks-per-node=8" in text
    assert "--mpi=pmix" in text
    prefixes = set(re.findall(r"shm-region-prefix-name=(\S+?)'", text))
    assert len(prefixes) == 8
    # only rank 0 opens network services
    assert sum("--grpc-port" in line for line in text.splitlines() if line.startswith("rank ")) == 1


@pytest.mark.parametrize("extra,name", [(["tp=8"], "tp8"), (["tp=16", "nodes=2"], "tp16_nodes2")])
def test_luna_trtllm_llmapi_plan(extra, name):
    """The headline `llmlaunch cluster=luna engine=trtllm tp=8` (and 16 GPUs over 2 nodes): TensorRT-LLM's LLM API
    layout, one task per GPU under srun --mpi=pmix, every rank under trtllm-llmapi-launch, one tritonserver (rank 0,
    its own shm prefix) and model.yaml with the parallel sizes."""
    cfg, spec = plan(["cluster=luna", "engine=trtllm", "model=llama3_8b", *extra])
    text = normalise(plan_text(spec, RUN_DIR))
    check_expected(f"plan_trtllm_llmapi_luna_{name}.txt", text)
    ranks = [line for line in text.splitlines() if re.match(r"rank \d+: ", line)]
    assert len(ranks) == spec.tp and "--mpi=pmix" in text and f"#SBATCH --nodes={spec.nodes}" in text
    assert (
        ranks[0].startswith("rank 0: trtllm-llmapi-launch tritonserver ")
        and "shm-region-prefix-name=llm${SLURM_JOB_ID}r0_" in ranks[0]
    )
    assert all(line.endswith(": trtllm-llmapi-launch") for line in ranks[1:])
    assert f"tensor_parallel_size: {spec.tp}" in text and "gpus_per_node: 8" in text and "backend: pytorch" in text


HOSTILE = [
    "a'b",
    'a"b',
    "$(touch /tmp/llmlaunch_pwned)",
    "`touch /tmp/llmlaunch_pwned`",
    "a; touch /tmp/llmlaunch_pwned",
    "x\ny",
    "$HOME",
    "a b\\c",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_never_escape_quoting(value, tmp_path):
    """Env values and paths with quotes, $(), backticks, ; and newlines stay data: bash -n passes and
    the parsed export gives back exactly the value; nothing is executed."""
    marker = Path("/tmp/llmlaunch_pwned")
    marker.unlink(missing_ok=True)
    import dataclasses

    cfg, spec = plan(["cluster=slurm", "engine=hf"])
    # As if a YAML profile carried it (Hydra's override grammar would need its own quoting).
    spec = dataclasses.replace(spec, cluster=dataclasses.replace(spec.cluster, env={"HOSTILE": value}))
    script = sbatch_script(spec, RUN_DIR)
    path = tmp_path / "s.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    setup = script.split("# setup\n", 1)[1].split("\n# command", 1)[0]
    out = subprocess.run(["bash", "-c", setup + '\nprintf %s "$HOSTILE"'], capture_output=True, text=True)
    assert out.stdout == value
    assert not marker.exists()


def test_hostile_model_path_is_one_argv_element(tmp_path):
    value = "/models/$(touch /tmp/llmlaunch_pwned); rm -rf x`y`"
    cfg, spec = plan(["engine=vllm", "cluster=slurm", f"model.path='{value}'"])
    assert spec.model.path == value
    for rel, text in repository_files(spec).items():
        if rel.endswith("model.json"):
            import json

            assert json.loads(text)["model"] == value


def serving_then_teardown(script: str) -> str:
    """The rendered script from its serving srun to the end."""
    return script[script.index("\nsrun --unbuffered ") + 1 :]


def test_the_teardown_keeps_the_serving_steps_status(tmp_path):
    """`$?` is taken on the line after the serving srun (submitit writes nothing in between) and the
    script ends with it, whatever the teardown step returns."""
    from launcher.render import SERVING_STATUS

    cfg, spec = plan(["cluster=local_slurm", "engine=hf"])
    script = sbatch_script(spec, RUN_DIR)
    code = [ln for ln in serving_then_teardown(script).splitlines() if ln.strip() and not ln.startswith("#")]
    assert code[0].startswith("srun --unbuffered ") and code[1].startswith(f"{SERVING_STATUS}=$?")
    assert code[-1] == f'exit "${SERVING_STATUS}"'
    for serving in (0, 1, 137):
        # srun stand-in: the serving step returns `serving`, the teardown step 3 (ignored)
        stub = f'srun() {{ if [ "$1" = --unbuffered ]; then return {serving}; fi; echo "teardown: $*"; return 3; }}\n'
        r = subprocess.run(
            ["bash", "-c", stub + serving_then_teardown(script)],
            capture_output=True,
            text=True,
            env={**os.environ, "SLURM_JOB_ID": "42"},
        )
        assert r.returncode == serving, (r.stdout, r.stderr)
        assert "teardown: --ntasks-per-node=1 --mpi=none --kill-on-bad-exit=0 rm -f /dev/shm/llm42r*" in r.stdout


def test_the_walltime_signal_and_requeue_are_rendered():
    """--signal takes serve.walltime_signal_s; requeue=true adds --requeue and a teardown line that requeues only
    when rank 0 recorded a drain at the time limit in this allocation."""
    _, spec = plan(["cluster=local_slurm", "engine=hf", "serve.walltime_signal_s=45", "serve.drain_timeout_s=20"])
    script = sbatch_script(spec, RUN_DIR)
    assert "#SBATCH --signal=USR2@45" in script and "--requeue" not in script and "scontrol" not in script
    _, spec = plan(["cluster=local_slurm", "engine=hf", "requeue=true"])
    script = sbatch_script(spec, RUN_DIR)
    assert "#SBATCH --requeue" in script
    line = f'if [ -e "{RUN_DIR}/walltime${{SLURM_RESTART_COUNT:-0}}.json" ]; then scontrol requeue "$SLURM_JOB_ID"; fi'
    assert line in serving_then_teardown(script).splitlines()
    for attempt, recorded, requeued in (
        ("", "walltime0.json", True),
        ("1", "walltime0.json", False),
        ("1", "walltime1.json", True),
    ):
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / recorded).write_text("{}")
            stub = 'srun() { return 0; }\nscontrol() { echo "scontrol $*"; }\n'
            env = {**os.environ, "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": attempt}
            if not attempt:
                env.pop("SLURM_RESTART_COUNT")
            r = subprocess.run(
                ["bash", "-c", stub + serving_then_teardown(script.replace(RUN_DIR, d))],
                capture_output=True,
                text=True,
                env=env,
            )
            assert r.returncode == 0 and ("scontrol requeue 42" in r.stdout) == requeued, (
                attempt,
                recorded,
                r.stdout,
                r.stderr,
            )


@pytest.mark.parametrize("router", ["host", "job"])
def test_a_service_plan_shows_the_router_one_replica_job_and_the_scaling_rule(router, tmp_path):
    """serve.router=host|job: the dry run names where the router runs (its batch script for job), the replica job's
    sbatch (one copy, on nodes/replicas nodes) and the scaling rule; the router's batch script passes bash -n."""
    from launcher.service.launch import router_script

    extra = [f"serve.router={router}", "replicas=2", "nodes=2", "serve.autoscale.max_replicas=4"]
    extra += ["cluster.router_partition=cpu", "cluster.router_time=7-00:00:00"] if router == "job" else []
    cfg, spec = plan(overrides_for("hf", "luna", extra))
    check_expected(f"plan_service_{router}_luna.txt", normalise(plan_text(spec, RUN_DIR)))
    script = tmp_path / "router.sh"
    script.write_text(router_script(spec, RUN_DIR))
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_disaggregated_plan_names_each_replicas_role_over_two_nodes():
    """disagg.prefill=1 disagg.decode=1 over two nodes: the plan says which replica prefills and which decodes, and how
    a request goes through them; the job is the replicas' job (two leaders, the front end on rank 0)."""
    cfg, spec = plan(overrides_for("hf", "luna", ["nodes=2", "disagg.prefill=1", "disagg.decode=1"]))
    text = normalise(plan_text(spec, RUN_DIR))
    assert "disaggregated: replica 0 prefill, replica 1 decode." in text
    check_expected("plan_hf_disagg_luna.txt", text)


def test_a_disaggregated_vllm_plan_puts_nixl_in_each_instances_engine_args():
    """engine=vllm with disagg: the plan names NIXL as the path, and each instance's model.json carries vLLM's
    kv_transfer_config (NixlConnector, kv_both, recompute where the blocks cannot be read)."""
    cfg, spec = plan(overrides_for("vllm", "luna", ["disagg.prefill=1", "disagg.decode=1"]))
    text = normalise(plan_text(spec, RUN_DIR))
    assert "replica 0 prefill, replica 1 decode" in text and "NixlConnector" in text
    assert '"kv_load_failure_policy": "recompute"' in text
    check_expected("plan_vllm_disagg_luna.txt", text)
