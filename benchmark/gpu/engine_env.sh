#!/usr/bin/env bash
# Does the environment the python stub hands the hf engine process slow it down, and which variable?
# The engine process (EngineProcess, as the served model runs it, without tritonserver) against the same
# engine in-process, with this shell's environment ("own"), the stub's ("server"), or this one plus a single
# variable taken from the stub's (e.g. LD_LIBRARY_PATH).  Variants alternate, so drift shows as own-vs-own spread.
# What LD_LIBRARY_PATH changes: which cuDNN the engine runs.  overhead.py's
# `cuda_libraries` and per-path `engine_steps` (GPU busy / idle per step) show it directly.
#
#   benchmark/gpu/engine_env.sh [OUT_DIR]        # default OUT_DIR: ./gpu-results
#
# Needs what one_gpu.sh needs.  Knobs: MODEL (/tmp/llama-1b, made by one_gpu.sh), CONCURRENCY ("1 128"),
# ROUNDS (3), VARIANTS ("own server own server LD_LIBRARY_PATH PYTHONPATH PATH"), DEVICE (cuda), DTYPE (bfloat16).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:-gpu-results}
MODEL=${MODEL:-/tmp/llama-1b}
CONCURRENCY=${CONCURRENCY:-1 128}
ROUNDS=${ROUNDS:-3}
VARIANTS=${VARIANTS:-own server own server LD_LIBRARY_PATH PYTHONPATH PATH}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
i=0
for v in $VARIANTS; do
    i=$((i + 1))
    case $v in
        own) env_args=(--process-env own) ;;
        server) env_args=(--process-env server) ;;
        pad*) env_args=(--process-env own --process-env-pad "${v#pad}") ;;  # e.g. pad100: 100 more bytes of env
        *) env_args=(--process-env server --process-env-keys "$v") ;;
    esac
    echo "== $i. engine process environment: $v"
    # shellcheck disable=SC2086
    timeout 400 $PY benchmark/overhead.py --model "$MODEL" --device "$DEVICE" --dtype "$DTYPE" --max-num-seqs 128 \
        --concurrency $CONCURRENCY --prompt-tokens 128 --max-tokens 128 --requests-per-stream 2 --rounds "$ROUNDS" \
        --paths direct process "${env_args[@]}" > "$OUT_DIR/engine_env.$i.$v.json" 2> "$OUT_DIR/engine_env.$i.$v.log"
    tail -4 "$OUT_DIR/engine_env.$i.$v.log"
done
$PY - "$OUT_DIR" <<'PY'
import glob, json, os, sys
# process / in-process per variant, in the order run
print(f"{'variant':<18} {'C':>4} {'in tok/s':>9} {'proc tok/s':>10} {'proc/in':>7} {'ITL in/proc ms':>15} {'TTFT in/proc ms':>16}")
files = sorted(glob.glob(os.path.join(sys.argv[1], "engine_env.*.json")), key=lambda f: int(f.split(".")[-3]))
for f in files:
    try:
        d = json.load(open(f))
    except ValueError:
        print(f"{os.path.basename(f)}: no result (see its .log)")
        continue
    for r in d["runs"]:
        print(f"{f.split('.')[-2]:<18} {r['concurrency']:>4} {r['direct_tokens_per_s']:>9.1f} {r['process_tokens_per_s']:>10.1f} "
              f"{r['process_ratio']:>7.3f} {r['direct_itl_ms_p50']:>7.3f}/{r['process_itl_ms_p50']:<7.3f} "
              f"{r['direct_ttft_ms_p50']:>7.2f}/{r['process_ttft_ms_p50']:<7.2f}")
PY
