"""The HTML reports of judge and pairwise run directories (`icqs report DIR`), on the score report's page
(icqs.report: style, embedded figures). Each opens with the run's settings and, first of all, any warning its own
checks raised; then the same tables the terminal prints (icqs.judges.results), a figure for each, and every item.

Judge: grades per K with their CIs and the agreement with the labels; each item's grade per K, split by label (or
by model), as dots; per model the mean grade with its CI beside the truth; the consistency of two runs; per item.
Pairwise: the bias check (measured beside the value of a judge without bias) as a table and a figure; the
Bradley-Terry leaderboard with its CIs, marked DISTRUSTED (table and figure) when the bias check fails; accuracy per
prompt variant against the reference winner; per pair.
"""

from __future__ import annotations

import html
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .io import atomic_write  # noqa: E402
from .report import WIDTH, figure_html, html_page  # noqa: E402
from .run import format_stats  # noqa: E402
from .run_tables import num  # noqa: E402

MAX_ROWS = 1000


def _esc(v) -> str:
    return html.escape(str(v))


def _header(title: str, facts: list[str], meta: dict, warnings: list[str]) -> list[str]:
    parts = [f"<h1>{_esc(title)}</h1>", "<p>" + "; ".join(_esc(f) for f in facts if f) + "</p>"]
    stats = meta.get("engine_stats") or {}
    if stats:
        parts.append(
            "<p>engine: " + "; ".join(f"{_esc(k)}: {_esc(format_stats(v))}" for k, v in stats.items()) + "</p>"
        )
    if warnings:
        parts.append(
            "<div class=how style='border-left-color:#c33'>"
            + "".join(f"<p class=warn>{_esc(w)}</p>" for w in warnings)
            + "</div>"
        )
    return parts


def _how(text: str) -> str:
    return f"<p class=how><b>How to read this.</b> {_esc(text)}</p>"


def _write(path: Path, output, title: str, parts: list[str]) -> Path:
    out = Path(output) if output else path / "report.html"
    atomic_write(out, html_page(title, parts))
    return out


def _cut(text, n: int = 300) -> str:
    text = str(text)
    return _esc(text if len(text) <= n else text[: n - 3] + "...")


# ---- judge -----------------------------------------------------------------------------------------------------------
def judge_report(run, output=None) -> Path:
    """report.html (or `output`) of a judge run (icqs.run_dirs.JudgeRun)."""
    from .judges.results import judge_audit_tables, judge_model_table

    s, meta = run.summary, run.meta
    grades = _grades_by_k(run)
    facts = [
        f"input {meta.get('input_file', '?')}",
        f"model {meta.get('model') or 'default'}",
        f"{s['items']} items",
        f"K = {', '.join(map(str, s['shots']))} demos",
        f"{s['runs']} run(s) with independent demo draws",
        f"seed {meta.get('seed', 0)}",
        f"method {meta.get('method')}",
        "demos drawn per item" if meta.get("per_item_draws") else "one demo draw shared by the items",
    ]
    parts = _header(f"Judge report: {Path(str(meta.get('input_file', run.path))).name}", facts, meta, s["warnings"])
    audit, board = judge_audit_tables(s), judge_model_table(s)
    parts += [
        "<h2>Grades per number of demos (K)</h2>",
        _how(
            "The judge rates each answer 1-10; its grade here is the expected rating under the probabilities "
            "of the rating tokens. With reference labels, AUC is the chance that an answer labeled right gets "
            "a higher grade than one labeled wrong: 1 is perfect, 0.5 a coin flip; at chance or inverted, the "
            "grades are not evidence and every ranking made from them is marked."
        ),
        audit[0].html(),
        _grades_figure(run, grades),
    ]
    if board is not None:
        parts += ["<h2>Per model</h2>", board.html()]
        if any("truth" in m for m in s["by_model"]):
            parts.append(_models_figure(s["by_model"]))
    for table in audit[1:]:
        parts += ["<h2>Consistency of two runs</h2>", table.html()]
    parts.append(_judge_items(run, grades))
    return _write(run.path, output, "Judge report", parts)


def _grades_by_k(run) -> dict:
    """(id, k) -> the mean expected grade over the runs."""
    table: dict = {}
    for r in run.rows:
        table.setdefault((str(r["id"]), r["k"]), []).append(r["expected"])
    return {key: float(np.mean(v)) for key, v in table.items()}


