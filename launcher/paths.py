"""Where llmlaunch's own files are: the checkout it runs from, and the cache of what it makes.

`cache_root()` is the one reader of `LLMLAUNCH_CACHE` (a user's setting: made models, compiled kernels, the Slurm
job index, local run dirs); conf/cluster/local.yaml reaches it through the `llmlaunch_cache` resolver that
launcher/compose.py registers.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the checkout: launcher/, conf/, model_repository/
CONF_DIR = PACKAGE_ROOT / "conf"  # Hydra's config groups
REPO_SOURCES = PACKAGE_ROOT / "model_repository"  # the python models a rendered repository copies
EVAL_TASKS = PACKAGE_ROOT / "launcher" / "data" / "eval_tasks.json"  # llmlaunch-bench --eval's tasks (lm-eval fields)
CACHE_ENV = "LLMLAUNCH_CACHE"


def cache_root() -> Path:
    """`$LLMLAUNCH_CACHE`, else `~/.cache/llmlaunch`."""
    return Path(os.environ.get(CACHE_ENV) or os.path.join("~", ".cache", "llmlaunch")).expanduser()
