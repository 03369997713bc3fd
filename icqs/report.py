"""The HTML report of a score run directory. It opens with the model (name and file) and the headline (the primary
measure, its ranking and the audit figure behind it, or next steps when no measure is reliable), then one table of
every model across every method and measure, then the evaluator audit (a table and a plot of each measure's AUC
with its CI on the task's own pool, beside the AUC against the candidates' truth where they carry it), then per
method: how to read its numbers, the leaderboard
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

from .aggregate import mark_symbol  # noqa: E402
from .audit import audit_share, flagged, marked  # noqa: E402
from .audit_state import AuditStatus, audit_status  # noqa: E402
from .io import atomic_write  # noqa: E402
from .methods import EXPLAIN, METHODS, measure_name  # noqa: E402
from .run import format_stats  # noqa: E402
from .score_run import leaderboards, load_scores, run_headline  # noqa: E402

WIDTH = 10.5  # inches at 100 dpi: the page's 1100 px column
STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:auto;padding:0 12px;line-height:1.4}"
    "table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}"
    "th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}"
    "tr.flag td{background:#fdecea}img{max-width:100%;height:auto;display:block;margin:8px 0}"
    ".how{background:#f6f8fa;border-left:4px solid #7a9;padding:6px 10px;font-size:14px}"
    ".warn{color:#a00;font-weight:bold}.items{max-height:520px;overflow:auto;display:block}"
    ".headline{border:2px solid #2a7;border-radius:6px;padding:8px 12px;margin:10px 0;font-size:15px}"
    ".headline.none{border-color:#c33}.headline p{margin:4px 0}tr.weak td{background:#fff6e0}"
    ".reading{background:#fffbe6;border-left:4px solid #d90;padding:6px 10px;font-size:14px}"
)
VERDICT_COLORS = {
    "reliable": "#2a7",
    "weak": "#d90",
    "at chance": "#c33",
    "inverted": "#800",
    "unscored": "#888",
    "skipped": "#888",
}


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
        ax.errorbar(
            e["auc"], i, xerr=[[e["auc"] - e["ci"][0]], [e["ci"][1] - e["auc"]]], fmt="o", color=color, capsize=4
        )
        ax.text(1.02, i, e["verdict"], va="center", color=color, fontsize=10, transform=ax.get_yaxis_transform())
    ax.axvline(0.5, color="#999", ls="--")
    for i, e in enumerate(shown):  # the AUC against the candidates' truth, where they carry it
        if e.get("truth_auc") is not None:
            t, ci = e["truth_auc"], e["truth_ci"]
            ax.errorbar(
                t,
                i + 0.25,
                xerr=[[t - ci[0]], [ci[1] - t]],
                fmt="s",
                color="#36c",
                capsize=3,
                markersize=5,
                label="candidates' truth" if i == 0 else None,
            )
    if any(e.get("truth_auc") is not None for e in shown):
        ax.legend(
            loc="lower left",
            fontsize=9,
            handles=[
                plt.Line2D([], [], marker="o", color="#555", ls="", label="pool audit (colour: verdict)"),
                plt.Line2D([], [], marker="s", color="#36c", ls="", label="candidates' own truth"),
            ],
        )
    ax.set_yticks(range(len(shown)), [f"{e['method']} {measure_name(e['method'], e['measure'])}" for e in shown])
    ax.set_xlim(-0.02, 1.02)  # a dot at AUC 1 stays whole
    ax.invert_yaxis()
    ax.set_xlabel("AUC on the task's own pool: held-out right vs wrong answers (0.5 = chance), 95% CI")
    return _png(fig)


def audit_status_note(meta: dict) -> str:
    """The line (icqs.audit_state) of a run without a usable audit: pending, skipped or --no-audit."""
    return AuditStatus(meta.get("audit", "unknown"), None).describe() or ""


def audit_section(entries: list[dict] | None, meta: dict) -> str:
    if entries is None:
        return (
            f"<h2>Evaluator audit</h2><p class='warn'>{html.escape(audit_status_note(meta))}: nothing here shows "
            "whether its scores tell right from wrong answers.</p>"
        )
    truth = any("truth_auc" in e for e in entries)
    rows = []
    for e in entries:
        if e["verdict"] == "skipped":
            rows.append(
                f"<tr><td>{html.escape(e['method'])}</td><td colspan=8>skipped: "
                f"{html.escape(e.get('note', ''))}</td></tr>"
            )
            continue
        reason = marked(e)
        cls = "" if reason is None else " class='weak'" if mark_symbol(reason) == "?" else " class='flag'"
        draws = ", ".join(_fmt(a) for a in e.get("auc_draws", [])) if e.get("draws", 1) > 1 else "-"
        tcols = ""
        if truth:
            agree = {True: "yes", False: "<span class=warn>NO</span>", None: "-"}[e.get("agrees")]
            tcols = (
                f"<td class=num>{_fmt(e.get('truth_auc'))}</td><td class=num>"
                + (f"[{_fmt(e['truth_ci'][0])}, {_fmt(e['truth_ci'][1])}]" if "truth_ci" in e else "-")
                + f"</td><td>{agree}</td>"
            )
        label = " (follows the label)" if e.get("label_bias") else ""
        rows.append(
            f"<tr{cls}><td>{html.escape(e['method'])}</td>"
            f"<td>{html.escape(measure_name(e['method'], e['measure']))}</td>"
            f"<td class=num>{_fmt(e['auc'])}</td><td class=num>[{_fmt(e['ci'][0])}, {_fmt(e['ci'][1])}]</td>"
            f"<td class=num>{draws}</td><td class=num>{_fmt(e.get('label_auc'))}</td>{tcols}"
            f"<td style='color:{VERDICT_COLORS.get(e['verdict'], '#000')}'><b>{e['verdict']}</b>{label}"
            f"{' ' + mark_symbol(reason) if reason else ''}</td></tr>"
        )
    e0 = entries[0]
    share = audit_share(meta)
    cost = (
        ""
        if share is None
        else (
            f" The audit computed {share['audit_tokens']:,} of the run's "
            f"{share['total_tokens']:,} tokens ({share['token_share']:.0%}) in "
            f"{share['time_share']:.0%} of its engine time."
        )
    )
    truth_text = (
        (
            " <b>truth AUC</b> is the same AUC on the candidates themselves, against the truth they carry "
            "(its CI resamples the draws and the questions); <b>agree</b> says whether the two CIs overlap. "
            "Where they do not, the pool is not like the candidates for that measure: trust the truth for "
            "this run."
        )
        if truth
        else ""
    )
    parts = [
        "<h2>Evaluator audit</h2>",
        f"<p class=how><b>How to read this.</b> Before trusting a leaderboard, check that its evaluator tells right "
        f"from wrong answers on this task. The task's own good and bad examples were split into "
        f"{e0.get('folds', '?')} folds; each fold's answers were scored with demos from the other folds (the "
        f"run's M, N, L and sampler), over {max(e.get('draws', 1) for e in entries)} demo draw(s) (one for the "
        f"methods without demos), and each answer's score is its "
        f"mean over the draws, as the leaderboard takes it. AUC is the chance that a held-out right answer "
        f"scores above a held-out wrong one: 1 is perfect, 0.5 is a coin flip. <i>at chance</i> (the CI "
        f"includes 0.5: no evidence either way on this many answers), <i>inverted</i> (below it) and "
        f"<i>constant</i> (one score for every answer) mark a measure's rows with !; <i>weak</i> (above chance, "
        f"below 0.7) with ?. label_auc (label tasks) says how well the score alone guesses which label an "
        f"answer carries: it should be near 0.5; far from it, the score follows the label, not the correctness "
        f"(marked ?, never the headline).{truth_text}{cost}</p>",
        "<table><tr><th>method</th><th>measure</th><th>AUC</th><th>95% CI</th><th>AUC per draw</th>"
        "<th>label_auc</th>"
        + ("<th>truth AUC</th><th>95% CI</th><th>agree</th>" if truth else "")
        + "<th>verdict</th></tr>"
        + "".join(rows)
        + "</table>",
    ]
    if any(e.get("auc") is not None for e in entries):
        parts.append(audit_figure(entries))
    return "".join(parts)


def headline_section(head: dict) -> str:
    """The headline as the report's first box: the same lines as the terminal's first lines."""
    lines = [html.escape(line.strip()) for line in head["lines"]]
    steps = [line[2:] for line in lines if line.startswith("- ")]
    body = [f"<p><b>{lines[0]}</b></p>"] + [
        f"<p>{line}</p>" for line in lines[1:] if not line.startswith("- ") and line != "next steps:"
    ]
    if steps:
        body.append("<p>Next steps:</p><ul>" + "".join(f"<li>{step}</li>" for step in steps) + "</ul>")
    return f"<div class='headline{'' if head.get('method') else ' none'}'>{''.join(body)}</div>"


def models_table(boards: list[dict], flags: dict, head: dict) -> str:
    """Every model (rows) across every method and measure (columns): mean, 95% CI and rank; marked measures
    carry ! or ?, the headline's measure is starred; the truth beside them where candidates carry it."""
    cols = [(b["method"], x) for b in boards for x in b["measures"]]
    if not cols:
        return ""
    cells = {
        (b["method"], x): {m["model"]: m for m in b["measures"][x]["models"]} for b in boards for x in b["measures"]
    }
    truth = next((b["truth"] for b in boards if b["truth"]), {})
    truth_rank = next((b["truth_rank"] for b in boards if b["truth"]), {})
    primary = (head.get("method"), head.get("measure"))
    models = head.get("ranking") or [
        m["model"] for m in boards[0]["measures"][next(iter(boards[0]["measures"]))]["models"]
    ]

    def th(col):
        reason = flags.get(col)
        mark = " *" if col == primary else f" {mark_symbol(reason)}" if reason else ""
        return f"<th>{html.escape(col[0])}<br>{html.escape(measure_name(*col))}{mark}</th>"

    head_row = "<tr><th>model</th>" + "".join(th(c) for c in cols) + ("<th>truth</th>" if truth else "") + "</tr>"
    body = []
    for model in models:
        tds = f"<td>{html.escape(model)}</td>"
        for col in cols:
            c = cells[col].get(model)
            style = " style='background:#e8f6ee'" if col == primary else " style='color:#999'" if col in flags else ""
            tds += (
                "<td class=num>-</td>"
                if c is None
                else f"<td class=num{style}>{_fmt(c['mean'])}<br><small>[{_fmt(c['ci_low'])}, {_fmt(c['ci_high'])}] "
                f"#{_fmt(c['rank'])}</small></td>"
            )
        if truth:
            tds += f"<td class=num>{_fmt(truth.get(model))}<br><small>#{_fmt(truth_rank.get(model))}</small></td>"
        body.append(f"<tr>{tds}</tr>")
    spearman = (
        "".join(f"<td class=num>{_fmt(b['measures'][x]['spearman'])}</td>" for b in boards for x in b["measures"])
        if truth
        else ""
    )
    if truth:
        body.append(f"<tr><td><i>Spearman vs truth</i></td>{spearman}<td></td></tr>")
    return (
        "<h2>Every model across every method</h2><p>Each cell: the model's mean score, its 95% CI and its rank "
        "under that measure (higher is better). * marks the headline's measure; ! a measure the audit found no "
        "evidence for (greyed), ? a weak or label-following one. Scores of different measures are on different "
        "scales: compare ranks across columns, not numbers.</p>"
        f"<table>{head_row}{''.join(body)}</table>"
    )


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


