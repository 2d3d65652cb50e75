"""Whose fault an error is: the words the circuit breaker and the OpenAI API both read (launcher/error_kinds.py)."""

import pytest

from launcher.error_kinds import CANCELLED, OVERLOAD, REQUEST, SERVER, UNAVAILABLE, error_kind

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "message, code, kind",
    [
        ("engine=hf: max_tokens must be >= 1", "", REQUEST),
        ("engine=hf: prompt of 9000 tokens exceeds the model's max_model_len 2048", "", REQUEST),
        ("unexpected inference input 'foo' for model 'hf_model'", "", REQUEST),
        ("anything at all", "INVALID_ARGUMENT", REQUEST),
        ("Exceeds maximum queue size", "", OVERLOAD),
        ("model 'hf_model' is not ready", "", UNAVAILABLE),
        (
            "[request id: 0] Server is stopping, scheduler for model has stopped accepting new inference requests",
            "",
            UNAVAILABLE,
        ),
        ("Request for unknown model: 'hf_model' has no available versions", "", UNAVAILABLE),
        ("failed to connect to all addresses", "UNAVAILABLE", UNAVAILABLE),
        ("request cancelled by the client", "", CANCELLED),
        ("request failed: CUDA error: an illegal memory access was encountered", "", SERVER),
        ("frontend_marker r1: the engine failed (BROKEN)", "", SERVER),
        ("Stub process 'hf_model_0_0' is not healthy.", "INTERNAL", SERVER),
    ],
)
def test_an_error_is_the_requests_the_loads_or_the_servers(message, code, kind):
    assert error_kind(message, code) == kind
