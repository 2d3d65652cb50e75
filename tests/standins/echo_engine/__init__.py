"""`engine=echo`: an engine kept outside llmlaunch, as a site or a vendor would keep one, to show what adding an engine
takes: this package (its Engine, its Config, the model Triton runs) and one registration (tests register it through
the `llmlaunch.engines` entry point group of a distribution, or with launcher.engines.registry.register). It streams
the prompt's words back, one a response, so it needs no weights; nothing in llmlaunch names it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from launcher import pbtxt
from launcher.domains import Int, Name, Pattern, arg
from launcher.engines.base import Engine, Problem, RenderedModel, triton_entry
from launcher.engines.config import EngineConfig


@dataclass
class EchoConfig(EngineConfig):
    name: str = arg(Name(), "echo")  # the registry key
    model_name: str = arg(Name(empty="the engine's default"), "echo_model")  # Triton model name clients address
    max_num_seqs: int = arg(Int("sequences batched at once"), 8)  # sequences batched at once
    prefix: str = arg(
        Pattern(r"[A-Za-z0-9 ]*", "letters, digits and spaces", "give {key} letters, digits and spaces only"), ""
    )  # words put before the echoed prompt


class EchoEngine(Engine):
    """Streams the prompt's words back; one tritonserver per rank, no GPU."""

    name = "echo"
    Config = EchoConfig
    worker_models = ("echo_model",)

    def models(self, spec) -> List[RenderedModel]:
        cfg = pbtxt.python_model(spec.model_name, spec.engine.max_num_seqs, {"prefix": spec.engine.prefix})
        entry = triton_entry("tests.standins.echo_engine.model")  # rendered: nothing of it lives in llmlaunch's tree
        return [RenderedModel(spec.model_name, cfg, extra_text={"1/model.py": entry})]

    def check(self, c, scheduler) -> List[Problem]:
        if c.tp != 1 or c.pp != 1:
            return [(f"tp={c.tp} pp={c.pp}", "engine=echo has no model to shard", "use tp=1 pp=1")]
        return []

    def needs_gpu(self, engine) -> bool:
        return False

    def host_paths(self, c):
        return []  # it loads nothing
