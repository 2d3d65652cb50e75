"""Questions to the server about its models (tritonclient's unary calls): the repository index, the model to talk
to by default, and what a model's config says it honours (request parameters) and tokenizes with."""

from __future__ import annotations

import os
import sys

from launcher.client.connection import ClientError, parse_url


def list_models(url: str, timeout: float = 10.0) -> list[dict]:
    """The server's repository index: [{'name', 'version', 'state', 'reason'}]."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(parse_url(url))
    try:
        index = client.get_model_repository_index(as_json=True, client_timeout=timeout)
    except InferenceServerException as exc:
        raise ClientError(f"cannot list models at {parse_url(url)}: {exc.message()}") from None
    finally:
        client.close()
    return [dict(m) for m in index.get("models", [])]


def honoured_parameters(url: str, model: str, timeout: float = 10.0) -> frozenset:
    """The request parameters of launcher.contract.PARAMETERS that `model` says it honours: its config's
    `llmlaunch_request_parameters` (contract.HONOURED_PARAMETERS_KEY, comma-separated; launcher.pbtxt writes it for
    llmlaunch's models).  Empty for a model without it (the TensorRT-LLM ensemble, a Triton model made elsewhere) and
    where the config cannot be read: a parameter is sent only to a model known to take it, since some fail a request
    on one they do not know (Triton's vLLM backend)."""
    import tritonclient.grpc as grpcclient

    from launcher.contract import HONOURED_PARAMETERS_KEY, PARAMETERS

    client = grpcclient.InferenceServerClient(parse_url(url))
    try:
        config = client.get_model_config(model, as_json=True, client_timeout=timeout).get("config", {})
    except Exception:
        return frozenset()
    finally:
        client.close()
    listed = config.get("parameters", {}).get(HONOURED_PARAMETERS_KEY, {}).get("string_value", "")
    return frozenset({n.strip() for n in listed.split(",")} & {p.name for p in PARAMETERS})


def served_tokenizer(url: str, model: str, timeout: float = 10.0) -> str:
    """The tokenizer folder the served `model` names in its config (contract.TOKENIZER_KEYS), when that folder is
    readable here; "" otherwise (a model made elsewhere, a path only the cluster's nodes see, no server)."""
    import tritonclient.grpc as grpcclient

    from launcher.contract import TOKENIZER_KEYS

    client = grpcclient.InferenceServerClient(parse_url(url))
    try:
        params = (
            client.get_model_config(model, as_json=True, client_timeout=timeout).get("config", {}).get("parameters", {})
        )
    except Exception:
        return ""
    finally:
        client.close()
    for key in TOKENIZER_KEYS:
        path = params.get(key, {}).get("string_value", "")
        if path and os.path.isdir(path):
            return path
    return ""


def default_model(url: str) -> str:
    """The model to talk to when --model is not given: the only ready model that
    takes text_input and max_tokens; among several, `ensemble`, else the first."""
    import tritonclient.grpc as grpcclient

    ready = [m["name"] for m in list_models(url) if m.get("state") == "READY"]
    if not ready:
        raise ClientError(f"no model is READY at {parse_url(url)}")
    client = grpcclient.InferenceServerClient(parse_url(url))
    try:
        speaking = []
        for name in ready:
            try:
                meta = client.get_model_metadata(name, as_json=True)
            except Exception:
                continue
            names = {i["name"] for i in meta.get("inputs", [])}
            if {"text_input", "max_tokens"} <= names:
                speaking.append(name)
    finally:
        client.close()
    candidates = speaking or ready
    choice = "ensemble" if "ensemble" in candidates else candidates[0]
    if len(candidates) > 1:
        print(
            f"note: several models are ready ({', '.join(candidates)}); using {choice!r} (pass --model)",
            file=sys.stderr,
        )
    return choice
