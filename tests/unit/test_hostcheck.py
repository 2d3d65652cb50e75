"""What the launch host sees, before a launch starts anything (launcher/hostcheck.py): the model's folders as the
engine loads them, and a GPU for an engine that needs one; both sides of each, the GPU probe given."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher import hostcheck
from launcher.compose import compose
from launcher.schedulers.registry import validated
from launcher.spec import plain
from launcher.validate import typed_config
from tests.unit.test_field_domains import make_hf_folder

GPU = lambda: (True, "a GPU for this test")  # noqa: E731
NO_GPU = lambda: (False, "no /dev/nvidia[0-9]* device files; no nvidia-smi on PATH")  # noqa: E731


def check(overrides, probe=NO_GPU):
    cfg = compose(overrides)
    validated(cfg)  # the values are valid: what is left is what the host shows
    return hostcheck.check(typed_config(plain(cfg))[0], probe)


def test_a_hf_folder_passes_and_each_missing_part_is_named(tmp_path):
    hf = make_hf_folder(tmp_path / "hf")
    assert check([f"model.path={hf}"]) == ([], [])
    for gone, needle in (
        ("config.json", "no config.json"),
        ("model.safetensors", "no weights"),
        ("tokenizer.json", "no tokenizer files"),
    ):
        (hf / gone).rename(tmp_path / gone)
        problems, _ = check([f"model.path={hf}"])
        assert len(problems) == 1 and problems[0][0] == f"model.path={str(hf)!r}" and needle in problems[0][1], problems
        assert "model.path" in problems[0][2]
        (tmp_path / gone).rename(hf / gone)


def test_a_separate_tokenizer_is_looked_for_in_its_own_folder(tmp_path):
    hf = make_hf_folder(tmp_path / "hf")
    (hf / "tokenizer.json").unlink()  # the weights' folder needs no tokenizer when model.tokenizer is given
    tok = make_hf_folder(tmp_path / "tok")
    assert check([f"model.path={hf}", f"model.tokenizer={tok}"]) == ([], [])
    problems, _ = check([f"model.path={hf}", f"model.tokenizer={tmp_path / 'nope'}"])
    assert [p[0] for p in problems] == [f"model.tokenizer={str(tmp_path / 'nope')!r}"]
    assert problems[0][1] == "no such file or folder"


def test_kv_routing_needs_a_tokenizer_json_for_the_front_end(tmp_path):
    """The engines read a tokenizer.model alone; the front end's `kv` routing needs tokenizer.json."""
    hf = make_hf_folder(tmp_path / "hf")
    kv = [f"model.path={hf}", "replicas=2", "serve.routing=kv"]
    assert check(kv) == ([], [])
    (hf / "tokenizer.json").rename(hf / "tokenizer.model")
    assert check([f"model.path={hf}", "replicas=2", "serve.routing=prefix"]) == ([], [])
    problems, _ = check(kv)
    assert [p[0] for p in problems] == ["serve.routing=kv"], problems
    assert f"{hf}/tokenizer.json, which does not exist" in problems[0][1] and "model.tokenizer" in problems[0][2]
    # a folder only the cluster's nodes see: a warning where they may, as for the model's own paths
    problems, warnings = check(["cluster=slurm", "model.path=/nonexistent-model", "replicas=2", "serve.routing=kv"])
    assert any("tokenizer.json" in w for w in warnings), (problems, warnings)


def test_a_file_in_place_of_a_folder(tmp_path):
    (tmp_path / "f").write_text("")
    problems, _ = check([f"model.path={tmp_path / 'f'}"])
    assert "not a folder" in problems[0][1]


@pytest.mark.parametrize("cluster,fails", [("local", True), ("local_slurm", True), ("slurm", False)])
def test_a_path_this_host_does_not_see_fails_here_and_warns_elsewhere(cluster, fails):
    """On this machine and the local Slurm cluster every path is this host's; a site cluster's nodes may see a path
    its login node does not, so there it is a warning and the launch goes on."""
    problems, warnings = check([f"cluster={cluster}", "model.path=/nonexistent-model"])
    if fails:
        assert [p[0] for p in problems] == ["model.path='/nonexistent-model'"] and warnings == []
    else:
        assert problems == [] and len(warnings) == 1
        assert "model.path='/nonexistent-model'" in warnings[0] and "nodes may see it" in warnings[0]


def test_a_visible_path_of_the_wrong_kind_fails_on_any_cluster(tmp_path):
    problems, _ = check(["cluster=slurm", f"model.path={tmp_path}"])
    assert "not a Hugging Face model folder" in problems[0][1]


