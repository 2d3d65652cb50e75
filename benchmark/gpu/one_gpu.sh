#!/usr/bin/env bash
# One GPU: the serving path of the hf engine against the same engine in-process and in its own process
# (the served path minus the stub, tritonserver and gRPC), static-batch generate as the yardstick, and
# batch-1 decode against the memory-bandwidth limit.
#
#   benchmark/gpu/one_gpu.sh [OUT_DIR]        # default OUT_DIR: ./gpu-results
#
# Needs: llmlaunch importable (pip install -e . or PYTHONPATH=<checkout>), torch with CUDA, a
# tritonserver llmlaunch can resolve (README), and, where torch comes with numpy 2, LLMLAUNCH_STUB_PYTHON
# naming the python3 of an environment with numpy<2 for the nvidia-pytriton stub (README, "GPU machines").
# A host that cannot download (all but torch/transformers carried): benchmark/gpu/offline_wheels.sh where the
# package registries are, carry the folder, then `source benchmark/gpu/offline_env.sh` on the host sets all that up.
# Model: a random-weight Llama of 1.24 B parameters (Llama 3.2 1B's shape), made here.
# Environment knobs: MODEL (folder, default /tmp/llama-1b), CONCURRENCY ("1 8 32 64 128"), ROUNDS (3),
# SPLIT_CPUS (1: the served path's clients on their own half of the cores), CLIENT_PROCESSES (half of nproc).
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

echo "== 0. smoke: llmlaunch (tiny model) on the GPU, one streamed request, SIGINT"
$PY - <<'PY' 2>&1 | tail -8
import os, signal, subprocess, sys, time
p = subprocess.Popen([sys.executable, "-m", "launcher.cli", "engine.device=cuda", "serve.grpc_port=18001",
                      "serve.http_port=18000", "serve.metrics_port=18002"], stdout=subprocess.PIPE, text=True,
                     start_new_session=True)
lines = [p.stdout.readline() for _ in range(2)]
print("".join(lines), end="")
url = lines[0].split()[1]
t0 = time.perf_counter()
out = subprocess.run([sys.executable, "-m", "launcher.client", "--url", url, "--prompt", "The capital of France is",
                      "--max-tokens", "16"], capture_output=True, text=True)
print(f"client rc={out.returncode} in {time.perf_counter() - t0:.2f}s: {out.stdout[-200:]!r} {out.stderr[-300:]}")
os.killpg(p.pid, signal.SIGINT)
print("llmlaunch exit", p.wait(60))
PY

echo "== 1. model: random Llama 1.24 B, bf16"
[ -f "$MODEL/config.json" ] || $PY -m launcher.tiny --out "$MODEL" --hidden 2048 --layers 16 --heads 32 --kv-heads 8 \
    --intermediate 8192 --vocab 128256 --tie-word-embeddings true --rope-theta 500000 --dtype bfloat16

echo "== 2. batch-1 decode vs the memory-bandwidth limit (four ways; greedy checks)"
timeout 900 $PY benchmark/gpu/decode_bandwidth.py --model "$MODEL" --tokens 256 | tee "$OUT_DIR/bandwidth.json"

echo "== 2b. the kernels of a batch-1 decode step, uncompiled and compiled"
timeout 700 $PY benchmark/gpu/decode_kernels.py --model "$MODEL" | tee "$OUT_DIR/kernels.txt"

echo "== 2c. time to first token on an idle engine: prompt steps as CUDA graphs vs eager, side by side"
timeout 400 $PY benchmark/gpu/prefill_ttft.py --model "$MODEL" | tee "$OUT_DIR/prefill_ttft.json"

echo "== 2d. prompts arriving while others decode (64-192 new tokens): beside the decode rows (mixed graphs) vs through their graphs alone vs eager steps"
timeout 600 $PY benchmark/gpu/prompts_alone.py --model "$MODEL" --rounds "$ROUNDS" --json "$OUT_DIR/prompts_alone.json" \
    > /dev/null

echo "== 2g. the serving path's own first-token cost with no engine (tritonserver, stub, a process hop, client), CPUs as they are and kept awake"
timeout 300 $PY benchmark/first_response.py --requests 800 --rounds 2 --awake both --json "$OUT_DIR/first_response.json"

