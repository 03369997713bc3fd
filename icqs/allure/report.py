"""The run's summary (from the run folder and the memory, no model needed) and its HTML report with the plots."""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

from engine.errors import UserError
from icqs.io import atomic_write, strict_json
from icqs.run_tables import Table, num

from . import plots
from .ablation import ablation_rows, sweep_rows
from .loop import round_table
from .memory import Memory
from .run_dir import AuditRun

MODES_FILE = "failure_modes.json"
METRICS = ("accuracy", "f1", "auc", "errors", "false_positives", "false_negatives")


def load_modes(run: AuditRun) -> dict | None:
    """failure_modes.json checked against its schema (icqs.run_files.read_run_file) and its lists aligned, every
    cluster named; None when there is none."""
    from icqs.run_files import read_run_file

    path = run.path / MODES_FILE
    fix = f"remove {MODES_FILE} and run `icqs allure run --failure-modes` again to recluster"
    modes = read_run_file(path, fix=fix)
    if modes is not None:
        if len({len(modes[k]) for k in ("ids", "cluster", "xy", "error_kind")}) != 1:
            raise UserError(f"its lists ids, cluster, xy and error_kind differ in length; {fix}", str(path))
        unnamed = sorted({c for c in modes["cluster"] if str(c) not in modes["names"]})
        if unnamed:
            raise UserError(f"cluster {unnamed[0]} has no name in field 'names'; {fix}", str(path))
    return modes


def summary(run: AuditRun, memory: Memory) -> dict:
    from .tasks import ground_truth
    from .template import template_from_dict

    modes = load_modes(run)
    truth = ground_truth(run.items, template_from_dict(run.settings["template"], "run.json"))
    return dict(
        settings=run.settings,
        ground_truth=truth,
        rounds=round_table(run, memory),
        sweep=sweep_rows(run),
        ablation=ablation_rows(run, modes),
        failure_modes=modes,
        memory=memory.counts(),
    )


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.3f}"
    return html.escape(str(v))


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<div class=wide><table><tr>{head}</tr>{body}</table></div>"  # a wide table scrolls, not the page


def _img(png: bytes | None, alt: str) -> str:
    if png is None:
        return f"<p><em>{html.escape(alt)}: nothing to plot yet.</em></p>"
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _split_columns(rows: list[dict], lead: list[str]) -> tuple[list[str], list[list]]:
    splits = [s for s in ("audit", "holdout", "all") if any(s in r for r in rows)]
    header = lead + [f"{s} {m}" for s in splits for m in METRICS]
    body = [[r.get(k) for k in lead] + [r.get(s, {}).get(m) for s in splits for m in METRICS] for r in rows]
    return header, body


def rounds_table(rows: list[dict]) -> Table:
    """The per-round table (`icqs allure run`, `icqs audit DIR`): the ICL examples shown and added, then accuracy,
    F1, AUC and errors on the audited and the holdout items."""
    splits = [s for s in ("audit", "holdout") if any(s in r for r in rows)]
    cols = ("round", "ICL examples", "new") + tuple(f"{s} {m}" for s in splits for m in ("acc", "F1", "AUC", "errors"))
    body = tuple(
        (
            str(r["round"]),
            str(r["n_icl"]),
            str(r["new_examples"]),
            *(num(r.get(s, {}).get(m)) for s in splits for m in ("accuracy", "f1", "auc", "errors")),
        )
        for r in rows
    )
    notes = (
        (
            "round r: the evaluator shown every accepted ICL example so far; its errors on the audited items become "
            "new examples; holdout items are only measured",
        )
        if rows
        else ("no completed round yet",)
    )
    return Table("ALLURE: the evaluator per round", cols, body, notes)


