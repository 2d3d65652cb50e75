"""Benchmark datasets: each loader returns a list of `Sample`s.

Formats (the project never downloads datasets; point `--dataset` at a file):

* ``sharegpt``: ShareGPT JSON (``ShareGPT_V3_unfiltered_cleaned_split.json``),
  a list of ``{"conversations": [{"from": ..., "value": ...}, ...]}``. As in
  vLLM's benchmarks: conversations with fewer than two turns are dropped, the
  first turn is the prompt, the second turn's length is the requested output
  length (unless ``output_len`` fixes it); samples are shuffled with the seed;
  pairs with prompt or output shorter than ``min_len`` (4) tokens, a prompt
  longer than ``max_input_len`` (1024) or prompt + output longer than
  ``max_total_len`` (2048) are skipped.
* ``cnn``: CNN/DailyMail ``mini_cnn_eval.json``, a list of
  ``{"instruction", "input", "output"}``. Prompt = instruction + newline +
  input, reference = output; output length = ``output_len`` if given, else the
  reference's token count (with a tokenizer) or ``int(words * 1.3)`` (without,
  the factor the TensorRT-LLM identity test uses). Prompts longer than
  ``max_input_len`` are skipped (the identity test's ``--max_input_len``).
* ``prompts``: a text file, one prompt per line, in
  file order; output length ``output_len`` (default 128).
* ``synthetic``: generated prompts of ``input_len`` tokens and outputs of
  ``output_len`` tokens; with ``range_ratio`` r > 0 each length is drawn
  uniformly from [L*(1-r), L*(1+r)]. Without a tokenizer the prompt is made of
  short words (one estimated token each); with one, of random token ids whose
  text encodes back to exactly that many (`TokenCounter.random_text`).
* ``prefix``: shared prefixes, as vLLM's and AIPerf's prefix benchmarks: ``prefix_groups`` groups, each with a
  random prefix of ``prefix_len`` tokens (a system prompt, the shots of a few-shot prompt); each request is its
  group's prefix and a unique random suffix of ``input_len`` tokens, the groups taken in turn.  Where the server
  caches prefixes, all but the first request of a group prefill only their suffix.
* ``multiturn``: conversations of ``turns`` turns, each turn a request that sends the whole history (every earlier
  user message and answer) and the new user message.  From a ShareGPT file (``--dataset``: its conversations, the
  recorded answers as the history, each answer's length the turn's output length unless ``output_len`` fixes it),
  or synthetic (user messages of ``input_len`` random tokens, answers of ``output_len``).  Requests are ordered turn
  by turn across the conversations, so a turn goes out after the earlier turns of its conversation did.

Token lengths: with a tokenizer (``--tokenizer``, a local Hugging Face
tokenizer directory, loaded through transformers; by default the one the
served model's config names) lengths are token counts without special tokens. Without one they are an estimate, `estimate_tokens`:
the number of whitespace-separated words, or characters / 4 when that is
larger (text without spaces). The server's own counts (input_tokens /
output_tokens) are what the metrics use whenever the model sends them.

Sampling is seeded; when more requests are asked for than the file has usable
samples, the samples are reused in order (`take`).
"""

from __future__ import annotations

import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

KINDS = ("sharegpt", "cnn", "prompts", "synthetic", "prefix", "multiturn")


@dataclass
class Sample:
    prompt: str  # text sent as text_input
    prompt_len: int  # prompt length in tokens (tokenizer) or estimated tokens
    output_len: int  # requested output length: max_tokens
    reference: Optional[str] = None  # the dataset's own answer, when it has one
    session: Optional[str] = None  # multiturn: the conversation's id, sent so a front end keeps it on one replica


