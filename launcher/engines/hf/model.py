"""Triton python-backend model serving llmlaunch's `hf` engine (decoupled, streaming).

Arguments: `1/model.json` (the file config.pbtxt's `engine_args_file` parameter names), read into
launcher.engines.hf.config.HFEngineArgs, which says what each key does and holds its default; a key it does not
have fails the load, listing the valid ones.  The launcher writes the file from the engine config.  How this model
uses some of them:
  tp_size           > 1: one tritonserver runs per rank (launcher.rank sets _LLMLAUNCH_GROUP_RANK/_SIZE,
                    _LLMLAUNCH_LEADER_ADDR, _LLMLAUNCH_DIST_PORT): group rank 0 (the leader) runs the engine and
                    takes requests; the other ranks run the worker loop of launcher.hf.tp on their shard
                    and take no requests.  tp_size must divide the model's attention and kv heads (checked at
                    load, clear error).  If a rank's engine process dies, this model stops its tritonserver, so
                    the rank supervisor fails the whole job (fail fast; with replicas > 1 on a serving job, only
                    this replica is lost: launcher.rank.decide_exit).  Requires engine_process=true.
  stream_interval_ms  tokens generated meanwhile are merged into one response (in the engine process); a
                    request's first token and its end are never delayed.
  engine_process    false runs the engine in the stub, whose interpreter then needs torch and transformers too
                    (on a GPU host the stub's own numpy<2 environment usually has neither: the load fails, saying
                    so).  It saves the hops to and from the engine process, a few tenths of a ms of TTFT at one
                    stream, but at 32 streams the engine and the responses share one GIL (worse TTFT and 0.93-0.95
                    of the tokens/s).

Response threads and nice value: launcher.python_backend.responders' rule, from the engine's device (4 threads and nice
10 for an engine process on a GPU, 1 thread and unchanged priority on CPU).  The engine process's receive thread
is the first response thread.  While fewer streams are open than there are threads, a new stream stays with the
receive thread: a hand-off to another thread would only add its wake-up to the stream's tokens.  The nice value
goes to this model's stubs and (from the instance that started it) tritonserver; the engine process keeps the one
it started with (launcher.python_backend.priority).  No privileges needed; where the system refuses (a container's
seccomp policy, say), a warning is logged and the server serves as is.

instance_group count N > 1 (llmlaunch's engine.response_processes): N stub processes share one engine
process.  A stub builds every response under its own GIL, so one stub sends a few thousand streamed
responses/s whatever its threads (H100 host: ~4.6-6k/s), while the engine makes one per running stream
per step; four stubs sent ~12k/s.  The first instance to initialize (an flock in a private directory
under $TMPDIR, keyed by tritonserver's pid and the model's name) starts the engine process listening on a
unix socket there; the others attach to it (waiting while it loads).  Triton spreads requests over the
instances; each gets its own requests' outputs.  engine_process=true and tp_size=1 only.  The extra
responses cost CPU beside the engine process, so the default is one.
A reload of the model inside a running server must unload it first (the new instances would attach to
the old engine).

Responses keep and resend the tensors that repeat (launcher.python_backend.triton_io.Responder: texts, counts,
finish reasons; building a tensor in the stub costs 12-30 us and its first send a copy into shared memory).

Inputs and outputs are launcher.contract's (the TensorRT-LLM ensemble interface),
with a leading batch dimension when max_batch_size > 0; batches > 1 are rejected.

Threads and processes: Triton calls `execute` on the stub's main thread; it
validates and tokenizes requests, queues them with the engine and returns at
once.  The engine runs in a child process (launcher.hf.client) so that
building and sending responses never competes with the engine loop for the
GIL; its outputs arrive once per engine step on a receive thread, which turns
them into responses (merging the pieces of a request from steps that queued up
while it was sending, so a slow client never slows the engine down) and polls
cancellation; with several response threads it keeps one share of the streams and
hands the others to as many more threads.  With engine_process=false the
engine runs on a thread of this process and one responder thread does the same.
That response side is launcher.engines.hf.streams (HFStreams, whose methods this model has); this file
reads the arguments, starts or attaches to the engine and takes the requests.

Metrics (launcher.python_backend.timings; means logged at unload): with the engine process, where
each streamed request's first token spent its time in here (execute took it -> read and queued ->
engine received -> first token made -> this stub had it -> response built -> response sent) goes to tritonserver's
metrics port as llmlaunch_first_token_seconds{part=parse|add|engine|back|respond|send} and
llmlaunch_first_tokens; and how
the engine loop spends its steps (wall, launch, wait for the GPU, host work, GPU busy and
idle) as llmlaunch_engine_seconds / _steps / _tokens.
"""

