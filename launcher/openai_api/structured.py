"""Structured output on the OpenAI API -> the contract's guide (guided_decoding_guide_type, guided_decoding_guide).

Three spellings reach the same guide, one per request:
* OpenAI's `response_format`: {"type": "text"} (none), {"type": "json_object"}, {"type": "json_schema",
  "json_schema": {"name", "schema", "strict"}};
* vLLM's `structured_outputs`: {"json": schema} | {"regex": str} | {"choice": [str]} | {"grammar": str} |
  {"json_object": true};
* vLLM's older top-level `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, which client scripts
  written for it still send.
A choice becomes an EBNF grammar of its strings (every engine compiles xgrammar's EBNF).  Pure functions: the engine
compiles the guide and refuses one it cannot (the API answers that with a 400).
"""

from __future__ import annotations

import json

from launcher.openai_api.errors import bad

# vLLM's structured_outputs constraint -> the contract's kind (choice is turned into ebnf_grammar)
_CONSTRAINTS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "ebnf_grammar"}
_GUIDED = {f"guided_{k}": k for k in _CONSTRAINTS}  # vLLM's older top-level names


def guide_of(body: dict) -> tuple[str, str] | None:
    """The request's guide as (kind, guide) of launcher.contract.GUIDE_KINDS, None for free text; ApiError naming
    the field where it is malformed or where two fields ask for a constraint."""
    found = []
    rf = body.get("response_format")
    if rf is not None:
        guide = _response_format(rf)
        if guide is not None:
            found.append(("response_format", guide))
    so = body.get("structured_outputs")
    if so is not None:
        found.append(("structured_outputs", _structured_outputs(so)))
    for name, key in _GUIDED.items():
        if body.get(name) is not None:
            found.append((name, _constraint(name, key, body[name])))
    if len(found) > 1:
        names = " and ".join(n for n, _ in found)
        raise bad(found[1][0], f"{names} both constrain the output; send one")
    return found[0][1] if found else None


def _response_format(rf) -> tuple[str, str] | None:
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise bad("response_format", f'must be {{"type": "text" | "json_object" | "json_schema", ...}}, got {rf!r}')
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return ("json", "")
    spec = rf.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), (dict, bool)):
        raise bad(
            "response_format.json_schema",
            'must be {"name": ..., "schema": {a JSON schema}}, got ' + repr(spec)[:200],
        )
    return ("json_schema", json.dumps(spec["schema"]))


def _structured_outputs(so) -> tuple[str, str]:
    if not isinstance(so, dict):
        raise bad("structured_outputs", f"must be an object with one constraint, got {so!r}")
    unknown = sorted(set(so) - set(_CONSTRAINTS) - {"json_object"})
    if unknown:
        raise bad(
            "structured_outputs",
            f"{unknown} are not served; one of {sorted(_CONSTRAINTS)} or json_object is",
        )
    asked = [k for k in (*_CONSTRAINTS, "json_object") if so.get(k) is not None]
    if len(asked) != 1:
        raise bad("structured_outputs", f"send exactly one of {sorted(_CONSTRAINTS)} or json_object, got {asked}")
    key = asked[0]
    if key == "json_object":
        if so[key] is not True:
            raise bad("structured_outputs.json_object", f"must be true, got {so[key]!r}")
        return ("json", "")
    return _constraint(f"structured_outputs.{key}", key, so[key])


def _constraint(param: str, key: str, value) -> tuple[str, str]:
    if key == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise bad(param, f"is not JSON: {exc}") from None
        if not isinstance(value, (dict, bool)):
            raise bad(param, f"must be a JSON schema (an object), got {value!r}")
        return ("json_schema", json.dumps(value))
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad(param, f"must be a non-empty list of non-empty strings, got {value!r}")
        return ("ebnf_grammar", choice_grammar(value))
    if not isinstance(value, str) or not value:
        raise bad(param, f"must be a non-empty string, got {value!r}")
    return (_CONSTRAINTS[key], value)


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose sentences are exactly `choices`."""
    return "root ::= " + " | ".join(_literal(c) for c in dict.fromkeys(choices))


def _literal(text: str) -> str:
    """`text` as an EBNF string literal: quotes and backslashes escaped, control characters as \\xHH."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
