"""What an engine's python model (vLLM, SGLang, LMDeploy, TensorRT-LLM's LLM API) gives the shared serving loop
(launcher/python_backend/async_runtime.py): an `EngineAdapter` that builds the engine and turns a request into its
stream of `Piece`s, and the `Log` it writes to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Optional, Sequence

from launcher.python_backend.logprob_io import LogProbRows


@dataclass
class Piece:
    """What an engine produced for a request since the previous piece."""

    text: str  # new text (a delta), whole characters only
    output_tokens: int  # tokens generated so far (cumulative)
    input_tokens: int  # tokens in the prompt (0 until the engine reports it)
    finish_reason: Optional[str] = None  # "length" | "stop" on the engine's last piece
    logprobs: Optional[LogProbRows] = None  # the new tokens' log probabilities, for a request that asked
    prompt_logprobs: Optional[LogProbRows] = None  # its prompt's, on a piece (the first) of a request that asked
    # the engine's own time.monotonic() stamps of the request, where it reports them (vLLM with its statistics on):
    # (queued in its scheduler, first token made), on the first piece; they split the first token's `engine` part
    engine_times: Optional[tuple] = None
    cached_tokens: Optional[int] = None  # prompt tokens the engine's prefix cache served, where it reports them
    # the new tokens' ids, from an adapter that `continues` requests (sent as output_ids once their text is out)
    token_ids: Optional[Sequence[int]] = None
    # on the last piece of a kv_export request: the handle of the prompt's keys and values the engine keeps (kv_handle)
    kv_handle: Optional[str] = None


class EngineAdapter:
    """What an engine's model.py provides. Methods run on the runtime's event loop."""

    name = "engine"
    supported: frozenset = frozenset()  # contract inputs the engine honours (others are logged and ignored)
    serves = True  # False on ranks whose engine share takes no requests
    max_model_len: Optional[int] = None  # for triton_io's max_tokens check; None = let the engine decide
    # takes continue_ids and gives Piece.token_ids: the front end may move its requests mid-stream
    # (launcher/frontend/migration.py); `tokenizer` (decode(ids, skip_special_tokens=...)) says whose text is out
    continues = False
    tokenizer = None

    def cannot_continue(self, params) -> str:
        """Why a request with these SamplingParams cannot go on elsewhere after its tokens ("" where it can)."""
        return "" if self.continues and self.tokenizer is not None else f"engine={self.name} cannot"

    async def start(self) -> None:
        raise NotImplementedError

    def generate(self, request_id: str, request) -> AsyncIterator[Piece]:
        """request: launcher.python_backend.triton_io.GenerationRequest."""
        raise NotImplementedError

    async def abort(self, request_id: str) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    def wait_engine_exit(self) -> bool:
        """Worker ranks: block until the engine's processes are gone and return True; return False at
        once when this adapter cannot watch them."""
        return False


class Log:
    """pb_utils.Logger inside Triton, print elsewhere."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        try:
            import triton_python_backend_utils as pb_utils

            self._logger = getattr(pb_utils, "Logger", None)
        except ImportError:
            self._logger = None

    def _emit(self, level: str, msg: str) -> None:
        text = f"[{self.prefix}] {msg}"
        if self._logger is not None:
            getattr(self._logger, f"log_{level}")(text)
        else:
            print(text, flush=True)

    def info(self, msg):
        self._emit("info", msg)

    def warn(self, msg):
        self._emit("warn", msg)

    def error(self, msg):
        self._emit("error", msg)
