"""Issue 39's before/after table from `icqs score` run directories: per method and measure, the pool audit's AUC
[95% CI] and verdict (as the run's own audit.json has them), the candidates' AUC against their truth [95% CI] (the
current icqs.audit.truth_auc applied to the run's scores.jsonl, so a run made before truth AUC existed gets the same
computation), the leaderboard's Spearman against the true model ranking (leaderboard.json), the headline (run.json;
absent before the headline existed), the audit's share of the tokens computed, and the load average the run saw
(RUN.load, written by the script that ran it).

    python benchmarks/icqs_issue39_table.py RUN_DIR [RUN_DIR ...]     # markdown rows on stdout
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from icqs.audit import _ci, _num, audit_share, truth_auc
from icqs.methods import measure_name


def rows_of(run: Path) -> list[str]:
    audit = json.loads((run / "audit.json").read_text())
    boards = {b["method"]: b for b in json.loads((run / "leaderboard.json").read_text())}
    scores = [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines() if line.strip()]
    question = (
        {
            json.loads(c)["id"]: json.loads(c)["x"]
            for c in (run / "candidates.jsonl").read_text().splitlines()
            if c.strip()
        }
        if (run / "candidates.jsonl").exists()
        else {}
    )
    meta = json.loads((run / "run.json").read_text())
    head = meta.get("headline")
    out = []
    for e in audit:
        if e["verdict"] == "skipped":
            out.append(f"| | {e['method']} | skipped: {e.get('note', '')} | | | |")
            continue
        t = truth_auc(scores, e["method"], e["measure"], question)
        rho = boards.get(e["method"], {}).get("measures", {}).get(e["measure"], {}).get("spearman")
        name = f"{e['method']} {measure_name(e['method'], e['measure'])}"
        if head and (head.get("method"), head.get("measure")) == (e["method"], e["measure"]):
            name = f"**{name} (headline)**"
        verdict = e["verdict"] + (", follows the label" if e.get("label_bias") else "")
        if e["verdict"] == "reliable" and e.get("ci_family") and e["ci_family"][0] <= 0.5:
            verdict += f" (not with the {e['family']} compared)"
        out.append(
            f"| | {name} | {_num(e['auc'])} {_ci(e['ci'])} | "
            f"{_num(t['auc']) + ' ' + _ci(t['ci']) if t else '-'} | {_num(rho, '+.2f')} | {verdict} |"
        )
    share = audit_share(meta)
    load = run.parent / f"{run.name}.load"
    out.append(
        f"  {run.name}: audit {share['token_share']:.0%} of {share['total_tokens']:,} tokens computed"
        if share
        else f"  {run.name}: no audit stats"
    )
    if load.exists():
        out.append("  load: " + " | ".join(load.read_text().split("\n")).strip())
    out.append("  headline: " + (" / ".join(head.get("text") or head.get("lines") or []) if head else "none"))
    return out


def main() -> None:
    print("| task, model | method measure | audit AUC [CI] | truth AUC [CI] | Spearman | verdict |")
    print("|---|---|---|---|---|---|")
    for arg in sys.argv[1:]:
        print(f"| {Path(arg).name} | | | | | |")
        print("\n".join(rows_of(Path(arg))))


if __name__ == "__main__":
    main()
