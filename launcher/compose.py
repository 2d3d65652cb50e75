"""Hydra composition: a command line's overrides -> the composed config, with every way a word can fail to compose
(a profile that does not exist, a word that is no override, a value Hydra cannot parse or type) turned into our
value / why / fix. Nothing here validates values (launcher/validate.py) or launches.
"""

from __future__ import annotations

import collections.abc
import typing
from dataclasses import is_dataclass
from typing import Any, Dict, List, Tuple

from launcher.engines.registry import schemas as engine_schemas
from launcher.errors import LaunchError
from launcher.paths import CONF_DIR, cache_root
from launcher.replay import override_keys, pinned_values
from launcher.schema import BenchConfig, ClusterConfig, LaunchConfig, ModelConfig, field_domain
from launcher.suggest import unknown_choice, unknown_key

GROUPS = ("cluster", "engine", "model", "bench")


def available(group: str) -> List[str]:
    """The choices of a config group: its conf/<group>/*.yaml, and for `engine` every registered engine."""
    names = {p.stem for p in (CONF_DIR / group).glob("*.yaml")}
    if group == "engine":
        names |= set(engine_schemas())
    return sorted(names)


def check_group_choices(argv: List[str]) -> None:
    """Hydra's own message for `engine=foo` is a traceback-ish exit 1; ours names the closest profile (`engine=vlm`:
    vllm) and lists the choices, exit 2."""
    problems = []
    for arg in argv:
        if arg.startswith("-") or "=" not in arg:
            continue
        key, _, value = arg.partition("=")
        key = key.lstrip("+~")
        if key in GROUPS:
            for v in value.split(","):  # multirun sweeps list choices with commas
                if v not in available(key):
                    problems.append(
                        (
                            f"{key}={v}",
                            f"no such {key} profile in {CONF_DIR / key}",
                            unknown_choice(key, v, available(key)),
                        )
                    )
    if problems:
        raise LaunchError(problems)


def free_mappings() -> Tuple[str, ...]:
    """Dotted names of the fields that are free mappings (a `Dict` field: engine.engine_args, cluster.env, ...):
    their keys are the user's (an engine's own arguments, environment variables), not the schema's. The
    engine's are those of every engine's dataclass; a key under one of another engine is refused by
    launcher/validate.py as a field that engine does not have."""
    out: List[str] = []

    def walk(cls, prefix: str) -> None:
        for name, hint in typing.get_type_hints(cls).items():
            if typing.get_origin(hint) in (dict, collections.abc.Mapping):
                out.append(prefix + name)
            elif is_dataclass(hint):
                walk(hint, f"{prefix}{name}.")

    for name, hint in typing.get_type_hints(LaunchConfig).items():
        if name == "engine":
            for schema in engine_schemas().values():
                walk(schema, "engine.")
        elif is_dataclass(hint):
            walk(hint, f"{name}.")
    return tuple(sorted(set(out)))


def free_mapping_overrides(argv: List[str]) -> List[str]:
    """`engine.engine_args.enforce_eager=true` as `++engine.engine_args.enforce_eager=true`: a key inside a free
    mapping (`free_mappings`) is the user's own, so it needs no `+` to be added, and `++` also sets
    one the profile already gives. Every other argument is kept as it is: an unknown key elsewhere is still
    refused by Hydra's struct mode (and reported by `hydra_problem`)."""
    mappings = free_mappings()
    out = []
    for arg in argv:
        key = arg.partition("=")[0]
        if "=" in arg and not arg.startswith(("-", "+", "~")) and any(key.startswith(m + ".") for m in mappings):
            arg = "++" + arg
        out.append(arg)
    return out


