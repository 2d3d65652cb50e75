#!/usr/bin/env bash
# Several GPUs of one host: tp and replicas of the hf engine through `llmlaunch cluster=local`
# (benchmark/gpu/multi_gpu.py), bf16 for throughput, then float32 for the greedy tp=1 == tp=2 check
# (bf16 all-reduce sums in another order, so near-ties can flip a token of a random-weight model).
#
#   benchmark/gpu/multi_gpu.sh [OUT_DIR]      # GPUS (default: all visible), MODEL (default /tmp/llama-1b)
#
# More knobs: CONCURRENCY (bf16 pass, default "1 64 128": one bench per value while a layout is up),
# NUM_PROMPTS (default: 4 x concurrency, at least 16), CLIENT_PROCESSES (llmlaunch-bench processes; default: a
# quarter of nproc, at most C: one cannot keep up with 128 streams), WORK (/tmp/llmlaunch-multigpu), EXTRA (llmlaunch overrides for every layout of both
# passes, space-separated, e.g. EXTRA="engine.cuda_graphs=false"), SKIP_BF16=1 / SKIP_FP32=1 (one pass only).
# Same environment as one_gpu.sh.  NCCL's NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:-gpu-results}
MODEL=${MODEL:-/tmp/llama-1b}
PY=${PYTHON:-python3}
GPUS=${GPUS:-$(nvidia-smi -L | wc -l)}
CONCURRENCY=${CONCURRENCY:-1 64 128}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=1
mkdir -p "$OUT_DIR"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT_DIR/gpus.txt"
[ -f "$MODEL/config.json" ] || $PY -m launcher.tiny --out "$MODEL" --hidden 2048 --layers 16 --heads 32 --kv-heads 8 \
    --intermediate 8192 --vocab 128256 --tie-word-embeddings true --rope-theta 500000 --dtype bfloat16
LAYOUTS="tp1 tp2 rep2"
[ "$GPUS" -ge 4 ] && LAYOUTS="tp1 tp2 tp4 rep2 rep4 rep2tp2"
[ -n "${SKIP_BF16:-}" ] || {
echo "== throughput, bf16, concurrency $CONCURRENCY: $LAYOUTS${EXTRA:+ ($EXTRA)}"
# LAYOUTS, CONCURRENCY and EXTRA are lists: unquoted, so that they split into arguments
# shellcheck disable=SC2086
$PY -m benchmark.gpu.multi_gpu --model "$MODEL" --gpus "$GPUS" --layouts $LAYOUTS --concurrency $CONCURRENCY \
    --num-prompts "${NUM_PROMPTS:-0}" --client-processes "${CLIENT_PROCESSES:-0}" --json "$OUT_DIR/multi_gpu_bf16.json" --workdir "${WORK:-/tmp/llmlaunch-multigpu}/bf16" \
    ${EXTRA:+--extra $EXTRA}
}
FP32_LAYOUTS="tp1 tp2"
[ "$GPUS" -ge 4 ] && FP32_LAYOUTS="tp1 tp2 tp4"
[ -n "${SKIP_FP32:-}" ] && exit 0
echo "== greedy tp=1 vs $FP32_LAYOUTS, float32"
# shellcheck disable=SC2086
$PY -m benchmark.gpu.multi_gpu --model "$MODEL" --gpus "$GPUS" --layouts $FP32_LAYOUTS --dtype float32 --concurrency 8 \
    --num-prompts 16 --client-processes "${CLIENT_PROCESSES:-0}" --json "$OUT_DIR/multi_gpu_fp32.json" --workdir "${WORK:-/tmp/llmlaunch-multigpu}/fp32" \
    ${EXTRA:+--extra $EXTRA}
