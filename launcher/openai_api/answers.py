"""Requests that are more than one stream of text: several choices (n, best_of, a list of prompts), log
probabilities, echo.  Each choice is one contract request (translate.choice_generations); this runs them together
and answers in OpenAI's shapes (launcher/openai_api/choices.py), as one JSON body or as SSE chunks that carry each
choice's index.  The one-choice text stream keeps its own faster path in launcher/openai_api/app.py."""

from __future__ import annotations

import asyncio
import time

from launcher.openai_api import choices as ch, translate as tr
from launcher.openai_api.backend import Final, LogProbs, Utf8Pieces
from launcher.python_backend.logprob_io import merged


def _prompt_text(text_of, gen) -> str:
    return gen.prompt if isinstance(gen.prompt, str) else text_of.decode(gen.prompt)


def none_returned() -> tr.ApiError:
    return tr.ApiError(
        400,
        "logprobs: this model returned no log probabilities (the TensorRT-LLM ensemble computes them but does not "
        "return them); serve it with engine.bls=true, or leave logprobs out",
        param="logprobs",
        code="unsupported_value",
    )


async def read(it, first=None) -> ch.Answer:
    """One request's generate() iterator (its first item read already, if `first`) to its end, then closed: its
    text (decoded once from the joined bytes), counts, finish reason and log probabilities."""
    ans, pieces = ch.Answer(), []
    try:
        item = first if first is not None else await it.__anext__()
        while True:
            if isinstance(item, Final):
                ans.finish_reason = item.finish_reason
                ans.input_tokens, ans.output_tokens = item.input_tokens or 0, item.output_tokens or 0
                break
            if isinstance(item, LogProbs):
                ans.logprobs = merged(ans.logprobs, item.rows)
                ans.prompt_logprobs = ans.prompt_logprobs or item.prompt
            else:
                pieces.append(item)
            item = await it.__anext__()
    finally:
        await it.aclose()
    ans.text = b"".join(pieces).decode("utf-8", errors="replace")
    return ans


async def answers(its: list, first) -> list:
    """Every choice's Answer (its iterator, the first one's first item read already); the first failure cancels the
    others and is raised."""
    tasks = [asyncio.ensure_future(read(it, first if i == 0 else None)) for i, it in enumerate(its)]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        for it in its:
            await it.aclose()


def _usage(answers: list, opts: tr.Options) -> dict:
    """Prompt tokens once per prompt (as OpenAI counts them), every candidate's completion tokens."""
    per = max(opts.best_of, 1)
    prompt = sum(a.input_tokens for a in answers[::per])
    return tr.usage(prompt, sum(a.output_tokens for a in answers))


def body(rid: str, gens: list, answers: list, opts: tr.Options, chat: bool, text_of) -> tuple:
    """(the response body, its usage) of a request whose choices have all ended."""
    per = opts.best_of
    wanted = opts.logprobs is not None or per > opts.n  # best_of ranks by them
    if wanted and any(a.output_tokens and a.logprobs is None for a in answers):
        raise none_returned()
    chosen = []
    for i in range(0, len(answers), per):
        group = answers[i : i + per]
        for a in group:
            a.prompt_text = _prompt_text(text_of, gens[i]) if opts.echo else ""
        chosen.extend(ch.best(group, opts.n) if per > opts.n else group)
    out = []
    for index, a in enumerate(chosen):
        reason = tr.finish_reason(a.finish_reason)
        if chat:
            lp = ch.chat_logprobs(text_of.in_context, a.logprobs) if opts.logprobs is not None else None
            out.append(
                {
                    "index": index,
                    "message": {"role": "assistant", "content": a.text},
                    "logprobs": lp,
                    "finish_reason": reason,
                }
            )
        else:
            lp = None
            if opts.logprobs is not None:
                lp = ch.completion_logprobs(text_of.in_context, a.logprobs, a.prompt_logprobs if opts.echo else None)
            out.append({"index": index, "text": a.prompt_text + a.text, "logprobs": lp, "finish_reason": reason})
    counts = _usage(answers, opts)
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": opts.model,
        "choices": out,
        "usage": counts,
    }, counts


async def events(rid: str, gens: list, its: list, first, opts: tr.Options, chat: bool, text_of, sse):
    """SSE events of several streams (or one with log probabilities or echo): each response of a choice becomes a
    chunk with its index, in the order they arrive; each choice ends with its finish_reason; then the usage chunk
    (stream_options.include_usage) and [DONE].  The last item yielded is the usage dict (not an event)."""
    queue: asyncio.Queue = asyncio.Queue()
    tasks = [asyncio.ensure_future(_pump(queue, i, it, first if i == 0 else None)) for i, it in enumerate(its)]
    stream = _ChoiceChunks(rid, len(its), opts, chat, text_of, sse)
    done, finals = 0, [None] * len(its)
    try:
        for event in stream.opening(gens):
            yield event
        while done < len(its):
            i, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if stream.echo[i] is not None:  # the prompt first, with its log probabilities when they were asked
                yield stream.echoed(i, item)
            if isinstance(item, LogProbs):
                stream.hold(i, item)
            elif isinstance(item, Final):
                if opts.logprobs is not None and item.output_tokens and not stream.seen[i]:
                    yield sse(none_returned().body())
                    return
                yield stream.final(i, item)
                finals[i], done = item, done + 1
            else:
                event = stream.text(i, item)
                if event is not None:
                    yield event
        counts = _usage(
            [ch.Answer(input_tokens=f.input_tokens or 0, output_tokens=f.output_tokens or 0) for f in finals], opts
        )
        if opts.include_usage:
            yield stream.usage(counts)
        yield counts
    finally:
        for t in tasks:
            t.cancel()
        for it in its:
            await it.aclose()


