"""The HTML report of a score run directory. It opens with the evaluator audit (a table and a plot of each
measure's AUC with its CI on the task's own pool), then per method: how to read its numbers, the leaderboard
(measures the audit found at chance or inverted marked), the log-likelihood vs ratio curves (the paper's Fig. 5-6,
one line per truth group, else per model), each model's scores (every candidate as a dot, the mean with its 95% CI),
and predicted vs true per-model quality (one panel per measure, one scale each). It ends with a per-item table
(question, answer, model, each method's score, truth). Plots are embedded PNGs sized to the page; the file is
written whole. `benchmarks/report_screenshots.py` renders reports in headless Chromium to check them by eye."""
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

from .audit import BAD_VERDICTS, audit_share, flagged, read_audit  # noqa: E402
from .io import atomic_write  # noqa: E402
from .methods import EXPLAIN, MEASURE_NAMES, METHODS  # noqa: E402
from .run import format_stats  # noqa: E402
from .score_run import leaderboards, load_scores  # noqa: E402

WIDTH = 10.5  # inches at 100 dpi: the page's 1100 px column
STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:auto;padding:0 12px;line-height:1.4}"
         "table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}"
         "th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}"
         "tr.flag td{background:#fdecea}img{max-width:100%;height:auto;display:block;margin:8px 0}"
         ".how{background:#f6f8fa;border-left:4px solid #7a9;padding:6px 10px;font-size:14px}"
         ".warn{color:#a00;font-weight:bold}.items{max-height:520px;overflow:auto;display:block}")
VERDICT_COLORS = {"reliable": "#2a7", "weak": "#d90", "at chance": "#c33", "inverted": "#800", "unscored": "#888",
                  "skipped": "#888"}


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _fmt(v) -> str:
    """One way for every number: 3 decimals, integers as they are, nan / None as '-'."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v))
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    return f"{v:.3f}" if isinstance(v, float) else html.escape(str(v))


def _draw0(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("draw", 0) == 0]


def _group(row: dict) -> str:
    t = row.get("truth")
    return f"truth {t:g}" if t is not None else row["model"]


def audit_figure(entries: list[dict]) -> str:
    """Each measure's audit AUC with its 95% CI, coloured by verdict, against the chance line."""
    shown = [e for e in entries if e.get("auc") is not None and not math.isnan(e["auc"])]
    fig, ax = plt.subplots(figsize=(WIDTH, 0.45 * len(shown) + 1.2))
    for i, e in enumerate(shown):
        color = VERDICT_COLORS.get(e["verdict"], "#555")
        ax.errorbar(e["auc"], i, xerr=[[e["auc"] - e["ci"][0]], [e["ci"][1] - e["auc"]]], fmt="o", color=color,
                    capsize=4)
        ax.text(1.02, i, e["verdict"], va="center", color=color, fontsize=10, transform=ax.get_yaxis_transform())
    ax.axvline(0.5, color="#999", ls="--")
    ax.set_yticks(range(len(shown)), [f"{e['method']} {MEASURE_NAMES.get(e['measure'], e['measure'])}"
                                      for e in shown])
    ax.set_xlim(-0.02, 1.02)  # a dot at AUC 1 stays whole
    ax.invert_yaxis()
    ax.set_xlabel("AUC on the task's own pool: held-out right vs wrong answers (0.5 = chance), 95% CI")
    return _png(fig)


