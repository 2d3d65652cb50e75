"""Build `config.pbtxt` files as `ModelConfig` protobuf messages.

No string templates and no sed: every file is produced by protobuf's text
format from a message, so it parses by construction (tests parse each one back).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from launcher import contract


def _pb():
    # tritonclient ships Triton's own model_config.proto compiled; lazy so `--help` stays fast.
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2


def dtype(name: str) -> int:
    pb = _pb()
    # Triton calls BYTES "TYPE_STRING" in config files.
    return pb.DataType.Value("TYPE_STRING" if name == "BYTES" else f"TYPE_{name}")


def tensor_input(
    name: str,
    dt: str,
    dims: Sequence[int],
    optional: bool = False,
    reshape: Optional[Sequence[int]] = None,
    ragged: bool = False,
):
    pb = _pb()
    t = pb.ModelInput(name=name, data_type=dtype(dt), dims=list(dims), optional=optional)
    if reshape is not None:
        t.reshape.shape.extend(list(reshape))
    if ragged:
        t.allow_ragged_batch = True
    return t


def tensor_output(name: str, dt: str, dims: Sequence[int]):
    pb = _pb()
    return pb.ModelOutput(name=name, data_type=dtype(dt), dims=list(dims))


def contract_inputs():
    return [tensor_input(t.name, t.dtype, t.dims, t.optional) for t in contract.INPUTS]


def contract_outputs():
    return [tensor_output(t.name, t.dtype, t.dims) for t in contract.OUTPUTS]


def set_parameters(cfg, params: Mapping[str, object]) -> None:
    """Triton parameters are string-valued; bools become "true"/"false", dicts JSON."""
    import json

    for k in sorted(params):
        v = params[k]
        if isinstance(v, bool):
            s = "true" if v else "false"
        elif isinstance(v, (dict, list)):
            s = json.dumps(v, sort_keys=True)
        else:
            s = str(v)
        cfg.parameters[k].string_value = s


def python_model(
    name: str,
    max_batch_size: int,
    params: Mapping[str, object],
    decoupled: bool = True,
    instances: int = 1,
    kind: str = "KIND_CPU",
    continues: bool = False,
):
    """A python-backend model serving the common contract (hf, vllm, sglang, lmdeploy); `continues`: it takes
    continue_ids and honours return_token_ids (Engine.continues_requests)."""
    pb = _pb()
    cfg = pb.ModelConfig(name=name, backend="python", max_batch_size=max_batch_size)
    cfg.model_transaction_policy.decoupled = decoupled
    cfg.input.extend(contract_inputs())
    cfg.output.extend(contract_outputs())
    cfg.instance_group.add(count=instances, kind=pb.ModelInstanceGroup.Kind.Value(kind))
    # the request parameters these models honour, for a client to read before it sends them (contract.PARAMETERS)
    honoured = [p.name for p in contract.PARAMETERS if continues or p.name != "return_token_ids"]
    set_parameters(cfg, {contract.HONOURED_PARAMETERS_KEY: ",".join(honoured), **params})
    return cfg


def to_text(cfg) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(cfg, use_short_repeated_primitives=True)


def parse(text: str):
    from google.protobuf import text_format

    return text_format.Parse(text, _pb().ModelConfig())
