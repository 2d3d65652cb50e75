"""What Triton loads: the TritonPythonModel of launcher.engines.vllm.model."""

import os
import sys

sys.path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

from launcher.engines.vllm.model import TritonPythonModel  # noqa: E402,F401