def audit_section(entries: list[dict] | None, meta: dict) -> str:
    if entries is None:
        return "<h2>Evaluator audit</h2><p class='warn'>This run has no audit (--no-audit): nothing here shows " \
               "whether its scores tell right from wrong answers.</p>"
    rows = []
    for e in entries:
        if e["verdict"] == "skipped":
            rows.append(f"<tr><td>{html.escape(e['method'])}</td><td colspan=6>skipped: "
                        f"{html.escape(e.get('note', ''))}</td></tr>")
            continue
        cls = " class='flag'" if e["verdict"] in BAD_VERDICTS else ""
        draws = ", ".join(_fmt(a) for a in e.get("auc_draws", [])) if e.get("draws", 1) > 1 else "-"
        rows.append(f"<tr{cls}><td>{html.escape(e['method'])}</td>"
                    f"<td>{html.escape(MEASURE_NAMES.get(e['measure'], e['measure']))}</td>"
                    f"<td class=num>{_fmt(e['auc'])}</td><td class=num>[{_fmt(e['ci'][0])}, {_fmt(e['ci'][1])}]</td>"
                    f"<td class=num>{draws}</td><td class=num>{_fmt(e.get('label_auc'))}</td>"
                    f"<td style='color:{VERDICT_COLORS.get(e['verdict'], '#000')}'><b>{e['verdict']}</b></td></tr>")
    e0 = entries[0]
    share = audit_share(meta)
    cost = "" if share is None else (f" The audit computed {share['audit_tokens']:,} of the run's "
                                     f"{share['total_tokens']:,} tokens ({share['token_share']:.0%}) in "
                                     f"{share['time_share']:.0%} of its engine time.")
    parts = ["<h2>Evaluator audit</h2>",
             f"<p class=how><b>How to read this.</b> Before trusting a leaderboard, check that its evaluator tells right "
             f"from wrong answers on this task. The task's own good and bad examples were split into "
             f"{e0.get('folds', '?')} folds; each fold's answers were scored with demos from the other folds, "
             f"over {e0.get('draws', 1)} demo draw(s). AUC is the chance that a held-out right answer scores above a "
             f"held-out wrong one: 1 is perfect, 0.5 is a coin flip. <i>at chance</i> (the CI includes 0.5) and "
             f"<i>inverted</i> (below it) mean that measure's ranking is not evidence; its leaderboard rows are "
             f"marked. label_auc (label tasks) says how well the score alone guesses which label an answer "
             f"carries: it should be near 0.5; far from it, the score follows the label, not the correctness."
             f"{cost}</p>",
             "<table><tr><th>method</th><th>measure</th><th>AUC</th><th>95% CI</th><th>AUC per draw</th>"
             "<th>label_auc</th><th>verdict</th></tr>" + "".join(rows) + "</table>"]
    if any(e.get("auc") is not None for e in entries):
        parts.append(audit_figure(entries))
    return "".join(parts)


def curves_figure(rows: list[dict], ratios: list[float], method: str) -> str:
    """Mean log-likelihood of the candidates' answers against the ratio r, per group, with +-1 standard error."""
    groups: dict[str, list] = {}
    for r in _draw0(rows):
        if r["method"] == method:
            groups.setdefault(_group(r), []).append(r["curve"])
    fig, ax = plt.subplots(figsize=(WIDTH * 0.6, 3.8))
    for name in sorted(groups):
        c = np.array(groups[name])
        mean = c.mean(0)
        se = c.std(0, ddof=1) / np.sqrt(len(c)) if len(c) > 1 else np.zeros(c.shape[1])
        ax.plot(ratios, mean, marker="o", label=f"{name} (n={len(c)})")
        ax.fill_between(ratios, mean - se, mean + se, alpha=0.2)
    ax.set_xlabel("ratio r (share of right answers among the demos)")
    ax.set_ylabel("mean log P(answer | demos, question)")
    ax.set_title(f"{method}: log-likelihood vs ratio (demo draw 0)")
    if groups:
        ax.legend(fontsize=9)
    return _png(fig)


def scores_figure(board: dict, rows: list[dict]) -> str:
    """Per model and measure: every candidate's score as a dot (mean over draws), the mean and its 95% CI."""
    method, measures = board["method"], list(board["measures"])
    models = [m["model"] for m in board["measures"][measures[0]]["models"]]
    fig, axes = plt.subplots(1, len(measures), figsize=(WIDTH, 3.4), squeeze=False)
    rng = np.random.default_rng(0)
    by_cand: dict = {}
    for r in rows:
        if r["method"] == method:
            by_cand.setdefault((r["model"], r["id"]), []).append(r)
    for ax, measure in zip(axes[0], measures):
        stats = {m["model"]: m for m in board["measures"][measure]["models"]}
        for i, model in enumerate(models):
            vals = [np.mean([x[measure] for x in rs]) for (mo, _), rs in by_cand.items()
                    if mo == model and all(x.get(measure) is not None for x in rs)]
            ax.scatter(i + rng.uniform(-0.18, 0.18, len(vals)), vals, s=9, alpha=0.35, color="gray")
            s = stats[model]
            if not math.isnan(s["mean"]):
                err = [[s["mean"] - s["ci_low"]], [s["ci_high"] - s["mean"]]] if not math.isnan(s["ci_low"]) \
                    else None
                ax.errorbar(i, s["mean"], yerr=err, fmt="D", color="C3", capsize=5, markersize=6)
        ax.set_xticks(range(len(models)), models, rotation=20, ha="right", fontsize=9)
        ax.set_title(f"{MEASURE_NAMES[measure]}: candidates (dots), mean and 95% CI", fontsize=10)
        ax.set_ylim(-0.05, 1.05)
    fig.tight_layout()
    return _png(fig)


