"""A child service's config as data: the parent writes one dataclass as a JSON file, the child reads it back into the
same dataclass (`JsonConfig`: to_json / from_json, write / read).

The dataclass is the one place of the config's fields and defaults; nothing turns them into command-line options
and back.  Reading is strict, because the file crosses a process boundary (and may be written by hand to run a
service alone): a key the dataclass does not have, a field it requires that is missing, or a value of another type
than the field's is refused, naming the field, what it got and what it takes.  Checks across fields are the
dataclass's own (`__post_init__`, raising ValueError), run for both the parent's object and the child's.

Field types a config may use: str, int, float, bool, List[X], Tuple[X, ...] and fixed tuples such as Tuple[str, int]
(JSON lists read back as the field's list or tuple).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import os
import textwrap
import tokenize
import typing
from pathlib import Path
from typing import Any, Dict, List, Type, TypeVar, Union

C = TypeVar("C", bound="JsonConfig")

_SCALARS = {str: "string", int: "integer", float: "number", bool: "true/false"}  # JSON's names for them
_ARTICLE = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


class ConfigError(ValueError):
    """A config file a child service cannot take; the message names the file, the field and the fix."""


def _shape(tp) -> str:
    """A type as JSON would show it: `[[string, integer], ...]`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list or (origin is tuple and len(args) == 2 and args[1] is Ellipsis):
        return f"[{_shape(args[0])}, ...]"
    if origin is tuple:
        return "[" + ", ".join(_shape(a) for a in args) + "]"
    return _SCALARS.get(tp, repr(tp))


def kind(tp) -> str:
    """How a field's type reads in a message: `an integer`, `a list [[string, integer], ...]`."""
    return _ARTICLE[tp] if tp in _ARTICLE else f"a list {_shape(tp)}"


def _items(value, args, name: str) -> Any:
    """A JSON list as the tuple type `args` (homogeneous `X, ...` or fixed); None where it does not fit."""
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(coerce(v, args[0], f"{name}[{i}]") for i, v in enumerate(value))
    if len(value) != len(args):
        return None
    return tuple(coerce(v, a, f"{name}[{i}]") for i, (v, a) in enumerate(zip(value, args)))


def coerce(value, tp, name: str) -> Any:
    """`value`, read from JSON, as the field type `tp` (a list becomes a tuple where the field is one; an integer a
    float where the field is a float); raises ConfigError naming `name` where it is of another type."""
    origin = typing.get_origin(tp)
    out = None
    if origin is list and isinstance(value, list):
        out = [coerce(v, typing.get_args(tp)[0], f"{name}[{i}]") for i, v in enumerate(value)]
    elif origin is tuple and isinstance(value, (list, tuple)):
        out = _items(value, typing.get_args(tp), name)
    elif tp is bool and isinstance(value, bool):
        out = value
    elif tp is int and isinstance(value, int) and not isinstance(value, bool):
        out = value
    elif tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        out = float(value)
    elif tp is str and isinstance(value, str):
        out = value
    elif origin not in (list, tuple) and tp not in _SCALARS:
        raise TypeError(f"{name}: a config field of type {tp!r} has no JSON form here (see launcher/procs/config.py)")
    if out is None:
        raise ConfigError(f"{name} must be {kind(tp)}, got {json.dumps(value)}: write it as {kind(tp)}")
    return out


class JsonConfig:
    """What a config dataclass handed to a child service gets: its JSON form and the strict way back."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls: Type[C], text: str, where: str = "") -> C:
        """The config `text` (a JSON object of this dataclass's fields) says; `where` (the file) leads any error."""
        where = f"{where}: " if where else ""
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{where}not JSON ({e}); write one JSON object of {cls.__name__}'s fields") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{where}{cls.__name__} is a JSON object of its fields, got {type(data).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ConfigError(
                f"{where}unknown key(s) {unknown}: {cls.__name__} has {sorted(fields)}; remove them or fix the spelling"
            )
        missing = [n for n, f in fields.items() if n not in data and _required(f)]
        if missing:
            raise ConfigError(f"{where}missing key(s) {missing}: {cls.__name__} has no default for them; give them")
        hints = typing.get_type_hints(cls)
        try:
            values = {n: coerce(v, hints[n], f"{cls.__name__}.{n}") for n, v in data.items()}
            return cls(**values)
        except ValueError as e:  # ConfigError, or the dataclass's own checks across fields
            raise ConfigError(f"{where}{e}") from None

    def write(self, path: Union[str, os.PathLike]) -> Path:
        """Whole or not at all (a rename): the child never reads half a file."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.to_json() + "\n")
        tmp.rename(path)
        return path

    @classmethod
    def read(cls: Type[C], path: Union[str, os.PathLike]) -> C:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read the config file {path}: {e.strerror}") from None
        return cls.from_json(text, str(path))

    @classmethod
    def fields_help(cls) -> str:
        """For a child's --help: each field's key, the type it takes, its default (or `required`), and the comment
        the dataclass gives it."""
        hints = typing.get_type_hints(cls)
        comments = field_comments(cls)
        lines: List[str] = []
        for f in dataclasses.fields(cls):
            if f.init:
                given = "required" if _required(f) else f"default {json.dumps(_default(f))}"
                lines.append(f"  {f.name}: {kind(hints[f.name])} ({given})")
                lines += textwrap.wrap(comments.get(f.name, ""), 100, initial_indent=" " * 6, subsequent_indent=" " * 6)
        return "\n".join(lines)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _default(f: dataclasses.Field) -> Any:
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return list(value) if isinstance(value, tuple) else value


def field_comments(cls) -> Dict[str, str]:
    """{field: its comment} from the dataclass's source: the comment at the end of the field's line, else the comment
    lines right above it ({} where the source cannot be read)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: Dict[int, str] = {}  # line -> the comment on it
    alone = set()  # lines holding nothing but a comment
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
            if not tok.line[: tok.start[1]].strip():
                alone.add(tok.start[0])
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if node.end_lineno in comments and node.end_lineno not in alone:
                out[node.target.id] = comments[node.end_lineno]
                continue
            above, line = [], node.lineno - 1
            while line in alone:
                above.insert(0, comments[line])
                line -= 1
            out[node.target.id] = " ".join(above)
    return out
