"""A run composed again from its record (`llmlaunch from=<record.json> ...`): which overrides the command line sets and
which of the record's values it leaves alone, so that the composed config is the record's again whatever conf/ says
now. Pure; launcher/compose.py applies it."""

from __future__ import annotations

from typing import Any, List, Tuple

# never copied from a record: where the new run goes and whether it only shows its plan are the new command's
NOT_REPLAYED = ("run_dir", "dry_run")


def _leaves(d: Any, prefix: str = "") -> List[Tuple[str, Any]]:
    if isinstance(d, dict) and d:
        out = []
        for k, v in d.items():
            out += _leaves(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return [(prefix, d)]


def override_keys(overrides: List[str]) -> List[str]:
    """The config keys a command line sets (`++engine.x=1` -> engine.x; `engine=vllm` -> engine, its subtree)."""
    return [a.partition("=")[0].lstrip("+~") for a in overrides if "=" in a and not a.startswith("-")]


def pinned_values(config: dict, overrides: List[str]) -> List[Tuple[str, Any]]:
    """Pure: the record's config values that the new overrides leave alone (key, value), run_dir and dry_run
    aside: set on top of the composed config, they make it the record's again, whatever conf/ says now."""
    touched = override_keys(overrides)
    out = []
    for key, value in _leaves(config):
        if key.split(".")[0] in NOT_REPLAYED:
            continue
        if any(key == t or key.startswith(t + ".") or t.startswith(key + ".") for t in touched):
            continue
        out.append((key, value))
    return out