def ranking_figure(board: dict) -> str:
    """Per-model mean of each measure against the model's true quality: one panel (and one scale) per measure."""
    truth = board["truth"]
    measures = list(board["measures"])
    fig, axes = plt.subplots(1, len(measures), figsize=(WIDTH, 3.6), squeeze=False)
    for ax, measure in zip(axes[0], measures):
        s = board["measures"][measure]
        models = [m for m in s["models"] if m["model"] in truth and not math.isnan(m["mean"])]
        x, y = [truth[m["model"]] for m in models], [m["mean"] for m in models]
        ax.scatter(x, y, color="C0")
        for k, (m, xi, yi) in enumerate(zip(models, x, y)):
            ax.annotate(m["model"], (xi, yi), fontsize=8, xytext=(5, 6 - 12 * (k % 2)), textcoords="offset points")
        ax.set_xlabel("true quality (mean truth)")
        ax.set_ylabel(f"predicted: mean {MEASURE_NAMES[measure]}")
        rho = s["spearman"]
        ax.set_title(f"{MEASURE_NAMES[measure]}: Spearman {'-' if math.isnan(rho) else f'{rho:+.2f}'}",
                     fontsize=10)
        ax.margins(0.15)
    fig.tight_layout()
    return _png(fig)


def board_table(board: dict, flags: dict) -> str:
    measures = list(board["measures"])
    head = "".join(f"<th>{MEASURE_NAMES[x]}{' !' if (board['method'], x) in flags else ''}</th><th>95% CI</th>"
                   f"<th>rank</th>" for x in measures)
    head += "<th>truth</th><th>true rank</th>" if board["truth"] else ""
    cells = {x: {m["model"]: m for m in board["measures"][x]["models"]} for x in measures}
    body = []
    any_flag = any((board["method"], x) in flags for x in measures)
    for m in board["measures"][measures[0]]["models"]:
        tds = f"<td>{html.escape(m['model'])}</td><td class=num>{m['n']}</td>"
        for x in measures:
            c = cells[x][m["model"]]
            tds += (f"<td class=num>{_fmt(c['mean'])}</td><td class=num>[{_fmt(c['ci_low'])}, "
                    f"{_fmt(c['ci_high'])}]</td><td class=num>{_fmt(c['rank'])}</td>")
        if board["truth"]:
            name = m["model"]
            tds += (f"<td class=num>{_fmt(board['truth'].get(name))}</td>"
                    f"<td class=num>{_fmt(board['truth_rank'].get(name))}</td>")
        body.append(f"<tr{' class=flag' if any_flag else ''}>{tds}</tr>")
    notes = []
    for x in measures:
        if (board["method"], x) in flags:
            notes.append(f"<span class=warn>! {MEASURE_NAMES[x]}: the audit found it {flags[(board['method'], x)]}"
                         f"; its ranking is not evidence</span>")
        s = board["measures"][x]
        if board["truth"]:
            notes.append(html.escape(f"{MEASURE_NAMES[x]} vs the true ranking: Spearman {_fmt(s['spearman'])}, "
                                     f"Kendall {_fmt(s['kendall'])}"))
        if s.get("draws"):
            d = s["draws"]
            notes.append(html.escape(f"{MEASURE_NAMES[x]}: over {d['n']} demo draws a model's mean moves by up to "
                                     f"{d['max_spread']:.3f}; ") + (
                "<span class=warn>the ranking flips between draws</span>" if d["flips"]
                else "the same ranking in every draw"))
        unscored = sum(m["unscored"] for m in s["models"])
        if unscored:
            notes.append(html.escape(f"{MEASURE_NAMES[x]}: {unscored} unscored"))
    if "distribution" in board:
        notes.append(html.escape(f"posterior vs truth_dist: MAE {_fmt(board['distribution']['mae'])}, "
                                 f"cross-entropy {_fmt(board['distribution']['cross_entropy'])}"))
    ci = "two-level bootstrap over demo draws and questions" if board.get("n_draws", 1) > 1 else \
        "bootstrap over questions"
    return (f"<table><tr><th>model</th><th>n</th>{head}</tr>{''.join(body)}</table>"
            f"<p>95% CIs: {ci}.<br>{'<br>'.join(notes)}</p>")


