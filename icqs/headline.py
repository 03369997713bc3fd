"""A score run's headline: the one answer a researcher reads first, in the terminal, leaderboard.txt, the report and
run.json (`headline`).

The primary measure is the audited-reliable one (verdict `reliable`, its score not following the label, and its
audit CI above 0.5 still when it is widened for the k measures the headline picks from: audit.json `ci_family`)
with the highest audit AUC on the task's own pool; ties (equal to two decimals) go to the cheaper method
(Method.cost), then to the registry's order. The headline names it, the ranking it gives (models best first, each
mean with its 95% CI) and the audit figure behind it; where candidates carry truth, also the candidate-level AUC
and the ranking's Spearman against the truth. When no measure is reliable it says so, with what was measured, and
lists next steps fitted to what the run saw: a larger model by name with an estimate of its time on this task (this
run's measured engine time scaled by the parameter ratio), more or cleaner pool examples, a label task, the
measures the truth supports.
"""

from __future__ import annotations

import math

from .methods import METHODS, measure_name

# Models this project can fetch by name (commands/fetch.py) and the embedded default, by parameter count.
LADDER = (
    ("SmolLM2-135M-Instruct (the default)", None, 134.5e6),
    ("Gemma-3-270M", "gemma-3-270m", 268.1e6),
    ("Qwen2.5-Coder-0.5B-Instruct", "qwen2.5-0.5b", 494.0e6),
    ("Qwen2.5-Coder-1.5B-Instruct", "qwen2.5-1.5b", 1543.7e6),
)
WIDE_CI = 0.12  # an audit CI half-width from which more pool examples are the first thing to add


def model_params(config) -> int:
    """Parameters of a Llama-family model from its config (embeddings counted once when tied)."""
    h, hd = config.hidden_size, config.head_dim
    attn = h * hd * (2 * config.num_heads + 2 * config.num_kv_heads)
    mlp = 3 * h * config.intermediate_size
    return int(config.num_layers * (attn + mlp) + config.vocab_size * h * (1 if config.tie_embeddings else 2))


