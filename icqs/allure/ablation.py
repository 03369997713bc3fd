"""Re-running the evaluator with chosen subsets of the memory.

  icl_sweep         metrics vs the number of ICL examples (the paper's Fig. 3): nested uniform samples of the
                    final examples, of the given sizes
  cluster_ablation  every failure-mode cluster removed in turn (Fig. 6-7): metrics, error counts and Cohen's kappa
                    between the ablated run's labels and the full run's
Stage names carry the size of the example set they sample from, so a memory that grew later gets new stages.
"""

from __future__ import annotations

import numpy as np

from .loop import turns_of
from .metrics import cohen_kappa
from .run_dir import AuditRun


def _sweep_stage(run: AuditRun, evaluator, memory, chosen: list[int], of: int) -> str:
    name = f"icl-{len(chosen)}-of-{of}"
    stage = run.plan(name, "sweep", chosen, n=len(chosen), of=of)
    run.evaluate(evaluator, name, turns_of(memory, stage["icl_ids"]))
    return name


def full_stage(run: AuditRun, evaluator, memory, ids: list[int]) -> str:
    """The evaluation with every example in `ids` (the reference of the sweep's last point and the ablations)."""
    return _sweep_stage(run, evaluator, memory, list(ids), len(ids))


def icl_sweep(run: AuditRun, evaluator, memory, ids: list[int], sizes: list[int], seed: int = 0) -> None:
    """Evaluate with nested uniform samples of `ids` of each size (capped at len(ids)), in memory order."""
    order = np.random.default_rng(seed).permutation(len(ids))
    for n in sorted({min(int(s), len(ids)) for s in sizes}):
        _sweep_stage(run, evaluator, memory, [int(ids[i]) for i in sorted(order[:n])], len(ids))


def cluster_ablation(run: AuditRun, evaluator, memory, ids: list[int], modes: dict) -> None:
    """Evaluate with all of `ids`, then with each failure-mode cluster's examples removed."""
    full_stage(run, evaluator, memory, ids)
    cluster_of = dict(zip(modes["ids"], modes["cluster"]))
    for c in sorted(set(modes["cluster"])):
        name = f"ablate-{c}-of-{len(ids)}"
        stage = run.plan(name, "ablation", [i for i in ids if cluster_of.get(i) != c], cluster=c, of=len(ids))
        run.evaluate(evaluator, name, turns_of(memory, stage["icl_ids"]))


def sweep_rows(run: AuditRun) -> list[dict]:
    """{n, of, stage, metrics...} of every finished sweep stage of the largest example set."""
    stages = [s for s in run.stages_of("sweep") if run.complete(s["stage"])]
    if not stages:
        return []
    of = max(s["of"] for s in stages)
    return [
        dict(n=s["n"], of=of, stage=s["stage"], **run.metrics(s["stage"]))
        for s in sorted(stages, key=lambda s: s["n"])
        if s["of"] == of
    ]


def ablation_rows(run: AuditRun, modes: dict | None) -> list[dict]:
    """{cluster, name, removed, kappa, metrics...}: the full run (cluster None) and each finished ablation,
    kappa measured between the ablated run's labels and the full run's."""
    stages = [s for s in run.stages_of("ablation") if run.complete(s["stage"])]
    if not stages or not modes:
        return []
    of = max(s["of"] for s in stages)
    full = f"icl-{of}-of-{of}"
    if not run.complete(full):
        return []
    full_labels = [r["label"] for r in run.rows(full)]
    out = [dict(cluster=None, name="none ablated", removed=0, kappa=1.0, stage=full, **run.metrics(full))]
    for s in sorted((s for s in stages if s["of"] == of), key=lambda s: s["cluster"]):
        c = s["cluster"]
        out.append(
            dict(
                cluster=c,
                name=modes["names"].get(str(c), f"cluster {c}"),
                removed=of - len(s["icl_ids"]),
                kappa=cohen_kappa([r["label"] for r in run.rows(s["stage"])], full_labels),
                stage=s["stage"],
                **run.metrics(s["stage"]),
            )
        )
    return out
