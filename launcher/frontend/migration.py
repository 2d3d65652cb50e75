"""Moving a stream to another replica mid-generation: what the front end keeps of a running request and the request
it sends in its place when its replica fails.

A model that can continue a request elsewhere (Engine.continues_requests) is asked, by the request parameter
`return_token_ids` appended to each request, for `output_ids` on its responses: the ids of the tokens whose text the
client has, sent with the response that completes their text (launcher/contract.py).  The front end appends them to
the request's ids as the responses pass through (`take_ids`, the one cost while nothing fails: the responses go on
to the client byte for byte, output_ids with them).  When the replica fails, the request goes to another one as
`continued_request`: the client's request as it came, plus `continue_ids`, those ids.  The model there prefills the
prompt and the ids, counts them as generated (output_tokens, max_tokens, min_length), skips a seeded request's draws
past them and sends only new text, so the client's stream goes on where it was: no token twice, the counts its own,
a greedy request's text that of a run that never moved.  A model that cannot continue one request (vLLM: one with
stop strings or a guide) answers its first response with output_ids [-1]: the front end never moves it.
"""

from __future__ import annotations

import struct
from array import array

from tritonclient.grpc import service_pb2

from launcher.frontend.wire import _field, add_input, without_inputs

TOKEN_IDS_PARAMETER = "return_token_ids"  # contract.PARAMETERS: asks the model for output_ids
OUTPUT_IDS = "output_ids"
CONTINUE_IDS = "continue_ids"
# answered with the request's first response, before it moved: not asked again
DROPPED_ON_MOVE = ("return_prompt_log_probs", CONTINUE_IDS)

# ModelInferRequest.parameters (field 4) gets {return_token_ids: bool_param true} (wire.py says why a field appended
# to the message is enough)
ASK_TOKEN_IDS = _field(4, _field(1, TOKEN_IDS_PARAMETER.encode()) + _field(2, b"\x08\x01"))
# ModelInferRequest.outputs (field 6) gets {name: output_ids}, for a request that names the outputs it wants
ASK_OUTPUT_IDS = _field(6, _field(1, OUTPUT_IDS.encode()))


def asks_token_ids(request: service_pb2.ModelInferRequest) -> bool:
    """The client asked for output_ids itself (then it gets them either way)."""
    p = request.parameters.get(TOKEN_IDS_PARAMETER)
    return p is not None and (p.bool_param or p.string_param.lower() in ("true", "1"))


def take_ids(response: service_pb2.ModelInferResponse, ids: array) -> None:
    """Append the response's output_ids (little-endian INT32, as tritonserver sends raw outputs) to `ids`.  The
    models send it last, so that one is looked at first: about 2 us a response (the others' names cost as much
    again each; benchmark figures in docs/performance/resilience.md)."""
    outputs = response.outputs
    if not outputs:
        return
    if outputs[-1].name == OUTPUT_IDS:
        ids.frombytes(response.raw_output_contents[-1])
        return
    for i in range(len(outputs) - 1):
        if outputs[i].name == OUTPUT_IDS:
            ids.frombytes(response.raw_output_contents[i])
            return


def names_outputs(request: service_pb2.ModelInferRequest) -> bool:
    """The client asked for some outputs by name (tritonserver then sends only those): output_ids must be asked too."""
    return len(request.outputs) > 0 and not any(o.name == OUTPUT_IDS for o in request.outputs)


def continued_request(raw: bytes, ids: array) -> bytes:
    """The client's request `raw` (a serialized ModelInferRequest) to run elsewhere after `ids`, the tokens it
    generated so far: `continue_ids` added (shaped like its other inputs: [1, n] where they have a batch dimension),
    the inputs answered before it moved left out."""
    req = without_inputs(service_pb2.ModelInferRequest.FromString(raw), DROPPED_ON_MOVE)
    if len(ids):  # nothing settled yet: it starts again (the client has no text of it)
        add_input(req, CONTINUE_IDS, "INT32", list(ids), struct.pack(f"<{len(ids)}i", *ids))
    return req.SerializeToString()
