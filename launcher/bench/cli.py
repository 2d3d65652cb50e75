"""`llmlaunch-bench`: measure a served model (launcher/contract.py interface).

    llmlaunch-bench --url HOST:PORT --dataset ShareGPT.json --num-prompts 1000 --concurrency 128
    llmlaunch-bench --url HOST:PORT --dataset-name synthetic --input-len 128 --output-len 128 \\
        --request-rate 20 --burstiness 0.5 --duration 60 --ignore-eos --goodput ttft:500 tpot:50
    # identity test: the same dataset against two models, then a speedup table
    llmlaunch-bench --url localhost:8001 --model llama-python --dataset mini_cnn_eval.json \\
        --max-input-len 100 --concurrency 16 --compare localhost:8001,ensemble
    # the same load over OpenAI HTTP: llmlaunch's OpenAI API, or any OpenAI-compatible server (vLLM's)
    llmlaunch-bench --backend openai-chat --url http://localhost:8003/v1 --dataset-name synthetic --concurrency 8

Output: a live progress bar on stderr, the result table on stdout,
`--result-json` (config, metrics and every request; format "llmlaunch-bench/1",
see below) and `--result-csv` (one summary line per run, appended; header
written when the file is new). With --compare, B's JSON goes beside A's with
".B" before the suffix.

Exit status: 0 when every request produced tokens; 1 when any request failed
(error or zero output tokens; the count is printed); 2 when the run could not
be made (bad arguments, server unreachable, unreadable dataset).

Result JSON:
    {"format": "llmlaunch-bench/1", "label", "started_at", "argv",
     "config": {"url", "backend", "model", "dataset": {...}, "load": {...LoadSpec...}, "request": {...}, "goodput_slos_ms"},
     "metrics": {"requests", "completed", "failed", "errors", "zero_token", "duration_s",
                 "request_throughput", "output_throughput", "total_token_throughput", "goodput",
                 "ttft_ms"|"tpot_ms"|"itl_ms"|"e2el_ms": {"mean", "p50", "p90", "p99", "max"},
                 "client_handoff_ms": {...} (the client's own queue -> gRPC send, outside TTFT), ...},
     "server_first_token_ms": None | {"parse", "add", "engine", "back", "respond", "send", "inside_server", "outside_server",
                                      "requests", "client_requests"}
                              (--server-metrics: mean ms over the measured requests, the warm-up's left out, on
                              both sides; outside_server None where the model counted other requests than the client
                              took a first token of; launcher/python_backend/timings.py),
     "server_engine_steps": None | {"steps", "step_ms", "launch_ms", "wait_ms", "host_ms", "gpu_ms",
                              "gpu_idle_ms", "decode_rows", "prefill_tokens", "ahead"} (--server-metrics:
                              the hf engine's steps during the measured requests; timings.engine_step_split);
                              vLLM's engine core: {"steps", "decode_rows", "prefill_tokens", "running", "waiting",
                              "wall_step_ms"} (the measured phase's wall time a step: step_splits.with_wall_step) and, with
                              engine.engine_args.cudagraph_metrics=true, "scheduled_tokens", "graph_full",
                              "graph_piecewise", "graph_none",
     "server_prefix_cache": None | {"prompt_tokens", "cached_prompt_tokens", "prefix_hit_rate"} (--server-metrics;
                              with --prefill-metrics the prefill replicas', where a split computes its prompts),
     "server_kv_transfer": None | {"transfers", "failed", "bytes", "mib", "mib_per_transfer", "ms_per_transfer", "gib_per_s"}
                              (--server-metrics: keys and values the decode replicas moved from prefill replicas),
     "warmup_errors", "requests": [RequestResult as JSON, ...]}
Times in "requests" are seconds since the start of the measured phase.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import sys
from dataclasses import asdict

from launcher.bench import arguments, backends, datasets, metrics
from launcher.bench.progress import Progress
from launcher.bench.results import append_csv, b_path, csv_row, write_json
from launcher.bench.runner import Job, LoadSpec, generations, run_load
from launcher.client.connection import ClientError
from launcher.client.control import honoured_parameters, served_tokenizer
from launcher.python_backend import cache_splits, timings
from launcher.python_backend.step_splits import with_wall_step


def build_parser(prog: str = "llmlaunch-bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    arguments.add_target(p)
    arguments.add_dataset(p)
    arguments.add_load(p)
    arguments.add_requests(p)
    arguments.add_results(p)
    return p


def request_param(item: str):
    """`--request-param KEY=VALUE` -> (key, value as int, float, bool or text): the Triton request parameter sent
    (benchmark/overhead.py reads its own --request-param with it too)."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"bad --request-param {item!r}: use KEY=VALUE")
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            pass
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    return key, value


