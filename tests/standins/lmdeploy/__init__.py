"""Stand-in for the `lmdeploy` package (tests only; see tests/standins/_standin.py).

Follows the serving API of LMDeploy main (InternLM/lmdeploy, lmdeploy/serve/core/async_engine.py,
serve/managers/session_manager.py, messages.py): `lmdeploy.serve.core.AsyncEngine(model_path,
backend=..., backend_config=...)` with `start_loop(loop, use_async_api=True)`, `session_mgr.get()`,
`await preprocess(messages=..., session_id=session, gen_config=..., do_preprocess=False)`,
`generate(request, stream_response=True)` (an async generator of GenOut: `response` is the new
text, `generate_token_len` cumulative, a last item with `finish_reason`), `Session.async_abort()`
and `close()`; `lmdeploy.GenerationConfig`, `TurbomindEngineConfig`, `PytorchEngineConfig`.
"""

from lmdeploy.messages import GenerationConfig, PytorchEngineConfig, TurbomindEngineConfig

__all__ = ["GenerationConfig", "PytorchEngineConfig", "TurbomindEngineConfig"]
