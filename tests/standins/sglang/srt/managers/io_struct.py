"""Stand-in: sglang.srt.managers.io_struct.GenerateReqInput (the fields the served model sets)."""

from dataclasses import dataclass
from typing import Any, Dict, Optional


@dataclass
class GenerateReqInput:
    text: Optional[str] = None
    sampling_params: Optional[Dict[str, Any]] = None
    stream: bool = False
    rid: Optional[str] = None
