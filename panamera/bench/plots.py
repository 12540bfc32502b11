"""The bench's charts, at README width (950 px) on linear axes around 1x, one colour per plan in
every chart. Needs matplotlib (the `plot` extra) to draw; `charts(records)` is pure data.

- `headline.png`: per suite, the geometric mean of Panamera's speedup over the best peer of each
  workload, with the range (worst to best workload) and the number of wins;
- `speedup_<suite>.png`: per workload, a grey bar for the speedup over the best peer and a dot
  for the speedup over each peer and stand-in (right of 1: Panamera is faster);
- `limit_<suite>.png`: per workload, each plan's modeled time over the limit (1 is the limit).

Axes are linear and clipped at a cap taken from the data (at most `MAX_CAP`): a value beyond it is
drawn at the edge as a triangle and written out at the right, so one 230x outlier does not squash
every other bar against 1, as a log axis it forces would.

>>> rec = lambda w, plan, us: {"suite": "s", "workload": w, "dtype": "f32", "plan": plan, "gpu": "H100",
...     "modeled_us": us, "ratio_to_limit": us / 10}
>>> pan = {**rec("a", "panamera", 10), "best_peer": "cub", "speedup_over_best_peer": 2.0}
>>> cs = charts([pan, rec("a", "cub", 20), rec("a", "tvm-default", 5000)])
>>> [c.name for c in cs], cs[1].width_px, cs[1].clipped
(['headline', 'speedup_s', 'limit_s'], 950, (('a f32', 'tvm-default', 500.0),))
>>> colour("cub") == cs[1].series[0].colour == cs[2].series[1].colour
True
"""

from __future__ import annotations

import math
import os
import zlib
from dataclasses import dataclass

from .. import logs
from .baselines import DETERMINISTIC, PEER_NAMES, SINGLE, UNFUSED

WIDTH_IN, DPI = 9.5, 100  # 950 px: the width of a README column on GitHub
ROW_IN, MARGIN_IN = 0.2, 1.5  # height per workload row, plus title, legend and axis
BEST_BAR = "#d9d9d9"  # the bar of a speedup over the best peer, in every chart
MAX_CAP = 5.0  # no axis goes beyond 5x (speedups) or 5 (ratios to the limit); outliers are written out

# One colour per plan, the same in every chart (Tableau's 10 + 10 lighter), in a fixed order;
# a plan not listed gets one from its name's checksum, so it too keeps its colour everywhere.
_TAB = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#aec7e8",
    "#ffbb78",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
    "#637939",
)  # fmt: skip  (no greys: those are Panamera's own variants)
PALETTE: dict[str, str] = {"panamera": "#000000", DETERMINISTIC: "#555555", SINGLE: "#999999", UNFUSED: "#cccccc"}
PALETTE.update({p: _TAB[k % len(_TAB)] for k, p in enumerate(p for p in PEER_NAMES if p not in PALETTE)})


def colour(plan: str) -> str:
    """The plan's colour in every chart."""
    return PALETTE.get(plan) or _TAB[zlib.crc32(plan.encode()) % len(_TAB)]


@dataclass(frozen=True)
class Series:
    name: str  # the plan
    colour: str
    values: tuple[float | None, ...]  # one per row; None where the plan has no kernel for it


@dataclass(frozen=True)
class Chart:
    """One figure as data: what `render` draws."""

    name: str  # the file is <name>.png
    title: str
    xlabel: str
    rows: tuple[str, ...]  # top to bottom
    series: tuple[Series, ...]  # dots (or, for "bars", one bar per row)
    lo: float  # the linear x axis
    hi: float
    lines: tuple[float, ...] = (1.0,)  # reference lines (1x; the limit)
    bars: Series | None = None  # a bar per row behind the dots (speedup over the best peer)
    notes: tuple[str, ...] = ()  # per row, text written at the right (a bar's label)
    clipped: tuple[tuple[str, str, float], ...] = ()  # (row, series, value) beyond `hi`, drawn at the edge
    scale: str = "linear"

    @property
    def width_px(self) -> int:
        return round(WIDTH_IN * DPI)

    @property
    def height_px(self) -> int:
        return round((MARGIN_IN + ROW_IN * max(len(self.rows), 3)) * DPI)