def items_table(task, candidates, rows: list[dict], boards: list[dict]) -> str:
    """Every candidate (at most 1000): question, answer, model, each method's score (mean over draws), truth."""
    cols = [(b["method"], "score") for b in boards]
    value: dict = {}
    for r in rows:
        if r.get("score") is not None:
            value.setdefault((r["method"], r["id"]), []).append(r["score"])
    head = "".join(f"<th>{html.escape(m)}</th>" for m, _ in cols)
    body = []
    for c in sorted(candidates, key=lambda c: (c.x, c.model))[:1000]:
        tds = "".join(f"<td class=num>{_fmt(float(np.mean(value[(m, c.id)])) if (m, c.id) in value else None)}</td>"
                      for m, _ in cols)
        body.append(f"<tr><td>{html.escape(c.x)}</td><td>{html.escape(c.y)}</td><td>{html.escape(c.model)}</td>"
                    f"{tds}<td class=num>{_fmt(c.truth)}</td></tr>")
    more = f" (the first 1000 of {len(candidates)})" if len(candidates) > 1000 else ""
    return (f"<h2>Per item</h2><p>Each candidate{more}, by question then model: its score under each method "
            f"(the mean over demo draws) and its truth.</p><table class=items><tr><th>question</th><th>answer</th>"
            f"<th>model</th>{head}<th>truth</th></tr>{''.join(body)}</table>")


def write_report(run_dir, output=None) -> Path:
    run_dir = Path(run_dir)
    task, candidates, rows, meta = load_scores(run_dir)
    entries = read_audit(run_dir)
    flags = flagged(entries)
    parts = [f"<h1>ICQS report: {html.escape(task.name)}</h1>",
             f"<p>model {html.escape(str(meta.get('model')))}; {len(candidates)} candidates; M = {task.M} "
             f"(ratios {', '.join(f'{r:g}' for r in task.ratios)}), N = {task.N} demos per set, L = {task.L}, "
             f"{html.escape(str(meta.get('sampler')))} demo sets, seed {task.seed}, {meta.get('draws', 1)} demo "
             f"draw(s)" + (f"; calibrated scores use the content-free input {html.escape(repr(task.content_free))}"
                           if task.calibrate else "") + "</p>",
             audit_section(entries, meta)]
    boards = leaderboards(rows, meta.get("engine_stats"))
    if not rows:
        parts.append("<p>No method has complete results yet.</p>")
    for board in boards:
        method = METHODS[board["method"]]
        parts += [f"<h2>{html.escape(method.title)}</h2>",
                  f"<p class=how><b>How to read this.</b> {html.escape(EXPLAIN[method.name])}</p>",
                  board_table(board, flags)]
        if "engine_stats" in board:
            parts.append(f"<p>engine: {html.escape(format_stats(board['engine_stats']))}</p>")
        if method.curves:
            parts.append(curves_figure(rows, task.ratios, method.name))
        parts.append(scores_figure(board, rows))
        if board["truth"]:
            parts.append(ranking_figure(board))
    if rows:
        parts.append(items_table(task, candidates, rows, boards))
    path = Path(output) if output else run_dir / "report.html"
    atomic_write(path, html_page(f"ICQS report: {task.name}", parts))
    return path


# ---- shared with the reports of the other run types (icqs.report_runs) ----------------------------------------------
figure_html = _png  # a matplotlib figure as an embedded PNG, sized to the page


def html_page(title: str, parts: list[str]) -> str:
    """A whole report page: its title, the reports' style, the parts in order."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")
