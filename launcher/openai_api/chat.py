"""The model's chat template, rendered as transformers' `apply_chat_template` renders it, without transformers.

The API process only needs the template text, the tokenizer's special tokens and whether the engine's tokenizer adds
BOS.  transformers brings torch with it: 300 MiB of the API process's memory (PSS) against 42 MiB for jinja2 and
tokenizers (benchmark/memory.py measures the whole launch).  So the template is read from the tokenizer folder
(`chat_template.jinja`, `tokenizer_config.json`'s `chat_template`, or `chat_template.json`) and rendered in the same
sandboxed jinja2 environment transformers builds (trim_blocks, lstrip_blocks, loop controls, its `tojson`,
`raise_exception`, `strftime_now`), with the same variables (the messages without None-valued keys, the special tokens
by name, `add_generation_prompt`).  tests/unit/test_openai_chat.py holds both renderings side by side.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Optional

from launcher.openai_api import translate as tr

# The named special tokens a template may read (transformers' SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def read_template(folder: str) -> tuple:
    """(template text or "", the special tokens by name) from a tokenizer folder; raises ValueError naming the file
    that could not be read."""
    config = _json(folder, "tokenizer_config.json")
    tokens = {**_json(folder, "special_tokens_map.json"), **config}
    special = {k: _content(tokens[k]) for k in SPECIAL_TOKENS if tokens.get(k) is not None}
    path = os.path.join(folder, "chat_template.jinja")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return f.read(), special
    template = config.get("chat_template") or _json(folder, "chat_template.json").get("chat_template") or ""
    if isinstance(template, list):  # named templates: the one called "default" serves chat without tools
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or ""
    return (template if isinstance(template, str) else ""), special


def _json(folder: str, name: str) -> dict:
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} did not read as JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _content(token) -> str:
    # a token is its text, or an AddedToken's dict ({"content": "<s>", "lstrip": false, ...})
    return str(token.get("content", "")) if isinstance(token, dict) else str(token)


def compile_template(text: str):
    """The jinja2 template, in the environment transformers renders chat templates in (templates from the Hub are
    untrusted code: the sandbox is immutable, and namespaces refuse underscore names)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja2's own tojson escapes HTML characters, which a prompt must keep
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, attrs = args[0], dict(*args[1:], **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"a chat template cannot set {name!r} on a namespace")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(
        raise_exception=raise_exception,
        strftime_now=lambda fmt: datetime.now().strftime(fmt),
        dict=dict,
        namespace=Namespace,
    )
    return env.from_string(text)


def tokenizer_adds_bos(folder: str, bos: str) -> bool:
    """Whether the engines' tokenizer (transformers' with its defaults) puts `bos` before a text.  tokenizer.json's
    post-processor says so for the tokenizers models ship; where tokenizer_config.json's `add_bos_token` says
    otherwise (transformers may rebuild the post-processor from it, depending on the tokenizer's class), or where
    there is no tokenizer.json (a sentencepiece-only tokenizer), transformers itself is asked."""
    path = os.path.join(folder, "tokenizer.json")
    if os.path.exists(path):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        ids, bos_id = tok.encode("x").ids, tok.token_to_id(bos)
        adds = bool(ids) and bos_id is not None and ids[0] == bos_id
        if _json(folder, "tokenizer_config.json").get("add_bos_token", adds) == adds:
            return adds
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok("x")["input_ids"]
    return bool(ids) and ids[0] == tok.bos_token_id


class ChatTemplate:
    """The model's chat template, from its tokenizer folder; `load()` at start-up, then `template(messages)`."""

    def __init__(self, tokenizer_path: str, model_name: str):
        self.path, self.model_name = tokenizer_path, model_name
        self._template = None
        self._special: dict = {}
        self._why = ""
        self._bos = ""  # the BOS text a rendered prompt starts with that the engine's tokenizer adds again

    def load(self) -> None:
        """Read and compile the template now (at start-up: a broken one is named before the first chat request)."""
        if not self.path:
            self._why = "no tokenizer folder was given to the server"
            return
        try:
            text, self._special = read_template(self.path)
        except ValueError as e:  # the API still serves /v1/completions
            self._why = f"its tokenizer at {self.path} did not load ({e})"
            return
        if not text:
            self._why = f"its tokenizer ({self.path}) has no chat template"
            return
        try:
            self._template = compile_template(text)
        except Exception as e:  # jinja2's TemplateSyntaxError
            self._why = f"its chat template ({self.path}) did not compile ({e})"
            return
        # Templates that write the BOS token (Llama 3's `<|begin_of_text|>`) meet engines that tokenize the prompt
        # text with the tokenizer's defaults, which add BOS too: the model would see it twice, as vLLM's server
        # avoids by tokenizing chat prompts without special tokens.  Where the tokenizer adds it, the text's goes.
        bos = self._special.get("bos_token")
        if bos and tokenizer_adds_bos(self.path, bos):
            self._bos = bos

    def __call__(self, messages: list) -> str:
        if self._why:
            raise tr.ApiError(
                400,
                f"model {self.model_name!r} cannot serve chat: {self._why}; use /v1/completions "
                "with a plain prompt, or serve a model whose tokenizer has a chat template",
                param="messages",
                code="no_chat_template",
            )
        try:
            prompt = self.render(messages)
        except Exception as e:  # the template refused these messages (roles out of order, ...)
            raise tr.ApiError(
                400, f"messages: the model's chat template refused them: {e}", param="messages", code="invalid_value"
            ) from None
        return prompt[len(self._bos) :] if self._bos and prompt.startswith(self._bos) else prompt

    def render(self, messages: list, add_generation_prompt: bool = True, tools: Optional[list] = None) -> str:
        """The template's text for `messages`, as transformers renders it (keys whose value is None dropped: OpenAI
        clients send `content: null` beside tool calls, which templates print as "None")."""
        chat = [{k: v for k, v in m.items() if v is not None} if isinstance(m, dict) else m for m in messages]
        return self._template.render(
            messages=chat, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **self._special
        )
