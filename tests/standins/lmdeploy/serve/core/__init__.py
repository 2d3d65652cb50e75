from lmdeploy.serve.core.async_engine import AsyncEngine, GenOut, PreprocessedRequest
from lmdeploy.serve.core.exceptions import ErrorCode, RequestError

__all__ = ["AsyncEngine", "ErrorCode", "GenOut", "PreprocessedRequest", "RequestError"]
