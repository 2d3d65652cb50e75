"""Whose fault a request's error is, from its message (and gRPC status code where there is one): the OpenAI API
answers by it with 400, 429, 503 or 500 (launcher/openai_api/translate.py), and the front end's circuit breaker counts
only the server's own failures (launcher/frontend/proxy.py: a bad request never takes a replica out).

A streamed error carries only its message (ModelStreamInferResponse.error_message), so the words are the contract
models' and tritonserver's own.  Data only: no Triton, no gRPC."""

from __future__ import annotations

REQUEST = "request"  # the request's fault (a bad value, a missing input, too long): 400
OVERLOAD = "overload"  # the server will not take more work now: 429
UNAVAILABLE = "unavailable"  # the server is not there or not ready: 503
CANCELLED = "cancelled"  # the client cancelled it
SERVER = "server"  # anything else: the engine or the server failed it: 500

# Words of the contract models' request checks (launcher/engines/*/model.py, launcher/python_backend/triton_io.py):
# an error carrying one is the request's fault, not the engine's.
REQUEST_WORDS = (
    "must be",
    "exceeds the model",
    "is empty",
    "is not supported",
    "missing required input",
    "unexpected inference input",
    "too long",
    "guided_decoding_guide",  # a guide the engine cannot compile (launcher/python_backend/triton_io.py: check_guide)
)
# Triton's words when a model's queue is full or the server will not take more work.
OVERLOAD_WORDS = ("exceeds maximum queue size", "queue is full", "resource_exhausted", "too many requests")
# "no replica is up": the replicas' front end (launcher/frontend/proxy.py) with every replica down; the rest:
# tritonserver draining (its time limit, a stop), which refuses new requests and unloads its models
UNAVAILABLE_WORDS = (
    "not ready",
    "no replica is up",
    "server is stopping",
    "has no available versions",
    "server exiting",
)
CANCELLED_WORDS = ("request cancelled", "cancelled by the client")


def error_kind(message: str, grpc_code: str = "") -> str:
    """REQUEST, OVERLOAD, UNAVAILABLE, CANCELLED or SERVER for an error `message`; `grpc_code`: the status code's
    name (e.g. "INVALID_ARGUMENT") where the error came as a gRPC status, "" where it came in a stream."""
    low = message.lower()
    if grpc_code == "RESOURCE_EXHAUSTED" or any(w in low for w in OVERLOAD_WORDS):
        return OVERLOAD
    if grpc_code in ("UNAVAILABLE", "DEADLINE_EXCEEDED") or any(w in low for w in UNAVAILABLE_WORDS):
        return UNAVAILABLE
    if grpc_code == "CANCELLED" or any(w in low for w in CANCELLED_WORDS):
        return CANCELLED
    if grpc_code == "INVALID_ARGUMENT" or any(w in low for w in REQUEST_WORDS):
        return REQUEST
    return SERVER