def curves_reading(rows: list[dict], method: str) -> str | None:
    """What this run's curves show, in words (None without both truth groups): the gap between the right and the
    wrong answers' lines, and how much more the right answers' line rises with r, each against its standard
    error (two of them: a visible effect)."""
    curves = {1: [], 0: []}
    for r in _draw0(rows):
        if r["method"] == method and r.get("truth") in (0.0, 1.0):
            curves[int(r["truth"])].append(r["curve"])
    if min(len(c) for c in curves.values()) < 2:
        return None
    c1, c0 = np.array(curves[1]), np.array(curves[0])
    level1, level0 = c1.mean(axis=1), c0.mean(axis=1)
    rise1, rise0 = c1[:, -1] - c1[:, 0], c0[:, -1] - c0[:, 0]

    def effect(a, b):
        diff = a.mean() - b.mean()
        se = math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
        return diff, (abs(diff) > 2 * se if se > 0 else diff != 0)

    gap, gap_real = effect(level1, level0)
    slope, slope_real = effect(rise1, rise0)
    lines = (
        f"Here: the right answers' line lies {abs(gap):.2f} nats {'above' if gap > 0 else 'below'} the wrong "
        f"answers' on average, and from r = 0 to 1 it changes by {rise1.mean():+.2f} against the wrong answers' "
        f"{rise0.mean():+.2f}. "
    )
    if slope_real and slope > 0:
        return (
            lines + "The lines slope apart the right way: the demos' ratio separates right from wrong, which "
            "is what ICQS reads."
        )
    if slope_real and slope < 0:
        return (
            lines + "The wrong answers gain more from right demos than the right answers do: ICQS is inverted "
            "on these candidates."
        )
    if gap_real:
        return lines + (
            "The lines run parallel, far apart: the model tells right from wrong without the demos (the "
            "likelihood baselines read this gap) while the demos move every answer alike, so ICQS's "
            "ratio, which reads only the slope, cannot separate them."
            if gap > 0
            else "The lines run parallel with the wrong answers above: the model finds the wrong answers "
            "more likely, with or without demos."
        )
    return (
        lines + "The lines lie on top of each other within their noise: the model does not tell these right "
        "and wrong answers apart, with or without the demos."
    )


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
            vals = [
                np.mean([x[measure] for x in rs])
                for (mo, _), rs in by_cand.items()
                if mo == model and all(x.get(measure) is not None for x in rs)
            ]
            ax.scatter(i + rng.uniform(-0.18, 0.18, len(vals)), vals, s=9, alpha=0.35, color="gray")
            s = stats[model]
            if not math.isnan(s["mean"]):
                err = [[s["mean"] - s["ci_low"]], [s["ci_high"] - s["mean"]]] if not math.isnan(s["ci_low"]) else None
                ax.errorbar(i, s["mean"], yerr=err, fmt="D", color="C3", capsize=5, markersize=6)
        ax.set_xticks(range(len(models)), models, rotation=20, ha="right", fontsize=9)
        ax.set_title(f"{measure_name(method, measure)}: candidates (dots), mean and 95% CI", fontsize=10)
        if METHODS[method].curves or method in ("icl", "judge"):
            ax.set_ylim(-0.05, 1.05)  # a share or a probability; log-likelihoods keep their own scale
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
        ax.set_ylabel(f"predicted: mean {measure_name(board['method'], measure)}")
        rho = s["spearman"]
        ax.set_title(
            f"{measure_name(board['method'], measure)}: Spearman {'-' if math.isnan(rho) else f'{rho:+.2f}'}",
            fontsize=10,
        )
        ax.margins(0.15)
    fig.tight_layout()
    return _png(fig)