def _num(v, fmt: str = ".2f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _ci(ci) -> str:
    return f"[{_num(ci[0])}, {_num(ci[1])}]"


def _usable(e: dict) -> bool:
    return e.get("verdict") not in (None, "skipped") and e.get("auc") is not None and not math.isnan(e["auc"])


def _survives_family(e: dict) -> bool:
    """Whether the measure's audit CI stays above 0.5 once the k measures compared are counted (ci_family; an
    audit.json written before it existed, or one measure alone, has none: its 95% CI decides)."""
    low = (e.get("ci_family") or [None])[0]
    return low is None or low > 0.5


def primary(entries: list[dict] | None, boards: list[dict]) -> dict | None:
    """The audit entry of the headline's measure, or None when no measure is audited reliable (with the measures
    compared counted: _survives_family)."""
    shown = {(b["method"], x) for b in boards for x in b["measures"]}
    order = list(METHODS)
    reliable = [
        e
        for e in entries or []
        if _usable(e)
        and e["verdict"] == "reliable"
        and not e.get("label_bias")
        and (e["method"], e["measure"]) in shown
        and _survives_family(e)
    ]
    if not reliable:
        return None
    return min(
        reliable,
        key=lambda e: (
            -round(e["auc"], 2),
            METHODS[e["method"]].cost,
            order.index(e["method"]),
            METHODS[e["method"]].measures.index(e["measure"]),
        ),
    )


def _board(boards: list[dict], method: str) -> dict:
    return next(b for b in boards if b["method"] == method)


def _ranking(board: dict, measure: str) -> list[dict]:
    return [
        {"model": m["model"], "mean": m["mean"], "ci": [m["ci_low"], m["ci_high"]], "rank": m["rank"]}
        for m in board["measures"][measure]["models"]
        if not math.isnan(m["mean"])
    ]


def _ranking_text(ranking: list[dict]) -> str:
    return " > ".join(f"{r['model']} {_num(r['mean'], '.3f')} {_ci(r['ci'])}" for r in ranking)


def _unsettled(ranking: list[dict]) -> list[str]:
    """Neighbours in the ranking whose CIs overlap: their order is not settled by this run."""
    out = []
    for a, b in zip(ranking, ranking[1:]):
        if not any(math.isnan(v) for v in (*a["ci"], *b["ci"])) and b["ci"][1] >= a["ci"][0]:
            out.append(f"{a['model']} / {b['model']}")
    return out


def _larger_model(meta: dict) -> str | None:
    """A next step: the next larger model this project can fetch, with its estimated time on this task."""
    info = meta.get("model_info") or {}
    params = info.get("params")
    if not params:
        return None
    seconds = sum(
        p.get("seconds", 0) for key in ("engine_stats", "audit_stats") for p in (meta.get(key) or {}).values()
    )
    for title, name, size in LADDER:
        if size > 1.5 * params:
            ratio = size / params
            flag = f" --model {name}" if name else ""
            minutes = seconds * ratio / 60
            est = (
                (f"; about {minutes:.0f} min" if minutes >= 1 else f"; about {minutes * 60:.0f} s")
                + f" for this run on this machine (this run's {seconds:.3g} s of engine time x {ratio:.1f}, the "
                f"parameter ratio; `icqs preview TASK CANDIDATES{flag}` measures it)"
                if seconds
                else ""
            )
            return (
                f"a larger model: {flag.strip() or 'the default model (no --model)'} ({title}, "
                f"{size / 1e9:.2g}B parameters vs this one's {params / 1e9:.2g}B){est}"
            )
    return (
        "a larger model than this project can fetch (a 7B or larger GGUF with --model PATH): this one, "
        f"{params / 1e9:.2g}B parameters, is the largest here"
    )


def _labels_balanced(task, tolerance: float = 0.1) -> bool:
    """Whether every label has the same share (within `tolerance`) of the good and of the bad pool examples."""
    if not task.is_label_task or not task.good or not task.bad:
        return False
    shares = [[sum(e.y == lab for e in pool) / len(pool) for pool in (task.good, task.bad)] for lab in task.labels]
    return all(abs(g - b) <= tolerance for g, b in shares)


def next_steps(entries: list[dict] | None, task, meta: dict) -> list[str]:
    """What to try when no measure is reliable, fitted to what the audit saw."""
    usable = [e for e in entries or [] if _usable(e)]
    steps = []
    truth_ok = [
        e
        for e in usable
        if e.get("truth_ci") and e["truth_ci"][0] is not None and e["truth_ci"][0] > 0.5 and not e.get("label_bias")
    ]
    if truth_ok:
        best = max(truth_ok, key=lambda e: e["truth_auc"])
        steps.append(
            f"your candidates' own truth says {best['method']} {measure_name(best['method'], best['measure'])}"
            f" separates their right from wrong answers (AUC {_num(best['truth_auc'])} "
            f"{_ci(best['truth_ci'])}) where the pool audit does not: make the pool like the candidates (a "
            f"few candidates whose truth you know, as good and bad examples) so the audit can confirm it"
        )
    larger = _larger_model(meta)
    if larger:
        steps.append(larger)
    if usable:
        n = max(e.get("n", 0) for e in usable)
        half = sorted((e["ci"][1] - e["ci"][0]) / 2 for e in usable)[len(usable) // 2]
        if half > WIDE_CI:
            steps.append(
                f"more pool examples: the audit scored {n} pool answers and its CIs are about +-{half:.2f} "
                f"wide, too wide to call an AUC of 0.7 reliable; 2-3x more good and bad examples "
                f"(`good`, `bad` in the task) narrow them by 1.4-1.7x"
            )
    if any(e.get("label_bias") for e in usable):
        if _labels_balanced(task):
            if not task.calibrate:
                steps.append(
                    "calibration: some scores follow the answer's label (label_auc far from 0.5) although "
                    "every label has the same share of the good and of the bad pool examples, so the model "
                    "rates one label higher whatever the answer; --calibrate scores each answer against the "
                    "same answer after a content-free input (the task's content_free), which takes that "
                    "preference out of icqs and epistemic (their _cal measures)"
                )
        else:
            steps.append(
                "cleaner pool examples: some scores follow the answer's label (label_auc far from 0.5): "
                "give every label the same share among the good and the bad examples"
            )
    if any(e.get("agrees") is False for e in usable):
        steps.append(
            "a pool like the candidates: the pool audit and the candidates' truth disagree; take the "
            "pool's wrong answers from the kind of mistakes the scored models make"
        )
    if not task.is_label_task:
        steps.append(
            "a label task: rewrite each answer as an input and ask for a verdict, e.g. template "
            "'Question: {x}\\nVerdict: {y}' with x = the question and the answer, y = correct / wrong, "
            "then add --method icl (plain ICL reads the model's own verdict)"
        )
    elif "icl" not in meta.get("methods", []):
        steps.append("--method icl: plain ICL, the model's own label after the all-good demos")
    return steps


def headline(entries: list[dict] | None, boards: list[dict], task, meta: dict) -> dict:
    """{method, measure, verdict, auc, ci, ranking (model names, best first), means, next_steps, lines}."""
    if not entries and meta.get("audit", "unknown") not in ("off",) and not str(meta.get("audit")).startswith("skip"):
        # asked for and missing (killed, audit.json removed or emptied): pending, never as if --no-audit (audit_state)
        return {
            "method": None,
            "measure": None,
            "verdict": "audit pending",
            "auc": None,
            "ci": None,
            "ranking": [],
            "means": [],
            "next_steps": ["run the same `icqs score` command again: it finishes the audit"],
            "lines": [
                "No headline yet: this run's evaluator audit is missing (pending), so nothing says which of "
                "its rankings tells right from wrong answers; run the same `icqs score` command again"
            ],
        }
    if entries is None:
        return {
            "method": None,
            "measure": None,
            "verdict": "no audit",
            "auc": None,
            "ci": None,
            "ranking": [],
            "means": [],
            "next_steps": ["run without --no-audit: the audit says which measure to trust"],
            "lines": [
                "No headline: this run has no audit (--no-audit), so nothing says which of its rankings "
                "tells right from wrong answers; run without --no-audit"
            ],
        }
    e = primary(entries, boards)
    if e is not None:
        board = _board(boards, e["method"])
        ranking = _ranking(board, e["measure"])
        name = f"{e['method']} {measure_name(e['method'], e['measure'])}".replace(" score", "")
        family = (
            f"; {_ci(e['ci_family'])} at {1 - 0.05 / e['family']:.1%} with the {e['family']} measures compared"
            if e.get("ci_family")
            else ""
        )
        lines = [
            f"Best: {ranking[0]['model']} by {name} (audit reliable: AUC {_num(e['auc'])} {_ci(e['ci'])} on "
            f"{e.get('n', '?')} pool answers{family})",
            f"  ranking: {_ranking_text(ranking)}",
        ]
        unsettled = _unsettled(ranking)
        if unsettled:
            lines.append(f"  not settled by this run (95% CIs overlap): {', '.join(unsettled)}")
        if "truth_auc" in e:
            rho = board["measures"][e["measure"]].get("spearman")
            exact = [r["model"] for r in ranking] == sorted(board["truth"], key=lambda m: (board["truth_rank"][m], m))
            lines.append(
                f"  on the candidates' own truth: AUC {_num(e['truth_auc'])} {_ci(e['truth_ci'])}"
                + (f", ranking vs truth Spearman {_num(rho, '+.2f')}" if rho is not None else "")
                + (" (the exact true order)" if exact else "")
                + ("" if e.get("agrees", True) else "; the pool audit and the truth DISAGREE (see warnings)")
            )
        return {
            "method": e["method"],
            "measure": e["measure"],
            "verdict": e["verdict"],
            "auc": e["auc"],
            "ci": e["ci"],
            "ranking": [r["model"] for r in ranking],
            "means": ranking,
            "next_steps": [],
            "lines": lines,
        }
    usable = [x for x in entries if _usable(x)]
    best = max(usable, key=lambda x: x["auc"], default=None)
    if best is None:
        what = "the audit could not score any measure"
    else:
        what = (
            f"the best, {best['method']} {measure_name(best['method'], best['measure'])}, has audit AUC "
            f"{_num(best['auc'])} {_ci(best['ci'])} on {best.get('n', '?')} pool answers ({best['verdict']}"
            + (", following the label" if best.get("label_bias") else "")
            + ")"
        )
        if best["verdict"] == "reliable" and not best.get("label_bias") and not _survives_family(best):
            level = 1 - 0.05 / best["family"]
            what += (
                f", but not once the {best['family']} measures compared are counted: its {level:.1%} CI "
                f"{_ci(best['ci_family'])} includes 0.5 (the best of {best['family']} measures at chance often "
                f"looks this good on {best.get('n', '?')} pool answers)"
            )
    steps = next_steps(entries, task, meta)
    lines = [
        f"No reliable measure: none of the {len(usable)} audited measures tells right from wrong answers on "
        f"the task's own pool with this model; {what}. No ranking below is evidence.",
        "  next steps:",
    ]
    lines += [f"  - {s}" for s in steps]
    verdict = best["verdict"] if best else "unscored"
    if verdict == "reliable":  # yet not the headline's: it follows the label, or not once the family is counted
        verdict = (
            "label-following" if best.get("label_bias") else f"not reliable with {best['family']} measures compared"
        )
    return {
        "method": None,
        "measure": None,
        "verdict": verdict,
        "auc": best["auc"] if best else None,
        "ci": best["ci"] if best else None,
        "ranking": [],
        "means": [],
        "next_steps": steps,
        "lines": lines,
    }


def format_headline(h: dict) -> str:
    return "\n".join(h["lines"]) + "\n"