def round_markdown(rows: list[dict]) -> str:
    """The per-round table as Markdown (for RESULTS.md)."""
    header, body = _split_columns(rows, ["round", "n_icl", "new_examples"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in body:
        lines.append("| " + " | ".join(_fmt(c) for c in row) + " |")
    return "\n".join(lines)


def render_html(s: dict, examples: list, questions: dict | None = None) -> str:
    """The report; `questions`: item id -> the item's question (or source) for the memory table."""
    questions = questions or {}
    st = s["settings"]
    parts = [
        f"<h1>ALLURE audit of the evaluator</h1><p>items: {html.escape(str(st.get('tasks')))}, model: "
        f"{html.escape(str(st.get('model')))}, template: {html.escape(str(st.get('template', {}).get('name')))}"
        f", holdout fraction: {_fmt(st.get('holdout'))}, memory: {html.escape(json.dumps(s['memory']))}</p>"
    ]
    if s.get("ground_truth"):
        parts.append(
            "<h2>Ground truth</h2><p>Whether each response is right, by its match rule (or its human "
            "label), before any round: the evaluator's labels are checked against this.</p>"
        )
        parts.append(
            _table(
                ["rule", "right", "wrong", "how", "examples (read from the response / expected)"],
                [
                    [
                        g["kind"] if g["kind"] == g["named"] else f"{g['kind']} (for {g['named']})",
                        g["right"],
                        g["wrong"],
                        g["rule"],
                        "\n".join(
                            f"{v}: {e['response'][:80]!r}"
                            + ("" if g["kind"] == "label" else f" -> {e['read']!r} / {e['expected']!r}")
                            for v, rows in g["examples"].items()
                            for e in rows
                        ),
                    ]
                    for g in s["ground_truth"]
                ],
            )
        )
    parts.append(
        "<h2>Rounds</h2><p>Round r shows the evaluator every accepted ICL example; its errors on audit "
        "items become new examples. Holdout items are never turned into examples.</p>"
    )
    parts.append(_table(*_split_columns(s["rounds"], ["round", "n_icl", "new_examples", "new_accepted"])))
    warned = [f"round {r['round']}: {w}" for r in s["rounds"] for w in r.get("warnings", [])]
    if warned:
        parts.append("<ul class=warn>" + "".join(f"<li>warning: {html.escape(w)}</li>" for w in warned) + "</ul>")
    parts.append(_img(plots.rounds_figure(s["rounds"]), "metrics per round"))
    parts.append("<h2>F1 and AUC vs number of ICL examples</h2>")
    if s["sweep"]:
        parts.append(_table(*_split_columns(s["sweep"], ["n", "of"])))
    parts.append(_img(plots.icl_size_figure(s["sweep"], s["rounds"]), "F1/AUC vs number of ICL examples"))
    modes = s["failure_modes"]
    parts.append("<h2>Failure modes</h2>")
    if modes:
        counts = {c: modes["cluster"].count(int(c)) for c in modes["names"]}
        parts.append(
            _table(
                ["cluster", "examples", "top words"],
                [[c, counts[c], name] for c, name in sorted(modes["names"].items())],
            )
        )
    parts.append(_img(plots.tsne_figure(modes), "t-SNE map of the ICL examples"))
    parts.append("<h2>Cluster ablation</h2>")
    if s["ablation"]:
        rows = [
            [r["cluster"], r["name"], r["removed"], r["kappa"], r["all"]["f1"], r["all"]["auc"], r["all"]["errors"]]
            for r in s["ablation"]
        ]
        parts.append(
            _table(["ablated cluster", "name", "examples removed", "kappa vs full", "F1", "AUC", "errors"], rows)
        )
    parts.append(_img(plots.ablation_figure(s["ablation"]), "cluster ablation"))
    parts.append("<h2>ICL examples memory</h2>")
    parts.append(
        _table(
            ["id", "status", "round", "error", "failure mode", "question", "ICL user turn", "label"],
            [
                [
                    e.id,
                    e.status,
                    e.round,
                    e.error_kind,
                    e.failure_mode,
                    str(questions.get(e.item_id, ""))[:300],
                    e.user_text[:300],
                    e.correct_label,
                ]
                for e in examples
            ],
        )
    )
    style = (
        "body{font-family:sans-serif;max-width:1200px;margin:auto;padding:0 12px}.wide{overflow-x:auto}"
        "table{border-collapse:collapse;"
        "margin:8px 0;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top;"
        "white-space:pre-wrap}img{max-width:100%}.warn{color:#a00}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>ALLURE report</title><style>{style}"
        f"</style></head><body>{''.join(parts)}</body></html>\n"
    )


def write_report(run: AuditRun, memory: Memory, out: Path | None = None) -> tuple[Path, dict]:
    """summary.json and report.html (or `out`) in the run folder, written atomically."""
    s = summary(run, memory)
    atomic_write(run.path / "summary.json", json.dumps(strict_json(s), indent=2, default=str) + "\n")
    ids = {i for st in run.stages.rows for i in st["icl_ids"]}
    examples = [e for e in memory.examples() if e.run_id == run.run_id or e.id in ids]
    out = out or run.path / "report.html"
    questions = {it["id"]: it.get("question", it.get("source", "")) for it in run.items}
    atomic_write(out, render_html(s, examples, questions))
    return out, s
