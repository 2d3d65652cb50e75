"""`EndpointRecord`: endpoint.json, which rank 0 writes once the job really serves (launcher/rank/rank.py publish)
and the launching side, llmlaunch-status, a sweep and the benchmarks read (through launcher/rundir.py).

Its presence says the job serves; its content where. One writer and every reader go through this class: a record
missing a field, with an unknown one or with a value of the wrong type is refused naming it (a file of another
llmlaunch version, or edited by hand), never read with a silent default.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from typing import Any, Dict, Optional, Tuple, get_args, get_origin, get_type_hints

from launcher.errors import LaunchError


@dataclass(frozen=True)
class RankEntry:
    """One rank of the job."""

    rank: int  # its global rank
    addr: str  # the address the other ranks reach it at (the rendezvous's)


@dataclass(frozen=True)
class ReplicaEntry:
    """One replica leader's own server (with replicas > 1 the public port is the front end's)."""

    replica: int  # which data-parallel copy of the model
    addr: str  # its leader's address
    grpc_port: int  # the gRPC port its leader's server bound
    metrics_url: str  # its leader's tritonserver metrics (its first-token split, engine totals); "" without a port


@dataclass(frozen=True)
class FrontendEntry:
    """Rank 0's replicas front end (launcher/frontend), where replicas > 1."""

    pid: int  # its process id on rank 0's node
    processes: int  # how many processes it runs


@dataclass(frozen=True)
class EndpointRecord:
    url: str  # grpc://host:port clients send to: rank 0's server, or its front end with replicas > 1
    model: str  # the model name requests go to
    job_id: str  # the Slurm job id, or the local launcher's pid
    host: str  # where rank 0's servers are reached
    grpc_port: int  # the public gRPC port (url's)
    http_port: Optional[int]  # the public HTTP port; None behind the front end, which speaks gRPC only
    metrics_port: int  # the public metrics port: rank 0's tritonserver's, or the front end's
    metrics_url: str  # http://host:metrics_port/metrics
    openai_port: int  # the OpenAI API's port
    openai_url: str  # the OpenAI API's base URL (…/v1)
    token: str  # this run's rendezvous token: a record an earlier run of the same dir left does not count
    ready_s: float  # seconds rank 0's server took from its start to answering its first request
    ranks: Tuple[RankEntry, ...]  # every rank, by global rank
    replicas: Tuple[ReplicaEntry, ...]  # every replica leader, by replica
    frontend: Optional[FrontendEntry] = None  # the replicas' front end; None with one replica

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "endpoint.json") -> "EndpointRecord":
        """The record `doc` holds; LaunchError naming the field when one is missing, unknown or of the wrong type."""
        return _load(cls, doc, where)

    @classmethod
    def from_json(cls, text: str, where: str = "endpoint.json") -> "EndpointRecord":
        return cls.from_dict(json.loads(text), where)


def _refuse(where: str, why: str) -> LaunchError:
    return LaunchError(
        (
            where,
            why,
            "it was not written by this llmlaunch's rank 0 (another version, or edited): launch the job again with "
            "this version, or read the file by hand",
        )
    )


def _load(cls, doc: Any, where: str):
    """`doc` as the dataclass `cls`, checked field by field (nested dataclasses, tuples of them, Optional)."""
    if not isinstance(doc, dict):
        raise _refuse(where, f"a {type(doc).__name__} where an object of {cls.__name__} was expected")
    hints = get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(doc) - set(names))
    if unknown:
        raise _refuse(where, f"unknown fields {unknown} (those of {cls.__name__}: {names})")
    required = [f.name for f in fields(cls) if f.default is MISSING]
    missing = [n for n in required if n not in doc]
    if missing:
        raise _refuse(where, f"missing fields {missing}")
    return cls(**{n: _value(hints[n], doc[n], f"{where}: {n}") for n in names if n in doc})


def _value(hint, value: Any, where: str):
    args = get_args(hint)
    if type(None) in args:  # Optional[X]
        return None if value is None else _value(next(a for a in args if a is not type(None)), value, where)
    if get_origin(hint) is tuple:
        if not isinstance(value, list):
            raise _refuse(where, f"{value!r} is not a list")
        return tuple(_value(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if is_dataclass(hint):
        return _load(hint, value, where)
    kinds, word = _SCALARS[hint]
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise _refuse(where, f"{value!r} is not {word}")
    return float(value) if hint is float else value


_SCALARS = {int: (int, "a whole number"), float: ((int, float), "a number"), str: (str, "a string")}
