"""Bar charts like the paper's Figs. 9-11: speedup of Panamera over each baseline per workload,
and Panamera's modeled time against the limit. Needs matplotlib (the `plot` extra)."""

from __future__ import annotations

import os

from ..errors import PanameraError


def plot_all(records: list[dict], out: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PanameraError("--plot needs matplotlib: pip install 'panamera[plot]'") from None
    paths = []
    for suite in dict.fromkeys(r["suite"] for r in records):
        rows = {}
        for r in records:
            if r["suite"] == suite:
                rows.setdefault(f"{r['workload']} {r['dtype']}", {})[r["plan"]] = r
        names, gpu = list(rows), records[0]["gpu"]
        fig, ax = plt.subplots(figsize=(max(8, 0.35 * len(names)), 5))
        width = 0.27
        for k, base in enumerate(("eager", "single-block", "deterministic")):
            vals = [rows[n][base]["modeled_us"] / rows[n]["panamera"]["modeled_us"] for n in names]
            ax.bar([i + (k - 1) * width for i in range(len(names))], vals, width, label=f"over {base}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        paths.append(_save(plt, fig, ax, names, "speedup of Panamera (modeled)",
                           f"{suite}: modeled speedup on {gpu}", os.path.join(out, f"speedup_{suite}.png")))  # fmt: skip
        fig, ax = plt.subplots(figsize=(max(8, 0.35 * len(names)), 5))
        ax.bar(range(len(names)), [rows[n]["panamera"]["modeled_us"] for n in names], label="Panamera (modeled)")
        ax.plot(range(len(names)), [rows[n]["panamera"]["limit_us"] for n in names], "k_", markersize=14, label="limit")
        paths.append(_save(plt, fig, ax, names, "us", f"{suite}: modeled time against the limit on {gpu}",
                           os.path.join(out, f"limit_{suite}.png")))  # fmt: skip
    return paths


def _save(plt, fig, ax, names, ylabel: str, title: str, path: str) -> str:
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_xticks(range(len(names)), names, rotation=75, ha="right", fontsize=7)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