def test_trtllm_looks_for_the_engine_files_of_every_rank_and_the_tokenizer(tmp_path):
    hf = make_hf_folder(tmp_path / "hf")
    eng = tmp_path / "engine"
    eng.mkdir()
    (eng / "config.json").write_text("{}")
    (eng / "rank0.engine").write_text("")
    base = [
        "cluster=local_slurm",
        "engine=trtllm",
        "engine.layout=ensemble",
        f"model.path={eng}",
        f"engine.tokenizer_dir={hf}",
    ]
    assert check(base) == ([], [])
    problems, _ = check(base + ["tp=2"])
    assert [p[0] for p in problems] == [f"engine.engine_dir={str(eng)!r}"]
    assert "rank1.engine" in problems[0][1] and "tp*pp=2" in problems[0][1]
    # without engine.tokenizer_dir the tokenizer is model.path's: an engine folder holds none
    problems, _ = check(base[:-1])
    assert [p[0] for p in problems] == [f"model.path={str(eng)!r}"] and "no tokenizer files" in problems[0][1]


def test_lmdeploy_takes_a_turbomind_workspace(tmp_path):
    ws = tmp_path / "ws"
    (ws / "triton_models" / "weights").mkdir(parents=True)
    assert check(["cluster=local_slurm", "engine=lmdeploy", f"model.path={ws}"]) == ([], [])
    problems, _ = check(["cluster=local_slurm", "engine=lmdeploy", f"model.path={tmp_path}"])
    assert "TurboMind workspace" in problems[0][1]


@pytest.mark.parametrize(
    "overrides,needs",
    [
        (["engine.device=cuda"], True),
        (["engine.device=auto"], False),
        (["engine.device=cpu"], False),
        (["engine=vllm", "model.path=<hf>"], True),
        (["engine=vllm", "model.path=<hf>", "engine.device=cpu"], False),
        (["engine=trtllm", "engine.layout=ensemble", "model.path=<engine>", "engine.tokenizer_dir=<hf>"], True),
    ],
)
def test_an_engine_that_needs_a_gpu_is_refused_without_one_on_a_local_launch(overrides, needs, tmp_path):
    hf = make_hf_folder(tmp_path / "hf")
    eng = tmp_path / "engine"
    eng.mkdir()
    (eng / "config.json").write_text("{}")
    (eng / "rank0.engine").write_text("")
    overrides = [o.replace("<hf>", str(hf)).replace("<engine>", str(eng)) for o in overrides]
    assert check(overrides, GPU) == ([], [])
    problems, _ = check(overrides, NO_GPU)
    if not needs:
        assert problems == []
        return
    assert len(problems) == 1
    what, why, fix = problems[0]
    assert what.startswith("engine")
    assert "needs a GPU" in why and "/dev/nvidia" in why and "nvidia-smi" in why and fix
    # on a Slurm cluster the GPUs are the nodes', not this host's
    assert check(["cluster=local_slurm", *overrides], NO_GPU) == ([], [])


def test_the_probe_says_what_hid_the_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    found, looked = hostcheck.probe_gpus()
    assert not found and "CUDA_VISIBLE_DEVICES=''" in looked


def test_run_and_jobs_dirs_may_be_missing_but_not_files(tmp_path):
    assert check([f"run_dir={tmp_path / 'new'}", f"cluster.jobs_dir={tmp_path / 'jobs'}"]) == ([], [])
    (tmp_path / "f").write_text("")
    problems, _ = check([f"run_dir={tmp_path / 'f'}"])
    assert problems[0][0] == f"run_dir={str(tmp_path / 'f')!r}" and "not a folder" in problems[0][1]


def test_a_command_is_looked_for_on_path(tmp_path):
    assert check(["cluster.python=sh"]) == ([], [])
    problems, _ = check(["cluster.python=no-such-python-here"])
    assert "PATH" in problems[0][1]
    exe = tmp_path / "tritonserver"
    exe.write_text("")
    problems, _ = check([f"cluster.tritonserver={exe}"])
    assert problems[0][1] == "not executable"


def test_a_sweep_point_that_launches_is_checked_and_a_dry_one_only_for_the_models_shape(tmp_path):
    from launcher.sweep.point import _validate

    args = ["bench=sharegpt_small", "model.make=", "model.path=/nonexistent-model"]
    _, problems = _validate(compose(args), plain(compose(args)))
    assert any("model.path='/nonexistent-model'" in p and "fix:" in p for p in problems), problems
    _, problems = _validate(compose(args + ["dry_run=true"]), plain(compose(args + ["dry_run=true"])))
    assert problems == []
    dry = ["bench=sharegpt_small", "cluster=local_slurm", "tp=2", "nodes=2", "dry_run=true"]  # the made model's 9 heads
    _, problems = _validate(compose(dry), plain(compose(dry)))
    assert len(problems) == 1 and problems[0].startswith("tp=2: tp does not divide its 9 attention heads"), problems


