"""Each config field's domain, declared beside the field, and the one validator that reads the declarations.

A field of launcher/schema.py is declared with `arg(domain, default)`: what values it takes (a range, choices, a
name pattern, a path and its kind, "0 = auto" where zero means automatic) sits next to its definition, and
`problems(config)` walks every field of a config and asks its domain. A field without a domain is a programming
error that `problems` raises at once, so no field can be added without its check. Rules across fields (tp x
replicas against the GPUs, ports that must differ) stay in launcher/spec.py and the engines' `check`.

Pure: reads no files. A path's kind (`Path.kind`) is what launcher/hostcheck.py looks for on the launch host.
Every problem is (what, why, fix) as `launcher.errors.LaunchError` prints it.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

Problem = Tuple[str, str, str]

# The choices of the config's fixed-choice fields (launcher/schema.py declares which field takes which)
ROUTINGS = (
    "least_outstanding",
    "prefix",
    "kv",
)  # serve.routing: the registry launcher.frontend.routing holds one class for each
# serve.router: where the front end runs: in the job with the replicas, or apart from them (launcher/service/), as a
# process on the launch host or a Slurm job of its own
ROUTERS = ("in_job", "host", "job")
# serve.autoscale.signal: what the service scales by; the registry launcher/service/signals.py holds one entry for each
SCALE_SIGNALS = ("in_flight", "kv_cache", "ttft_p90")
GPU_REQUESTS = ("gpus-per-node", "gres", "none")  # cluster.gpu_request
MPI_TYPES = ("pmix", "pmi2", "none")  # cluster.mpi (srun --mpi=)
CONTAINER_RUNTIMES = ("none", "pyxis")  # cluster.container.runtime
DEVICES = ("auto", "cpu", "cuda")  # engine.device
DTYPES = ("auto", "float32", "bfloat16", "float16")  # model.dtype
# serve.* ports rank 0 offers clients, each its own: tritonserver's three, and the OpenAI API's (launcher/openai_api)
PUBLIC_PORTS = ("grpc_port", "http_port", "metrics_port", "openai_port")

_KEY = "llmlaunch_domain"  # the field metadata key a domain is stored under
_NO_DEFAULT = object()


def arg(domain: "Domain", default: Any = _NO_DEFAULT, *, factory: Optional[Callable[[], Any]] = None) -> Any:
    """A dataclass field with its domain: `tp: int = arg(Pow2(), 1)`, `mounts: List[str] = arg(Items(...), factory=list)`."""
    meta = {_KEY: domain}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    if default is _NO_DEFAULT:
        raise TypeError("arg() needs a default or a factory")
    return dataclasses.field(default=default, metadata=meta)


def domain_of(f: dataclasses.Field) -> Optional["Domain"]:
    return f.metadata.get(_KEY)


def problems(config: Any, prefix: str = "") -> List[Problem]:
    """Every field of the dataclass `config` (nested ones too) checked against its declared domain."""
    out: List[Problem] = []
    for f in dataclasses.fields(config):
        domain = domain_of(f)
        if domain is None:
            raise TypeError(
                f"{type(config).__name__}.{f.name} declares no domain: declare it with "
                "launcher.domains.arg(<domain>, <default>) in launcher/schema.py"
            )
        value = getattr(config, f.name)
        if isinstance(domain, Nested):
            if dataclasses.is_dataclass(value):
                out += problems(value, f"{prefix}{f.name}.")
            continue
        out += domain.problems(prefix + f.name, value)
    return out


def _what(key: str, value: Any) -> str:
    return f"{key}={value!r}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Domain:
    """What one field takes. `why(value)` says why a value is not in it (None: it is); `fix` is the fix line, a
    template with {key} (the field's dotted name), or "" for the domain's own."""

    fix: str = ""

    def why(self, value: Any) -> Optional[str]:
        raise NotImplementedError

    def default_fix(self, key: str) -> str:
        raise NotImplementedError

    def fix_line(self, key: str) -> str:
        return self.fix.format(key=key) if self.fix else self.default_fix(key)

    def problems(self, key: str, value: Any) -> List[Problem]:
        why = self.why(value)
        if why is None:
            return []
        return [(_what(key, value), why, self.fix_line(key))]


@dataclass(frozen=True)
class Nested(Domain):
    """A nested config: each of its own fields declares its domain."""

    def why(self, value):
        return None

    def default_fix(self, key):
        return f"set {key}'s fields one by one ({key}.<field>=value), or choose a profile ({key.split('.')[0]}=<name>)"


@dataclass(frozen=True)
class Int(Domain):
    """A whole number from `min` (to `max`); with `zero`, 0 is allowed and means that (0 = auto)."""

    what: str  # what the number counts, for the message
    min: int = 1
    max: Optional[int] = None
    zero: str = ""  # what 0 means where 0 picks a value itself; "" = 0 is not special
    fix: str = ""

    @property
    def low(self) -> int:
        return 0 if self.zero else self.min

    def why(self, v):
        if _is_int(v) and v >= self.low and (self.max is None or v <= self.max):
            return None
        top = f" to {self.max}" if self.max is not None else ""
        auto = f", 0 = {self.zero}" if self.zero else ""
        return f"{self.what}: a whole number from {self.low}{top}{auto}"

    def default_fix(self, key):
        return f"set {key} to a whole number >= {self.low}" + (f" (0 = {self.zero})" if self.zero else "")


@dataclass(frozen=True)
class Float(Domain):
    """A number in [lo, hi] (an end excluded where `lo_open` / `hi_open`); with `zero`, 0 also, meaning that."""

    what: str
    lo: float = 0.0
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = False
    zero: str = ""
    fix: str = ""

    def _range(self) -> str:
        left = "(" if self.lo_open else "["
        right = ")" if self.hi_open else "]"
        return f"{left}{self.lo:g}, {'inf)' if self.hi is None else f'{self.hi:g}{right}'}"

    def why(self, v):
        if _is_number(v):
            if self.zero and v == 0:
                return None
            above = v > self.lo if self.lo_open else v >= self.lo
            below = self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)
            if above and below:
                return None
        auto = f", or 0 = {self.zero}" if self.zero else ""
        return f"{self.what}: a number in {self._range()}{auto}"

    def default_fix(self, key):
        return f"set {key} to a number in {self._range()}" + (f" (0 = {self.zero})" if self.zero else "")


@dataclass(frozen=True)
class Choice(Domain):
    """One of `values` (a tuple, or a function returning them where the choices live elsewhere, e.g. a registry);
    `normalize` maps a value first (a str field given `true` by Hydra arrives as 'True')."""

    values: Union[Tuple[str, ...], Callable[[], Sequence[str]]]
    normalize: Optional[Callable[[Any], Any]] = None
    fix: str = ""

    def allowed(self) -> Tuple[str, ...]:
        return tuple(self.values() if callable(self.values) else self.values)

    def _shown(self) -> str:
        return ", ".join(str(v) if v != "" else "''" for v in self.allowed())

    def why(self, v):
        v = self.normalize(v) if self.normalize else v
        return None if v in self.allowed() else f"not one of {self._shown()}"

    def default_fix(self, key):
        return f"set {key} to one of: {self._shown()}"


@dataclass(frozen=True)
class Flag(Domain):
    """true or false."""

    fix: str = ""

    def why(self, v):
        return None if isinstance(v, bool) else "not true or false"

    def default_fix(self, key):
        return f"set {key}=true or {key}=false"


@dataclass(frozen=True)
class Pattern(Domain):
    """A string matching `regex` ("" too where `empty` says what empty means)."""

    regex: str
    what: str  # why the value must match, for the message
    fix: str
    empty: str = ""  # what "" means where it is allowed; "" = not allowed unless the regex takes it

    def why(self, v):
        if isinstance(v, str) and ((self.empty and v == "") or re.fullmatch(self.regex, v)):
            return None
        return self.what


# Characters allowed in values that land in `#SBATCH` lines or file names. Those lines are not parsed by a shell
# (so quoting cannot help) and Slurm splits on whitespace, so anything else is refused rather than escaped.
SBATCH_TOKEN = r"[A-Za-z0-9._+@%:=,/~-]*"
SAFE_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
ENV_KEY = r"[A-Za-z_][A-Za-z0-9_]*"
IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
SLURM_TIME = r"(\d+-)?\d{1,2}:\d{2}:\d{2}|\d+"


def eval_tasks() -> Tuple[str, ...]:
    """bench.eval's choices: llmlaunch-bench --eval's tasks (launcher/data/eval_tasks.json, which
    launcher/bench/evaluate.py runs)."""
    import json

    from launcher.paths import EVAL_TASKS

    with open(EVAL_TASKS) as f:
        return tuple(json.load(f)["tasks"])


def time_minutes(t: str) -> int:
    """A Slurm time limit (SLURM_TIME: minutes, HH:MM:SS or D-HH:MM:SS) in whole minutes, a started minute counted."""
    t = str(t)
    if t.isdigit():
        return int(t)
    days = 0
    if "-" in t:
        d, t = t.split("-", 1)
        days = int(d)
    h, m, s = (int(x) for x in t.split(":"))
    return days * 1440 + h * 60 + m + (1 if s else 0)


def Name(what: str = "names go into scripts, file names and Triton model names", empty: str = "") -> Pattern:
    """A name: 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit."""
    return Pattern(
        SAFE_NAME, what, "give {key} 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", empty
    )


def SbatchToken() -> Pattern:
    return Pattern(
        SBATCH_TOKEN,
        "it goes into an #SBATCH line, which no shell parses, so spaces, quotes, $, `, ; and "
        "newlines cannot be escaped there",
        "use only letters, digits and . _ + @ % : = , / ~ - in {key}",
    )


@dataclass(frozen=True)
class Path(Domain):
    """A path: a string without newline or NUL (paths go into commands shell-quoted, but those break even quoted
    #SBATCH and log handling). `kind` is what launcher/hostcheck.py looks for where the path is visible from the
    launch host: one of hostcheck.KINDS, or "engine" where the engine decides (Engine.host_paths), or "" for
    a path only the job's nodes or its container see."""

    kind: str
    token: bool = False  # it also goes into an #SBATCH line (SbatchToken's characters only)
    absolute: bool = False  # it must be absolute (a path inside a container)
    fix: str = ""

    def why(self, v):
        if not isinstance(v, str):
            return "not a path"
        if any(c in v for c in "\n\r\0"):
            return "contains a newline or NUL character"
        if self.token and v:
            return SbatchToken().why(v)
        if self.absolute and v and not v.startswith("/"):
            return "must be an absolute path (it is resolved inside the container)"
        return None

    def default_fix(self, key):
        if self.token:
            return f"give {key} a path of letters, digits and . _ + @ % : = , / ~ - only"
        return (
            f"give {key} an absolute path, e.g. /workspace"
            if self.absolute
            else f"give {key} a path without control characters"
        )


@dataclass(frozen=True)
class ShellLine(Domain):
    """One line of shell: no newline, and quotes that close (shlex splits it)."""

    fix: str = ""

    def why(self, v):
        if not isinstance(v, str) or "\n" in v or "\0" in v:
            return "one shell line per entry (no newline or NUL)"
        try:
            shlex.split(v)
        except ValueError as e:
            return f"not a shell line: {e}"
        return None

    def default_fix(self, key):
        return f"close the quotes in {key}, or give each command its own entry"


@dataclass(frozen=True)
class Items(Domain):
    """A list, each item in `item`'s domain (its key shown as key[i])."""

    item: Domain
    fix: str = ""

    def why(self, v):
        return None if isinstance(v, (list, tuple)) else "not a list"

    def default_fix(self, key):
        return f"give {key} as a list, e.g. {key}=[a,b]"

    def problems(self, key, value):
        out = super().problems(key, value)
        if out:
            return out
        for i, x in enumerate(value):
            out += self.item.problems(f"{key}[{i}]", x)
        return out


@dataclass(frozen=True)
class FreeMapping(Domain):
    """A free mapping (the user's own keys: environment variables, an engine's arguments): keys matching
    `key_regex`, each value in `value` (None: any)."""

    key_regex: str
    key_what: str  # what a key must be, for the message
    value: Optional[Domain] = None
    fix: str = ""

    def why(self, v):
        return None if isinstance(v, dict) else "not a mapping"

    def default_fix(self, key):
        return f"give {key} as a mapping, e.g. {key}={{A: b}}"

    def problems(self, key, value):
        out = super().problems(key, value)
        if out:
            return out
        for k, x in value.items():
            if not isinstance(k, str) or not re.fullmatch(self.key_regex, k):
                out.append((f"{key} key {k!r}", f"not {self.key_what}", f"use {self.key_what} as the keys of {key}"))
            elif self.value is not None:
                out += self.value.problems(f"{key}.{k}", x)
        return out
