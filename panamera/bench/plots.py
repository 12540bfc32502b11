"""Bar charts like the paper's Figs. 9-11: speedup of Panamera over every peer (and the stand-ins) per
workload, and every plan's modeled time as a ratio to the limit. Needs matplotlib (the `plot` extra)."""

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
        plans = [p for p in dict.fromkeys(r["plan"] for r in records if r["suite"] == suite) if p != "panamera"]
        fig, ax = plt.subplots(figsize=(max(10, 0.45 * len(names)), 5.5))
        width = 0.8 / max(len(plans), 1)
        for k, base in enumerate(plans):
            xs = [i + (k - (len(plans) - 1) / 2) * width for i, n in enumerate(names) if base in rows[n]]
            vals = [rows[n][base]["modeled_us"] / rows[n]["panamera"]["modeled_us"] for n in names if base in rows[n]]
            ax.bar(xs, vals, width, label=f"over {base}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        paths.append(_save(plt, fig, ax, names, "speedup of Panamera (modeled)",
                           f"{suite}: modeled speedup over each peer on {gpu}", os.path.join(out, f"speedup_{suite}.png")))  # fmt: skip
        fig, ax = plt.subplots(figsize=(max(10, 0.45 * len(names)), 5.5))
        every = ["panamera", *[p for p in plans if "stand-in" not in p]]
        width = 0.8 / len(every)
        for k, base in enumerate(every):
            xs = [i + (k - (len(every) - 1) / 2) * width for i, n in enumerate(names) if base in rows[n]]
            ax.bar(xs, [rows[n][base]["ratio_to_limit"] for n in names if base in rows[n]], width, label=base)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(1.1, color="grey", linewidth=0.8, linestyle="--")
        paths.append(_save(plt, fig, ax, names, "modeled time / limit", f"{suite}: ratio to the limit on {gpu}",
                           os.path.join(out, f"limit_{suite}.png")))  # fmt: skip
    return paths


def _save(plt, fig, ax, names, ylabel: str, title: str, path: str) -> str:
    ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_xticks(range(len(names)), names, rotation=75, ha="right", fontsize=7)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