def shaped_folder(path: Path, **shape) -> Path:
    """A Hugging Face folder whose config.json gives the model's shape (what tp and pp are checked against)."""
    import json

    make_hf_folder(path)
    (path / "config.json").write_text(json.dumps(shape))
    return path


LLAMA_8B = dict(num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=32, intermediate_size=14336)


@pytest.mark.parametrize(
    "overrides,found",
    [
        # the default model (SmolLM2: 9 heads, 3 KV heads) before it is made: tp=2 splits neither, tp=3 splits both
        (
            ["cluster=local_slurm", "tp=2", "nodes=2"],
            ("tp=2", "9 attention heads or its 3 KV heads", "use tp=1, 3 with engine=hf"),
        ),
        (["tp=3"], None),
        (["model=tiny", "tp=4"], ("tp=4", "2 KV heads", "use tp=1, 2 with engine=hf")),
        (["model=tiny", "tp=2"], None),
    ],
)
def test_tp_is_checked_against_a_made_models_heads_before_launch(overrides, found):
    problems, _ = check(overrides)
    mine = [p for p in problems if p[0].startswith("tp=")]
    if found is None:
        assert mine == []
    else:
        assert len(mine) == 1 and mine[0][0] == found[0] and found[1] in mine[0][1] and mine[0][2] == found[2], mine


def test_tp_against_a_folders_config_and_kv_heads_replicated_where_the_engine_does(tmp_path):
    hf = shaped_folder(tmp_path / "llama", **LLAMA_8B)
    base = ["cluster=luna", f"model.path={hf}"]
    assert check(base + ["engine=vllm", "tp=16", "nodes=2"])[0] == []  # 8 KV heads, each on two ranks
    problems, _ = check(base + ["engine=hf", "replicas=1", "tp=16", "nodes=2"])
    assert [p[0] for p in problems] == ["tp=16"] and "8 KV heads" in problems[0][1] and "config.json" in problems[0][1]
    assert problems[0][2] == "use tp=1, 2, 4, 8 with engine=hf"


def test_a_tp_that_fits_the_heads_but_not_the_mlp_is_named(tmp_path):
    hf = shaped_folder(
        tmp_path / "odd", num_attention_heads=12, num_key_value_heads=12, num_hidden_layers=4, intermediate_size=100
    )
    problems, _ = check(["cluster=luna", "engine=vllm", f"model.path={hf}", "tp=3"])
    assert [p[0] for p in problems] == ["tp=3"] and "MLP's 100 rows" in problems[0][1]


def test_more_pipeline_stages_than_layers_is_refused(tmp_path):
    hf = shaped_folder(tmp_path / "short", **{**LLAMA_8B, "num_hidden_layers": 2})
    problems, _ = check(["cluster=luna", "engine=vllm", f"model.path={hf}", "pp=4"])
    assert (
        [p[0] for p in problems] == ["pp=4"] and "2 layers" in problems[0][1] and problems[0][2] == "use pp=2 or fewer"
    )


def test_a_multimodal_config_is_read_for_its_language_model(tmp_path):
    hf = shaped_folder(tmp_path / "vl", text_config=dict(LLAMA_8B), vision_config={"num_attention_heads": 16})
    assert check(["cluster=luna", "engine=vllm", f"model.path={hf}", "tp=8"])[0] == []
    assert [p[0] for p in check(["cluster=luna", "engine=vllm", f"model.path={hf}", "tp=6"])[0]] == ["tp=6"]


def test_a_tp_the_model_cannot_take_exits_2_before_submission(tmp_path):
    """`llmlaunch cluster=local_slurm tp=2 nodes=2` with the default model: refused on the launch host, nothing written."""
    import subprocess
    import sys

    jobs = tmp_path / "jobs"
    r = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "cluster=local_slurm", "tp=2", "nodes=2", f"cluster.jobs_dir={jobs}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert (
        "tp=2: tp does not divide its 9 attention heads or its 3 KV heads" in r.stderr
        and "use tp=1, 3 with engine=hf" in r.stderr
    )
    assert not jobs.exists()