def spec_from_args(args, num_requests) -> LoadSpec:
    return LoadSpec(
        concurrency=args.concurrency,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        num_requests=num_requests,
        duration=args.duration,
        warmup=args.warmup,
        streams=args.streams,
        processes=args.processes,
        seed=args.seed,
        timeout=args.timeout,
    )


def prepare(args):
    """(samples, kind, token counter) from the dataset arguments."""
    kind = datasets.detect_kind(args.dataset) if args.dataset_name == "auto" else args.dataset_name
    tokens = datasets.TokenCounter(args.tokenizer)
    num = args.num_prompts
    if num is None and kind in ("sharegpt", "synthetic", "prefix", "multiturn"):
        num = 1000
    return _load(args, kind, tokens, num, args.seed), kind, tokens


def warmup_samples(args, kind: str, tokens) -> list:
    """The warm-up requests' samples: drawn with the next seed, so that a server's prefix cache does not serve the
    measured requests from what the warm-up computed (a generated dataset then shares nothing with them)."""
    return _load(args, kind, tokens, args.warmup, args.seed + 1) if args.warmup else []


def _load(args, kind: str, tokens, num, seed: int):
    return datasets.load(
        kind,
        args.dataset,
        num,
        tokens,
        seed=seed,
        output_len=args.output_len,
        input_len=args.input_len,
        range_ratio=args.range_ratio,
        max_input_len=args.max_input_len,
        max_total_len=args.max_total_len,
        prefix_groups=args.prefix_groups,
        prefix_len=args.prefix_len,
        turns=args.turns,
    )


def bench_one(
    args,
    url: str,
    model: str,
    samples,
    kind: str,
    tokens,
    label: str = "",
    progress_label: str = "",
    server_metrics: str | None = None,
    prefill_metrics: str | None = None,
) -> dict:
    """Run the benchmark once; returns the result document (see module docstring).  `server_metrics`: the
    served model's metrics URL, read before and after for the first-token split; `prefill_metrics`: those of them
    that are prefill replicas (disagg), whose split is shown beside the decode replicas'."""
    sampling = {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "seed": args.sampling_seed,
        "stop": tuple(args.stop),
    }
    gens = generations(samples, sampling, stream=not args.no_stream, ignore_eos=args.ignore_eos)
    num_requests = args.num_prompts if args.num_prompts is not None else (None if args.duration else len(samples))
    spec = spec_from_args(args, num_requests)
    params = _request_parameters(args, url, model)
    slos = metrics.parse_slos(args.goodput)
    warm = generations(
        warmup_samples(args, kind, tokens), sampling, stream=not args.no_stream, ignore_eos=args.ignore_eos
    )
    job = Job(url=url, model=model, gens=gens, spec=spec, parameters=params, backend=args.backend, warm_gens=warm)
    make_bar = None
    if not args.no_progress:
        make_bar = lambda read: Progress(read, num_requests, label=progress_label)  # noqa: E731
    totals = {}  # the server's counters once the warm-up has ended: the run's figures cover the measured requests
    after_warmup = _server_reader(server_metrics, prefill_metrics, model, totals)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    _announce(spec, num_requests, model, url, kind)
    out = run_load(job, make_bar, after_warmup=after_warmup)
    before, engine_before = totals.get("before", (None, None))
    results = [
        metrics.from_record(idx, samples[idx % len(samples)], rec, out.t0, tokens, args.save_text)
        for idx, rec in out.records
    ]
    ends = [r.end for r in results if r.end is not None] + [r.sent for r in results]
    duration = max(ends) if ends else 0.0
    m = metrics.compute(results, duration, slos)
    split = steps = prefix = moved = None
    if before is not None and not args.no_stream:
        # the model counts every streamed request whose first token it sent, failed later or not: the client's mean
        # is taken over the same measured requests, those it has a first token of
        ttfts = [r.ttft for r in results if r.ttft is not None]
        ttft_mean = 1000.0 * sum(ttfts) / len(ttfts) if ttfts else None
        split = _first_token_split(server_metrics, prefill_metrics, model, totals, len(ttfts), ttft_mean)
    if engine_before is not None:
        steps, prefix, moved = _engine_splits(server_metrics, prefill_metrics, model, engine_before, totals)
        steps = with_wall_step(steps, duration, len([u for u in server_metrics.split(",") if u.strip()]))
    return {
        "format": "llmlaunch-bench/1",
        "label": label,
        "started_at": started,
        "argv": getattr(args, "argv", None),
        "config": _config(args, url, model, samples, kind, tokens, spec, sampling, params, slos),
        "metrics": m,
        "server_first_token_ms": split,
        "server_engine_steps": steps,
        "server_prefix_cache": prefix,
        "server_kv_transfer": moved,
        "t0_perf_counter": out.t0,  # request times are relative to this time.perf_counter() (CLOCK_MONOTONIC)
        "warmup_errors": len(out.warmup_errors),
        "requests": [r.to_json() for r in results],
    }


