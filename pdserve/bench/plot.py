"""TBT over time, one panel per configuration: each chat token gap at the time it ended, with the
documents' arrivals (dashed) and first tokens (solid) marked."""

from __future__ import annotations

from pathlib import Path

from pdserve.bench.compare_report import CompareRuns
from pdserve.bench.runner import RunResult


def _chat_gaps(run: RunResult) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for record in run.records:
        if record.kind == "chat":
            xs.extend(record.token_times[1:])
            ys.extend(g * 1e3 for g in record.gaps_s)
    return xs, ys


def _panel(ax, title: str, run: RunResult) -> None:
    xs, ys = _chat_gaps(run)
    ax.scatter(xs, ys, s=6, alpha=0.6)
    for record in run.records:
        if record.kind == "document" and record.sent_s is not None:
            ax.axvline(record.sent_s, color="tab:red", linestyle="--", linewidth=0.8)
            if record.token_times:
                ax.axvline(record.token_times[0], color="tab:red", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.set_ylabel("chat TBT (ms)")
    ax.grid(True, which="both", alpha=0.3)


def plot_tbt(runs: CompareRuns, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f"mixed on {name}", run) for name, run in runs.mixed.items()]
    panels.append(("chat alone on disaggregated", runs.chat))
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.2 * len(panels)), sharex=True, sharey=True)
    for ax, (title, run) in zip(axes, panels):
        _panel(ax, title, run)
    axes[-1].set_xlabel("seconds since the run started (red: document sent --, first token -)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
