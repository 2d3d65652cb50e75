"""Stand-in for the `lmdeploy` package (tests only; see tests/standins/_standin.py).

Imitates LMDeploy 0.18.0's serving API at the boundary llmlaunch uses (the real package's
lmdeploy/serve/core/async_engine.py, serve/core/exceptions.py, serve/managers/session_manager.py,
messages.py): `lmdeploy.serve.core.AsyncEngine(model_path, backend=..., backend_config=...)` with
`start_loop(loop, use_async_api=True)`, `session_mgr.get()` (sessions numbered from 0),
`await preprocess(messages=..., session_id=session, gen_config=..., do_preprocess=False)` (which
normalizes a greedy config as LMDeploy does and raises RequestError for a request it refuses),
`generate(request, stream_response=True)` (an async generator of GenOut: `response` is the new
text, `generate_token_len` cumulative, a last item with `finish_reason` "stop" | "length" | "abort";
an engine failure raised as RequestError(INTERNAL_ERROR) from the cause), `Session.async_abort()`
and `close()`; `lmdeploy.GenerationConfig`, `TurbomindEngineConfig`, `PytorchEngineConfig` with
LMDeploy's range checks.
"""

from lmdeploy.messages import GenerationConfig, PytorchEngineConfig, TurbomindEngineConfig

__all__ = ["GenerationConfig", "PytorchEngineConfig", "TurbomindEngineConfig"]
