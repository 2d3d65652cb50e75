"""What an engine is made of: one package (its Engine, its Config, the model Triton runs), one registration and, for
the engines llmlaunch ships, one conf/engine YAML. An engine kept in another distribution (tests/standins/
echo_engine, registered through the `llmlaunch.engines` entry point group of a distribution made here) is validated
and dry-run by the real `llmlaunch` command like the built-in ones."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.engines.base import Engine, triton_entry
from launcher.engines.config import EngineConfig
from launcher.engines.registry import BUILTIN, ENGINES, Registry, schemas

ROOT = Path(__file__).resolve().parents[2]
LLMLAUNCH = str(Path(sys.executable).parent / "llmlaunch")


def distribution_with_echo_engine(tmp_path: Path) -> Path:
    """A folder holding an installed distribution's metadata whose entry point registers the echo engine."""
    info = tmp_path / "site" / "echo_engine-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-engine\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[llmlaunch.engines]\necho = tests.standins.echo_engine:EchoEngine\n")
    return info.parent


def llmlaunch(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    site = distribution_with_echo_engine(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    return subprocess.run(
        [LLMLAUNCH, *overrides, f"cluster.jobs_dir={tmp_path / 'runs'}"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_engine_kept_elsewhere_dry_runs_through_its_entry_point(tmp_path):
    run = llmlaunch(tmp_path, "engine=echo", "engine.prefix=said", "replicas=2", "dry_run=true")
    assert run.returncode == 0, run.stderr
    plan = run.stdout
    assert "  name: echo\n  model_name: echo_model\n  max_num_seqs: 8\n" in plan  # its Config's defaults composed
    assert "  prefix: said\n" in plan
    assert (
        "===== file model_repository/echo_model/1/model.py =====\n" + triton_entry("tests.standins.echo_engine.model")
        in plan + "\n"
    )
    assert 'key: "prefix"\n  value {\n    string_value: "said"' in plan  # its config.pbtxt, rendered by its Engine
    assert "gRPC endpoint: rank 0, 127.0.0.1:8001, model echo_model" in plan
    assert plan.count("--model-repository=") == 2  # one tritonserver per replica


@pytest.mark.parametrize(
    "overrides,named",
    [
        (["engine.prefix=a-b"], "engine.prefix='a-b'"),  # its Config's domain
        (["tp=2"], "tp=2 pp=1"),  # its Engine's check
        (["engine.prefx=a"], "engine.prefx"),  # a key its Config does not have
    ],
)
def test_an_engine_kept_elsewhere_refuses_bad_input_by_its_own_rules(tmp_path, overrides, named):
    run = llmlaunch(tmp_path, "engine=echo", *overrides, "dry_run=true")
    assert run.returncode == 2, run.stdout + run.stderr
    assert named in run.stderr and "fix:" in run.stderr


def test_the_registry_takes_engine_classes_once_each():
    class Other(Engine):
        name = "hf"

    reg = Registry(BUILTIN)
    assert reg.add(BUILTIN[0]) is reg["hf"]  # the same class again: the same engine
    with pytest.raises(ValueError, match="engine=hf is registered already"):
        reg.add(Other)
    with pytest.raises(TypeError):
        reg.add(EngineConfig)


def test_every_engine_has_its_config_and_its_choice():
    """Each registered engine's Config extends EngineConfig, names the engine and gives every field a default, and
    conf/engine/<name>.yaml chooses it by extending its Config (`base_<name>`), nothing else to repeat."""
    for name, config in schemas().items():
        assert issubclass(config, EngineConfig) and config().name == name
        assert all(
            f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            for f in dataclasses.fields(config)
        )
        yaml = (ROOT / "conf" / "engine" / f"{name}.yaml").read_text()
        assert f"  - base_{name}\n" in yaml


def entry_module(path: Path) -> str:
    """The module a checked-in model_repository/.../1/model.py takes its TritonPythonModel from."""
    tree = ast.parse(path.read_text())
    found = [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module.startswith("launcher.engines.")]
    assert len(found) == 1, path
    return found[0]


def test_the_model_repository_holds_only_the_entries_triton_loads():
    """model_repository/<...>/1/model.py is what Triton's python backend loads by path: the one entry text
    (launcher.engines.base.triton_entry) pointing at the engine package's module, which defines the model."""
    entries = sorted((ROOT / "model_repository").rglob("model.py"))
    assert len(entries) == 8
    for path in entries:
        module = entry_module(path)
        assert path.read_text() == triton_entry(module), f"{path}: rewrite it with triton_entry({module!r})"
        spec = importlib.util.find_spec(module)
        assert spec is not None and "class TritonPythonModel" in Path(spec.origin).read_text(), module


def test_the_engines_render_only_entries_that_exist():
    """Every python model file a built-in engine copies is one of those entries."""
    from launcher.compose import compose
    from launcher.render import copied_files
    from launcher.schedulers.registry import validated

    for name, layout in [(n, "") for n in ENGINES if n != "trtllm"] + [("trtllm", "llmapi"), ("trtllm", "ensemble")]:
        overrides = [f"engine={name}", "model.path=/models/m", "cluster=luna"]
        if layout:
            overrides += [f"engine.layout={layout}", "engine.engine_dir=/models/e", "engine.bls=true"]
        spec = validated(compose(overrides))
        for m in ENGINES[name].models(spec):
            for rel, source in m.files.items():
                assert (ROOT / "model_repository" / source).is_file(), (name, rel, source)
        assert copied_files(spec)


def test_the_hf_engine_process_reads_back_the_arguments_it_is_sent():
    """The hf model hands its engine process the arguments (HFEngineArgs.to_dict), which reads them back with
    from_dict: the launch's settings arrive whole, and the config's own fields (its name, Triton's instance count)
    are not arguments."""
    from launcher.compose import compose
    from launcher.engines.hf import launch_args
    from launcher.engines.hf.config import NOT_ARGUMENTS, HFEngineArgs
    from launcher.schedulers.registry import validated

    spec = validated(
        compose(["model=tiny", "engine.response_processes=2", "engine.block_size=32", "engine.torch_threads=1"])
    )
    sent = launch_args(spec).to_dict()
    assert not set(NOT_ARGUMENTS) & set(sent)
    back = HFEngineArgs.from_dict(sent)
    assert back.to_dict() == sent and (back.block_size, back.torch_threads) == (32, 1)
