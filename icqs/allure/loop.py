"""The ALLURE loop: evaluator -> audit -> grow the memory -> re-run (the paper's Fig. 1).

Round r labels every item with the memory's accepted examples as ICL turns. The audit compares each label with
the item's audited truth; every disagreement on an "audit" item becomes an ICL example (its correct label as the
assistant turn) in the memory, pending a human audit when review is on. Items of the "holdout" split are labelled
and measured but never turned into examples, so their metrics tell whether the corrections generalise.

The loop stops after `rounds` rounds, when the next round would show the evaluator the same examples as the last
(no new errors, or every new example rejected), or when new examples await review (`icqs allure review`, then run
again to resume).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .audit import disagreements
from .memory import Example, Memory
from .metrics import f1
from .run_dir import AuditRun


@dataclass
class Outcome:
    status: str  # "done" (all rounds), "converged" (no new examples), "review" (examples await a human audit)
    rounds: int  # rounds completed
    message: str


def shown_examples(memory: Memory, max_icl: int | None = None) -> list[int]:
    """Ids of the examples the evaluator is shown: the accepted ones, the newest `max_icl` if capped."""
    ids = [e.id for e in memory.accepted()]
    return ids[-max_icl:] if max_icl else ids


def turns_of(memory: Memory, ids: list[int]) -> list[tuple[str, str]]:
    found = {e.id: e for e in memory.examples(ids=ids)}
    missing = [i for i in ids if i not in found]
    if missing:
        raise KeyError(f"ICL examples {missing} are no longer in the memory {memory.path}")
    return [found[i].turns for i in ids]


def grow(
    run: AuditRun, memory: Memory, template, rows: list[dict], round_no: int, review: bool, provenance: dict
) -> int:
    """Add an ICL example for every audit-split error of a round; returns how many were new to the memory."""
    items = {it["id"]: it for it in run.items}
    audit_rows = [r for r in rows if r["split"] == "audit"]
    added = 0
    for i, kind in disagreements([r["truth"] for r in audit_rows], [r["label"] for r in audit_rows]):
        r = audit_rows[i]
        item = items[r["id"]]
        user, assistant = template.icl_example(item, r["truth"])
        ex = Example(
            item_id=item["id"],
            user_text=user,
            assistant_text=assistant,
            response=str(item["response"]),
            answer=None if item.get("answer") is None else str(item["answer"]),
            correct_label=int(r["truth"]),
            evaluator_label=int(r["label"]),
            evaluator_prob=float(r["p_correct"]),
            error_kind=kind,
            status="pending" if review else "accepted",
            run_id=run.run_id,
            round=round_no,
            provenance={**provenance, "stage": f"round-{round_no}", "group": item.get("group")},
        )
        added += memory.add(ex) is not None
    return added


def evaluator_warnings(rows: list[dict]) -> list[str]:
    """What makes a round's labels no evidence: an evaluator that gives every item the same label (it does not read
    the responses), or an F1 of 0 (it calls no right response right)."""
    if not rows:
        return []
    labels = [int(r["label"]) for r in rows]
    truths = [int(r["truth"]) for r in rows]
    score = f1(truths, labels)
    out = []
    if len(set(labels)) == 1:
        out.append(
            f"the evaluator labelled all {len(rows)} items {labels[0]} ({'right' if labels[0] else 'wrong'}), "
            f"whatever the response (F1 {score:.2f}): a constant evaluator; try a stronger --model "
            f"(qwen2.5-1.5b), a clearer 'system' instruction in the template, or more rounds"
        )
    elif score == 0.0:
        out.append(
            f"the evaluator's F1 is 0.00: it labelled none of the {sum(truths)} right responses right; check "
            f"the ground truth printed at the start and the template's instruction"
        )
    return out


def iterate(
    run: AuditRun,
    evaluator,
    memory: Memory,
    rounds: int,
    review: bool = False,
    max_icl: int | None = None,
    provenance: dict | None = None,
) -> Outcome:
    provenance = provenance or {}
    for r in range(1, rounds + 1):
        name = f"round-{r}"
        if run.stage(name) is None:
            pending = memory.examples(status="pending", run_id=run.run_id)
            if pending:
                return Outcome(
                    "review",
                    r - 1,
                    f"{len(pending)} new ICL example(s) await review: run "
                    f"`icqs allure review --memory {memory.path}`, then run again",
                )
            ids = shown_examples(memory, max_icl)
            last = run.stage(f"round-{r - 1}")
            if last is not None and last["icl_ids"] == ids:
                return Outcome("converged", r - 1, f"round {r - 1} added no new ICL example: stopped")
            run.plan(name, "round", ids, round=r)
        rows = run.evaluate(evaluator, name, turns_of(memory, run.stage(name)["icl_ids"]))
        for text in evaluator_warnings(rows):
            print(f"warning: round {r}: {text}", file=sys.stderr)
        grow(run, memory, evaluator.template, rows, r, review, provenance)
    return Outcome("done", rounds, f"{rounds} round(s) done")


def round_table(run: AuditRun, memory: Memory) -> list[dict]:
    """One row per completed round: ICL examples shown, examples the round's audit added, metrics per split."""
    out = []
    for st in run.stages_of("round"):
        if not run.complete(st["stage"]):
            continue
        added = memory.examples(run_id=run.run_id, round=st["round"])
        out.append(
            dict(
                round=st["round"],
                n_icl=len(st["icl_ids"]),
                new_examples=len(added),
                new_accepted=sum(e.status == "accepted" for e in added),
                **run.metrics(st["stage"]),
                warnings=evaluator_warnings(run.rows(st["stage"])),
            )
        )
    return out