def estimate_tokens(text: str) -> int:
    """Token count without a tokenizer: whitespace words, or chars/4 if larger."""
    return max(len(text.split()), (len(text) + 3) // 4)


class TokenCounter:
    """Token counts through a Hugging Face tokenizer, or the estimate when none."""

    def __init__(self, tokenizer: Optional[str] = None):
        self.name = tokenizer
        self._tok = None
        self._vocab: Optional[list[int]] = None  # _plain_vocab's ids, listed once
        if tokenizer:
            try:
                from transformers import AutoTokenizer
            except ImportError as exc:
                raise RuntimeError("--tokenizer needs the transformers package (pip install transformers)") from exc
            try:
                self._tok = AutoTokenizer.from_pretrained(tokenizer)
            except Exception as exc:
                raise RuntimeError(f"cannot load tokenizer {tokenizer!r}: {exc}") from exc

    @property
    def exact(self) -> bool:
        return self._tok is not None

    def count(self, text: str) -> int:
        if self._tok is None:
            return estimate_tokens(text)
        return len(self._tok(text, add_special_tokens=False).input_ids)

    def count_many(self, texts: list[str]) -> list[int]:
        if self._tok is None or not texts:
            return [estimate_tokens(t) for t in texts]
        return [len(ids) for ids in self._tok(texts, add_special_tokens=False).input_ids]

    def random_text(self, n: int, rng: random.Random) -> tuple[str, int]:
        """A prompt of n tokens: random token ids made into text that encodes back to exactly n of them (tokenizer),
        or n short words (estimate).

        Random ids decoded do not encode back to as many: ids that are pieces of a multi-byte character decode to
        U+FFFD, which takes up to three tokens again, and neighbours merge differently (a Llama 3 vocabulary gave
        ~200 tokens for 128).  So the text is re-encoded and its ids cut or topped up with random ones until the
        count is n (two or three rounds); the length returned is the re-encoded count either way."""
        if self._tok is None:
            words = [rng.choice(_WORDS) for _ in range(n)]
            text = " ".join(words)
            return text, estimate_tokens(text)
        vocab = self._plain_vocab()
        ids = [rng.choice(vocab) for _ in range(n)]
        for _ in range(_ROUNDS):
            text = self._tok.decode(ids)
            ids = self._tok(text, add_special_tokens=False).input_ids
            if len(ids) == n:
                return text, n
            ids = ids[:n] if len(ids) > n else ids + [rng.choice(vocab) for _ in range(n - len(ids))]
        text = self._tok.decode(ids)
        return text, self.count(text)

    def _plain_vocab(self) -> list[int]:
        """Token ids that are ordinary text: not special, not added (chat markers such as <|im_start|>), and whole
        characters (a token alone decodes to text that encodes back to it: no piece of a multi-byte character,
        whose U+FFFD would grow the prompt each round)."""
        if self._vocab is None:
            skip = set(self._tok.all_special_ids or []) | set(self._tok.get_added_vocab().values())
            ids = [i for i in range(len(self._tok)) if i not in skip]
            texts = self._tok.batch_decode([[i] for i in ids])
            back = self._tok(texts, add_special_tokens=False).input_ids
            self._vocab = [i for i, b in zip(ids, back) if b == [i]] or ids
        return self._vocab


_ROUNDS = 8  # re-encode rounds before random_text settles for the length it reached

# Three-letter-or-shorter words: one estimated token each (estimate_tokens).
_WORDS = (
    "the and for are but not you all any can had her was one our out day get has him his how man new now old see "
    "two way who boy did its let put say she too use sun sea sky red big few cat dog run top end art car eye air"
).split()


def detect_kind(path: Optional[str]) -> str:
    """Dataset kind from the file: .txt = prompts; JSON list of conversations = sharegpt;
    of instruction/input = cnn; no path, or the word `synthetic` where no such file is, = synthetic."""
    if not path or (path == "synthetic" and not Path(path).exists()):
        return "synthetic"
    p = Path(path)
    if p.suffix.lower() == ".txt":
        return "prompts"
    try:
        with open(p, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read dataset {path}: {exc}") from exc
    first = data[0] if isinstance(data, list) and data else {}
    if isinstance(first, dict) and "conversations" in first:
        return "sharegpt"
    if isinstance(first, dict) and "input" in first and "instruction" in first:
        return "cnn"
    raise ValueError(
        f"cannot tell the format of {path}: expected a ShareGPT list of {{'conversations': [...]}}, a CNN/DailyMail "
        "list of {'instruction', 'input', 'output'}, or a .txt file of prompts; pass --dataset-name"
    )


def take(samples: list[Sample], n: Optional[int], what: str) -> list[Sample]:
    """The first n samples, reusing them in order when there are fewer."""
    if not samples:
        raise ValueError(f"{what}: no usable samples (check the file and the length filters)")
    if n is None or n <= len(samples):
        return samples if n is None else samples[:n]
    print(f"note: {what} has {len(samples)} usable samples; {n} requests reuse them in order", file=sys.stderr)
    return [samples[i % len(samples)] for i in range(n)]


def load_sharegpt(
    path,
    num: Optional[int],
    tokens: TokenCounter,
    seed: int = 0,
    output_len: Optional[int] = None,
    max_input_len: int = 1024,
    max_total_len: int = 2048,
    min_len: int = 4,
) -> list[Sample]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    pairs = [
        (d["conversations"][0]["value"], d["conversations"][1]["value"])
        for d in data
        if isinstance(d, dict) and len(d.get("conversations") or []) >= 2
    ]
    random.Random(seed).shuffle(pairs)
    out: list[Sample] = []
    batch = 256  # tokenize in batches, stop once enough samples passed the filters
    for start in range(0, len(pairs), batch):
        chunk = pairs[start : start + batch]
        p_lens = tokens.count_many([p for p, _ in chunk])
        c_lens = tokens.count_many([c for _, c in chunk]) if output_len is None else [output_len] * len(chunk)
        for (prompt, completion), p_len, c_len in zip(chunk, p_lens, c_lens):
            if p_len < min_len or (output_len is None and c_len < min_len):
                continue
            if p_len > max_input_len or p_len + c_len > max_total_len:
                continue
            out.append(Sample(prompt, p_len, c_len, completion))
        if num is not None and len(out) >= num:
            break
    return take(out, num, f"ShareGPT file {path}")


def load_cnn(
    path,
    num: Optional[int],
    tokens: TokenCounter,
    seed: int = 0,
    output_len: Optional[int] = None,
    max_input_len: Optional[int] = None,
) -> list[Sample]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    rows = [d for d in data if isinstance(d, dict) and "input" in d]
    random.Random(seed).shuffle(rows)
    prompts = [f"{d.get('instruction', '').strip()}\n{d['input']}".strip() for d in rows]
    p_lens = tokens.count_many(prompts)
    out = []
    for d, prompt, p_len in zip(rows, prompts, p_lens):
        if max_input_len and p_len > max_input_len:
            continue
        ref = d.get("output")
        if output_len is not None:
            o_len = output_len
        elif ref and tokens.exact:
            o_len = tokens.count(ref)
        else:
            o_len = int(len((ref or "").split(" ")) * 1.3)  # words -> tokens, as the TensorRT-LLM identity test
        out.append(Sample(prompt, p_len, max(1, o_len), ref))
    return take(out, num, f"CNN/DailyMail file {path}")


def load_prompts(path, num: Optional[int], tokens: TokenCounter, output_len: Optional[int] = None) -> list[Sample]:
    with open(path, encoding="utf-8") as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    lens = tokens.count_many(prompts)
    out = [Sample(p, n, output_len or 128) for p, n in zip(prompts, lens)]
    return take(out, num, f"prompts file {path}")


def load_synthetic(
    num: Optional[int],
    tokens: TokenCounter,
    seed: int = 0,
    input_len: int = 128,
    output_len: Optional[int] = None,
    range_ratio: float = 0.0,
) -> list[Sample]:
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--range-ratio must be in [0, 1), got {range_ratio}")
    output_len = output_len or 128
    rng = random.Random(seed)

    def draw(n):
        lo, hi = math.floor(n * (1 - range_ratio)), math.ceil(n * (1 + range_ratio))
        return max(1, rng.randint(lo, hi) if range_ratio else n)

    out = []
    for _ in range(num or 1000):
        text, n = tokens.random_text(draw(input_len), rng)
        out.append(Sample(text, n, draw(output_len)))
    return out


def load_prefix(
    num: Optional[int],
    tokens: TokenCounter,
    seed: int = 0,
    groups: int = 8,
    prefix_len: int = 1024,
    input_len: int = 128,
    output_len: Optional[int] = None,
) -> list[Sample]:
    if groups < 1 or prefix_len < 1:
        raise ValueError(f"--prefix-groups and --prefix-len must be >= 1, got {groups} and {prefix_len}")
    rng = random.Random(seed)
    prefixes = [tokens.random_text(prefix_len, rng)[0] for _ in range(groups)]
    texts = [prefixes[i % groups] + " " + tokens.random_text(input_len, rng)[0] for i in range(num or 1000)]
    return [Sample(text, n, output_len or 128) for text, n in zip(texts, tokens.count_many(texts))]


def _conversation_turns(
    messages: list[str], answers: list[str], out_lens: list[int]
) -> list[tuple[str, int, Optional[str]]]:
    """(prompt, output length, the recorded answer) of each turn: the history so far, then the turn's user message."""
    history, out = "", []
    for user, answer, n in zip(messages, answers, out_lens):
        prompt = f"{history}User: {user}\nAssistant:"
        out.append((prompt, n, answer))
        history = f"{prompt} {answer}\n"
    return out


def load_multiturn(
    path,
    num: Optional[int],
    tokens: TokenCounter,
    seed: int = 0,
    turns: int = 4,
    input_len: int = 128,
    output_len: Optional[int] = None,
    max_total_len: int = 8192,
) -> list[Sample]:
    if turns < 1:
        raise ValueError(f"--turns must be >= 1, got {turns}")
    rng = random.Random(seed)
    conversations = []  # per conversation: [(prompt, output length, answer) per turn]
    wanted = -(-(num or 1000) // turns)
    if path:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        rows = [d["conversations"] for d in data if isinstance(d, dict) and len(d.get("conversations") or []) >= 2]
        rng.shuffle(rows)
        for conv in rows:
            users = [m["value"] for m in conv[0::2]][:turns]
            answers = [m["value"] for m in conv[1::2]][: len(users)]
            users = users[: len(answers)]
            lens = [output_len] * len(answers) if output_len else [max(1, n) for n in tokens.count_many(answers)]
            conversations.append(_conversation_turns(users, answers, lens))
            if len(conversations) >= wanted:
                break
    else:
        n_out = output_len or 128
        for _ in range(wanted):
            users = [tokens.random_text(input_len, rng)[0] for _ in range(turns)]
            answers = [tokens.random_text(n_out, rng)[0] for _ in range(turns)]
            conversations.append(_conversation_turns(users, answers, [n_out] * turns))
    # turn by turn; each turn with its conversation's id (the seed in it: ids of two runs' conversations differ)
    ordered = [
        (*conv[t], f"s{seed}-c{i}") for t in range(turns) for i, conv in enumerate(conversations) if t < len(conv)
    ]
    lens = tokens.count_many([p for p, _, _, _ in ordered])
    out = [Sample(p, n, o, a, s) for (p, o, a, s), n in zip(ordered, lens) if n + o <= max_total_len]
    return take(out, num, f"multi-turn conversations{' of ' + str(path) if path else ''}")


def load(
    kind: str,
    path: Optional[str],
    num: Optional[int],
    tokens: TokenCounter,
    seed: int = 0,
    output_len: Optional[int] = None,
    input_len: int = 128,
    range_ratio: float = 0.0,
    max_input_len: Optional[int] = None,
    max_total_len: int = 2048,
    prefix_groups: int = 8,
    prefix_len: int = 1024,
    turns: int = 4,
) -> list[Sample]:
    """Dispatch on kind ('auto' detects it from the file)."""
    if kind == "auto":
        kind = detect_kind(path)
    if kind == "prefix":
        return load_prefix(num, tokens, seed, prefix_groups, prefix_len, input_len, output_len)
    if kind == "multiturn":
        return load_multiturn(path, num, tokens, seed, turns, input_len, output_len, max_total_len)
    if kind != "synthetic" and not path:
        raise ValueError(f"dataset {kind!r} needs --dataset PATH")
    if kind == "sharegpt":
        return load_sharegpt(path, num, tokens, seed, output_len, max_input_len or 1024, max_total_len)
    if kind == "cnn":
        return load_cnn(path, num, tokens, seed, output_len, max_input_len)
    if kind == "prompts":
        return load_prompts(path, num, tokens, output_len)
    if kind == "synthetic":
        return load_synthetic(num, tokens, seed, input_len, output_len, range_ratio)
    raise ValueError(f"unknown dataset kind {kind!r}; choose one of {', '.join(KINDS)} or auto")
