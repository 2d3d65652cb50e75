"""The OpenAI API's chat prompts (launcher/openai_api/chat.py): the model's template rendered without transformers,
side by side with transformers' apply_chat_template on the same tokenizer folder, the BOS a template writes that the
engine's tokenizer adds again, templates that refuse messages or do not compile, and the API process free of torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launcher.openai_api.chat import ChatTemplate
from launcher.openai_api.translate import ApiError

# Templates in the shapes the Hub's models ship, each using what transformers' environment gives a template.
CHATML = (  # SmolLM2 / Qwen: a default system message, loop.first
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3 = (  # BOS written by the template, a namespace, tojson of tools, strftime_now, trim/lstrip blocks
    "{{- bos_token }}\n{%- set ns = namespace(system='') %}\n"
    "{%- for m in messages %}\n  {%- if m['role'] == 'system' %}{% set ns.system = m['content'] %}{% endif %}\n"
    "{%- endfor %}\n"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\nToday: ' + strftime_now('%Y') + '\\n' + ns.system }}\n"
    "{%- if tools is not none %}{{ tools | tojson(indent=2) }}{% endif %}\n{{- '<|eot_id|>' }}\n"
    "{%- for m in messages if m['role'] != 'system' %}\n"
    "    {{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}\n"
)
STRICT = (  # Mistral-style: alternating roles or raise_exception, loop controls, eos_token
    "{% for m in messages %}{% if m['role'] == 'system' %}{% continue %}{% endif %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% else %}{{ m['content'] }}{{ eos_token }}"
    "{% endif %}{% endfor %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in French. <é>"}, {"role": "user", "content": "  Capital of Italy?  "}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": 'Hello! "quoted" & <tagged>'},
        {"role": "user", "content": "Count to 3", "name": None},
    ],
]


def _folder(tmp_path, template: str, **config) -> str:
    """A tokenizer folder as transformers saves it (the template in chat_template.jinja), then `config` merged into
    its tokenizer_config.json."""
    from launcher.tiny import build_tokenizer

    tok = build_tokenizer(512)
    tok.chat_template = template
    tok.save_pretrained(tmp_path)
    if config:
        path = tmp_path / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return str(tmp_path)


def _loaded(folder: str) -> ChatTemplate:
    t = ChatTemplate(folder, "m")
    t.load()
    return t


@pytest.mark.parametrize("name", ["chatml", "llama3", "strict"])
def test_the_template_renders_as_transformers_renders_it(tmp_path, name):
    from transformers import AutoTokenizer

    template = {"chatml": CHATML, "llama3": LLAMA3, "strict": STRICT}[name]
    folder = _folder(tmp_path, template)
    tok, ours = AutoTokenizer.from_pretrained(folder), _loaded(folder)
    for messages in CONVERSATIONS:
        for generation_prompt in (True, False):
            try:
                theirs = tok.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
            except Exception as e:
                with pytest.raises(type(e), match="roles must alternate"):
                    ours.render(messages, generation_prompt)
                continue
            assert ours.render(messages, generation_prompt) == theirs, (name, messages)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    if name == "llama3":
        assert ours.render(CONVERSATIONS[0], tools=tools) == tok.apply_chat_template(
            CONVERSATIONS[0], tools=tools, add_generation_prompt=True, tokenize=False
        )


def test_a_template_that_writes_bos_does_not_give_the_engine_a_second_one(tmp_path):
    """The engines tokenize the prompt with the tokenizer's defaults, which add BOS: the text's own goes."""
    from transformers import AutoTokenizer

    folder = _folder(
        tmp_path, "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    )
    prompt = _loaded(folder)([{"role": "user", "content": "hi"}])
    assert prompt == "[user] hi\n"
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok(prompt)["input_ids"].count(tok.bos_token_id) == 1


@pytest.mark.parametrize("add_bos_token", [False, True])
def test_where_the_tokenizers_settings_disagree_the_engine_still_sees_one_bos(tmp_path, add_bos_token):
    """tokenizer.json adds BOS, tokenizer_config.json's add_bos_token may say otherwise: whichever transformers
    follows for this tokenizer, the prompt it tokenizes holds one BOS."""
    from transformers import AutoTokenizer

    folder = _folder(tmp_path, "{{ bos_token }}{{ messages[0]['content'] }}", add_bos_token=add_bos_token)
    prompt = _loaded(folder)([{"role": "user", "content": "hi"}])
    assert prompt in ("hi", "<s>hi")
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok(prompt)["input_ids"].count(tok.bos_token_id) == 1


def test_a_template_without_bos_is_left_as_it_renders(tmp_path):
    t = _loaded(_folder(tmp_path, "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"))
    assert t([{"role": "user", "content": "hi"}]) == "<hi>"


def test_named_templates_in_tokenizer_config_serve_chat_with_the_default_one(tmp_path):
    from launcher.tiny import build_tokenizer

    build_tokenizer(512).save_pretrained(tmp_path)
    path = tmp_path / "tokenizer_config.json"
    named = [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "{{ messages[0]['content'] }}!"},
    ]
    path.write_text(json.dumps({**json.loads(path.read_text()), "chat_template": named}))
    assert _loaded(str(tmp_path))([{"role": "user", "content": "hi"}]) == "hi!"


def test_messages_the_template_refuses_are_a_400_naming_why(tmp_path):
    t = _loaded(_folder(tmp_path, STRICT))
    with pytest.raises(ApiError) as e:
        t([{"role": "assistant", "content": "first"}])
    assert e.value.status == 400 and "roles must alternate" in e.value.message and e.value.param == "messages"


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.__class__.__name__ }}",  # renders "list" outside the sandbox
        "{{ messages.append('x') }}",  # the immutable sandbox: no changing the caller's messages
        "{% set ns = namespace() %}{% set ns._x = 1 %}{{ ns._x }}",  # namespaces refuse underscore names
    ],
)
def test_a_template_cannot_reach_python_internals(tmp_path, template):
    """Templates from the Hub are untrusted: the sandbox refuses what transformers' refuses, as a 400."""
    t = _loaded(_folder(tmp_path, template))
    with pytest.raises(ApiError) as e:
        t([{"role": "user", "content": "hi"}])
    assert e.value.status == 400 and ("unsafe" in e.value.message or "namespace" in e.value.message), e.value.message


@pytest.mark.parametrize(
    "template, why",
    [("", "has no chat template"), ("{% for m in messages %}", "did not compile")],
)
def test_a_model_without_a_usable_template_refuses_chat_naming_why(tmp_path, template, why):
    from launcher.tiny import build_tokenizer

    build_tokenizer(512).save_pretrained(tmp_path)
    if template:
        (tmp_path / "chat_template.jinja").write_text(template)
    with pytest.raises(ApiError) as e:
        _loaded(str(tmp_path))([{"role": "user", "content": "hi"}])
    assert e.value.status == 400 and e.value.code == "no_chat_template" and why in e.value.message


def test_the_api_process_renders_chat_without_torch_or_transformers(tmp_path):
    """What keeps the API process small (benchmark/memory.py): neither is imported by its app or its template."""
    folder = _folder(tmp_path, CHATML)
    code = (
        "import sys\n"
        "from launcher.openai_api import process, app, backend\n"
        "from launcher.openai_api.chat import ChatTemplate\n"
        f"t = ChatTemplate({folder!r}, 'm'); t.load()\n"
        "assert t([{'role': 'user', 'content': 'hi'}]).endswith('assistant\\n')\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
