"""One endpoint for data-parallel replicas: a front end that speaks Triton's own gRPC protocol.

    cfg = FrontendConfig([("127.0.0.1", 9001), ("127.0.0.1", 9002)], port=8001, metrics_port=8002, model_name="hf_model")
    FrontendProcess(cfg).start().wait_ready(60)     # python -m launcher.frontend --config <cfg as JSON>
    run_frontend(cfg)                               # or serve it in this process

    python -m launcher.frontend --config frontend.json  # by hand: FILE is a FrontendConfig as JSON (--help: its keys)

With `replicas=N`, every replica leader runs its own tritonserver on an
internal port; global rank 0 runs this front end on the public port
(launcher/rank/frontend.py). Clients (tritonclient, launcher.client, launcher.bench)
talk to it exactly as to one tritonserver: it serves Triton's
GRPCInferenceService (ServerLive, ServerReady, ModelReady, ServerMetadata,
ModelMetadata, ModelConfig, RepositoryIndex, ModelInfer, ModelStreamInfer).

What it does:
* routes each request, including each request inside one ModelStreamInfer
  stream, by `routing` (launcher/frontend/routing.py): to the replica with
  the fewest requests in flight (`least_outstanding`, ties in turn), or to the
  one that was sent the longest run of the prompt's prefix, within a load
  bound (`prefix`), or to the one whose engine holds the longest run of its token
  blocks, as the engines' KV-cache events say (`kv`). A client stream gets one backend stream per replica and model it
  uses (see Session.dispatch for why per model); responses are passed back as
  they arrive, looked up by request id.
* forwards the client's serialized messages byte for byte. Only when it must
  does it append a protobuf field (the wire format lets a later field override
  an earlier one, and repeated embedded messages merge): a new request id when
  two running requests of one stream share an id, the id restored on their
  responses, and `triton_enable_empty_final_response` so every request ends
  with a final flag it can count (the empty final response is dropped again
  when the client did not ask for it). Tensors are never re-encoded.
* propagates cancellation: a client that cancels its stream or disconnects
  gets its backend streams cancelled, so the python model's
  `request.is_cancelled()` turns true.
* tracks replica health: a backend stream that fails, or a unary call that
  fails while the replica no longer answers ServerLive, marks the replica down;
  its requests that already streamed something end with the error
  `replica N (<addr>) failed: ...`, those it had not answered yet go to another
  replica (once; the client saw nothing of them), and no more requests go there. A ServerReady (+ ModelReady) probe every
  `probe_interval_s` brings it back, or marks a silent one down.
* ServerReady is true only when every replica is up and ready; ServerLive
  while the front end runs; ModelReady when the model is ready on every replica.
* serves Prometheus counters over HTTP on the metrics port (GET /metrics):
  requests, responses, errors, in flight and up/down per replica.
* follows a members file where `members` names one (launcher/frontend/members.py):
  a long-lived service's replicas are separate jobs a controller adds (they
  join: probed, routed to once ready), drains (no new request goes there, the
  running ones finish) and removes (its running streams end as a failed
  replica's do), all while the front end serves; every worker process polls
  the file, and /metrics labels each slot with its member's name and address,
  beside its draining gauge and the version of the file every worker applied.
  The front end then starts with no replica, if need be (a request gets
  UNAVAILABLE, none has registered), and ServerReady says whether one serves.
  Routing kv is refused with it (its KV-cache event subscriptions are fixed).

Cost and scale (benchmark/frontend_capacity.py, frontend_overhead.py): every
forwarded response is one grpc.aio read and one write, about 50 us of the
event-loop thread plus gRPC's own I/O threads. On a 16-core Xeon one process
passed 21,000 streamed responses/s with asyncio's loop and 29,000 with uvloop
(used when installed); `processes=N` starts N worker processes that share the
gRPC port through SO_REUSEPORT (the kernel spreads client connections over
them, so one client connection stays on one worker): 2 processes 40,000/s,
4 processes 51,000/s against 57,000/s straight to the replicas. Workers route
by the in-flight counts of all workers (shared memory); the parent serves the
metrics, summing the workers' counters, and fails if a worker dies.

The package, one module a job:
    wire.py     the protobuf fields appended to forwarded messages, in-band errors
    replica.py  Replica: one replica's channel, up/down state, health probes, load and counters
    members.py  the members file (Member, write_members, read_members) and MembersFile, a process following it
    session.py  Session: one client stream, its requests spread over the replicas and their responses passed back
    proxy.py    Frontend: routing, the health probe, the gRPC handlers, the counters
    routing.py  the routing policies (serve.routing): least_outstanding, prefix, kv
    text_blocks.py   a prompt's text blocks and their chained keys (prefix's index)
    kv_index.py      kv's index of the blocks each replica's engine holds, fed by their KV-cache events
    prompt_tokens.py kv's prompt token blocks, with the tokens of text seen before remembered
    metrics.py  the Prometheus text and its HTTP server
    server.py   FrontendConfig (the one config, as JSON between processes) and one serving process
    workers.py  several processes sharing the port; run_frontend picks one or several
    process.py  the command line (main: --config FILE) and FrontendProcess, the front end as a child process
"""

from launcher.frontend.members import Member, read_members, write_members
from launcher.frontend.metrics import metrics_text
from launcher.frontend.process import FrontendProcess, connect_host, main
from launcher.frontend.proxy import Frontend
from launcher.frontend.replica import Replica
from launcher.frontend.server import FrontendConfig
from launcher.frontend.workers import run_frontend

__all__ = [
    "Frontend",
    "FrontendConfig",
    "FrontendProcess",
    "Member",
    "Replica",
    "connect_host",
    "main",
    "metrics_text",
    "read_members",
    "run_frontend",
    "write_members",
]
