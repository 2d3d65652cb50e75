"""Did you mean: the valid name closest to a misspelled key (`model.pth` -> model.path) or profile (`engine=vlm` ->
vllm), for the errors that refuse them (launcher/compose.py, launcher/validate.py). Close is difflib's ratio; when
nothing is close nothing is suggested, so a word that is no near miss is not answered with an unrelated name."""

from __future__ import annotations

import collections.abc
import difflib
import typing
from dataclasses import fields, is_dataclass
from typing import Iterable, Optional, Tuple

from launcher.engines.config import EngineConfig
from launcher.engines.registry import schemas as engine_schemas
from launcher.schema import LaunchConfig

# difflib's default: `pth`/path (0.86), `replica`/replicas (0.93), `lcoal`/local (0.8) pass; `gpu_mem` is not
# taken for gpu_memory_utilization (0.48), nor `foo` for host (0.29)
CUTOFF = 0.6


def closest(word: str, choices: Iterable[str]) -> Optional[str]:
    """The choice closest to `word` (case aside: `TP` finds tp), or None when none is close."""
    by_lower = {c.lower(): c for c in choices}
    found = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=CUTOFF)
    return by_lower[found[0]] if found else None


def closest_key(key: str, engine: Optional[str] = None) -> Optional[str]:
    """The schema's dotted key closest to `key`, corrected a segment at a time against the names that can stand
    there (launcher/schema.py's dataclasses; under `engine.`, engine=`engine`'s own, or the fields every engine has
    when it is not known); a key inside a free mapping (cluster.env's, engine.engine_args') is the user's and kept.
    None when a segment has no close name, or `key` is already valid."""
    cls: object = LaunchConfig
    out = []
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not is_dataclass(cls):
            if typing.get_origin(cls) in (dict, collections.abc.Mapping):
                out += parts[i:]  # a free mapping's keys are the user's own
                break
            return None  # a value has no keys under it
        names = [f.name for f in fields(cls)]
        name = part if part in names else closest(part, names)
        if name is None:
            return None
        out.append(name)
        if cls is LaunchConfig and name == "engine":
            cls = engine_schemas().get(engine or "", EngineConfig)
        else:
            cls = typing.get_type_hints(cls)[name]
    found = ".".join(out)
    return None if found == key else found


def unknown_key(key: str, engine: Optional[str] = None) -> Tuple[str, str, str]:
    """The problem (value, why, fix) of a key the schema does not have, with the closest one it has, if any.
    `engine`: the engine whose dataclass holds `engine.` keys (named in the why when the key is one of those)."""
    why = "no such key in launcher/schema.py" + (
        f" for engine={engine}" if engine and key.startswith("engine.") else ""
    )
    near = closest_key(key, engine)
    listing = "`llmlaunch --cfg job` prints every key"
    fix = f"did you mean {near}? ({listing})" if near else f"check the spelling ({listing})"
    return key, why, fix


def unknown_choice(group: str, value: str, options: Iterable[str]) -> str:
    """The fix for `group=value` where value is no profile of the group: the closest one, then every one."""
    options = list(options)
    near = closest(value, options)
    listing = f"choose one of: {', '.join(options)}"
    return f"did you mean {group}={near}? ({listing})" if near else listing