def _grades_figure(run, grades: dict) -> str:
    """Each item's grade per K as a dot, grouped by label (or model), with the group's mean."""
    by_id = {it["id"]: it for it in run.items}
    ks = run.summary["shots"]
    labeled = any("label" in it for it in run.items)
    group = (
        (lambda it: f"label {num(it['label'], 1)}" if "label" in it else "no label")
        if labeled
        else (lambda it: it.get("model", "all items"))
    )
    names = sorted({group(it) for it in run.items})
    fig, ax = plt.subplots(figsize=(WIDTH * 0.7, 3.6))
    rng = np.random.default_rng(0)
    width = 0.8 / max(len(names), 1)
    for g, name in enumerate(names):
        for j, k in enumerate(ks):
            vals = [v for (i, kk), v in grades.items() if kk == k and i in by_id and group(by_id[i]) == name]
            x = j - 0.4 + width * (g + 0.5)
            ax.scatter(
                x + rng.uniform(-width / 4, width / 4, len(vals)),
                vals,
                s=12,
                alpha=0.5,
                color=f"C{g}",
                label=name if j == 0 else None,
            )
            if vals:
                ax.plot([x - width / 2.5, x + width / 2.5], [np.mean(vals)] * 2, color=f"C{g}", lw=2)
    ax.set_xticks(range(len(ks)), [f"K={k}" for k in ks])
    ax.set_ylabel("grade (expected rating 1-10)")
    ax.set_title("each item's grade (dots) and the group mean (bar)", fontsize=10)
    ax.legend(fontsize=9)
    return figure_html(fig)


def _models_figure(models: list[dict]) -> str:
    """Per model and K: mean grade with its CI against the share of the model's answers labeled right."""
    fig, ax = plt.subplots(figsize=(WIDTH * 0.6, 3.8))
    for n, k in enumerate(sorted({m["k"] for m in models})):
        ms = [m for m in models if m["k"] == k and "truth" in m]
        x = np.array([m["truth"] for m in ms])
        y = np.array([m["mean_expected"] for m in ms])
        err = np.array(
            [[m["mean_expected"] - m["ci"][0], m["ci"][1] - m["mean_expected"]] if m["ci"] else [0, 0] for m in ms]
        ).T
        ax.errorbar(x, y, yerr=err, fmt="o", capsize=4, color=f"C{n}", label=f"K={k}")
        for m in ms:
            ax.annotate(
                m["model"], (m["truth"], m["mean_expected"]), fontsize=8, xytext=(5, 4), textcoords="offset points"
            )
    ax.set_xlabel("truth: share of the model's answers labeled right")
    ax.set_ylabel("judge: mean grade (95% CI)")
    ax.set_title("a useful judge puts the better models higher", fontsize=10)
    ax.legend(fontsize=9)
    ax.margins(0.15)
    return figure_html(fig)


def _judge_items(run, grades: dict) -> str:
    ks = run.summary["shots"]
    extra = [c for c in ("model", "label") if any(c in it for it in run.items)]
    head = "".join(f"<th>{c}</th>" for c in ["id", *extra, "question", "response"]) + "".join(
        f"<th>K={k}</th>" for k in ks
    )
    body = []
    for it in run.items[:MAX_ROWS]:
        cells = [_esc(it["id"])] + [_esc(it.get(c, "-")) for c in extra] + [_cut(it["question"]), _cut(it["response"])]
        body.append(
            "<tr>"
            + "".join(f"<td>{c}</td>" for c in cells)
            + "".join(f"<td class=num>{num(grades.get((it['id'], k)))}</td>" for k in ks)
            + "</tr>"
        )
    more = f" (the first {MAX_ROWS} of {len(run.items)})" if len(run.items) > MAX_ROWS else ""
    return (
        f"<h2>Per item</h2><p>Every graded answer{more}: its grade at each K (the mean over the runs).</p>"
        f"<table class=items><tr>{head}</tr>{''.join(body)}</table>"
    )


# ---- pairwise --------------------------------------------------------------------------------------------------------
def pairwise_report(run, output=None) -> Path:
    """report.html (or `output`) of a pairwise run (icqs.run_dirs.PairwiseRun)."""
    from .judges.results import pairwise_audit_table, pairwise_leaderboard_table

    s, meta = run.summary, run.meta
    facts = [
        f"input {meta.get('input_file', '?')}",
        f"model {meta.get('model') or 'default'}",
        f"{s['pairs']} pairs x 4 prompts",
        "ties allowed" if meta.get("tie", True) else "no ties (--no-tie)",
        "with a rubric" if meta.get("rubric") else "no rubric",
    ]
    warnings = list(s["warnings"])
    if s["distrusted"] and "leaderboard" in s:
        warnings.insert(
            0,
            "DISTRUSTED RANKING: the judge's own bias check failed ("
            + "; ".join(s["distrusted"])
            + "): the leaderboard below is not evidence of which model is better",
        )
    parts = _header(f"Pairwise report: {Path(str(meta.get('input_file', run.path))).name}", facts, meta, warnings)
    parts += [
        "<h2>Bias check: measured vs a judge without bias</h2>",
        _how(
            "Each pair is judged under four prompts: the two answers in both orders, and the verdict symbols "
            "A and B in both assignments. A judge that reads only the answers gives the same verdict under "
            "all four: no flips, and the first position and the symbol A chosen half the time. The measured "
            "column is this judge; the other is that ideal. Flips in half the swaps or more, or mostly ties, "
            "mean its ranking is not evidence."
        ),
        pairwise_audit_table(s).html(),
        _bias_figure(s),
    ]
    accuracy = s["logprob"].get("accuracy")
    if accuracy:
        parts += ["<h3>Agreement with the reference winner per prompt</h3>", _accuracy_table(accuracy)]
    board = pairwise_leaderboard_table(s)
    if board is not None:
        parts += [
            "<h2>Leaderboard" + (" <span class=warn>(DISTRUSTED)</span>" if s["distrusted"] else "") + "</h2>",
            _how(
                "Bradley-Terry strengths from the aggregated verdicts (a tie counts half a win each), on the "
                "Elo scale, with 95% bootstrap CIs over the pairs."
            ),
            board.html(),
            _board_figure(s),
        ]
    parts.append(_pairwise_items(run))
    return _write(run.path, output, "Pairwise report", parts)