def _server_reader(server_metrics, prefill_metrics, model: str, totals: dict):
    """With --server-metrics: what reads the server's totals into `totals` once the warm-up has ended (each role's
    too, with --prefill-metrics); None without.  An unreadable URL fails here, before any request is sent."""
    if not server_metrics:
        return None
    _server_totals(server_metrics, model, settled=False)

    def after_warmup():
        totals["before"] = _server_totals(server_metrics, model)
        if prefill_metrics:  # each role's URLs and totals, settled with the others above
            urls = (decode_metrics(server_metrics, prefill_metrics), prefill_metrics)
            totals["roles"] = tuple((u, timings.fetch_first_token_metrics(u, model)) for u in urls)
            totals["prefill_engine"] = timings.fetch_engine_metrics(prefill_metrics, model)

    return after_warmup


def _engine_splits(server_metrics, prefill_metrics, model: str, engine_before: dict, totals: dict) -> tuple:
    """(engine steps, prefix cache, keys and values moved) over the measured requests.  A split's prompts are computed
    on its prefill replicas, so its prefix cache is theirs: a decode replica finds a prompt's moved blocks in its own
    cache, which is the transfer (server_kv_transfer), not a prefix cache hit."""
    steps, prefix, moved = timings.engine_splits_after(server_metrics, model, engine_before)
    if prefill_metrics:
        after = timings.fetch_engine_metrics(prefill_metrics, model)  # settled above, with every replica's
        prefix = cache_splits.prefix_cache_split(totals["prefill_engine"], after)
    return steps, prefix, moved


def decode_metrics(server_metrics: str, prefill_metrics: str) -> str:
    """The URLs of `server_metrics` that are not prefill replicas' (`prefill_metrics`), comma-separated."""
    prefill = {u.strip() for u in prefill_metrics.split(",")}
    return ",".join(u.strip() for u in server_metrics.split(",") if u.strip() and u.strip() not in prefill)


def _first_token_split(server_metrics, prefill_metrics, model: str, totals: dict, n: int, ttft_mean) -> dict | None:
    """The model's first-token split over the n measured requests; with prefill replicas, the decode replicas' with
    the prefill replicas' beside it (timings.with_prefill_split)."""
    if not prefill_metrics:
        return timings.first_token_split(server_metrics, model, totals["before"][0], n, ttft_mean)
    (decode, decode_before), (prefill, prefill_before) = totals["roles"]
    split = timings.first_token_split(decode, model, decode_before, n, ttft_mean)
    return timings.with_prefill_split(
        split, timings.first_token_split(prefill, model, prefill_before, n, None), ttft_mean
    )