def register_configs() -> None:
    """Register launcher/schema.py's dataclasses with Hydra's ConfigStore (idempotent): `conf/<group>/<name>.yaml`
    extends `base_<group>` (an engine's, `base_<engine>`)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="launch_schema", node=LaunchConfig)
    cs.store(group="cluster", name="base_cluster", node=ClusterConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="bench", name="base_bench", node=BenchConfig)
    for name, schema in engine_schemas().items():
        cs.store(group="engine", name=f"base_{name}", node=schema)
        if not (CONF_DIR / "engine" / f"{name}.yaml").exists():  # an engine kept elsewhere: its defaults are the choice
            cs.store(group="engine", name=name, node=schema)


def register() -> None:
    """What composing needs registered first (idempotent): the schema's dataclasses in Hydra's ConfigStore, and the
    `llmlaunch_cache` resolver (`${llmlaunch_cache:runs}`: a folder under launcher.paths.cache_root())."""
    from omegaconf import OmegaConf

    register_configs()
    OmegaConf.register_new_resolver("llmlaunch_cache", lambda sub="": str(cache_root() / sub), replace=True)


def compose(overrides: List[str]):
    """Compose the config the way `llmlaunch` does (used by tests and tools)."""
    from hydra import compose as hcompose, initialize_config_dir

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hcompose(config_name="config", overrides=free_mapping_overrides(list(overrides)))


def composed(overrides: List[str]):
    """Overrides -> the composed config, with a bad group choice or a value that does not compose as a LaunchError.
    Hydra stops at the first key the config has no place for; each is left out and the rest composed again, so
    every misspelled key is named at once (with the closest valid one, launcher/suggest.py)."""
    check_words(overrides)
    check_group_choices(overrides)
    problems: List[Tuple[str, str, str]] = []
    rest = list(overrides)
    while True:
        try:
            cfg = compose(rest)
        except LaunchError:
            raise
        except Exception as e:  # Hydra/OmegaConf type and key errors: make them ours
            problems.append(hydra_problem(e))
            left = [o for o in rest if o.partition("=")[0] != problems[-1][0]]
            if not str(e).startswith("Could not override") or len(left) == len(rest):
                raise LaunchError(problems) from None
            rest = left
            continue
        if problems:
            raise LaunchError(problems)
        return cfg


# How to quote, for both layers: the shell splits an argument at spaces, Hydra reads ; ( ) [ ] { } $ ` as syntax.
QUOTING = (
    "quote the value, e.g. key='value with ; chars' (inside the shell: \"key='...'\"); a value with spaces: "
    "quote the whole override for the shell, e.g. 'job_name=a b'"
)
# Hydra's flags that take the next argument as their value (so that word is not a stray one)
_FLAGS_WITH_VALUE = (
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-name",
    "-cn",
    "--config-path",
    "-cp",
    "--config-dir",
    "-cd",
    "--info",
    "--experimental-rerun",
)


def check_words(argv: List[str]) -> None:
    """A word without `=` (not a flag or a flag's value) is no override: mostly the rest of a value the shell split
    at a space (`job_name=a b`). Hydra's own message for it is the bare word; ours says what it is and how to quote."""
    problems = []
    for i, arg in enumerate(argv):
        before = argv[i - 1] if i else ""
        if "=" in arg or arg.startswith("-") or (before in _FLAGS_WITH_VALUE):
            continue
        if "=" in before and not before.startswith("-"):
            why = (
                f"a word without '=' is not an override (key=value, or a profile such as engine=vllm); the shell "
                f"split an unquoted space, so it is probably the rest of the value of {before!r}"
            )
            fix = f"quote the whole override for the shell: '{before} {arg}' (or drop the space)"
        else:
            why = "a word without '=' is not an override: overrides are key=value (tp=2) or a profile choice (engine=vllm)"
            fix = "write it as key=value; a value with spaces: quote the whole override for the shell, e.g. 'job_name=a b'"
        problems.append((repr(arg), why, fix))
    if problems:
        raise LaunchError(problems)


def hydra_problem(e: Exception):
    """Turn Hydra/OmegaConf composition errors into (value, why, fix)."""
    cause = e.__cause__ or e
    lines = [ln.strip() for ln in str(cause).strip().splitlines() if ln.strip()]
    key = next((ln.split("full_key:")[1].strip() for ln in lines if ln.startswith("full_key:")), "")
    why = lines[0] if lines else type(e).__name__
    override = str(e).split("override", 1)[-1].strip() if "override" in str(e) else key
    if type(cause).__name__ == "OverrideParseException" or type(e).__name__ == "OverrideParseException":
        first = str(e).splitlines()[0]
        if "override '" in first:  # "Error parsing override 'X'"
            bad = first.split("override '", 1)[1].rsplit("'", 1)[0]
        else:  # "LexerNoViableAltException: X"
            bad = first.split(": ", 1)[-1]
        raw = str(e).splitlines()
        caret = next((ln.index("^") for ln in raw[1:] if ln.strip() == "^"), -1)
        if 0 <= caret < len(first):  # the lexer's message: the override with a caret under the first bad character
            reason = f"it stops at {first[caret]!r}"
        else:
            reason = next((ln for ln in lines[1:] if not ln.startswith(("See ", "^"))), "") or lines[0]
        return (
            bad,
            f"Hydra cannot parse this override ({reason}): characters like ; ( ) [ ] {{ }} $ ` , = and quotes "
            "are its syntax",
            QUOTING,
        )
    if str(e).startswith("Could not override"):  # a key the config has no place for (struct mode)
        k = str(e).split("'")[1] if "'" in str(e) else override
        return unknown_key(k, _engine_named(lines))
    domain = field_domain(key) if key else None
    fix = (
        domain.fix_line(key)
        if domain is not None
        else f"give {key or 'it'} a value of the type launcher/schema.py declares for it"
    )
    return (override or key or "override", why, fix)


def _engine_named(lines: List[str]) -> str:
    """The engine whose dataclass Hydra looked a key up in (its error's `object_type=VLLMEngineConfig`), or ""."""
    kind = next((ln.split("=", 1)[1].strip() for ln in lines if ln.startswith("object_type=")), "")
    return next((name for name, cls in engine_schemas().items() if cls.__name__ == kind), "")


_ABSENT = object()  # a key the composed config does not have


def config_from_record(record: Dict[str, Any], overrides: List[str]):
    """The composed config of `llmlaunch --from-record R OVERRIDES`: R's overrides (less those given again) then
    the new ones composed,
    then R's composed values pinned wherever the new overrides do not reach. Returns (cfg, every override,
    keys of R the current schema no longer has, which were left out)."""
    from omegaconf import OmegaConf, open_dict

    new_keys = set(override_keys(overrides))
    # a key given again replaces the record's (Hydra refuses one key twice on a command line)
    line = [o for o in record.get("overrides") or [] if not set(override_keys([o])) & new_keys] + list(overrides)
    cfg = composed(line)
    gone = []
    with open_dict(cfg):
        for key, value in pinned_values(record["config"], overrides):
            if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
                gone.append(key)
                continue
            OmegaConf.update(cfg, key, value, merge=False)
    return cfg, line, gone