echo "== 3. served vs in-process vs engine process vs static generate, concurrency $CONCURRENCY"
# three engines on the GPU at once (in-process, engine process, the server's): each holds its weights and KV cache.
# The served path's load generator runs on its own half of the cores, tritonserver and its engine on the other
# (--split-cpus; SPLIT_CPUS=0 shares them): on one machine the generator's CPU (several cores at 128 streams)
# otherwise slows the engine's host work, which a remote client would not. One client process per client core (CLIENT_PROCESSES, default half of nproc: 8 on
# the H100 host), one gRPC stream each: with 4 processes x 2 streams the generator itself was the limit at 128 streams
# (each process ~1.2 cores busy; served 0.87 of in-process), with 8 x 1 served kept 0.99.
SPLIT=()
[ "${SPLIT_CPUS:-1}" = 1 ] && SPLIT=(--split-cpus)
# shellcheck disable=SC2086
timeout 900 $PY benchmark/overhead.py --model "$MODEL" --device cuda --dtype bfloat16 --max-num-seqs 128 \
    --concurrency $CONCURRENCY --prompt-tokens 128 --max-tokens 128 --requests-per-stream 2 --rounds "$ROUNDS" \
    --warmup-tokens 128 --client-processes "${CLIENT_PROCESSES:-$(( $(nproc) / 2 ))}" --client-streams 1 "${SPLIT[@]}" \
    --paths direct process served --vs-generate > "$OUT_DIR/overhead.json"
$PY - "$OUT_DIR/overhead.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
# tok/s and ratios: in-process, engine process, served; ratios are to in-process
print(f"{'C':>4} {'tok/s in / proc / served':>26} {'proc':>6} {'served':>6} {'TTFT p50 in/served ms':>22} {'+ms':>6} "
      f"{'ITL p50 in/proc/served ms':>26} {'step ms':>7} {'generate tok/s':>14} {'served/gen':>10}")
gen = {g["concurrency"]: g["generate_tokens_per_s"] for g in d.get("vs_generate", [])}
for r in d["runs"]:
    print(f"{r['concurrency']:>4} {r['direct_tokens_per_s']:>8.1f} {r['process_tokens_per_s']:>8.1f} "
          f"{r['served_tokens_per_s']:>8.1f} {r['process_ratio']:>6.3f} {r['ratio']:>6.3f} "
          f"{r['direct_ttft_ms_p50']:>10.2f} / {r['served_ttft_ms_p50']:<9.2f} {r.get('ttft_added_ms_p50', 0):>6.2f} "
          f"{r['direct_itl_ms_p50']:>8.3f} {r['process_itl_ms_p50']:>8.3f} {r['served_itl_ms_p50']:>8.3f} "
          f"{r['direct_step_ms'] or 0:>7.3f} {gen.get(r['concurrency'], 0):>14.1f} {r.get('served_vs_generate', 0):>10.3f}")
# where the served TTFT goes (means, ms): inside the model (its metrics) and outside it (tritonserver, gRPC, client)
print(f"{'C':>4} {'TTFT mean in/served':>20} {'parse':>6} {'add':>7} {'engine':>8} {'back':>7} {'respond':>8} {'outside':>8}")
for r in d["runs"]:
    ft = r.get("served_first_token_ms")
    if ft:
        print(f"{r['concurrency']:>4} {r['direct_ttft_ms_mean']:>9.2f} / {r['served_ttft_ms_mean']:<8.2f} {ft['parse']:>6.2f} "
              f"{ft['add']:>7.2f} {ft['engine']:>8.2f} {ft['back']:>7.2f} {ft['respond']:>8.2f} {ft['outside_server']:>8.2f}")
# how each path's engine spent a step (ms): GPU-bound (wait, GPU busy) or host-bound (launch, host, GPU idle)
print(f"{'C':>4} {'path':<8} {'step':>7} {'launch':>7} {'wait':>7} {'host':>7} {'GPU busy':>9} {'GPU idle':>9}")
for r in d["runs"]:
    for path in ("direct", "process", "served"):
        es = r.get(f"{path}_engine_steps")
        if es:
            print(f"{r['concurrency']:>4} {path:<8} {es['step_ms']:>7.3f} {es['launch_ms']:>7.3f} {es['wait_ms']:>7.3f} "
                  f"{es['host_ms']:>7.3f} {es.get('gpu_ms', 0):>9.3f} {es.get('gpu_idle_ms', 0):>9.3f}")
# the CUDA libraries each engine mapped: a library path can swap a cuDNN piece
libs = d.get("cuda_libraries", {})
base = set(libs.get("direct", []))
for path, found in libs.items():
    diff = sorted(set(found) ^ base)
    print(f"{path} engine: {len(found)} CUDA libraries" + (f"; differs from in-process: {' '.join(diff)}" if diff else ""))
PY

