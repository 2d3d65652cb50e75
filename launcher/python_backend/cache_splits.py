"""An engine's prefix cache and its transfers of keys and values between two readings of its totals
(launcher/python_backend/timings.py's `read_engine_metrics`, or an hf engine's EngineStats as a dict): what
llmlaunch-bench reports after a run (--server-metrics) and the tests check, with their one-line forms."""

from __future__ import annotations


def prefix_cache_split(before: dict, after: dict) -> dict | None:
    """The prefix cache between two readings of an engine's totals (`read_engine_metrics`; {} = from the start):
    prompt tokens, those served from the cache, and their share; None when no prompt was counted between."""
    prompt = after.get("prompt_tokens", 0) - before.get("prompt_tokens", 0)
    if prompt <= 0:
        return None
    cached = after.get("cached_prompt_tokens", 0) - before.get("cached_prompt_tokens", 0)
    return {
        "prompt_tokens": int(prompt),
        "cached_prompt_tokens": int(cached),
        "prefix_hit_rate": round(cached / prompt, 4),
    }


def kv_transfer_split(before: dict, after: dict) -> dict | None:
    """Keys and values moved between two readings of an engine's totals (`read_engine_metrics`; {} = from the start):
    transfers done and failed, the bytes moved, MiB and ms per transfer, the rate; None when none was tried between."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in ("kv_transfers", "kv_transfer_failures")}
    d.update({k: after.get(k, 0.0) - before.get(k, 0.0) for k in ("kv_transfer_bytes", "kv_transfer_s")})
    n = d["kv_transfers"]
    if n <= 0 and d["kv_transfer_failures"] <= 0:
        return None
    mib = d["kv_transfer_bytes"] / 2**20
    return {
        "transfers": int(n),
        "failed": int(d["kv_transfer_failures"]),
        "bytes": int(d["kv_transfer_bytes"]),
        "mib": round(mib, 3),
        "mib_per_transfer": round(mib / n, 3) if n > 0 else None,
        "ms_per_transfer": round(1000.0 * d["kv_transfer_s"] / n, 3) if n > 0 else None,
        "gib_per_s": round(mib / 1024 / d["kv_transfer_s"], 3) if d["kv_transfer_s"] > 0 else None,
    }


def format_kv_transfer(split: dict) -> str:
    """'64 transfers (0 failed), 64.00 MiB and 1.250 ms each, 50.0 GiB/s' (one line)."""
    line = f"{split['transfers']:,} transfers ({split['failed']} failed)"
    if split["mib_per_transfer"] is not None:
        line += f", {split['mib_per_transfer']:.2f} MiB and {split['ms_per_transfer']:.3f} ms each"
    if split["gib_per_s"] is not None:
        line += f", {split['gib_per_s']:.1f} GiB/s"
    return line


def format_prefix_cache(split: dict) -> str:
    """'76.3% of 12,345 prompt tokens served from the cache (9,419), not prefilled' (one line)."""
    return (
        f"{100 * split['prefix_hit_rate']:.1f}% of {split['prompt_tokens']:,} prompt tokens served from the cache "
        f"({split['cached_prompt_tokens']:,}), not prefilled"
    )
