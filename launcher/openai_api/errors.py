"""The OpenAI API's error: an HTTP status and OpenAI's error object, naming the field that is wrong."""

from __future__ import annotations

from typing import Optional


class ApiError(Exception):
    """A request the API answers with an error: `status` and OpenAI's error object."""

    def __init__(
        self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None, type: str = ""
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


def bad(param: str, why: str) -> ApiError:
    return ApiError(400, f"{param}: {why}", param=param, code="invalid_value")