def _bias_figure(s: dict) -> str:
    checks = [c for c in s["audit"]["checks"] if c["measured"] is not None]
    fig, ax = plt.subplots(figsize=(WIDTH * 0.7, 0.45 * len(checks) + 1.2))
    y = np.arange(len(checks))
    ax.barh(y, [c["measured"] for c in checks], color="#7a9", label="measured")
    ideal = [(i, c["ideal"]) for i, c in enumerate(checks) if c["ideal"] is not None]
    ax.scatter(
        [v for _, v in ideal],
        [i for i, _ in ideal],
        marker="D",
        s=40,
        color="k",
        zorder=3,
        label="a judge without bias",
    )
    ax.set_yticks(y, [c["measure"].replace("_", " ") for c in checks])
    ax.set_xlim(-0.03, 1.03)
    ax.invert_yaxis()
    ax.legend(fontsize=9, loc="lower right")
    ax.set_title("bias check: measured (bars) vs a judge without bias (diamonds)", fontsize=10)
    return figure_html(fig)


def _accuracy_table(accuracy: dict) -> str:
    from .judges.pairwise import VARIANTS

    rows = "".join(
        f"<tr><td>{_esc(name)}</td><td class=num>{num(accuracy[name]['accuracy'])}</td>"
        f"<td class=num>{num(accuracy[f'{name}_decisive']['accuracy'])}</td>"
        f"<td class=num>{accuracy[name]['n']}</td></tr>"
        for name in [v.name for v in VARIANTS] + ["aggregate"]
    )
    return (
        "<table><tr><th>prompt</th><th>agreement</th><th>agreement, tie option ignored</th><th>labeled pairs</th>"
        f"</tr>{rows}</table>"
    )


def _board_figure(s: dict) -> str:
    board = s["leaderboard"]
    fig, ax = plt.subplots(figsize=(WIDTH * 0.6, 0.45 * len(board) + 1.4))
    y = np.arange(len(board))
    color = "#c33" if s["distrusted"] else "C0"
    ax.errorbar(
        [r["score"] for r in board],
        y,
        xerr=[[r["score"] - r["lower"] for r in board], [r["upper"] - r["score"] for r in board]],
        fmt="o",
        capsize=4,
        color=color,
    )
    ax.set_yticks(y, [r["model"] for r in board])
    ax.invert_yaxis()
    ax.axvline(1000, color="#999", ls="--")
    ax.set_xlabel("Bradley-Terry strength (Elo scale), 95% CI")
    ax.set_title(
        "DISTRUSTED: the judge's bias check failed" if s["distrusted"] else "leaderboard", color=color, fontsize=10
    )
    return figure_html(fig)


def _pairwise_items(run) -> str:
    from .judges.pairwise import VARIANTS

    items = {it["id"]: it for it in run.items}
    head = "".join(
        f"<th>{c}</th>"
        for c in [
            "id",
            "question",
            "answer_a",
            "answer_b",
            "model_a",
            "model_b",
            "winner",
            *[v.name for v in VARIANTS],
            "verdict",
            "P(a better)",
        ]
    )
    body = []
    for r in run.rows[:MAX_ROWS]:
        it = items[str(r["id"])]
        wrong = r.get("winner") is not None and r["verdict"] != r["winner"]
        cells = [
            _esc(r["id"]),
            _cut(it["question"], 200),
            _cut(it["answer_a"], 200),
            _cut(it["answer_b"], 200),
            _esc(r.get("model_a", "-")),
            _esc(r.get("model_b", "-")),
            _esc(r.get("winner") or "-"),
            *[_esc(r["verdicts"][v.name]) for v in VARIANTS],
            _esc(r["verdict"]),
        ]
        body.append(
            f"<tr{' class=flag' if wrong else ''}>"
            + "".join(f"<td>{c}</td>" for c in cells)
            + f"<td class=num>{num(r['aggregate']['model_a'])}</td></tr>"
        )
    more = f" (the first {MAX_ROWS} of {len(run.rows)})" if len(run.rows) > MAX_ROWS else ""
    return (
        f"<h2>Per pair</h2><p>Every pair{more}: each prompt's verdict, the aggregated verdict and its "
        f"P(answer_a better); a row whose verdict differs from the reference winner is shaded.</p>"
        f"<table class=items><tr>{head}</tr>{''.join(body)}</table>"
    )
