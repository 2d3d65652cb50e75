#!/usr/bin/env bash
# Carry SGLang 0.5.15 (it pins torch 2.11.0, the GPU machine's torch) and its kernels to a GPU host that cannot
# download.
#
#   benchmark/gpu/carry/sglang_parts.sh make [DIR]     # here, with the package registries (DIR default .sglang, git-ignored)
#   benchmark/gpu/carry/sglang_parts.sh stash PART     # on the GPU host, once per carried part: copy it to /tmp/sparts
#   benchmark/gpu/carry/sglang_parts.sh install        # on the GPU host, all parts stashed: unpack into /tmp/sglang-site
#
# What is trimmed, and why. sglang-kernel 0.4.4 (the kernel release SGLang 0.5.15 asks for; CUDA 13 build, which the
# host's driver runs) is 615 MB packed, 1.8 GB unpacked; kept are its Hopper ops (sm90/common_ops, 20 MB, loaded at
# import on compute capability 9.0), spatial_ops and the Python around them (and triton_kernels, in the same wheel).
# Dropped: flash_ops (FlashAttention-3, 1.76 GB: imported lazily inside a try; llmlaunch picks the triton attention
# backend on a host without it, launcher/engines/sglang.py), sm100/common_ops (Blackwell and newer only) and
# flashmla_ops (DeepSeek's MLA: a try-guarded import; Llama never calls it). SGLang's own wheel is carried whole.
# Left out of SGLang's requirements, and why: flash-attn-4, nvidia-cutlass-dsl, quack-kernels, tilelang,
# tokenspeed_mla, sgl-deep-gemm, torchao (imported only inside the functions of the attention backends, MoE and
# quantization paths they serve; a dense Llama with triton attention never calls them), flashinfer-cubin
# (flashinfer builds a kernel with the host's nvcc the first time one is used), torch_memory_saver and torchcodec
# (try-guarded imports), anthropic, datasets, modelscope, outlines, llguidance, py-spy, smg-grpc-servicer, blobfile
# (SGLang's language frontend, benchmarks, other grammar backends, gRPC server, Azure loader: not on the Engine's
# path, nor on its server's). xgrammar 0.2.8 with apache-tvm-ffi 0.1.11 stands in for the
# pinned 0.2.1 (44 MB; the API SGLang calls is the same). transformers is SGLang's pin, 5.12.1 (with tokenizers
# 0.22): the host's 5.17 already defines configs SGLang registers at import ("'qwen3_asr' is already used by a
# Transformers config"). Already on the host: torch 2.11, torchaudio, torchvision, triton, numpy, scipy, timm,
# uvloop, aiohttp, requests, psutil, pillow, einops, sentencepiece, tiktoken, jinja2, ninja, nvcc, cuda-bindings,
# nvidia-ml-py, prometheus-client, safetensors, huggingface-hub, tqdm, pyyaml, regex, packaging.
# DIR/p1 is SGLang and the trimmed kernels (xz) with transformers, DIR/p2 the other wheels: each one carry.
# `install` leaves /tmp/sglang-site to prepend to PYTHONPATH (benchmark/gpu/engines.sh does where SGLang runs).
set -euo pipefail
cd "$(dirname "$0")/../../.."
# shellcheck source=benchmark/gpu/carry/parts_site.sh
source benchmark/gpu/carry/parts_site.sh
VERSION=0.5.15
KERNEL=0.4.4
cmd=${1:?usage: sglang_parts.sh make [DIR] | stash PART | install}
case $cmd in
make)
    DIR=${2:-.sglang}
    mkdir -p "$DIR"/p1 "$DIR"/p2 "$DIR"/work
    dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_39_x86_64 --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
            --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform any -d "$@"; }
    ls "$DIR"/work/sglang-$VERSION-*.whl > /dev/null 2>&1 || dl "$DIR"/work sglang==$VERSION
    ls "$DIR"/work/sglang_kernel-$KERNEL-*.whl > /dev/null 2>&1 || dl "$DIR"/work sglang-kernel==$KERNEL
    rm -f "$DIR"/p1/* "$DIR"/p2/*
    dl "$DIR"/p1 transformers==5.12.1 tokenizers==0.22.2 loguru
    # What the Engine's processes import at start (module level, from sglang.srt.entrypoints.engine, the scheduler,
    # tokenizer and detokenizer managers, the model runner, the Llama model, triton attention, the sampler) that
    # the host lacks: IPython (sglang.utils), flashinfer (the sampler), openai (the OpenAI protocol types),
    # compressed-tensors (with loguru, in p1) and gguf (quantization registry), and the rest of the list below;
    # SGLang's own server (sglang.launch_server, the yardstick) also imports jsonschema (its chat serving),
    # soundfile (its realtime audio route) and zstandard (request decompression).
    dl "$DIR"/p2 apache-tvm-ffi==0.1.11 xgrammar==0.2.8 flashinfer-python==0.6.12 "pydantic>=2.12" pydantic-core==2.50.5 \
       annotated-types typing-inspection typing_extensions "fastapi<0.137" "starlette>=1.0.1" uvicorn python-multipart \
       openai==2.54.0 distro jiter sniffio orjson msgspec pyzmq pybase64 setproctitle partial-json-parser \
       compressed-tensors==0.17.0 dill gguf openai-harmony==0.0.4 interegular watchfiles tabulate \
       ipython ipython-pygments-lexers jedi parso matplotlib-inline traitlets pexpect ptyprocess "prompt_toolkit<3.1" \
       wcwidth stack_data executing asttokens pure_eval decorator \
       jsonschema jsonschema-specifications referencing rpds-py soundfile==0.13.1 cffi pycparser zstandard
    rm -rf "$DIR"/work/x && mkdir -p "$DIR"/work/x
    (cd "$DIR"/work/x && python3 -m zipfile -e ../sglang-$VERSION-*.whl . && python3 -m zipfile -e ../sglang_kernel-$KERNEL-*.whl .)
    rm -rf "$DIR"/work/x/sgl_kernel/flash_ops.abi3.so "$DIR"/work/x/sgl_kernel/flashmla_ops.abi3.so "$DIR"/work/x/sgl_kernel/sm100
    tar -C "$DIR"/work/x -cf - . | nice -n 19 xz -T2 -6 > "$DIR"/p1/sglang.tar.xz
    du -sh "$DIR"/p1 "$DIR"/p2 ;;
stash)
    parts_stash "${2:?usage: sglang_parts.sh stash PART}" /tmp/sparts ;;
install)
    parts_install /tmp/sparts /tmp/sglang-site sglang ;;
*)
    echo "usage: sglang_parts.sh make [DIR] | stash PART | install" >&2; exit 2 ;;
esac
