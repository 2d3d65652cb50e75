"""The pure parts of the GPU measurement scripts (benchmark/gpu): they run only on the lent GPU machine, so what
can be checked without a GPU is checked here: the token-by-token comparison of two servings' greedy answers, the
startup breakdown read from vLLM's log lines, and that every benchmark script or module the scripts and the docs
name exists (a stale name in a GPU script would fail only there)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    return importlib.import_module(f"benchmark.gpu.{name}")


class Words:
    """A tokenizer of whitespace-separated words, enough for comparing answers token by token."""

    def __init__(self):
        self.ids: dict = {}

    def encode(self, text, add_special_tokens=False):
        return [self.ids.setdefault(w, len(self.ids)) for w in text.split()]

    def decode(self, ids):
        words = {v: k for k, v in self.ids.items()}
        return " ".join(words[i] for i in ids)


def test_identity_counts_equal_positions_and_names_the_first_divergence():
    identity = _load("identity")
    prompts = identity.prompts(3)
    assert len(set(prompts)) == 3 and prompts == identity.prompts(3)  # the same prompts on every call
    a = {"prompts": prompts, "answers": ["a b c d", "x y z w", "p q"]}
    b = {"prompts": prompts, "answers": ["a b c d", "x y k l", "p q r"]}
    report = identity.compare(a, b, Words())
    assert report["identical_answers"] == 1
    assert report["token_share"] == (4 + 2 + 2) / (4 + 4 + 3)
    assert report["first_divergence"] == [
        {"prompt": 1, "position": 2, "a": "z", "b": "k"},
        {"prompt": 2, "position": 2, "a": "<end>", "b": "r"},
    ]


def test_identity_refuses_answers_to_different_prompts():
    identity = _load("identity")
    with pytest.raises(SystemExit, match="different prompts"):
        identity.compare({"prompts": ["a"], "answers": ["x"]}, {"prompts": ["b"], "answers": ["x"]}, Words())


def test_startup_breakdown_reads_vllms_log_lines(tmp_path):
    serve_bench = _load("serve_bench")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text(
        "(Worker pid=1) INFO [default_loader.py:430] Loading weights took 0.37 seconds\n"
        "(Worker pid=1) INFO [model_runner.py:302] Model loading took 2.3 GiB and 2.798511 seconds\n"
        "(Worker pid=1) INFO [backends.py:1149] Dynamo bytecode transform time: 3.78 s\n"
        "(Worker pid=1) INFO [monitor.py:53] torch.compile took 11.55 s in total\n"
        "(Worker pid=1) INFO [model_runner.py:722] Graph capturing finished in 2 secs, took 0.37 GiB\n"
        "(EngineCore pid=2) INFO [core.py:337] init engine (profile, create kv cache, warmup model) took 105.57 s\n"
    )
    (logs / "rank1.log").write_text("(Worker pid=3) INFO Loading weights took 9.00 seconds\n")
    assert serve_bench.startup_breakdown(str(tmp_path)) == {
        "weights_s": 0.37,
        "model_load_s": 2.798511,
        "dynamo_s": 3.78,
        "compile_s": 11.55,
        "cuda_graphs_s": 2.0,
        "engine_init_s": 105.57,
    }
    assert serve_bench.startup_breakdown(str(tmp_path / "absent")) == {}


# `benchmark/x/y.py` / `.sh` paths and `-m benchmark.x.y` modules, as the shell scripts and docs write them
_PATH = re.compile(r"benchmark/[\w/]+\.(?:py|sh)")
_MODULE = re.compile(r"-m (benchmark(?:\.\w+)+)")


def test_every_benchmark_path_and_module_named_exists():
    scripts = [f for f in sorted((ROOT / "benchmark").rglob("*")) if f.suffix in (".py", ".sh")]
    texts = [*scripts, *sorted((ROOT / "docs").glob("*.md"))]
    texts += [ROOT / "README.md", ROOT / "benchmark" / "README.md"]
    missing = []
    for f in texts:
        text = f.read_text()
        missing += [f"{f.relative_to(ROOT)}: {p}" for p in _PATH.findall(text) if not (ROOT / p).is_file()]
        for m in _MODULE.findall(text):
            if not (ROOT / (m.replace(".", "/") + ".py")).is_file():
                missing.append(f"{f.relative_to(ROOT)}: -m {m}")
    assert missing == []