echo "== 3b. open loops: the TTFT serving adds when both paths get the same arrivals (RATES req/s: ${RATES:=10 40 120 240})"
# In the closed loops above a served request's successor leaves only once the last piece reached the client, so the
# two engines see different arrival patterns; here every path sends each request at the same drawn time (Poisson,
# the served path's client processes' arrivals), so the TTFT difference is the serving path's alone. Two response
# processes, as for 128 streams above, and beside them (served_alt, a second server) four: from ~45 requests in flight
# the stubs' sending is what serving adds.
# shellcheck disable=SC2086
timeout 1200 $PY benchmark/overhead.py --model "$MODEL" --device cuda --dtype bfloat16 --max-num-seqs 128 \
    --request-rate $RATES --open-seconds 4 --prompt-tokens 128 --max-tokens 128 --rounds "$ROUNDS" \
    --warmup-tokens 128 --client-processes "${CLIENT_PROCESSES:-$(( $(nproc) / 2 ))}" --client-streams 1 "${SPLIT[@]}" \
    --response-processes 2 --alt-response-processes 4 --paths direct served served_alt > "$OUT_DIR/overhead_open.json"
$PY benchmark/gpu/open_loop_table.py "$OUT_DIR/overhead_open.json"

echo "== 3c. open loops, eight response processes of two responder threads (RATES8 req/s: ${RATES8:=220 240 260})"
# Beside them (served_alt) the same with four threads each: eight processes
# of two threads kept the added first token under 2 ms to ~79 requests in flight on two H200s.
# The server gets half the cores (SPLIT_CPUS=1): eight stubs want about 16 CPUs.
# shellcheck disable=SC2086
timeout 900 $PY benchmark/overhead.py --model "$MODEL" --device cuda --dtype bfloat16 --max-num-seqs 128 \
    --request-rate $RATES8 --open-seconds 4 --prompt-tokens 128 --max-tokens 128 --rounds "$ROUNDS" \
    --warmup-tokens 128 --client-processes "${CLIENT_PROCESSES:-$(( $(nproc) / 2 ))}" --client-streams 1 "${SPLIT[@]}" \
    --response-processes 8 --server-param response_threads=2 --alt-server-param response_threads=4 \
    --paths direct served served_alt > "$OUT_DIR/overhead_open8_1.json"
$PY benchmark/gpu/open_loop_table.py "$OUT_DIR/overhead_open8_1.json"

# Steps 3d and 3i-3l: closed loops through two servers side by side against the same in-process engine and arrivals, both
# 8 response processes x 2 threads, served_alt changed by the arguments after the first four; then their table.
#   closed_pair NAME "CONCURRENCIES" REQUESTS_PER_STREAM ROUNDS SERVED_ALT_ARG...
closed_pair() {
    local name=$1 conc=$2 rps=$3 rounds=$4
    shift 4
    # shellcheck disable=SC2086  # $conc: one argument per concurrency
    timeout 900 $PY benchmark/overhead.py --model "$MODEL" --device cuda --dtype bfloat16 --max-num-seqs 128 \
        --concurrency $conc --prompt-tokens 128 --max-tokens 128 --requests-per-stream "$rps" --rounds "$rounds" \
        --warmup-tokens 128 --client-processes "${CLIENT_PROCESSES:-$(( $(nproc) / 2 ))}" --client-streams 1 "${SPLIT[@]}" \
        --response-processes 8 --server-param response_threads=2 "$@" \
        --paths direct served served_alt > "$OUT_DIR/$name.json"
    $PY benchmark/gpu/open_loop_table.py "$OUT_DIR/$name.json"
}

echo "== 3d. closed loops at concurrencies 1 8 32 128: eight response processes of two threads, and one"
# served: 8 x 2, the setting README gives a server with 16 CPUs of its own; served_alt: one response process (two
# threads too: --server-param is both servers'). On two H200s 8 x 2 added 2.6 / 2.7 / 3.6 / 8.3
# ms to the closed loops' first token (one process: 2.3 / 4.0 / 4.7 / 21.0) at 0.97-0.99 of in-process tokens/s.
closed_pair overhead_closed8 "1 8 32 128" 4 "$ROUNDS" --alt-response-processes 1

echo "== 3i. closed loops (1 8 32 64 128): tritonserver and the stubs at nice 10 (served, the GPU default) / unchanged (served_alt)"
# response_nice=0: tritonserver and the stubs keep the engine process's priority.
# On H100 hosts with the server on 8 vCPUs nice 10 kept more of in-process tokens/s in 7
# of 8 pairs at 64-128 streams (by 0.009-0.049), with shorter engine steps and less GPU idle time; at 1-32 streams,
# where the CPUs are not all busy, it made no difference beyond the order the servers ran in.
closed_pair overhead_response_nice "1 8 32 64 128" 16 2 --alt-server-param response_nice=0

