"""The engines llmlaunch serves, by `engine.name`: one `EngineDef` (launcher/engines/base.py) per engine module.

Adding an engine is one module here (its EngineDef), its config dataclass in launcher/engine_schema.py, its
conf/engine/<name>.yaml and its python model under model_repository/; nothing else branches on the engine's name.
"""

from __future__ import annotations

from typing import Dict

from launcher.engines import hf, lmdeploy, sglang, trtllm, vllm
from launcher.engines.base import EngineDef

ENGINES: Dict[str, EngineDef] = {
    e.name: e for e in (hf.ENGINE, trtllm.ENGINE, vllm.ENGINE, sglang.ENGINE, lmdeploy.ENGINE)
}