async def _pump(queue: asyncio.Queue, i: int, it, item) -> None:
    """Choice i's responses (`item`: its first, read already, or None) onto `queue` as (i, response), up to its Final;
    an error instead as (i, exception), for the writer to answer."""
    try:
        while True:
            if item is None:
                item = await it.__anext__()
            await queue.put((i, item))
            if isinstance(item, Final):
                return
            item = None
    except Exception as exc:  # noqa: BLE001 - handed to the writer, which answers it
        await queue.put((i, exc))


class _ChoiceChunks:
    """The SSE chunks of a stream of `n` choices, and what each choice carries from one response to the next: its
    text's incomplete UTF-8, its log probabilities until its text goes, its text offset and its prompt to echo."""

    def __init__(self, rid: str, n: int, opts: tr.Options, chat: bool, text_of, sse):
        self.rid, self.opts, self.chat, self.text_of, self.sse = rid, opts, chat, text_of, sse
        self.created = int(time.time())
        self.kind = "chat.completion.chunk" if chat else "text_completion"
        self.contexts = [[] for _ in range(n)]  # each choice's tokens so far (how a token split over bytes shows)
        self.utf8 = [Utf8Pieces() for _ in range(n)]
        self.held = [None] * n  # each choice's log probabilities (LogProbRows) until its text goes
        self.offset = [0] * n  # text_offset of each choice's next token
        self.echo = [None] * n  # each choice's prompt, until its first chunk carries it (echo)
        self.seen = [False] * n  # log probabilities came for the choice

    def chunk(self, i, delta, lp=None, reason=None):
        c = {"index": i, "logprobs": lp, "finish_reason": reason}
        c["delta" if self.chat else "text"] = delta
        out = {"id": self.rid, "object": self.kind, "created": self.created, "model": self.opts.model, "choices": [c]}
        if self.opts.include_usage:
            out["usage"] = None
        return self.sse(out)

    def logprobs(self, i, rows, prompt_rows=None, start=0):
        if self.opts.logprobs is None or (rows is None and prompt_rows is None):
            return None
        if self.chat:
            return ch.chat_logprobs(self.text_of.in_context, rows, self.contexts[i])
        return ch.completion_logprobs(self.text_of.in_context, rows, prompt_rows, start, self.contexts[i])

    def opening(self, gens: list) -> list:
        """The chunks before any response: each chat choice's role; with echo, each prompt is kept for its choice's
        first chunk."""
        out = []
        for i, gen in enumerate(gens):
            if self.chat:
                out.append(self.chunk(i, {"role": "assistant", "content": ""}))
            elif self.opts.echo:
                self.echo[i] = _prompt_text(self.text_of, gen)
                self.offset[i] = len(self.echo[i])
        return out

    def echoed(self, i, item):
        """Choice i's first chunk, its prompt (echo), with the prompt's log probabilities if `item` has them."""
        prompt_rows = item.prompt if isinstance(item, LogProbs) else None
        lp = self.logprobs(i, None, prompt_rows, 0)
        if lp is not None:  # offsets run over the tokens' texts, as in a body that is not streamed
            self.offset[i] = sum(len(t) for t in lp["tokens"])
        prompt, self.echo[i] = self.echo[i], None
        return self.chunk(i, prompt, lp)

    def hold(self, i, item) -> None:
        """Choice i's log probabilities, kept until its text goes."""
        self.held[i] = merged(self.held[i], item.rows)
        self.seen[i] = self.seen[i] or item.rows is not None

    def final(self, i, item):
        """Choice i's last chunk: what is left of its text, with its finish_reason."""
        rest, lp = self.utf8[i].flush(), self.logprobs(i, self.held[i], start=self.offset[i])
        reason = tr.finish_reason(item.finish_reason)
        return self.chunk(i, ({"content": rest} if rest else {}) if self.chat else rest, lp, reason)

    def text(self, i, item):
        """Choice i's chunk of new text (and the log probabilities held for it); None while there is neither."""
        text = self.utf8[i].feed(item)
        if not text and self.held[i] is None:
            return None
        lp = self.logprobs(i, self.held[i], start=self.offset[i])
        if lp is not None and not self.chat:
            self.offset[i] += sum(len(t) for t in lp["tokens"])
        self.held[i] = None
        return self.chunk(i, {"content": text} if self.chat else text, lp)

    def usage(self, counts: dict):
        return self.sse(
            {
                "id": self.rid,
                "object": self.kind,
                "created": self.created,
                "model": self.opts.model,
                "choices": [],
                "usage": counts,
            }
        )
