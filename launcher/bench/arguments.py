"""`llmlaunch-bench`'s options, a function per group of them (launcher/bench/cli.py's build_parser adds them in
this order, which is the order of --help)."""

from __future__ import annotations

import argparse
import math

from launcher.bench import backends, datasets


def add_target(p: argparse.ArgumentParser) -> None:
    """--url, --backend, --model: where the requests go, over which protocol."""
    p.add_argument(
        "--url",
        "-u",
        default="localhost:8001",
        help="grpc://HOST:PORT or HOST:PORT (default localhost:8001); with an openai backend http://HOST:PORT[/v1]",
    )
    p.add_argument(
        "--backend",
        default=backends.DEFAULT,
        choices=backends.NAMES,
        help="the protocol requests go over (default triton-grpc): triton-grpc = KServe v2 gRPC streaming; "
        "openai-completions / openai-chat = OpenAI HTTP /v1/completions or /v1/chat/completions with "
        "SSE, against llmlaunch's OpenAI API or any OpenAI-compatible server (vLLM's, SGLang's)",
    )
    p.add_argument("--model", "-m", help="model name (default: the one the server serves)")


def add_dataset(p: argparse.ArgumentParser) -> None:
    """The prompts: which dataset, how many, how long."""
    d = p.add_argument_group("dataset")
    d.add_argument("--dataset", help="dataset file: ShareGPT .json, CNN/DailyMail .json, or prompts .txt")
    d.add_argument(
        "--dataset-name",
        default="auto",
        choices=("auto",) + datasets.KINDS,
        help="format of --dataset (auto: detect); 'synthetic' needs no file",
    )
    d.add_argument(
        "--num-prompts",
        type=int,
        help="measured requests (default: 1000 for sharegpt/synthetic, "
        "the whole file otherwise; unlimited with --duration)",
    )
    d.add_argument(
        "--tokenizer",
        help="Hugging Face tokenizer directory for token lengths and synthetic prompts "
        "(default: the one the served model's config names, when that folder is readable here; else an "
        "estimate, whitespace words or chars/4)",
    )
    d.add_argument("--input-len", type=int, default=128, help="synthetic prompt length in tokens (default 128)")
    d.add_argument(
        "--output-len",
        type=int,
        help="requested output tokens for every request (default: the "
        "dataset's completion length; 128 for prompts/synthetic)",
    )
    d.add_argument("--range-ratio", type=float, default=0.0, help="synthetic lengths uniform in [L(1-r), L(1+r)]")
    d.add_argument("--prefix-groups", type=int, default=8, help="prefix: groups sharing one prefix each (default 8)")
    d.add_argument(
        "--prefix-len",
        type=int,
        default=1024,
        help="prefix: tokens of each group's shared prefix (default 1024); --input-len is each request's own suffix",
    )
    d.add_argument(
        "--turns",
        type=int,
        default=4,
        help="multiturn: turns a conversation (default 4); each turn sends the whole history; with --dataset, "
        "a ShareGPT file's conversations, else synthetic (--input-len user messages, --output-len answers)",
    )
    d.add_argument("--max-input-len", type=int, help="skip prompts longer than this (sharegpt default 1024)")
    d.add_argument("--max-total-len", type=int, default=2048, help="sharegpt: skip prompt+output longer than this")
    d.add_argument("--seed", type=int, default=0, help="seed of dataset sampling and arrival times (default 0)")


def add_load(p: argparse.ArgumentParser) -> None:
    """How the requests are sent: concurrency or rate, for how long, from how many processes."""
    ld = p.add_argument_group("load")
    ld.add_argument("--concurrency", "-c", type=int, help="max requests in flight (fixed-concurrency mode)")
    ld.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="mean requests/s with random arrivals (default inf: no pacing)",
    )
    ld.add_argument(
        "--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps: 1 = Poisson, <1 burstier"
    )
    ld.add_argument("--duration", type=float, help="stop sending after this many seconds (dataset cycled)")
    ld.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="requests sent first and not counted; their prompts drawn with --seed + 1, apart from the measured ones",
    )
    ld.add_argument(
        "--processes",
        type=int,
        default=1,
        help="client processes sharing the load (at a --concurrency "
        "alone they take requests from one queue, a process whose request ended sending the next; at a "
        "--request-rate request i is sent by process i %% N, at the same arrival times for any N)",
    )
    ld.add_argument("--streams", type=int, default=1, help="gRPC streams per client process")
    ld.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="fail requests still running this long after the last send (default 600 s)",
    )


def add_requests(p: argparse.ArgumentParser) -> None:
    """What each request asks: its sampling, stop words, parameters."""
    r = p.add_argument_group("requests")
    r.add_argument(
        "--ignore-eos",
        action="store_true",
        help="enforce the requested output length (ignore_eos and min_length = max_tokens)",
    )
    r.add_argument("--no-stream", action="store_true", help="ask for one response per request")
    r.add_argument("--temperature", type=float, help="temperature (unset: server default)")
    r.add_argument("--top-p", type=float)
    r.add_argument("--top-k", type=int)
    r.add_argument("--sampling-seed", type=int, help="random_seed sent with every request")
    r.add_argument("--stop", action="append", default=[], metavar="WORD", help="stop word (repeatable)")
    r.add_argument(
        "--request-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Triton request parameter passed to the model (repeatable)",
    )
    r.add_argument(
        "--final-counts-only",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="ask for the token counts on each streamed request's final response only (text_output alone "
        "before it: less for the server to send a token, the figures the same).  Default: asked of a "
        "model whose config says it honours it (llmlaunch's models; not the TensorRT-LLM ensemble "
        "or a model made elsewhere, some of which fail a request on a parameter they do not know)",
    )


def add_results(p: argparse.ArgumentParser) -> None:
    """Where the results go, and what else to measure or compare."""
    o = p.add_argument_group("results")
    o.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="SLOs for goodput: ttft:MS tpot:MS e2el:MS")
    o.add_argument("--result-json", help="write config, metrics and every request here")
    o.add_argument("--result-csv", help="append a one-line summary here (header when new)")
    o.add_argument("--label", default="", help="free text stored with the results")
    o.add_argument("--save-text", action="store_true", help="keep generated text in the JSON")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    o.add_argument(
        "--eval", action="store_true", help="score the model instead (lm-eval; `llmlaunch-bench --eval --help`)"
    )
    o.add_argument(
        "--server-metrics",
        metavar="URL[,URL...]",
        help="tritonserver metrics URL (http://HOST:PORT/metrics) of the served llmlaunch model: report where "
        "the mean TTFT goes, inside the model (parse / add / engine / back / respond / send) and outside it, and how "
        "the hf engine spent its steps (launch / wait for the GPU / host work; GPU busy and idle; its prefix cache's "
        "hit rate) (first run only), over the measured requests (read after the warm-up).  With replicas, the replica leaders' URLs (endpoint.json's replicas' "
        "metrics_url), comma-separated: their totals are summed",
    )
    o.add_argument(
        "--prefill-metrics",
        metavar="URL[,URL...]",
        help="disaggregated serving: which of --server-metrics' URLs are prefill replicas' (the first "
        "disagg.prefill replicas of endpoint.json); the first-token split is then shown for the decode replicas "
        "with the prefill replicas' beside it, and what lies outside both (the front end's two legs, gRPC, client)",
    )
    o.add_argument(
        "--compare",
        metavar="URL2[,MODEL2]",
        help="identity test: run the same load against a second model and print the speedup of it over the first",
    )
