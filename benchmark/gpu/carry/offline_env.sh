# Source on the GPU host, from the checkout's root, with the folder offline_wheels.sh filled:
#
#   source benchmark/gpu/carry/offline_env.sh [WHEELS]      # default WHEELS: .whl
#   STUB_HOST_SITE=1 source benchmark/gpu/carry/offline_env.sh   # also the host's torch stack for the stub (below)
#
# Installs the wheels into /tmp/llmlaunch-site beside the host's torch (PYTHONPATH; no network, no
# dependency resolution: grpcio and protobuf come from the host), and gives the python-backend stub an
# environment of its own with numpy<2 (LLMLAUNCH_STUB_PYTHON; README, "GPU machines").  PYTHON picks the
# interpreter (default: /opt/torch/.venv/bin/python3 where it exists, else python3).
_wheels=${1:-.whl}
PYTHON=${PYTHON:-$( [ -x /opt/torch/.venv/bin/python3 ] && echo /opt/torch/.venv/bin/python3 || echo python3 )}
export PYTHON
mkdir -p /tmp/llmlaunch-site
# pip's resolver warnings about pytriton's own client dependencies are expected: only its tritonserver is used
"$PYTHON" -m pip install -q --no-deps --no-index --target /tmp/llmlaunch-site \
    $(ls "$_wheels"/*.whl | grep -v '/numpy-') > /dev/null 2>&1 || echo "offline_env: pip install into /tmp/llmlaunch-site failed" >&2
[ -x /tmp/llmlaunch-stub-env/bin/python3 ] || { "$PYTHON" -m venv /tmp/llmlaunch-stub-env \
    && /tmp/llmlaunch-stub-env/bin/pip install -q --no-index "$_wheels"/numpy-*.whl; }
if [ "${STUB_HOST_SITE:-0}" = 1 ]; then
    # the hf model's engine_process=false runs the engine in the stub: link the host's torch stack into the stub
    # environment, without what cannot import under its numpy<2 (stub_site.py says what it left out)
    "$PYTHON" benchmark/gpu/carry/stub_site.py \
        "$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')" \
        /tmp/llmlaunch-host-site --python /tmp/llmlaunch-stub-env/bin/python3 \
        --check "import torch, transformers; from transformers import AutoModelForCausalLM, AutoTokenizer" \
        || echo "offline_env: the stub cannot run the engine (engine_process=false); engine_process=true still works" >&2
fi
export PYTHONPATH=/tmp/llmlaunch-site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export LLMLAUNCH_STUB_PYTHON=/tmp/llmlaunch-stub-env/bin/python3
"$PYTHON" -c "import grpc, tritonclient.grpc, hydra, submitit, torch; print('offline_env: ready, torch', torch.__version__)"
unset _wheels
