from lmdeploy.serve.core.async_engine import AsyncEngine, GenOut, PreprocessedRequest

__all__ = ["AsyncEngine", "GenOut", "PreprocessedRequest"]