def board_table(board: dict, flags: dict) -> str:
    measures = list(board["measures"])
    label = {x: measure_name(board["method"], x) for x in measures}
    mark = {x: f" {mark_symbol(flags[(board['method'], x)])}" for x in measures if (board["method"], x) in flags}
    head = "".join(f"<th>{html.escape(label[x])}{mark.get(x, '')}</th><th>95% CI</th><th>rank</th>" for x in measures)
    head += "<th>truth</th><th>true rank</th>" if board["truth"] else ""
    cells = {x: {m["model"]: m for m in board["measures"][x]["models"]} for x in measures}
    body = []
    any_flag = any(mark.get(x) == " !" for x in measures)
    for m in board["measures"][measures[0]]["models"]:
        tds = f"<td>{html.escape(m['model'])}</td><td class=num>{m['n']}</td>"
        for x in measures:
            c = cells[x][m["model"]]
            tds += (
                f"<td class=num>{_fmt(c['mean'])}</td><td class=num>[{_fmt(c['ci_low'])}, "
                f"{_fmt(c['ci_high'])}]</td><td class=num>{_fmt(c['rank'])}</td>"
            )
        if board["truth"]:
            name = m["model"]
            tds += (
                f"<td class=num>{_fmt(board['truth'].get(name))}</td>"
                f"<td class=num>{_fmt(board['truth_rank'].get(name))}</td>"
            )
        body.append(f"<tr{' class=flag' if any_flag else ''}>{tds}</tr>")
    notes = []
    for x in measures:
        if (board["method"], x) in flags:
            reason = flags[(board["method"], x)]
            notes.append(
                f"<span class=warn>{mark[x].strip()} {html.escape(label[x])}: the audit found it {reason}; "
                f"its ranking is {'weak evidence at best' if mark[x] == ' ?' else 'not evidence'}</span>"
            )
        s = board["measures"][x]
        if board["truth"]:
            notes.append(
                html.escape(
                    f"{label[x]} vs the true ranking: Spearman {_fmt(s['spearman'])}, Kendall {_fmt(s['kendall'])}"
                )
            )
        if s.get("draws"):
            d = s["draws"]
            notes.append(
                html.escape(
                    f"{label[x]}: over {d['n']} demo draws a model's mean moves by up to {d['max_spread']:.3f}; "
                )
                + (
                    "<span class=warn>the ranking flips between draws</span>"
                    if d["flips"]
                    else "the same ranking in every draw"
                )
            )
        unscored = sum(m["unscored"] for m in s["models"])
        if unscored:
            notes.append(html.escape(f"{label[x]}: {unscored} unscored"))
    if "distribution" in board:
        notes.append(
            html.escape(
                f"posterior vs truth_dist: MAE {_fmt(board['distribution']['mae'])}, "
                f"cross-entropy {_fmt(board['distribution']['cross_entropy'])}"
            )
        )
    ci = (
        "two-level bootstrap over demo draws and questions"
        if board.get("n_draws", 1) > 1
        else "bootstrap over questions"
    )
    return (
        f"<table><tr><th>model</th><th>n</th>{head}</tr>{''.join(body)}</table>"
        f"<p>95% CIs: {ci}.<br>{'<br>'.join(notes)}</p>"
    )


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
        tds = "".join(
            f"<td class=num>{_fmt(float(np.mean(value[(m, c.id)])) if (m, c.id) in value else None)}</td>"
            for m, _ in cols
        )
        body.append(
            f"<tr><td>{html.escape(c.x)}</td><td>{html.escape(c.y)}</td><td>{html.escape(c.model)}</td>"
            f"{tds}<td class=num>{_fmt(c.truth)}</td></tr>"
        )
    more = f" (the first 1000 of {len(candidates)})" if len(candidates) > 1000 else ""
    return (
        f"<h2>Per item</h2><p>Each candidate{more}, by question then model: its score under each method "
        f"(the mean over demo draws) and its truth.</p><table class=items><tr><th>question</th><th>answer</th>"
        f"<th>model</th>{head}<th>truth</th></tr>{''.join(body)}</table>"
    )


