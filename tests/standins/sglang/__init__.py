"""Stand-in for the `sglang` package (tests only; see tests/standins/_standin.py).

Follows the public offline-engine API of SGLang 0.4.x - 0.5.x (sgl-project/sglang main,
python/sglang/srt/entrypoints/engine.py): `sglang.Engine(**ServerArgs fields)`,
`await Engine.async_generate(prompt=..., sampling_params={...}, stream=True, rid=...)`
returning an async generator of {"text", "output_ids", "meta_info"} dicts (text is the
whole text so far unless incremental_streaming_output is set),
`Engine.tokenizer_manager.abort_request(rid=...)`, `Engine.shutdown()`; on node_rank > 0
with SGLANG_BLOCK_NONZERO_RANK_CHILDREN=0 the constructor returns with no tokenizer
manager, and `_scheduler_init_result.block_until_scheduler_exits()` blocks until shutdown.
"""

from sglang.srt.entrypoints.engine import Engine

__all__ = ["Engine"]
