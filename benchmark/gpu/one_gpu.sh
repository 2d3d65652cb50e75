#!/usr/bin/env bash
# One GPU: the serving path of the hf engine against the same engine in-process and in its own process
# (the served path minus the stub, tritonserver and gRPC), static-batch generate as the yardstick, and
# batch-1 decode against the memory-bandwidth limit: the figures of docs/performance/hf.md's earlier-leases table.
#
#   benchmark/gpu/one_gpu.sh [OUT_DIR]        # default OUT_DIR: ./gpu-results
#
# Needs: llmlaunch's dependencies (its python scripts run as modules from the checkout, which they import), torch
# with CUDA, a tritonserver llmlaunch can resolve (README), and, where torch comes with numpy 2, LLMLAUNCH_STUB_PYTHON
# naming the python3 of an environment with numpy<2 for the nvidia-pytriton stub (README, "GPU machines").
# A host that cannot download (all but torch/transformers carried): benchmark/gpu/carry/offline_wheels.sh where the
# package registries are, carry the folder, then `source benchmark/gpu/carry/offline_env.sh` on the host sets all that up.
# Model: a random-weight Llama of 1.24 B parameters (Llama 3.2 1B's shape), made here.
# Environment knobs: MODEL (folder, default /tmp/llama-1b), CONCURRENCY ("1 8 32 64 128"), ROUNDS (3), RATES
# (open loops, "10 40 120 240" req/s), SPLIT_CPUS (1: the served path's clients on their own half of the cores),
# CLIENT_PROCESSES (half of nproc).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:-gpu-results}
MODEL=${MODEL:-/tmp/llama-1b}
CONCURRENCY=${CONCURRENCY:-1 8 32 64 128}
ROUNDS=${ROUNDS:-3}
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT_DIR/gpu.txt"

echo "== 0. smoke: llmlaunch (its default model) on the GPU, one streamed request, SIGINT"
$PY -m benchmark.smoke engine.device=cuda serve.grpc_port=18001 serve.http_port=18000 serve.metrics_port=18002 \
    serve.openai_port=18003 2>&1 | tail -8

echo "== 1. model: random Llama 1.24 B, bf16"
[ -f "$MODEL/config.json" ] || $PY -m launcher.tiny --out "$MODEL" --hidden 2048 --layers 16 --heads 32 --kv-heads 8 \
    --intermediate 8192 --vocab 128256 --tie-word-embeddings true --rope-theta 500000 --dtype bfloat16

echo "== 2. batch-1 decode vs the memory-bandwidth limit (four ways; greedy checks)"
timeout 900 $PY -m benchmark.gpu.decode_bandwidth --model "$MODEL" --tokens 256 | tee "$OUT_DIR/bandwidth.json"

echo "== 2b. the kernels of a batch-1 decode step, uncompiled and compiled"
timeout 700 $PY -m benchmark.gpu.decode_kernels --model "$MODEL" | tee "$OUT_DIR/kernels.txt"

echo "== 2c. time to first token on an idle engine: prompt steps as CUDA graphs vs eager, side by side"
timeout 400 $PY -m benchmark.gpu.prefill_ttft --model "$MODEL" | tee "$OUT_DIR/prefill_ttft.json"

echo "== 2d. the serving path's own first-token cost with no engine (tritonserver, stub, a process hop, client)"
timeout 300 $PY -m benchmark.first_response --requests 800 --rounds 2 --json "$OUT_DIR/first_response.json"

# The served path's load generator runs on its own half of the cores, tritonserver and its engine on the other
# (--split-cpus; SPLIT_CPUS=0 shares them): on one machine the generator's CPU (several cores at 128 streams)
# otherwise slows the engine's host work, which a remote client would not.  One client process per client core
# (CLIENT_PROCESSES, default half of nproc), one gRPC stream each.  overhead.py prints its table on stderr.
SPLIT=()
[ "${SPLIT_CPUS:-1}" = 1 ] && SPLIT=(--split-cpus)
CLIENTS=(--client-processes "${CLIENT_PROCESSES:-$(( $(nproc) / 2 ))}" --client-streams 1)
COMMON=(--model "$MODEL" --device cuda --dtype bfloat16 --max-num-seqs 128 --prompt-tokens 128 --max-tokens 128
        --rounds "$ROUNDS" --warmup-tokens 128 "${CLIENTS[@]}" "${SPLIT[@]}")

echo "== 3. served vs in-process vs engine process vs static generate, concurrency $CONCURRENCY"
# three engines on the GPU at once (in-process, engine process, the server's): each holds its weights and KV cache.
# shellcheck disable=SC2086
timeout 900 $PY -m benchmark.overhead "${COMMON[@]}" --concurrency $CONCURRENCY --requests-per-stream 2 \
    --paths direct process served --vs-generate --json "$OUT_DIR/overhead.json" > /dev/null

echo "== 3b. open loops: the TTFT serving adds when both paths get the same arrivals (RATES req/s: ${RATES:=10 40 120 240})"
# In a closed loop a served request's successor leaves only once the last piece reached the client, so the two
# engines see different arrival patterns; here both paths send each request at the same drawn time (Poisson), so
# the TTFT difference is the serving path's alone.
# shellcheck disable=SC2086
timeout 900 $PY -m benchmark.overhead "${COMMON[@]}" --request-rate $RATES --open-seconds 4 --paths direct served \
    --json "$OUT_DIR/overhead_open.json" > /dev/null

echo "== 4. closed loops (1 8 64 128), output lengths of their own (64-192 new tokens), final counts only: a response a step, then a stream's tokens merged over 8 ms"
# With 128 new tokens for all, requests that start together end together and a closed loop's successors arrive in
# waves; with lengths of their own (drawn once, the same on every path) they end apart, as in real traffic.
# engine.stream_interval_ms=8: tokens a stream made within 8 ms of its last response wait for the next one; its
# first token and its end never wait.
for ms in 0 8; do
    timeout 900 $PY -m benchmark.overhead "${COMMON[@]}" --concurrency 1 8 64 128 --requests-per-stream 12 \
        --max-tokens 192 --max-tokens-min 64 --request-param final_counts_only=true --stream-interval-ms "$ms" \
        --paths direct served --json "$OUT_DIR/overhead_stream_interval_$ms.json" > /dev/null
done
