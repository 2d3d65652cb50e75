"""The engines llmlaunch serves, by `engine.name`: one `Engine` (launcher/engines/base.py) per engine package.

Adding an engine is its package under launcher/engines/ (its Engine, Config and the code Triton runs), one line in
`BUILTIN` below and its conf/engine/<name>.yaml. An engine kept outside llmlaunch registers itself with `register`,
or through the `llmlaunch.engines` entry point group of its distribution (`name = "package.module:EngineClass"`),
which is read the first time the registry is asked; such an engine's `engine=<name>` needs no YAML (its Config's
defaults are the choice).
"""

from __future__ import annotations

import importlib.metadata
from typing import Dict, Iterator, Mapping, Type

from launcher.engines.base import Engine
from launcher.engines.hf import HFEngine
from launcher.engines.lmdeploy import LMDeployEngine
from launcher.engines.sglang import SGLangEngine
from launcher.engines.trtllm import TRTLLMEngine
from launcher.engines.vllm import VLLMEngine

BUILTIN = (HFEngine, TRTLLMEngine, VLLMEngine, SGLangEngine, LMDeployEngine)
ENTRY_POINTS = "llmlaunch.engines"  # the entry point group of engines kept in other distributions


class Registry(Mapping[str, Engine]):
    """name -> Engine. The built-in engines are there from the start; entry points are loaded on the first lookup."""

    def __init__(self, engines):
        self._engines: Dict[str, Engine] = {}
        self._plugins_loaded = False
        for cls in engines:
            self.add(cls)

    def add(self, cls: Type[Engine]) -> Engine:
        if not (isinstance(cls, type) and issubclass(cls, Engine)) or not cls.name:
            raise TypeError(f"{cls!r} is not an Engine subclass with a name")
        known = self._engines.get(cls.name)
        if known is not None and type(known) is not cls:
            raise ValueError(f"engine={cls.name} is registered already, by {type(known).__module__}")
        self._engines[cls.name] = known or cls()
        return self._engines[cls.name]

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in importlib.metadata.entry_points(group=ENTRY_POINTS):
            self.add(ep.load())

    def __getitem__(self, name: str) -> Engine:
        self._load_plugins()
        return self._engines[name]

    def __iter__(self) -> Iterator[str]:
        self._load_plugins()
        return iter(self._engines)

    def __len__(self) -> int:
        self._load_plugins()
        return len(self._engines)


ENGINES = Registry(BUILTIN)


def register(cls: Type[Engine]) -> Type[Engine]:
    """Register an engine class kept outside llmlaunch (usable as a class decorator); registering the same class again
    is a no-op, another class under a registered name an error."""
    ENGINES.add(cls)
    return cls


def schemas() -> Dict[str, type]:
    """engine name -> its config dataclass (the schema of the `engine` group for that choice)."""
    return {name: engine.Config for name, engine in ENGINES.items()}