def _cap(primary, values) -> float:
    """The axis end: past every `primary` value (what the chart is about: the speedup over the
    best peer, Panamera's ratio to the limit) and past half of all `values`, rounded up to a half,
    at least 1.5 and at most MAX_CAP."""
    ps = [v for v in primary if v is not None and math.isfinite(v)]
    vs = sorted(v for v in values if v is not None and math.isfinite(v))
    top = max(max(ps, default=1.0) * 1.1, vs[len(vs) // 2] if vs else 1.0)
    return min(MAX_CAP, max(1.5, math.ceil(top * 2) / 2))


def _clipped(rows, series, hi) -> tuple:
    return tuple((r, s.name, v) for s in series for r, v in zip(rows, s.values) if v is not None and v > hi)


def _by_suite(records: list[dict]) -> dict[str, dict[str, dict[str, dict]]]:
    out: dict = {}
    for r in records:
        out.setdefault(r["suite"], {}).setdefault(f"{r['workload']} {r['dtype']}", {})[r["plan"]] = r
    return out


def charts(records: list[dict]) -> list[Chart]:
    """Every chart of `records` (run_bench's), as data."""
    gpu = records[0]["gpu"] if records else "?"
    suites = _by_suite(records)
    out = [_headline(suites, gpu)]
    for suite, rows in suites.items():
        names = tuple(rows)
        plans = [p for p in dict.fromkeys(r["plan"] for r in records if r["suite"] == suite) if p != "panamera"]
        ratio = {p: tuple(rows[n][p]["modeled_us"] / rows[n]["panamera"]["modeled_us"] if p in rows[n] else None
                          for n in names) for p in plans}  # fmt: skip
        series = tuple(Series(p, colour(p), ratio[p]) for p in plans)
        best = tuple(rows[n]["panamera"].get("speedup_over_best_peer") for n in names)
        best_bar = Series("over the best peer", BEST_BAR, best)
        hi = _cap(best, [v for s in series if s.name in PEER_NAMES for v in s.values])
        notes = tuple(f"{b:.2f}x over {_short(rows[n]['panamera'].get('best_peer', '-'))}" if b else ""
                      for n, b in zip(names, best))  # fmt: skip
        out.append(Chart(
            f"speedup_{suite}", f"{suite}: Panamera's modeled speedup over each peer on {gpu} (bar: over the best)",
            "speedup of Panamera (modeled; > 1: Panamera faster)", names, series, 0.0, hi, (1.0,), best_bar, notes,
            _clipped(names, series + (best_bar,), hi)))  # fmt: skip
        every = ["panamera", *[p for p in plans if "stand-in" not in p]]
        lim = tuple(Series(p, colour(p), tuple(rows[n][p]["ratio_to_limit"] if p in rows[n] else None for n in names))
                    for p in every)  # fmt: skip
        hi = _cap(lim[0].values, [v for s in lim for v in s.values])
        out.append(Chart(f"limit_{suite}", f"{suite}: modeled time over the limit on {gpu} (1 = the limit)",
                         "modeled time / limit", names, lim, 0.9, hi, (1.0, 1.1), clipped=_clipped(names, lim, hi)))  # fmt: skip
    return out


def _headline(suites: dict, gpu: str) -> Chart:
    names, gm, lo_hi, notes = [], [], [], []
    for suite, rows in suites.items():
        sp = [
            p["panamera"]["speedup_over_best_peer"] for p in rows.values() if "speedup_over_best_peer" in p["panamera"]
        ]
        if not sp:
            continue
        g = math.exp(sum(map(math.log, sp)) / len(sp))
        names.append(suite)
        gm.append(g)
        lo_hi.append((min(sp), max(sp)))
        wins = sum(1 for v in sp if v > 1.0)
        notes.append(f"{g:.2f}x geomean, {wins}/{len(sp)} wins, range {min(sp):.2f}-{max(sp):.2f}x")
    bars = Series("geomean over the best peer", BEST_BAR, tuple(gm))
    worst = Series("worst workload", "#d62728", tuple(lo for lo, _ in lo_hi))
    best = Series("best workload", "#2ca02c", tuple(hi for _, hi in lo_hi))
    hi = _cap(best.values, gm)
    return Chart(
        "headline",
        f"Panamera's modeled speedup over the best peer of each workload, per suite ({gpu})",
        "speedup over the best peer (modeled; > 1: Panamera faster)",
        tuple(names),
        (worst, best),
        0.0,
        hi,
        (1.0,),
        bars,
        tuple(notes),
    )  # fmt: skip  (the notes give the range: nothing clipped to write)


def _short(plan: str) -> str:
    from .runner import SHORT

    return SHORT.get(plan, plan)


def render(chart: Chart, out: str) -> str:
    """Draw `chart` to `out/<name>.png` (matplotlib, Agg); returns the path."""
    logs.require_extra(logs.Extra.MATPLOTLIB, "bench --plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(chart.rows)
    fig, ax = plt.subplots(figsize=(chart.width_px / DPI, chart.height_px / DPI), dpi=DPI)
    ys = list(range(n))[::-1]  # first row on top
    if chart.bars is not None:
        vals = [min(v, chart.hi) if v is not None else 0.0 for v in chart.bars.values]
        ax.barh(ys, vals, height=0.7, color=chart.bars.colour, label=chart.bars.name, zorder=1)
    k = len(chart.series)
    for j, s in enumerate(chart.series):
        off = (j - (k - 1) / 2) * min(0.6 / max(k, 1), 0.12)  # spread the dots of one row a little
        pts = [(min(v, chart.hi), y + off, v > chart.hi) for v, y in zip(s.values, ys) if v is not None]
        inside = [(x, y) for x, y, c in pts if not c]
        edge = [(x, y) for x, y, c in pts if c]
        if inside:
            ax.scatter(*zip(*inside), s=18, color=s.colour, label=s.name, zorder=3, edgecolors="none")
        if edge:
            ax.scatter(*zip(*edge), s=22, color=s.colour, marker=">", zorder=3,
                       label=None if inside else s.name)  # fmt: skip
    for x in chart.lines:
        ax.axvline(x, color="black" if x == 1.0 else "grey", linewidth=0.8, linestyle="-" if x == 1.0 else "--")
    beyond: dict[str, list[tuple[float, str]]] = {}
    for row, name, v in chart.clipped:
        beyond.setdefault(row, []).append((v, name))
    for y, row, note in zip(ys, chart.rows, chart.notes or ("",) * n):
        far = sorted(beyond.get(row, []), reverse=True)
        more = f"{len(far)} beyond {chart.hi:g}, up to {far[0][0]:.3g} ({_short(far[0][1])})" if far else ""
        text = "; ".join(t for t in (note, more) if t)
        if text:
            ax.text(1.01, y, text, transform=ax.get_yaxis_transform(), fontsize=6, va="center", color="#333333")
    ax.set_xscale(chart.scale)
    ax.set_xlim(chart.lo, chart.hi)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_yticks(ys, chart.rows, fontsize=7)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel(chart.xlabel, fontsize=8)
    ax.grid(axis="x", linewidth=0.3, color="#dddddd", zorder=0)
    h = chart.height_px / DPI
    fig.suptitle(chart.title, fontsize=9, y=1 - 0.08 / h, va="top")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, [_short(lb) for lb in labels], fontsize=7, ncol=6, loc="upper center",
               bbox_to_anchor=(0.5, 1 - 0.32 / h), frameon=False, handletextpad=0.2, columnspacing=1.0)  # fmt: skip
    label_px = 5.6 * max((len(r) for r in chart.rows), default=8) + 24  # 7-point labels: about 5.5 px a character
    fig.subplots_adjust(left=min(0.4, label_px / chart.width_px), right=0.72 if chart.notes or chart.clipped else 0.97,
                        top=1 - (MARGIN_IN - 0.55) / h, bottom=0.45 / h)  # fmt: skip
    path = os.path.join(out, f"{chart.name}.png")
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_all(records: list[dict], out: str) -> list[str]:
    """Draw every chart of `records` into `out`; returns the paths."""
    logs.require_extra(logs.Extra.MATPLOTLIB, "bench --plot")
    return [render(c, out) for c in charts(records)]
