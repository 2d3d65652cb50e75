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
    created = int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i, it, item):
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

    def chunk(i, delta, lp=None, reason=None):
        c = {"index": i, "logprobs": lp, "finish_reason": reason}
        c["delta" if chat else "text"] = delta
        out = {"id": rid, "object": kind, "created": created, "model": opts.model, "choices": [c]}
        if opts.include_usage:
            out["usage"] = None
        return sse(out)

    contexts = [[] for _ in its]  # each choice's tokens so far (how a token split over bytes shows)

    def logprobs(i, rows, prompt_rows=None, start=0):
        if opts.logprobs is None or (rows is None and prompt_rows is None):
            return None
        if chat:
            return ch.chat_logprobs(text_of.in_context, rows, contexts[i])
        return ch.completion_logprobs(text_of.in_context, rows, prompt_rows, start, contexts[i])

    tasks = [asyncio.ensure_future(pump(i, it, first if i == 0 else None)) for i, it in enumerate(its)]
    utf8 = [Utf8Pieces() for _ in its]
    held = [None] * len(its)  # each choice's log probabilities (LogProbRows) until its text goes
    offset = [0] * len(its)  # text_offset of each choice's next token
    echo = [None] * len(its)  # each choice's prompt, until its first chunk carries it (echo)
    seen = [False] * len(its)  # log probabilities came for the choice
    done, finals = 0, [None] * len(its)
    try:
        for i, gen in enumerate(gens):
            if chat:
                yield chunk(i, {"role": "assistant", "content": ""})
            elif opts.echo:
                echo[i] = _prompt_text(text_of, gen)
                offset[i] = len(echo[i])
        while done < len(its):
            i, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            if echo[i] is not None:  # the prompt first, with its log probabilities when they were asked
                prompt_rows = item.prompt if isinstance(item, LogProbs) else None
                lp = logprobs(i, None, prompt_rows, 0)
                if lp is not None:  # offsets run over the tokens' texts, as in a body that is not streamed
                    offset[i] = sum(len(t) for t in lp["tokens"])
                yield chunk(i, echo[i], lp)
                echo[i] = None
            if isinstance(item, LogProbs):
                held[i] = merged(held[i], item.rows)
                seen[i] = seen[i] or item.rows is not None
                continue
            if isinstance(item, Final):
                if opts.logprobs is not None and item.output_tokens and not seen[i]:
                    yield sse(none_returned().body())
                    return
                rest, lp = utf8[i].flush(), logprobs(i, held[i], start=offset[i])
                reason = tr.finish_reason(item.finish_reason)
                yield chunk(i, ({"content": rest} if rest else {}) if chat else rest, lp, reason)
                finals[i], done = item, done + 1
                continue
            text = utf8[i].feed(item)
            if text or held[i] is not None:
                lp = logprobs(i, held[i], start=offset[i])
                if lp is not None and not chat:
                    offset[i] += sum(len(t) for t in lp["tokens"])
                held[i] = None
                yield chunk(i, {"content": text} if chat else text, lp)
        counts = _usage(
            [ch.Answer(input_tokens=f.input_tokens or 0, output_tokens=f.output_tokens or 0) for f in finals], opts
        )
        if opts.include_usage:
            yield sse(
                {"id": rid, "object": kind, "created": created, "model": opts.model, "choices": [], "usage": counts}
            )
        yield counts
    finally:
        for t in tasks:
            t.cancel()
        for it in its:
            await it.aclose()
