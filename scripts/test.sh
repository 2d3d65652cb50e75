#!/usr/bin/env bash
# The test command: installs everything (venv, the local Slurm cluster's Debian packages), checks the lint and the
# formatting (ruff, configured in pyproject.toml), brings the local Slurm cluster up, runs the whole suite, and takes
# the cluster down again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
if [ "$(id -u)" = 0 ]; then
  .venv/bin/llmlaunch-localslurm up --nodes 4 --gpus-per-node 4
  trap '.venv/bin/llmlaunch-localslurm down || true' EXIT
  export LLMLAUNCH_KEEP_SLURM=1   # the fixture reuses the cluster brought up here
fi
# The slowest tests are listed at the end: CI runs the whole suite within a time limit, and this shows what to share.
.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 --durations=40 "$@"