def test_the_api_key_file_is_read_as_the_api_will_read_it_before_anything_starts(tmp_path):
    from launcher.openai_api.auth import read_key

    key = tmp_path / "key"
    key.write_text("  s3cret-key  \nsecond line ignored\n")
    assert read_key(str(key)) == "s3cret-key"
    assert check([f"serve.api_key_file={key}"]) == ([], [])
    for text, needle in (("", "is empty"), ("\n  \n", "is empty")):
        key.write_text(text)
        problems, _ = check([f"serve.api_key_file={key}"])
        assert len(problems) == 1 and needle in problems[0][1], problems
        assert problems[0][0] == f"serve.api_key_file={str(key)!r}" and "first line" in problems[0][2]
    problems, _ = check([f"serve.api_key_file={tmp_path / 'none'}"])
    assert len(problems) == 1 and "no such file" in problems[0][1], problems


SMALL = dict(num_attention_heads=9, num_key_value_heads=3, num_hidden_layers=4)  # SmolLM2-135M's heads, few layers


def dry_run(args, tmp_path, **env):
    """`llmlaunch ARGS dry_run=true` as a user runs it, HOME and the working folder empty."""
    import os
    import subprocess
    import sys

    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args, "dry_run=true"],
        capture_output=True,
        text=True,
        cwd=home,
        env={**os.environ, "HOME": str(home), **env},
        timeout=120,
    )


def test_a_dry_run_refuses_a_tp_the_model_folder_cannot_take_as_a_launch_does(tmp_path):
    """model.path's config.json is read in a dry run too: the launch's error, exit 2, before the plan is printed."""
    hf = shaped_folder(tmp_path / "nine", **SMALL)
    r = dry_run([f"model.path={hf}", "tp=5"], tmp_path)
    assert r.returncode == 2 and r.stdout == "", r
    launch_problems, _ = check([f"model.path={hf}", "tp=5"], GPU)  # what before_launch raises on a launch
    assert r.stderr.strip() == hostcheck.LaunchError(launch_problems).render(), r.stderr
    assert "tp=5: tp does not divide its 9 attention heads" in r.stderr and "use tp=1, 3 with engine=hf" in r.stderr
    assert dry_run([f"model.path={hf}", "tp=3"], tmp_path).returncode == 0


@pytest.mark.parametrize(
    "args,found",
    [
        (["engine=vllm", "pp=5"], ("pp=5", "the model has 4 layers")),
        (["cluster=slurm", "tp=5"], ("tp=5", "9 attention heads")),  # a site cluster's plan: the folder is here
    ],
)
def test_a_dry_run_checks_the_shape_on_any_cluster(args, found, tmp_path):
    from launcher.cli import plan

    hf = shaped_folder(tmp_path / "nine", **SMALL)
    cfg, _ = plan([f"model.path={hf}", *args, "dry_run=true"])
    with pytest.raises(hostcheck.LaunchError) as e:
        hostcheck.before_dry_run(cfg)
    assert [p[0] for p in e.value.problems] == [found[0]] and found[1] in e.value.problems[0][1], e.value.problems


@pytest.mark.parametrize(
    "args",
    [
        # the GPU, the programs, the ports and the paths are a launch's (the nodes' for a site cluster): not a plan's
        ["engine.device=cuda"],
        ["cluster.tritonserver=/nonexistent-tritonserver", "cluster.python=no-such-python-here"],
        ["serve.api_key_file=/nonexistent-key"],
        # a folder this host does not have: a site cluster's path, its shape unknown here, so nothing is checked
        ["cluster=slurm", "model.path=/nonexistent-model", "tp=5"],
        ["model.make=", "model.path=/nonexistent-model", "tp=5"],
    ],
)
def test_a_dry_run_looks_for_nothing_else_on_this_host(args, tmp_path):
    r = dry_run(args, tmp_path, CUDA_VISIBLE_DEVICES="")
    assert r.returncode == 0 and "===== rank layout" in r.stdout, r.stderr
    problems, warnings = check(args, NO_GPU)
    assert problems or warnings, "each of these a launch's check refuses or warns about: a dry run leaves it out"


def test_a_dry_run_checks_a_made_models_shape_before_it_is_made(tmp_path):
    r = dry_run(["cluster=local_slurm", "tp=2", "nodes=2"], tmp_path)
    assert r.returncode == 2 and r.stdout == "", r
    assert "tp=2: tp does not divide its 9 attention heads or its 3 KV heads (model=smollm2)" in r.stderr
    assert list((tmp_path / "home").iterdir()) == []  # a made model is not made for a plan
