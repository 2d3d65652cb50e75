"""A misspelled key or profile on the command line: exit status 2, the misspelling named, and the closest valid name
suggested (launcher/suggest.py), or nothing suggested when nothing is close; nothing run or written."""

import os
import subprocess
import sys

import pytest

from launcher import cli
from launcher.suggest import closest_key

# (command line, the value the error names, the suggestion)
MISSPELLED = [
    (["model.pth=/x"], "model.pth", "did you mean model.path?"),
    (["replica=2"], "replica", "did you mean replicas?"),
    (["engine=vlm"], "engine=vlm", "did you mean engine=vllm?"),
    (["cluster=lcoal"], "cluster=lcoal", "did you mean cluster=local?"),
    (["engine.max_num_seq=8"], "engine.max_num_seq", "did you mean engine.max_num_seqs?"),
    # the engine's own keys: those of the engine chosen
    (
        ["engine=vllm", "model.path=/m", "engine.gpu_memory_utilisation=0.5"],
        "engine.gpu_memory_utilisation",
        "did you mean engine.gpu_memory_utilization?",
    ),
    # a key added with `+` composes; the validator refuses it the same way
    (["+engine.max_num_seq=8"], "engine.max_num_seq", "did you mean engine.max_num_seqs?"),
    (["modle.path=/x"], "modle.path", "did you mean model.path?"),
    (["engin=vllm"], "engin", "did you mean engine?"),
    # a free mapping's name misspelled: the key under it is the user's and kept
    (["cluster.envs.NCCL_DEBUG=WARN"], "cluster.envs.NCCL_DEBUG", "did you mean cluster.env.NCCL_DEBUG?"),
    # a sweep's misspelled key, before Hydra runs a point
    (["-m", "replica=1,2"], "replica", "did you mean replicas?"),
    (["-m", "engine=hf,vlm"], "engine=vlm", "did you mean engine=vllm?"),
]


def run_cli(args, capsys):
    """`llmlaunch ARGS dry_run=true` in this process: (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as e:
        cli.main(args + ["dry_run=true", "run_dir=/nonexistent-run-dir"])
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.mark.parametrize("args,what,suggestion", MISSPELLED, ids=[" ".join(c[0]) for c in MISSPELLED])
def test_a_misspelling_is_named_with_the_closest_valid_name(args, what, suggestion, capsys):
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith(f"error: {what}: ") and f"fix: {suggestion}" in err, err
    assert err.count("did you mean") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "args,what,fix",
    [
        (["zzzqqq=1"], "zzzqqq", "check the spelling (`llmlaunch --cfg job` prints every key)"),
        (["engine=foo"], "engine=foo", "choose one of: hf, lmdeploy, sglang, trtllm, vllm"),
        (["serve.foo=1"], "serve.foo", "check the spelling"),  # `foo` is not taken for serve.host
        (["tp.x=1"], "tp.x=1", "set tp to a whole number >= 1"),  # a value has no keys under it: a type error
        # another engine's key: nothing close among the hf engine's
        (["engine.gpu_memory_utilization=0.5"], "engine.gpu_memory_utilization", "check the spelling"),
    ],
)
def test_nothing_is_suggested_when_nothing_is_close(args, what, fix, capsys):
    code, out, err = run_cli(args, capsys)
    assert code == 2 and out == "", (code, out, err)
    assert what in err and fix in err and "did you mean" not in err, err


def test_every_misspelled_key_is_named_at_once(capsys):
    """Hydra stops at the first key it cannot place; each is named, with a bad value beside them."""
    code, _, err = run_cli(["model.pth=/x", "replica=2", "tp=abc"], capsys)
    assert code == 2 and err.startswith("error: 3 problems in the configuration:"), err
    assert "1. model.pth: " in err and "did you mean model.path?" in err
    assert "2. replica: " in err and "did you mean replicas?" in err
    assert "3. tp=abc: " in err


def test_hydras_own_flags_get_the_same_error(tmp_path):
    """`llmlaunch --cfg job replica=2` goes to Hydra's entry point, whose own message for the key would be its
    "Could not override" text and exit status 1; the key is checked first, as on a launch."""
    env = {**os.environ, "HOME": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "--cfg", "job", "replica=2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.startswith("error: replica: ") and "did you mean replicas?" in r.stderr, r.stderr
    assert "Could not override" not in r.stderr and "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "key,engine,found",
    [
        ("model.pth", None, "model.path"),
        ("TP", None, "tp"),  # case aside
        ("engin.max_num_seq", None, "engine.max_num_seqs"),  # a segment at a time
        ("engine.engine_arg.enforce_eager", "vllm", "engine.engine_args.enforce_eager"),
        ("engine.engine_arg.enforce_eager", "hf", None),  # the hf engine has no engine_args
        ("cluster.container.imag", None, "cluster.container.image"),
        ("model.path", None, None),  # valid: nothing to suggest
        ("model.path.x", None, None),
    ],
)
def test_the_closest_key_is_found_a_segment_at_a_time(key, engine, found):
    assert closest_key(key, engine) == found
