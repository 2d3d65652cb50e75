#!/usr/bin/env bash
# Carry vLLM 0.25.0 (the release built for torch 2.11 + CUDA 13, the GPU machine's stack) to a GPU host that
# cannot download.
#
#   benchmark/gpu/carry/vllm_parts.sh make [DIR]        # here, with the package registries (DIR default .vllm, git-ignored)
#   benchmark/gpu/carry/vllm_parts.sh stash PART        # on the GPU host, once per carried part: copy it to /tmp/vparts
#   benchmark/gpu/carry/vllm_parts.sh install           # on the GPU host, all parts stashed: unpack into /tmp/vllm-site
#
# `make` downloads vLLM and the packages it imports that the host lacks, drops what an H100/H200 does not use
# (FlashAttention-2 kernels: Hopper runs FA3; the vllm-rs binary; deep_gemm builds for other Pythons), and splits
# the result into DIR/p1, DIR/p2 (vLLM, xz) and DIR/p3 (dependency wheels), each under one carry's 64 MiB with
# the checkout; DIR/p4 holds NIXL (nixl-cu13 1.5.1 and the `nixl` module vLLM imports it by), which vLLM's
# NixlConnector needs for disaggregated serving only: stash it before `install` where a run splits prefill and
# decode. The device machine is given back after 30 s idle: carry the parts in back-to-back calls
# (benchmark/gpu/engines.sh says the order), then use the same warm machine.
# `install` leaves /tmp/vllm-site to prepend to PYTHONPATH; the host's own torch 2.11 stays.
set -euo pipefail
cd "$(dirname "$0")/../../.."
# shellcheck source=benchmark/gpu/carry/parts_site.sh
source benchmark/gpu/carry/parts_site.sh
cmd=${1:?usage: vllm_parts.sh make [DIR] | stash PART | install}
case $cmd in
make)
    DIR=${2:-.vllm}
    mkdir -p "$DIR"/p1 "$DIR"/p2 "$DIR"/p3 "$DIR"/p4 "$DIR"/work
    dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
            --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform manylinux1_x86_64 --platform any -d "$@"; }
    [ -f "$DIR"/work/vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl ] || dl "$DIR"/work vllm==0.25.0
    # Versions that import together on the GPU host: openai 3.x needs httpx2 (absent there); xgrammar 0.2.8
    # needs apache-tvm-ffi >= 0.1.11 (vLLM pins 0.1.9, which breaks it).  model-hosting-container-standards,
    # jmespath and supervisor are what `vllm serve` (vllm.entrypoints.openai.api_server) imports beyond the engine.
    dl "$DIR"/p3 blake3 cachetools "fastapi<0.137" "starlette>=1.0.1" openai==2.54.0 distro jiter sniffio \
       "pydantic>=2.12" pydantic-core==2.50.5 annotated-types typing-inspection "prometheus-fastapi-instrumentator>=8.0.0" \
       lm-format-enforcer==0.11.3 interegular "llguidance<1.8.0,>=1.7.0" outlines_core==0.2.14 diskcache==5.6.3 lark==1.2.2 \
       xgrammar==0.2.8 apache-tvm-ffi==0.1.11 partial-json-parser jsonschema jsonschema-specifications referencing rpds-py \
       pyzmq msgspec mistral_common pycountry compressed-tensors==0.17.0 depyf==0.20.0 astor dill watchfiles \
       python-json-logger pybase64 cbor2 ijson setproctitle openai-harmony gguf flashinfer-python==0.6.13 nvtx==0.2.15 \
       typing_extensions model-hosting-container-standards==0.1.16 jmespath==1.1.0 supervisor==4.3.0
    dl "$DIR"/p4 nixl==1.5.1 nixl-cu13==1.5.1
    rm -rf "$DIR"/work/x && mkdir -p "$DIR"/work/x
    (cd "$DIR"/work/x && python3 -m zipfile -e ../vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl .)
    rm -f "$DIR"/work/x/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$DIR"/work/x/vllm/vllm-rs \
          "$DIR"/work/x/vllm/third_party/deep_gemm/_C.cpython-31[0134]-*.so
    tar -C "$DIR"/work/x -cf - . | xz -T0 -6 > "$DIR"/work/vllm.tar.xz
    rm -f "$DIR"/p1/* "$DIR"/p2/* "$DIR"/work/vllm.tar.xz.0*
    split -b 57M -d "$DIR"/work/vllm.tar.xz "$DIR"/work/vllm.tar.xz.
    mv "$DIR"/work/vllm.tar.xz.00 "$DIR"/p1/
    mv "$DIR"/work/vllm.tar.xz.01 "$DIR"/p2/
    [ ! -e "$DIR"/work/vllm.tar.xz.02 ] || { echo "vllm_parts: the trimmed vLLM needs a third part" >&2; exit 1; }
    du -sh "$DIR"/p1 "$DIR"/p2 "$DIR"/p3 "$DIR"/p4 ;;
stash)
    parts_stash "${2:?usage: vllm_parts.sh stash PART}" /tmp/vparts ;;
install)
    parts_install /tmp/vparts /tmp/vllm-site vllm ;;
*)
    echo "usage: vllm_parts.sh make [DIR] | stash PART | install" >&2; exit 2 ;;
esac
