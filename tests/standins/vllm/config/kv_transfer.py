"""Stand-in: vllm.config.kv_transfer.KVTransferConfig (the fields llmlaunch sets; names and defaults as in vLLM 0.25)."""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional


@dataclass
class KVTransferConfig:
    kv_connector: Optional[str] = None
    engine_id: Optional[str] = None
    kv_role: Optional[str] = None  # kv_producer | kv_consumer | kv_both
    kv_connector_extra_config: Dict[str, Any] = field(default_factory=dict)
    kv_load_failure_policy: str = "fail"  # fail | recompute

    def __post_init__(self):
        if self.kv_role not in (None, "kv_producer", "kv_consumer", "kv_both"):
            raise ValueError(f"Unsupported kv_role: {self.kv_role}")
        if self.kv_load_failure_policy not in ("fail", "recompute"):
            raise ValueError(f"Unsupported kv_load_failure_policy: {self.kv_load_failure_policy}")
        self.engine_id = self.engine_id or "standin-engine"