def _request_parameters(args, url: str, model: str) -> dict:
    """The Triton request parameters every request carries: --request-param's, and final_counts_only where it is
    asked for or, unasked, where a streamed run's model says it honours it (one config read per model)."""
    params = dict(request_param(x) for x in args.request_param)
    backend = backends.get(args.backend)
    if params and not backend.triton_parameters:
        raise ValueError(f"--request-param is a Triton request parameter; --backend {args.backend} cannot send it")
    if "final_counts_only" not in params and backend.triton_parameters:  # --request-param final_counts_only=... wins
        asked = args.final_counts_only
        if asked is None:
            asked = not args.no_stream and "final_counts_only" in honoured_parameters(url, model)
        if asked:
            params["final_counts_only"] = True
    return params


def _check_prefill_metrics(args) -> None:
    """--prefill-metrics names some of --server-metrics' servers, not all of them."""
    if not args.prefill_metrics:
        return
    if not args.server_metrics:
        raise ValueError(
            f"--prefill-metrics {args.prefill_metrics}: it names the prefill replicas among --server-metrics' "
            "servers, and --server-metrics is not given; give every replica leader's metrics URL to --server-metrics"
        )
    if not decode_metrics(args.server_metrics, args.prefill_metrics):
        raise ValueError(
            f"--prefill-metrics {args.prefill_metrics}: it names every server of --server-metrics, so no decode "
            "replica is left to split; give --server-metrics every replica leader's URL, decode ones included"
        )


def _server_totals(server_metrics: str, model: str, settled: bool = True) -> tuple | None:
    """(first-token totals, engine-step totals) of the served model before the measured requests (--server-metrics);
    `settled=False`: one reading, only to check that the URL answers."""
    try:
        if not settled:
            timings.fetch_metrics_text(server_metrics)
            return None
        # the totals once the last requests' first tokens and steps are in (they come up to a second late)
        return timings.settled_server_metrics(server_metrics, model)
    except OSError as exc:
        raise ValueError(
            f"--server-metrics {server_metrics}: cannot read it ({getattr(exc, 'reason', exc)}); "
            "give the served model's tritonserver metrics URL, http://HOST:PORT/metrics "
            "(llmlaunch: serve.metrics_port)"
        ) from None


def _announce(spec: LoadSpec, num_requests, model: str, url: str, kind: str) -> None:
    """The run's one line on stderr: how many requests, to what, in which shape of load."""
    shape = (f"concurrency {spec.concurrency}" if spec.concurrency else "") + (
        f"{', ' if spec.concurrency else ''}rate {spec.request_rate:g}/s" if math.isfinite(spec.request_rate) else ""
    )
    print(
        f"llmlaunch-bench: {num_requests if num_requests is not None else 'unlimited'} requests"
        f"{f' for {spec.duration:g} s' if spec.duration else ''} to {model!r} at {url} ({shape}, {kind} dataset)",
        file=sys.stderr,
    )


def _config(args, url: str, model: str, samples, kind: str, tokens, spec: LoadSpec, sampling, params, slos) -> dict:
    """The result document's "config": what was measured, with which data, load and requests."""
    load = asdict(spec)
    load["request_rate"] = metrics.finite(spec.request_rate)
    return {
        "url": url,
        "backend": args.backend,
        "model": model,
        "dataset": {
            "name": kind,
            "path": args.dataset,
            "samples": len(samples),
            "seed": args.seed,
            "tokenizer": args.tokenizer,
            "token_lengths": "tokenizer" if tokens.exact else "estimate (whitespace words or chars/4)",
            "input_len": args.input_len if kind == "synthetic" else None,
            "output_len": args.output_len,
            "range_ratio": args.range_ratio,
        },
        "load": load,
        "request": {
            "stream": not args.no_stream,
            "ignore_eos": args.ignore_eos,
            "sampling": {k: v for k, v in sampling.items() if v not in (None, ())},
            "parameters": params,
        },
        "goodput_slos_ms": slos,
    }