import fcntl
import json
import os
import signal
import sys
import time

import triton_python_backend_utils as pb_utils

from launcher.contract import INPUT_NAMES
from launcher.engines.hf.config import ARGS_FILE, HFEngineArgs
from launcher.engines.hf.streams import HFStreams, Stream, stub_log
from launcher.handoff.rank_env import RankEnv
from launcher.hf.reporting import describe_features
from launcher.python_backend import triton_io
from launcher.python_backend.counters import Counters, FirstTokenTimes
from launcher.python_backend.priority import lower_priority
from launcher.python_backend.responders import GPU_NICE, responders
from launcher.python_backend.timings import (
    ENGINE_COUNTERS,
    ENGINE_GAUGES,
    FIRST_TOKEN_COUNTERS,
    engine_summary,
    kv_cache_usage,
)

# Optional inputs this model honours.  exclude_input_in_output is honoured by construction (the prompt is never
# echoed); pad_id is accepted and ignored (a note is logged once).
SUPPORTED = frozenset(INPUT_NAMES) - {"pad_id"}


def _ignore(_output):
    pass


def _cause_chain(exc: BaseException) -> str:
    """The innermost cause first, then what it was raised inside (each cut short): transformers' lazy imports wrap
    the real failure (a package built for another numpy, a missing module) in "Could not import module
    'AutoTokenizer'. Are this object's requirements defined correctly? ...", twice over."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    text = f"{type(chain[-1]).__name__}: {chain[-1]}"
    outer = [f"{type(e).__name__}: {str(e)[:80]}{'...' if len(str(e)) > 80 else ''}" for e in reversed(chain[:-1])]
    return text + (f" (raised inside {'; inside '.join(outer)})" if outer else "")


class TritonPythonModel(HFStreams):
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        self._server_pid = os.getppid()  # the tritonserver that started this stub (tp > 1 stops it if the engine dies)
        self.instance_name = args.get("model_instance_name", "")
        self._check_decoupled()
        self._read_parameters(args)
        self._start_engine()
        self._start_responders()
        self._nice_text = self._lower_priority()
        # where streamed requests' first tokens spend their time in here, and how the engine spends a step:
        # Triton metrics (pushed once a second) + summaries at the end
        self._first_token = FirstTokenTimes()
        self._metrics = Counters(
            self.model_config.get("name", "hf"),
            FIRST_TOKEN_COUNTERS + ENGINE_COUNTERS,
            self._metric_values,
            gauges=ENGINE_GAUGES,
        ).start()
        role = (
            f", tp rank {self.tp_rank}/{self.tp}" + (" (worker)" if self.tp_rank else " (leader)")
            if self.tp > 1
            else ""
        )
        stub_log(
            "info",
            f"ready: {self.args.model_path} on {self.engine.device} ({self.engine.dtype}){role}, "
            f"max_num_seqs={self.engine.max_num_seqs}, max_model_len={self.engine.max_model_len}, "
            + (f"{self._share_text}, " if self._share_text else "")
            + (f"{self._nice_text}, " if self._nice_text else "")
            + f"engine_process={self.engine_process}, response_threads={len(self._queues)}"
            + (f", {describe_features(self.engine.features)}" if self.engine.features else ""),
        )

    def _metric_values(self) -> dict:
        """What the metrics thread pushes: first-token times, the engine's totals and its KV cache in use."""
        stats = self.engine.stats_dict()
        return {**self._first_token.totals_map(), **stats, "kv_cache_usage": kv_cache_usage(stats)}

    # -- initialize steps ----------------------------------------------------------------------------------
    def _check_decoupled(self):
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException(
                "the hf model streams: set `model_transaction_policy { decoupled: true }` in config.pbtxt"
            )
        self._batched = int(self.model_config.get("max_batch_size", 0)) > 0

    def _read_parameters(self, args):
        """The engine's arguments: HFEngineArgs from the file config.pbtxt names (1/model.json); every default is
        HFEngineArgs'.  The checks here are the ones that need this model's own config (its instance count)."""
        p = triton_io.model_parameters(self.model_config)
        path = os.path.join(
            args.get("model_repository", ""),
            str(args.get("model_version", "1")),
            p.get("engine_args_file") or ARGS_FILE,
        )
        try:
            self.args = HFEngineArgs.read(path)
        except FileNotFoundError:
            raise pb_utils.TritonModelException(
                f"{path} is missing: llmlaunch writes the hf engine's arguments there (render the repository again)"
            ) from None
        except (ValueError, TypeError) as exc:
            raise pb_utils.TritonModelException(str(exc)) from None
        a = self.args
        if not a.model_path:
            raise pb_utils.TritonModelException(f"{path}: model_path is empty: point it at a HF model folder")
        self.tp = max(1, a.tp_size)
        self.tp_rank = (RankEnv.from_environ(os.environ).group_rank or 0) if self.tp > 1 else 0
        self.cancel_check_s = a.cancel_check_ms / 1000.0
        self.stream_interval_s = a.stream_interval_ms / 1000.0
        self.engine_process = a.engine_process
        self.instances = sum(int(g.get("count", 1)) for g in self.model_config.get("instance_group") or []) or 1
        if self.instances > 1 and (self.tp > 1 or not self.engine_process):
            raise pb_utils.TritonModelException(
                f"instance_group count {self.instances}: several instances share one engine process, which needs "
                f"engine_process=true and tp_size=1; set the count to 1 (engine.response_processes=1)"
            )
        if self.tp > 1 and not self.engine_process:
            raise pb_utils.TritonModelException("tp_size > 1 needs engine_process=true")

    def _start_engine(self):
        self._responder = triton_io.Responder(self._batched)
        self._streams = {}  # request id -> Stream (its responder thread owns it after registration)
        self._queues = []  # one per share of the streams: lists of engine outputs to respond to (None: inline)
        self._threads = []  # the responder threads
        self._next_id = 0
        # a prefill replica's engine process serves the prompts it computed here: a kv_export request's kv_handle
        self._kv_handle = RankEnv.from_environ(os.environ).kv_transfer or ""
        self._noted = set()  # ignored inputs already logged
        self._finalizing = False
        self._share_text = ""  # how this instance shares the engine process (instance_group count > 1)
        self._share_files = None  # the owner's (lock fd, lock path)
        self._engine_owner = True  # this instance started the engine (process)
        if self.engine_process:
            self._start_engine_process()
        else:
            self._start_engine_in_stub()
        # response threads and nice value, once the engine's device is known (launcher.python_backend.responders)
        self._responders = responders(
            str(self.engine.device).split(":")[0],
            len(os.sched_getaffinity(0)),
            self.instances,
            engine_process=self.engine_process,
        )

    def _start_engine_process(self):
        """The engine in a child process (launcher.hf.client.EngineProcess), started by this instance or, where
        several instances share it, by the first of them and attached to by the others. Its receive thread hands
        over each engine step's outputs at once; `_route` passes them to the responder threads. The engine process
        itself merges outputs over stream_interval_ms, so nothing is held back here."""
        from launcher.hf.client import EngineProcess

        owner, sock = self._share_engine() if self.instances > 1 else (True, "")
        self._engine_owner = owner
        if owner:
            if sock:  # a failure an earlier server with this pid left would fail our instances
                EngineProcess.write_attach_failure(sock, None)
            try:
                self.engine = EngineProcess.from_args(
                    self.args,
                    on_batch=self._route,
                    on_exit=self._engine_exited if self.tp > 1 else None,
                    listen=sock,
                    worker=bool(self.tp_rank),
                ).start()
            except Exception as exc:  # the instances waiting to attach fail with this at once
                if sock:
                    EngineProcess.write_attach_failure(sock, str(exc))
                raise
        else:
            self.engine = EngineProcess.attach(sock, on_batch=self._route).start()
        if self.instances > 1:
            self._share_text = (
                f"instance {self.instance_name} {'started' if owner else 'attached to'} the "
                f"engine process (pid {self.engine.info.get('pid')}) that {self.instances} "
                f"instances share"
            )
        self._engine_callback = _ignore  # outputs arrive through on_batch
        self.stream_interval_s = 0.0

    def _start_engine_in_stub(self):
        """The engine in this stub's interpreter (engine_process=false), which then needs torch and transformers."""
        from launcher.hf.engine import Engine
        from launcher.python_backend.torch_libs import mapped_from, preload_torch_cudnn

        # the stub's library path would give torch's cuDNN the system's sub-libraries (torch_libs' docstring)
        preloaded = preload_torch_cudnn()
        try:
            # torch first: transformers would report a missing torch as its own "requires PyTorch" error
            import torch  # noqa: F401

            self.engine = Engine.from_args(self.args).start()
        except ImportError as exc:  # torch / transformers, imported by the engine, not by anything above
            raise pb_utils.TritonModelException(
                f"engine_process=false runs the engine in the python stub's interpreter ({sys.executable}), "
                f"which cannot import what it needs: {_cause_chain(exc)}. Leave engine_process=true "
                f"(the engine then runs on llmlaunch's own interpreter), or give the stub an environment with "
                f'torch and transformers besides numpy<2 (LLMLAUNCH_STUB_PYTHON; docs/engines.md, "GPU machines")'
            ) from None
        dirs = sorted({os.path.dirname(p) for p in mapped_from("libcudnn")})
        if preloaded or dirs:  # a GPU torch
            source = os.path.dirname(os.path.realpath(preloaded[0])) if preloaded else ""
            mixed = (
                ": two cuDNNs mixed, decode runs slower (launcher.python_backend.torch_libs)" if len(dirs) > 1 else ""
            )
            stub_log(
                "warn" if mixed else "info",
                f"engine in the stub: cuDNN {'preloaded from ' + source if source else 'not preloaded'}, "
                f"mapped from {', '.join(dirs) or '(none yet)'}{mixed}",
            )
        self._engine_callback = self._on_output

    def _share_engine(self):
        """(this instance starts the shared engine process?, its unix socket path).  The first instance of this model
        in this tritonserver to take the lock starts it; the lock is held until that instance finalizes."""
        from launcher.python_backend.instances import private_dir, share_key

        base, key = private_dir(), share_key(self.model_config.get("name", ""))
        lock_path, sock = os.path.join(base, f"hf-{key}.lock"), os.path.join(base, f"hf-{key}.sock")
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False, sock
        self._share_files = (fd, lock_path)
        return True, sock

    def _lower_priority(self) -> str:
        """The rule's nice value (launcher.python_backend.responders: GPU_NICE for an engine process on a GPU, else 0) for
        this stub's threads, and tritonserver's if this instance started the engine process; the engine process,
        started already, keeps its own (launcher.python_backend.priority says why).  -> the words for the ready line (""
        when 0).  Where the system refuses (a container's seccomp policy, say), it says so and goes on unchanged."""
        nice = self._responders.nice
        if not nice:
            return ""
        counts = []
        for who, pid in [("this stub", os.getpid())] + (
            [("tritonserver", self._server_pid)] if self._engine_owner else []
        ):
            try:
                counts.append(f"{who} {lower_priority(pid, nice)} threads")
            except PermissionError as exc:
                stub_log(
                    "warn",
                    f"nice {nice}: cannot lower the priority of {who} (pid {pid}): {exc.strerror}; the "
                    f"response path keeps the engine's priority (nice {GPU_NICE} is not needed to serve)",
                )
                return f"response path not lowered ({exc.strerror})"
        # (nice > 0 implies engine_process=true: the rule gives 0 for an engine in the stub)
        return (
            f"response path at nice {nice} ({', '.join(counts)} changed; engine process "
            f"{self.engine.info.get('pid')} as started)"
        )

    def _engine_exited(self, message):
        """tp > 1: a rank's engine died (a rank failed or a collective timed out): stop this tritonserver (our
        stub's parent) so the rank supervisor fails the job instead of serving from a broken group."""
        if self._finalizing:
            return
        if os.getppid() != self._server_pid:
            # the server is gone already (this stub was re-parented): its pid may be someone else's by now
            stub_log("error", f"tensor-parallel rank {self.tp_rank}: {message}; the server has exited already")
            return
        stub_log("error", f"tensor-parallel rank {self.tp_rank}: {message}; stopping this server")
        try:
            os.kill(self._server_pid, signal.SIGTERM)
        except OSError as exc:
            stub_log("error", f"could not stop tritonserver: {exc}")

    # -- requests ------------------------------------------------------------------------------------------
    def execute(self, requests):
        for request in requests:
            began = time.monotonic()
            sender = request.get_response_sender()
            if self.tp_rank:
                self._send(
                    sender,
                    triton_io.error_response(
                        f"this server is tensor-parallel worker rank {self.tp_rank}; send requests to rank 0"
                    ),
                    final=True,
                )
                continue
            try:
                req = triton_io.parse_request(request, SUPPORTED, self.engine.max_model_len, "engine=hf")
                if req.params.kv_from:  # the hf engine's handle: where the prefill engine serves its blocks
                    triton_io.host_port("kv_from", req.params.kv_from)
                self._note_ignored(req.ignored)
                self._next_id += 1
                rid = str(self._next_id)
                # register before the engine can produce output for it
                stream = Stream(
                    sender,
                    req.stream,
                    self._shard(),
                    counts=not req.final_counts_only,
                    token_ids=req.return_token_ids,
                )
                self._streams[rid] = stream
                stream.began, stream.queued = began, time.monotonic()
                if req.params.kv_export:
                    stream.handle, stream.timed = self._kv_handle, True
                try:
                    self.engine.add_request(rid, req.prompt, req.params, self._engine_callback)
                except BaseException:
                    self._streams.pop(rid, None)
                    raise
            except triton_io.InvalidRequest as exc:
                self._send(sender, triton_io.error_response(str(exc)), final=True)
            except Exception as exc:  # anything unexpected is still this request's problem only
                stub_log("error", f"request rejected: {exc!r}")
                self._send(sender, triton_io.error_response(f"request failed: {exc}"), final=True)
        return None

    def _note_ignored(self, names):
        for name in names:
            if name not in self._noted:
                self._noted.add(name)
                stub_log("info", f"input {name!r} is accepted and ignored by the hf engine (noted once)")

    def finalize(self):
        # reverse of initialize: stop the engine (running requests end 'cancelled'), then the responders
        self._finalizing = True
        self.engine.shutdown()
        self._stop_responders()
        self._metrics.stop()
        stub_log("info", self._first_token.summary())
        stats = self.engine.stats_dict()
        if not self.tp_rank and stats:  # (an instance attached to a shared engine gets no engine statistics)
            stub_log("info", engine_summary(stats))
        if self._share_files is not None:  # the engine process is gone: let the next server's instances start
            fd, lock_path = self._share_files
            try:
                os.unlink(lock_path)
            except OSError:
                pass
            os.close(fd)