def model_line(meta: dict) -> str:
    """The model as the report's header names it: its name and file (older runs: what run.json recorded)."""
    info = meta.get("model_info") or {}
    if not info:
        return f"model {html.escape(str(meta.get('model')))}"
    params = f", {info['params'] / 1e6:,.0f}M parameters" if info.get("params") else ""
    file = f" (file {html.escape(str(info['file']))})" if info.get("file") else ""
    dtype = str(meta.get("model", "")).rsplit(" ", 1)[-1]
    return f"model <b>{html.escape(str(info.get('name')))}</b>{params}{file}, run in {html.escape(dtype)}"


def write_report(run_dir, output=None) -> Path:
    run_dir = Path(run_dir)
    task, candidates, rows, meta = load_scores(run_dir)
    status = audit_status(run_dir, meta)  # a missing audit reads as pending, never as --no-audit
    entries = status.entries
    flags = {**status.pending_flags(leaderboards(rows)), **flagged(entries)}
    boards = leaderboards(rows, meta.get("engine_stats"))
    head = run_headline(run_dir, rows, task, meta) if rows else None
    parts = [f"<h1>ICQS report: {html.escape(task.name)}</h1>"]
    if head is not None:
        parts.append(headline_section(head))
    parts.append(
        f"<p>{model_line(meta)}; {len(candidates)} candidates; M = {task.M} "
        f"(ratios {', '.join(f'{r:g}' for r in task.ratios)}), N = {task.N} demos per set, L = {task.L}, "
        f"{html.escape(str(meta.get('sampler')))} demo sets, seed {task.seed}, {meta.get('draws', 1)} demo "
        f"draw(s)"
        + (
            f"; calibrated scores use the content-free input {html.escape(repr(task.content_free))}"
            if task.calibrate
            else ""
        )
        + "</p>"
    )
    if head is not None:
        parts.append(models_table(boards, flags, head))
    parts.append(audit_section(entries, meta))
    if not rows:
        parts.append("<p>No method has complete results yet.</p>")
    for board in boards:
        method = METHODS[board["method"]]
        parts += [
            f"<h2>{html.escape(method.title)}</h2>",
            f"<p class=how><b>How to read this.</b> {html.escape(EXPLAIN[method.name])}</p>",
            board_table(board, flags),
        ]
        if "engine_stats" in board:
            parts.append(f"<p>engine: {html.escape(format_stats(board['engine_stats']))}</p>")
        if method.curves:
            parts.append(curves_figure(rows, task.ratios, method.name))
            reading = curves_reading(rows, method.name)
            if reading:
                parts.append(f"<p class=reading>{html.escape(reading)}</p>")
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
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>"
    )