def main(argv=None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    if "--eval" in argv:  # accuracy instead of load: lm-eval against the OpenAI API
        from launcher.bench import evaluate

        return evaluate.main(argv)
    args = parser.parse_args(argv)
    args.argv = ["llmlaunch-bench", *argv]
    try:
        return run(args)
    except (ClientError, ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def run(args) -> int:
    backend = backends.get(args.backend)
    url = backend.url(args.url)
    spec_from_args(args, args.num_prompts).check()  # fail on bad load arguments before loading data
    metrics.parse_slos(args.goodput)
    _check_prefill_metrics(args)
    model = args.model or backend.default_model(url)
    if args.tokenizer is None and backend.name == "triton-grpc":
        # prompts in the served model's tokens: --input-len 128 sends 128 of them
        args.tokenizer = served_tokenizer(url, model) or None
        print(
            f"llmlaunch-bench: token lengths with {args.tokenizer or 'an estimate (no --tokenizer; the served model names none readable here)'}",
            file=sys.stderr,
        )
    samples, kind, tokens = prepare(args)
    docs = [
        bench_one(
            args,
            url,
            model,
            samples,
            kind,
            tokens,
            label=args.label or "",
            progress_label="A " if args.compare else "",
            server_metrics=args.server_metrics,
            prefill_metrics=args.prefill_metrics,
        )
    ]
    if args.compare:
        docs.append(_bench_b(args, backend, url, samples, kind, tokens))
        if not args.label:
            docs[0]["label"] = "A"
    _print_results(docs)
    sys.stdout.flush()
    _write_results(args, docs)
    return _exit_status(docs)


def _bench_b(args, backend, url: str, samples, kind: str, tokens) -> dict:
    """--compare URL2[,MODEL2]: the same load against the second model (URL2 empty: the first's server)."""
    url_b, _, model_b = args.compare.partition(",")
    url_b = backend.url(url_b) if url_b.strip() else url
    model_b = model_b.strip() or args.model or backend.default_model(url_b)
    return bench_one(
        args,
        url_b,
        model_b,
        samples,
        kind,
        tokens,
        label=(args.label + " " if args.label else "") + "B",
        progress_label="B ",
    )


def _print_results(docs: list) -> None:
    """Each run's table (and the server's splits, where measured); with --compare, B's speedup over A, which A's
    document keeps."""
    for i, doc in enumerate(docs):
        title = (
            "Serving Benchmark Result"
            if len(docs) == 1
            else f"{'AB'[i]}: {doc['config']['model']} @ {doc['config']['url']}"
        )
        print(metrics.format_table(doc["metrics"], title))
        if doc.get("server_first_token_ms"):
            print(metrics.format_first_token_split(doc["server_first_token_ms"]))
        if doc.get("server_engine_steps"):
            print("engine steps: " + timings.format_engine_split(doc["server_engine_steps"]))
        if doc.get("server_prefix_cache"):
            print("prefix cache: " + cache_splits.format_prefix_cache(doc["server_prefix_cache"]))
        if doc.get("server_kv_transfer"):
            print("keys and values moved: " + cache_splits.format_kv_transfer(doc["server_kv_transfer"]))
    if len(docs) == 2:
        name = lambda d: f"{d['config']['model']} @ {d['config']['url']}"  # noqa: E731
        print(metrics.format_speedup(docs[0]["metrics"], docs[1]["metrics"], name(docs[0]), name(docs[1])))
        docs[0]["compare"] = {"B": name(docs[1]), "speedup": metrics.speedups(docs[0]["metrics"], docs[1]["metrics"])}


def _write_results(args, docs: list) -> None:
    if args.result_json:
        write_json(docs[0], args.result_json)
        if len(docs) == 2:
            write_json(docs[1], b_path(args.result_json))
    if args.result_csv:
        append_csv([csv_row(d) for d in docs], args.result_csv)


def _exit_status(docs: list) -> int:
    """1 where a run had failed requests (each such run's first error is printed), else 0."""
    status = 0
    for i, doc in enumerate(docs):
        msg = metrics.failure_summary(doc["metrics"])
        if msg:
            who = f" ({'AB'[i]}: {doc['config']['model']})" if len(docs) == 2 else ""
            first = next((r["error"] for r in doc["requests"] if r["error"]), "")
            print(f"error: {msg}{who}; first error: {first}", file=sys.stderr)
            status = 1
    if docs[0].get("warmup_errors"):
        print(f"warning: {docs[0]['warmup_errors']} warm-up requests failed", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
