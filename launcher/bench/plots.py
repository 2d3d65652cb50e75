"""llmlaunch-report's plots of a sweep's points (launcher/bench/report.py's Points, which it loads and passes in):
output tokens/s against concurrency (or request rate) and latency against throughput, a line per config."""

from __future__ import annotations

from pathlib import Path


def _by_config(points):
    groups: dict = {}
    for pt in points:
        groups.setdefault(pt.config, []).append(pt)
    return groups


def plot(points: list, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    use_conc = any(p.concurrency is not None for p in points)
    xval = (lambda p: p.concurrency) if use_conc else (lambda p: p.request_rate)
    groups = sorted(_by_config(points).items())
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return [
        _plot_throughput(plt, groups, colors, xval, use_conc, out / "throughput_vs_concurrency.png"),
        _plot_latency(plt, groups, colors, xval, use_conc, out / "latency_throughput.png"),
    ]


def _plot_throughput(plt, groups: list, colors: list, xval, use_conc: bool, path: Path) -> Path:
    """Output tokens/s against concurrency (or request rate), a line per config; failed points as red crosses on the
    x axis, and points whose run had failed requests say how many."""
    from matplotlib import ticker

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    failed_label = True
    xs_all = []
    for i, (config, pts) in enumerate(groups):
        color = colors[i % len(colors)]
        good = sorted(
            (xval(p), p.metric("output_throughput"), p)
            for p in pts
            if p.result is not None and xval(p) is not None and p.metric("output_throughput") is not None
        )
        if good:
            ax.plot([g[0] for g in good], [g[1] for g in good], "o-", color=color, label=config)
            for x, y, p in good:
                if p.status == "errors":
                    ax.annotate(
                        f"{p.metric('failed')} requests failed",
                        (x, y),
                        textcoords="offset points",
                        xytext=(4, 6),
                        fontsize=7,
                        color="tab:red",
                    )
            xs_all += [g[0] for g in good]
        bad = [xval(p) for p in pts if p.result is None and xval(p) is not None]
        if bad:
            _plot_failed(ax, config, bad, failed_label)
            failed_label = False
            xs_all += bad
    if xs_all and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 8:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(xs_all)))
        ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    xlabel = "concurrency (requests in flight)" if use_conc else "request rate (req/s)"
    return _finish(plt, fig, ax, xlabel, "output tokens/s", "Output throughput against load", path)


def _plot_failed(ax, config: str, xs: list, legend: bool) -> None:
    """The failed points of one config (x values `xs`): red crosses on the x axis, each saying so; `legend`: the
    first config with any, whose crosses the legend explains."""
    ax.plot(
        xs,
        [0] * len(xs),
        "x",
        color="tab:red",
        markersize=10,
        mew=2,
        clip_on=False,
        zorder=5,
        label="failed point (see summary.csv)" if legend else None,
    )
    for x in xs:
        ax.annotate(
            f"{config}: failed",
            (x, 0),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
            fontsize=7,
            color="tab:red",
        )


def _plot_latency(plt, groups: list, colors: list, xval, use_conc: bool, path: Path) -> Path:
    """p50 (solid) and p99 (dashed) TTFT against output tokens/s, a pair of lines per config, each point labelled
    with its concurrency (c=) or request rate (r=)."""
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for i, (config, pts) in enumerate(groups):
        color = colors[i % len(colors)]
        good = sorted(
            (p.metric("output_throughput"), p.metric("ttft_ms.p50"), p.metric("ttft_ms.p99"), xval(p))
            for p in pts
            if p.result is not None
            and p.metric("output_throughput") is not None
            and p.metric("ttft_ms.p50") is not None
        )
        if not good:
            continue
        tput = [g[0] for g in good]
        ax.plot(tput, [g[1] for g in good], "o-", color=color, label=f"{config}: p50 TTFT")
        ax.plot(tput, [g[2] for g in good], "^--", color=color, label=f"{config}: p99 TTFT")
        for t, p50, _, x in good:
            if x is not None:
                ax.annotate(
                    f"{'c' if use_conc else 'r'}={x:g}",
                    (t, p50),
                    textcoords="offset points",
                    xytext=(4, -10),
                    fontsize=7,
                    color=color,
                )
    return _finish(plt, fig, ax, "output tokens/s", "time to first token (ms)", "Latency against throughput", path)


def _finish(plt, fig, ax, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    """Label the plot, y from 0, grid and legend (where there are lines); write it to `path` and close it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