echo "== 3j. closed loops (1 8 32 64 128): all four outputs on every response (served) / the counts on the final one only (served_alt)"
# Request parameter final_counts_only=true (what llmlaunch-bench asks of a model that honours it, unless
# --no-final-counts-only): text_output alone on every streamed response but the last, which carries input_tokens,
# output_tokens and finish_reason. On the CPU box the three count tensors were 11 of tritonserver's 61 us a response
# (stub_rate.py).
closed_pair overhead_final_counts "1 8 32 64 128" 16 2 --alt-request-param final_counts_only=true

echo "== 3k. closed loops (1 8 32 64 128) with output lengths of their own (64-192 new tokens): two servers set up alike"
# With 128 new tokens for all, requests that start together end together, and a closed loop's successors arrive in
# waves; with lengths of their own (drawn once, the same on every path) they end apart, as in real traffic. The
# served path's client processes share one queue of requests, as the in-process driver does. The two servers are twins,
# so their difference is the spread of one run. On an H200 host serving
# kept 0.986-0.995 of in-process tokens/s at 1-64 streams and 0.967-0.980 at 128, adding 1.3-2.1 ms at 1-64 streams
# and 2.6-4.2 ms at 128 (p50; final counts only: 1.3-2.0 and 2.6-3.1).
closed_pair overhead_lengths "1 8 32 64 128" 16 2 --max-tokens 192 --max-tokens-min 64
# the same lengths, all four outputs on every response (served) / the counts on the final one only (served_alt)
closed_pair overhead_lengths_final_counts "64 128" 16 2 --max-tokens 192 --max-tokens-min 64 \
    --alt-request-param final_counts_only=true

echo "== 3l. closed loops (1 8 64 128), lengths of their own, final counts only: a response a step (served) / a stream's tokens merged over 8 ms (served_alt)"
# engine.stream_interval_ms=8 (the hf model's stream_interval_ms): tokens a stream made within 8 ms of its last
# response wait for the next one; its first token and its end never wait. On H100 hosts with the server on 8 vCPUs
# 128 streams added 1.34-1.54 ms at 0.985-0.992 of in-process tokens/s with
# it and 4.37-4.57 ms at 0.957-0.958 without; 64 streams 1.72 against 2.07 ms; 1 and 8 streams the same either way.
closed_pair overhead_stream_interval "1 8 64 128" 12 2 --max-tokens 192 --max-tokens-min 64 \
    --request-param final_counts_only=true --alt-server-param stream_interval_ms=8

echo "== 4. 1 and 8 streams: the TTFT serving adds, CPUs as they are and kept awake (serve.keep_cpus_awake)"
# The same engines and rounds with idle-priority spinners on every CPU (launcher/awake.py) for the _awake paths: on a
# virtual machine an idle vCPU halts and waking a thread there is slow.  As
# serve.awake_pause_at does by default, the spinners pause while an engine holds 2 requests or more: at 8 streams
# spinners that never paused cost 1.5% of the served tokens/s, paused ones cost nothing.
# shellcheck disable=SC2086
timeout 600 $PY benchmark/overhead.py --model "$MODEL" --device cuda --dtype bfloat16 --max-num-seqs 128 \
    --concurrency 1 8 --prompt-tokens 128 --max-tokens 128 --requests-per-stream 12 --rounds "$ROUNDS" \
    --warmup-tokens 128 --client-processes "${CLIENT_PROCESSES:-$(( $(nproc) / 2 ))}" --client-streams 1 "${SPLIT[@]}" \
    --paths direct served direct_awake served_awake --awake-pause-at 2 > "$OUT_DIR/overhead_awake.json"
$PY - "$OUT_DIR/overhead_awake.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    print(f"C={r['concurrency']}: TTFT p50 in-process / served: {r['direct_ttft_ms_p50']:.2f} / "
          f"{r['served_ttft_ms_p50']:.2f} ms (+{r['ttft_added_ms_p50']:.2f}); CPUs awake "
          f"{r['direct_awake_ttft_ms_p50']:.2f} / {r['served_awake_ttft_ms_p50']:.2f} ms "
          f"(+{r['awake_ttft_added_ms_p50']:.2f}); served / in-process tok/s {r['ratio']:.3f}, awake "
          f"{r['awake_ratio']:.3f}; the in-process spinners ran {r['direct_awake_spinner_share']:.0%} of the time")
PY
