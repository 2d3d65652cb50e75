"""Who sends a served engine's responses, and at what priority: one rule, `responders`.

Three kinds of process handle every streamed response besides the engine: the hf model's stubs (response threads
build and send them), tritonserver (gRPC out), and with replicas > 1 rank 0's front end (launcher/frontend), whose
event loops pass each one on.  How many of each, and the stubs' and tritonserver's nice value, follow from the
device, the CPUs the rank may use, the replicas, and one setting, `engine.response_processes` (the hf model's
instances sharing one engine process: launcher.schema.HFEngineConfig says why it is the one a user chooses).
The hf model (launcher/engines/hf/model.py) asks for its threads and nice value once the engine's device is
known; rank 0 asks for its front-end processes once every replica is ready (launcher/rank/frontend.py),
and for its OpenAI API processes (`api_processes`) when it starts the API.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_THREADS = 4  # response threads of an hf stub whose engine runs on a GPU
GPU_NICE = 10  # nice value of tritonserver and the hf stubs while an engine process drives a GPU


@dataclass(frozen=True)
class Responders:
    threads: int  # response threads in each hf model instance (the engine process's receive thread is the first)
    nice: int  # nice value tritonserver and the hf stubs take once the engine process runs; 0 = unchanged
    frontend_processes: int  # rank 0's front-end processes sharing the public gRPC port (replicas > 1)


def responders(
    device_type: str, cpus: int, processes: int = 1, replicas: int = 1, engine_process: bool = True
) -> Responders:
    """The responders of one rank: `device_type` of its engine ("cpu", "cuda"), `cpus` it may use, `processes` hf
    model instances sharing each engine process (engine.response_processes; 1 for the other engines), `replicas`
    behind rank 0's front end, `engine_process`: the hf engine runs in its own process (false: on a stub thread).

    * threads: GPU_THREADS per stub on a GPU, 1 on CPU.  A send is a round trip to tritonserver (~50-200 us) with
      the GIL free, so on a GPU host several threads keep a new stream's first token from queueing behind a
      response for every running stream; on CPU the engine needs those cores itself.  An engine on a stub thread
      has one responder (its callbacks queue single outputs).
    * nice: GPU_NICE for an engine process on a GPU, else 0.  Where the node's CPUs are all busy (128 closed
      streams on 8 vCPUs) the engine process, started before at nice 0, then takes them first: only it sets how
      fast the GPU runs, and a response held back a fraction of a millisecond costs nothing else
      (launcher.python_backend.priority).  Not on CPU, where it was not measured; not for an engine in the stub.
    * frontend_processes: one per process sending responses (replicas x processes), at most half the CPUs (rank
      0's own tritonserver and engine run there too), at least 1.  Every streamed response passes through a
      front-end event loop, and one process is the limit once the replicas' stubs send more than ~21-29k
      responses/s: two H100 replicas at 128 streams with two response processes each got 32,598 tok/s through
      one front-end process, 37,579 through two and 39,573 through four; with one response process each,
      39,225 through one and 39,039 through two.
    """
    gpu = device_type != "cpu"
    threads = GPU_THREADS if gpu and engine_process else 1
    nice = GPU_NICE if gpu and engine_process else 0
    frontend = max(1, min(replicas * processes, cpus // 2))
    return Responders(threads, nice, frontend)


API_MAX_PROCESSES = 4


def api_processes(cpus: int) -> int:
    """Worker processes of rank 0's OpenAI API (launcher/openai_api), sharing its port: one per four CPUs the rank
    may use, 1 to API_MAX_PROCESSES.  Every streamed token of the job is an SSE event that one of them builds and
    writes: one process passes about 22,000 events/s on a 16-core H100 host (1.5 cores busy: its event loop and
    gRPC's threads; benchmark/openai_capacity.py), below what one H100 engine sends at 64-128 streams (20-40k
    responses/s); four passed 51,700.  Four CPUs a process leave the rest to the engine, tritonserver and the front
    end."""
    return max(1, min(API_MAX_PROCESSES, cpus // 4))
