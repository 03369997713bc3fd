"""The HTML report of a score run directory: leaderboards, log-likelihood vs ratio curves (the paper's Fig. 5-6,
here one line per group of candidates: by truth when the candidates carry one, else by model), per-model score
distributions, and predicted vs true per-model quality. Plots are embedded PNGs; the file is written whole."""
from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .io import atomic_write  # noqa: E402
from .methods import MEASURE_NAMES, METHODS  # noqa: E402
from .run import format_stats  # noqa: E402
from .score_run import leaderboards, load_scores  # noqa: E402


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _group(row: dict) -> str:
    t = row.get("truth")
    return f"truth {t:g}" if t is not None else row["model"]


def curves_figure(rows: list[dict], ratios: list[float], method: str) -> str:
    """Mean log-likelihood of the candidates' answers against the ratio r, per group, with +-1 standard error."""
    groups: dict[str, list] = {}
    for r in rows:
        if r["method"] == method:
            groups.setdefault(_group(r), []).append(r["curve"])
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for name in sorted(groups):
        c = np.array(groups[name])
        mean, se = c.mean(0), c.std(0, ddof=1) / np.sqrt(len(c)) if len(c) > 1 else np.zeros(c.shape[1])
        ax.plot(ratios, mean, marker="o", label=f"{name} (n={len(c)})")
        ax.fill_between(ratios, mean - se, mean + se, alpha=0.2)
    ax.set_xlabel("ratio r (fraction of good demos)")
    ax.set_ylabel("mean log P(y | demos, x)")
    ax.set_title(f"{method}: log-likelihood vs ratio")
    ax.legend(fontsize=8)
    return _png(fig)


def distribution_figure(rows: list[dict], method: str, measures: tuple[str, ...]) -> str:
    """Per-model distribution of each measure (box plot with the individual candidates over it)."""
    models = sorted({r["model"] for r in rows if r["method"] == method})
    fig, axes = plt.subplots(1, len(measures), figsize=(4.2 * len(measures), 3.4), squeeze=False)
    rng = np.random.default_rng(0)
    for ax, measure in zip(axes[0], measures):
        data = [[r[measure] for r in rows if r["method"] == method and r["model"] == m and r.get(measure) is not None]
                for m in models]
        ax.boxplot([d if d else [math.nan] for d in data], showmeans=True)
        ax.set_xticks(range(1, len(models) + 1), models, rotation=30, ha="right", fontsize=8)
        for i, d in enumerate(data, 1):
            ax.scatter(i + rng.uniform(-0.15, 0.15, len(d)), d, s=6, alpha=0.35, color="gray")
        ax.set_title(f"{method}: {MEASURE_NAMES[measure]}")
        ax.set_ylim(-0.05, 1.05)
    return _png(fig)


def ranking_figure(board: dict) -> str:
    """Per-model mean of each measure against the model's true quality."""
    truth = board["truth"]
    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    for measure, s in board["measures"].items():
        models = [m for m in s["models"] if m["model"] in truth and not math.isnan(m["mean"])]
        x, y = [truth[m["model"]] for m in models], [m["mean"] for m in models]
        ax.scatter(x, y, label=f"{MEASURE_NAMES[measure]} (Spearman {s['spearman']:+.2f})")
        for m, xi, yi in zip(models, x, y):
            ax.annotate(m["model"], (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("true quality (mean truth)")
    ax.set_ylabel("predicted (per-model mean)")
    ax.set_title(f"{board['method']}: predicted vs true")
    ax.legend(fontsize=8)
    return _png(fig)


def _fmt(v) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}" if isinstance(v, float) \
        else html.escape(str(v))


def board_table(board: dict) -> str:
    measures = list(board["measures"])
    head = "".join(f"<th>{MEASURE_NAMES[x]}</th><th>95% CI</th><th>rank</th>" for x in measures)
    head += "<th>truth</th><th>true rank</th>" if board["truth"] else ""
    cells = {x: {m["model"]: m for m in board["measures"][x]["models"]} for x in measures}
    body = []
    for m in board["measures"][measures[0]]["models"]:
        tds = f"<td>{html.escape(m['model'])}</td><td>{m['n']}</td>"
        for x in measures:
            c = cells[x][m["model"]]
            tds += (f"<td>{_fmt(c['mean'])}</td><td>[{_fmt(c['ci_low'])}, {_fmt(c['ci_high'])}]</td>"
                    f"<td>{_fmt(c['rank'])}</td>")
        if board["truth"]:
            name = m["model"]
            tds += f"<td>{_fmt(board['truth'].get(name))}</td><td>{_fmt(board['truth_rank'].get(name))}</td>"
        body.append(f"<tr>{tds}</tr>")
    notes = []
    for x in measures:
        s = board["measures"][x]
        if board["truth"]:
            notes.append(f"{MEASURE_NAMES[x]}: Spearman {_fmt(s['spearman'])}, Kendall {_fmt(s['kendall'])}")
        unscored = sum(m["unscored"] for m in s["models"])
        if unscored:
            notes.append(f"{MEASURE_NAMES[x]}: {unscored} unscored")
    if "distribution" in board:
        notes.append(f"posterior vs truth_dist: MAE {_fmt(board['distribution']['mae'])}, "
                     f"cross-entropy {_fmt(board['distribution']['cross_entropy'])}")
    return (f"<table><tr><th>model</th><th>n</th>{head}</tr>{''.join(body)}</table>"
            f"<p>{'; '.join(html.escape(n) for n in notes)}</p>")


def write_report(run_dir, output=None) -> Path:
    run_dir = Path(run_dir)
    task, candidates, rows, meta = load_scores(run_dir)
    parts = [f"<h1>ICQS report: {html.escape(task.name)}</h1>",
             f"<p>model {html.escape(str(meta.get('model')))}; {len(candidates)} candidates; M = {task.M} "
             f"(ratios {', '.join(f'{r:g}' for r in task.ratios)}), N = {task.N} demos per set, L = {task.L}, "
             f"{html.escape(str(meta.get('sampler')))} demo sets, seed {task.seed}</p>"]
    if not rows:
        parts.append("<p>No method has complete results yet.</p>")
    for board in leaderboards(rows, meta.get("engine_stats")):
        method = METHODS[board["method"]]
        parts += [f"<h2>{html.escape(method.title)}</h2>", board_table(board)]
        if "engine_stats" in board:
            parts.append(f"<p>engine: {html.escape(format_stats(board['engine_stats']))}</p>")
        if method.curves:
            parts.append(curves_figure(rows, task.ratios, method.name))
        parts.append(distribution_figure(rows, method.name, tuple(board["measures"])))
        if board["truth"]:
            parts.append(ranking_figure(board))
    style = ("body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}img{margin:6px}")
    text = f"<!doctype html><html><head><meta charset='utf-8'><title>ICQS report</title><style>{style}</style>" \
           f"</head><body>{''.join(parts)}</body></html>"
    path = Path(output) if output else run_dir / "report.html"
    atomic_write(path, text)
    return path
