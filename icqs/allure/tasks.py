"""The items an ALLURE run evaluates: one JSONL row per (task, response).

Fields (`icqs schema allure`): "response" (the generated response), "answer" (the task's correct answer: a number,
an option letter, or text) or "label" (a human 1/0 label; a row with a label and no answer is matched by kind
"label" whatever the template's match), optional "id" (default: the file's name:line), "match" (a match spec overriding the template's),
"split" ("audit": its errors grow the memory, "holdout": only measured), "group" (a problem type for error counts),
and any further fields the template's user turn names ({question}, {source}, ...).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.errors import UserError, did_you_mean
from icqs.contracts import check_row
from icqs.io import read_jsonl

from .audit import RULES, MatchSpec, MatchSpecError, judge_item, spec_of, truth
from .template import Template

SPLITS = ("audit", "holdout")
EXAMPLES = 3  # examples of right and of wrong responses shown per match kind


def load_items(path, template: Template, holdout: float = 0.0, seed: int = 0) -> list[dict]:
    """Read and check the items, add "truth" (the audited correctness) and "split" to each."""
    if not 0.0 <= holdout < 1.0:
        raise UserError(f"holdout fraction must be in [0, 1), got {holdout}")
    numbered = read_jsonl(path, required=("response",), with_lines=True)
    rows = [row for _, row in numbered]
    seen = {}
    for number, row in numbered:
        where = (str(path), number)
        check_row("allure", row, path, number)
        if "answer" not in row and "match" not in row:
            row["match"] = "label"  # a label-only row carries its own truth
        row.setdefault("id", f"{Path(path).name}:{number}")  # the same however the path is spelled (a rerun)
        row["id"] = str(row["id"])
        if row["id"] in seen:
            raise UserError(f"duplicate id {row['id']!r} (first at line {seen[row['id']]})", *where)
        seen[row["id"]] = number
        if not isinstance(row["response"], str):
            raise UserError("field 'response' must be text", *where)
        if isinstance(row.get("answer"), (int, float)) and not isinstance(row["answer"], bool):
            row["answer"] = str(row["answer"])  # "answer": 4 reads as "4"
        elif "answer" in row and not isinstance(row["answer"], str):
            raise UserError("field 'answer' must be text or a number", *where)
        try:
            spec = MatchSpec.parse(row["match"]) if "match" in row else template.match
            if spec.kind == "label":
                if row.get("label") not in (0, 1, True, False):
                    raise UserError("match kind 'label' needs a field 'label' of 1 or 0", *where)
            elif "answer" not in row:
                raise UserError("missing field 'answer' (the task's correct answer)", *where)
            row["truth"] = truth(row, template.match)
        except MatchSpecError as e:
            raise UserError(str(e), *where) from None
        missing = [f for f in template.fields if f not in row]
        if missing == ["answer"] and "label" in row:
            raise UserError(
                f"a row with a label and no answer needs a template that does not show the expected "
                f"answer; template {template.name!r} uses {{answer}}: use --template summary or a "
                f"YAML template (`icqs schema allure-template`)",
                *where,
            )
        if missing:
            raise UserError(
                f"missing field(s) {', '.join(map(repr, missing))} used by template "
                f"{template.name!r}{did_you_mean(missing[0], row)}",
                *where,
            )
        if "split" in row and row["split"] not in SPLITS:
            raise UserError(f"'split' must be one of {', '.join(SPLITS)}, got {row['split']!r}", *where)
    if not rows:
        raise UserError("no items", str(path))
    _assign_splits(rows, holdout, seed)
    return rows


def _assign_splits(rows: list[dict], holdout: float, seed: int) -> None:
    """Items without a "split" are held out at random (seeded): round(holdout * n) of them."""
    free = sorted((r for r in rows if "split" not in r), key=lambda r: r["id"])
    n_hold = int(round(holdout * len(free)))
    order = np.random.default_rng(seed).permutation(len(free))
    held = {free[i]["id"] for i in order[:n_hold]}
    for r in free:
        r["split"] = "holdout" if r["id"] in held else "audit"


def _short(text: str, width: int = 70) -> str:
    text = " ".join(str(text).split())
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def ground_truth(items: list[dict], template: Template) -> list[dict]:
    """What the audit takes as the truth, per match rule applied: its kind (and the kind the spec named, when the
    rule is another: "text" -> exact, "number" on a text answer -> exact), the rule, the counts right and wrong, and
    up to three examples of each: {id, response, read, expected}."""
    groups: dict[tuple, list] = {}
    for item in items:
        m = judge_item(item, template.match)
        groups.setdefault((m.kind, spec_of(item, template.match).kind), []).append((item, m))
    out = []
    for (kind, said), group in groups.items():
        examples = {
            verdict: [
                dict(id=it["id"], response=str(it["response"]), read=m.read, expected=m.expected)
                for it, m in group
                if bool(it["truth"]) == (verdict == "right")
            ][:EXAMPLES]
            for verdict in ("right", "wrong")
        }
        right = sum(int(it["truth"]) for it, _ in group)
        out.append(
            dict(kind=kind, named=said, rule=RULES[kind], right=right, wrong=len(group) - right, examples=examples)
        )
    return out


def ground_truth_text(items: list[dict], template: Template) -> str:
    """The ground truth as `icqs allure run` prints it before any round, with a warning when every response counts
    the same."""
    right_total = sum(int(it["truth"]) for it in items)
    lines = [f"ground truth: {right_total} of {len(items)} responses right (`icqs schema allure` states each rule)"]
    for g in ground_truth(items, template):
        name = (
            g["kind"]
            if g["kind"] == g["named"]
            else f"{g['kind']} (for match {g['named']!r}"
            + (", answers without a number)" if g["named"] == "number" else ")")
        )
        lines.append(f"  {name}: {g['right']} right, {g['wrong']} wrong of {g['right'] + g['wrong']}; {g['rule']}")
        for verdict, rows in g["examples"].items():
            for e in rows:
                read = (
                    ""
                    if g["kind"] == "label"
                    else f" -> read {e['read']!r}"
                    + (" = " if verdict == "right" else " != ")
                    + f"expected {e['expected']!r}"
                )
                lines.append(f"    {verdict}  {e['id']}: {_short(e['response'])}{read}")
    if right_total in (0, len(items)):
        lines.append(
            f"warning: every response counts as {'right' if right_total else 'wrong'}: the audit cannot "
            "tell a good evaluator from one that always answers the same; check the match rule above "
            "(`match` in the template or the items: exact, contains, regex, number, option)"
        )
    return "\n".join(lines) + "\n"
