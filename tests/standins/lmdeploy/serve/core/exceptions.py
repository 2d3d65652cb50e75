"""Stand-in: lmdeploy.serve.core.exceptions (ErrorCode and RequestError, as LMDeploy 0.18 raises them)."""

import enum


class ErrorCode(str, enum.Enum):
    INVALID_REQUEST = "invalid_request"
    REQUEST_CONFLICT = "request_conflict"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    UNSUPPORTED_FEATURE = "unsupported_feature"
    PREPROCESS_FAILED = "preprocess_failed"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    INTERNAL_ERROR = "internal_error"


class RequestError(RuntimeError):
    def __init__(self, code: ErrorCode, message=None):
        self.code = code
        self.message = message or f"{code.value.replace('_', ' ')}"
        super().__init__(self.message)
