#!/usr/bin/env bash
# Carry LMDeploy 0.18.0 (its PyTorch engine: it allows the GPU machine's torch 2.11 + CUDA 13) to a GPU host that
# cannot download.
#
#   benchmark/gpu/carry/lmdeploy_parts.sh make [DIR]     # here, with the package registries (DIR default .lmdeploy, git-ignored)
#   benchmark/gpu/carry/lmdeploy_parts.sh stash PART     # on the GPU host, once per carried part: copy it to /tmp/lparts
#   benchmark/gpu/carry/lmdeploy_parts.sh install        # on the GPU host, all parts stashed: unpack into /tmp/lmdeploy-site
#
# `make` downloads LMDeploy and the packages its PyTorch engine imports (AsyncEngine, the engine, its model agent and
# `uni` executor, the Llama model, the CUDA backend and kernels) that the host lacks, drops TurboMind's binaries
# (the 364 MB _turbomind extension and the 18 MB static libxgrammar.a: `engine.backend=pytorch` never loads them,
# and LMDeploy reports TurboMind as unavailable instead of failing), and packs it all into DIR/p1 (about 10 MB):
# one carry. Left out, and why: ray (imported only by the Ray executor and Ray multi-process engine: several
# nodes or data parallel; one GPU runs the `uni` executor), tilelang and flash-linear-attention (imported only by
# the kernels of gated-delta / causal-conv1d / sparse-MLA / DeepSeek V4 models, and by nn/gated_delta.py inside
# a function), rdkit (imported nowhere in LMDeploy), fire (the `lmdeploy` command line), uvicorn, fastapi and openai
# (LMDeploy's own HTTP server; llmlaunch serves through Triton), nvidia-*-cu12 (the host's torch brings CUDA 13's).
# Already on the host: torch, transformers, triton, numpy, safetensors, accelerate, einops, sentencepiece,
# tiktoken, pillow, protobuf, requests, psutil, rich, pyyaml, regex, aiohttp, cloudpickle, peft, prometheus-client,
# opencv-python-headless, torchvision.
# `install` leaves /tmp/lmdeploy-site to prepend to PYTHONPATH (benchmark/gpu/engines.sh does); the host's own
# torch 2.11 stays.
set -euo pipefail
cd "$(dirname "$0")/../../.."
# shellcheck source=benchmark/gpu/carry/parts_site.sh
source benchmark/gpu/carry/parts_site.sh
VERSION=0.18.0
WHEEL=lmdeploy-$VERSION-cp312-cp312-manylinux_2_28_x86_64.whl
cmd=${1:?usage: lmdeploy_parts.sh make [DIR] | stash PART | install}
case $cmd in
make)
    DIR=${2:-.lmdeploy}
    mkdir -p "$DIR"/p1 "$DIR"/work
    dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
            --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform manylinux1_x86_64 --platform any -d "$@"; }
    [ -f "$DIR/work/$WHEEL" ] || dl "$DIR"/work lmdeploy==$VERSION
    rm -f "$DIR"/p1/*
    # The imports of the engine's path that the host lacks, and who imports them: pydantic (lmdeploy.messages),
    # mmengine-lite with addict, yapf, platformdirs, termcolor (lmdeploy.model, the chat templates), pybase64
    # (lmdeploy.vl.media), pyzmq (pytorch/disagg/conn/engine_conn.py, imported by the engine), xgrammar with
    # apache-tvm-ffi 0.1.11 (LMDeploy's pin; the model agent's guided decoding), shortuuid (serve/openai/protocol.py,
    # imported by the model agent).
    dl "$DIR"/p1 "pydantic>=2.12" pydantic-core annotated-types typing-inspection typing_extensions \
       mmengine-lite addict yapf platformdirs termcolor pybase64 xgrammar==0.2.8 apache-tvm-ffi==0.1.11 \
       pyzmq shortuuid
    rm -rf "$DIR"/work/x && mkdir -p "$DIR"/work/x
    (cd "$DIR"/work/x && python3 -m zipfile -e "../$WHEEL" .)
    rm -f "$DIR"/work/x/lmdeploy/turbomind/_turbomind.*.so "$DIR"/work/x/lmdeploy/turbomind/lib64/libxgrammar.a
    tar -C "$DIR"/work/x -cf - . | nice -n 19 xz -T2 -6 > "$DIR"/p1/lmdeploy.tar.xz
    du -sh "$DIR"/p1 ;;
stash)
    parts_stash "${2:?usage: lmdeploy_parts.sh stash PART}" /tmp/lparts ;;
install)
    parts_install /tmp/lparts /tmp/lmdeploy-site lmdeploy ;;
*)
    echo "usage: lmdeploy_parts.sh make [DIR] | stash PART | install" >&2; exit 2 ;;
esac
