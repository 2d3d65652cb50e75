#!/bin/bash
# One rank of sbatch/tensorrt_llm_triton.sub: srun starts this in every task.
# Rank 0 serves gRPC/HTTP/metrics. The other ranks depend on LLMLAUNCH_ENGINE:
#   trtllm (default)  TensorRT-LLM's LLM API layout (engine.layout=llmapi): with more than one task, every
#                     task runs under trtllm-llmapi-launch, one MPI world; rank 0's runs tritonserver, the
#                     others run TensorRT-LLM's MPI worker and no tritonserver. One task: plain tritonserver.
#   trtllm-ensemble   the C++ backend's ensemble (engine.layout=ensemble): other ranks open no network
#                     services and load only the tensorrt_llm model (leader mode)
#   hf                llmlaunch's own engine: other ranks load only hf_model
# The shm-region prefix carries the job id AND the rank, so ranks and jobs sharing a node never collide.
#   TRITONSERVER          default /opt/tritonserver/bin/tritonserver (NGC containers)
#   TRITON_BACKEND_DIR    --backend-directory, when the backends are not beside the binary
#   TRTLLM_LLMAPI_LAUNCH  TensorRT-LLM's launcher (default trtllm-llmapi-launch, on PATH where its wheel is)
#   GRPC_PORT / HTTP_PORT / METRICS_PORT   rank 0's ports (default 8001 / 8000 / 8002)
set -euo pipefail
TRITONSERVER=${TRITONSERVER:-/opt/tritonserver/bin/tritonserver}
MODEL_REPO=${LLMLAUNCH_MODEL_REPO:?set LLMLAUNCH_MODEL_REPO to the model repository}
LAUNCH=()
case "${LLMLAUNCH_ENGINE:-trtllm}" in
  trtllm)
    WORKER_MODEL=""
    if [ "${SLURM_NTASKS:-1}" -gt 1 ]; then LAUNCH=("${TRTLLM_LLMAPI_LAUNCH:-trtllm-llmapi-launch}"); fi ;;
  trtllm-ensemble) WORKER_MODEL=tensorrt_llm ;;
  hf) WORKER_MODEL=hf_model ;;
  *) echo "LLMLAUNCH_ENGINE=${LLMLAUNCH_ENGINE}: use trtllm, trtllm-ensemble or hf" >&2; exit 2 ;;
esac
if [ "${#LAUNCH[@]}" -gt 0 ] && [ "${SLURM_PROCID}" != 0 ]; then
  exec "${LAUNCH[@]}"  # TensorRT-LLM's MPI worker: the model runs on rank 0's server
fi

ARGS=(
  --model-repository="$MODEL_REPO"
  --disable-auto-complete-config
  --backend-config=python,shm-region-prefix-name="llm${SLURM_JOB_ID}r${SLURM_PROCID}_"
)
if [ -n "${TRITON_BACKEND_DIR:-}" ]; then ARGS+=(--backend-directory="$TRITON_BACKEND_DIR"); fi
if [ "${SLURM_PROCID}" = 0 ]; then
  ARGS+=(--grpc-port="${GRPC_PORT:-8001}" --http-port="${HTTP_PORT:-8000}" --metrics-port="${METRICS_PORT:-8002}")
else
  ARGS+=(--allow-http=false --allow-grpc=false --allow-metrics=false --model-control-mode=explicit --load-model="$WORKER_MODEL")
fi
exec ${LAUNCH[@]+"${LAUNCH[@]}"} "$TRITONSERVER" "${ARGS[@]}"
