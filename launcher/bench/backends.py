"""The protocols llmlaunch-bench can load a server through (`--backend`), as registry entries: the same load
(launcher/bench/runner.py) and metrics whichever carries the requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Backend:
    name: str  # the --backend value
    stream: Callable  # stream(url, on_done=...) -> a TritonStream-like carrier (submit, wait, cancel, close)
    build: Callable  # build(model, gen, request_id, parameters) -> what stream.submit takes
    url: Callable  # url(text) -> the normalized URL (raises ValueError on a bad one)
    default_model: Callable  # default_model(url) -> the model the server serves
    triton_parameters: bool  # Triton request parameters (final_counts_only, --request-param) reach the model
    doc: str  # what it speaks, for --help


def _triton():
    from launcher.client.connection import parse_url
    from launcher.client.control import default_model
    from launcher.client.request import build_request
    from launcher.client.stream import TritonStream

    return Backend(
        "triton-grpc",
        TritonStream,
        build_request,
        parse_url,
        default_model,
        True,
        "KServe v2 gRPC streaming (ModelStreamInfer), the request contract of launcher/contract.py",
    )


def _openai(chat: bool):
    from launcher.bench.openai_stream import OpenAIStream, base_url, request_builder, served_model

    return Backend(
        "openai-chat" if chat else "openai-completions",
        OpenAIStream,
        request_builder(chat),
        base_url,
        served_model,
        False,
        f"OpenAI HTTP, POST /v1/{'chat/completions' if chat else 'completions'} with SSE streaming and "
        "stream_options.include_usage (any OpenAI-compatible server: llmlaunch's, vLLM's, SGLang's)",
    )


_MAKERS = {"triton-grpc": _triton, "openai-chat": lambda: _openai(True), "openai-completions": lambda: _openai(False)}
NAMES = tuple(_MAKERS)
DEFAULT = "triton-grpc"


def get(name: str) -> Backend:
    """The backend called `name` (imports its client only when asked)."""
    if name not in _MAKERS:
        raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(NAMES)}")
    return _MAKERS[name]()
