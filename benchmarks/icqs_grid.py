"""The ICQS comparison grid of issue 15, shared by the sentiment and yes/no experiments: old vs new sampler and
calibration on/off, against plain ICL, over several seeds.

Every held-out question q is two candidates, its correct answer and a wrong one. For each seed s the task is
scored with seed s (its demo sets), and four simulated models of known label accuracy (1.0 / 0.8 / 0.6 / 0.4) each
answer right on exactly round(acc * Q) questions drawn with seed s. Measures, per configuration:
- AUC correct vs wrong over the candidates (E[r], and the argmax score), mean over seeds;
- AUC of the score for one label vs the other (the label-frequency symptom: high means the score tracks which
  label an answer gives, not whether it is right);
- Spearman of the four models' mean scores with their accuracies, mean over seeds;
- 95% bootstrap CIs over questions (the same resampled questions for every seed, the measure averaged over seeds);
- how many seeds rank the four models exactly right.
Configurations: sampler old = `bernoulli` without balance (the project's earlier demo sets), new = `coupled` with
exact counts and label balance (marginal); calibrated scores come from the same runs (task.calibrate). Plain ICL
(the all-good demo set; the candidate's score is the probability ICL gives its answer) is the baseline.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy import stats
from sklearn.metrics import roc_auc_score

from icqs.baselines import compute_icl, icl_score
from icqs.candidates import Candidate
from icqs.io import ResultWriter
from icqs.scoring import compute_loglik, method_scores
from icqs.task import Task

SIMULATED = {"sim-1.0": 1.0, "sim-0.8": 0.8, "sim-0.6": 0.6, "sim-0.4": 0.4}
CONFIGS = {"old sampler": ("bernoulli", "none"), "new sampler": ("coupled", "marginal")}


def pair_candidates(questions: list[tuple[str, str]], labels: list[str]) -> list[Candidate]:
    """Two candidates per (x, gold label): q{i}/correct and q{i}/wrong (the other label; binary tasks)."""
    out = []
    for i, (x, y) in enumerate(questions):
        wrong = next(lab for lab in labels if lab != y)
        out += [Candidate(f"q{i}/correct", "correct", x, y, 1.0), Candidate(f"q{i}/wrong", "wrong", x, wrong, 0.0)]
    return out


def score_seed(engine, task: Task, cands: list[Candidate], out: Path, sampler: str, balance: str, seed: int) -> dict:
    """ICQS rows (raw and calibrated) and ICL rows for one sampler configuration and seed; resumable in `out`."""
    t = replace(task, seed=seed, balance=balance, calibrate=True)
    folder = out / f"{sampler}-{balance}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    with ResultWriter(folder / "loglik.jsonl", ("sampler", "l", "id")) as w:
        compute_loglik(engine, t, cands, w, sampler, repeats=1, progress=False)
        icqs = method_scores(w.rows, cands, t, sampler, epistemic=False)
    with ResultWriter(folder / "icl.jsonl", "id") as w:
        compute_icl(engine, t, cands, w, sampler, progress=False)
        by_id = {r["id"]: r for r in w.rows}
    icl = [icl_score(t, c, by_id[c.id]) for c in cands]
    return {"icqs": icqs, "icl": icl}


def measures(rows: dict, cands: list[Candidate]) -> dict[str, np.ndarray]:
    """Per method/measure, the candidate scores as an array [Q, 2] (column 0: correct answer, 1: wrong one)."""
    q = len(cands) // 2
    out = {}
    for name, key in (
        ("ICQS E[r]", "expected"),
        ("ICQS argmax", "score"),
        ("ICQS E[r] calibrated", "expected_cal"),
        ("ICQS argmax calibrated", "score_cal"),
    ):
        out[name] = np.array([r[key] for r in rows["icqs"]]).reshape(q, 2)
    out["plain ICL p_label"] = np.array([r["p_label"] for r in rows["icl"]]).reshape(q, 2)
    return out


def _auc(scores: np.ndarray) -> float:
    return roc_auc_score([1] * len(scores) + [0] * len(scores), np.concatenate([scores[:, 0], scores[:, 1]]))


def _label_auc(scores: np.ndarray, is_first_label: np.ndarray) -> float:
    flat, lab = scores.reshape(-1), is_first_label.reshape(-1)
    return roc_auc_score(lab, flat) if 0 < lab.sum() < len(lab) else np.nan


def _model_means(scores: np.ndarray, right: dict[str, np.ndarray]) -> np.ndarray:
    """Each simulated model's mean score: column 0 where it is right, 1 elsewhere."""
    return np.array([np.where(right[m], scores[:, 0], scores[:, 1]).mean() for m in SIMULATED])


def simulated(q: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, 7])
    out = {}
    for m, acc in SIMULATED.items():
        mask = np.zeros(q, dtype=bool)
        mask[rng.permutation(q)[: round(acc * q)]] = True
        out[m] = mask
    return out


def _spearman(means: np.ndarray) -> float:
    if len(set(means.tolist())) < 2:
        return np.nan
    return float(stats.spearmanr(means, list(SIMULATED.values())).statistic)


def summarize(
    per_seed: list[dict[str, np.ndarray]], is_first_label: np.ndarray, resamples: int = 1000, seed: int = 0
) -> dict[str, dict]:
    """Per measure: AUC correct vs wrong, label AUC, Spearman (means over seeds, 95% bootstrap CIs over questions)
    and the number of seeds with the exact ranking."""
    q = is_first_label.shape[0]
    sims = [simulated(q, s) for s in range(len(per_seed))]
    rng = np.random.default_rng(seed)
    boots = [rng.integers(0, q, q) for _ in range(resamples)]
    out = {}
    for name in per_seed[0]:

        def stat(idx):
            auc = np.mean([_auc(m[name][idx]) for m in per_seed])
            rho = np.nanmean(
                [
                    _spearman(_model_means(m[name][idx], {k: v[idx] for k, v in sim.items()}))
                    for m, sim in zip(per_seed, sims)
                ]
            )
            return auc, rho

        full = np.arange(q)
        auc, rho = stat(full)
        b = np.array([stat(idx) for idx in boots])
        exact = sum(bool(np.all(np.diff(_model_means(m[name], sim)) < 0)) for m, sim in zip(per_seed, sims))
        label_auc = np.nanmean([_label_auc(m[name], is_first_label) for m in per_seed])
        out[name] = {
            "auc": auc,
            "auc_ci": np.nanpercentile(b[:, 0], [2.5, 97.5]),
            "rho": rho,
            "rho_ci": np.nanpercentile(b[:, 1], [2.5, 97.5]),
            "exact": exact,
            "label_auc": label_auc,
        }
    return out


def run_grid(
    engine, task: Task, cands: list[Candidate], out: Path, seeds: int, label_of_first: str
) -> tuple[list[str], dict]:
    """Score every configuration and seed, then the markdown table lines; also returns the summaries."""
    out = Path(out)
    q = len(cands) // 2
    is_first = np.array([[c.y == label_of_first for c in cands[2 * i : 2 * i + 2]] for i in range(q)])
    lines = [
        "| sampler | measure | AUC correct vs wrong [95% CI] | AUC '" + label_of_first + "' vs other answers | "
        "Spearman of 4 models [95% CI] | exact ranking (seeds) | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    results = {}
    for config, (sampler, balance) in CONFIGS.items():
        t0 = time.time()
        per_seed = [measures(score_seed(engine, task, cands, out, sampler, balance, s), cands) for s in range(seeds)]
        seconds = time.time() - t0
        results[config] = summary = summarize(per_seed, is_first)
        for name, s in summary.items():  # plain ICL: the all-good set of this sampler (balanced or not)
            lines.append(
                f"| {config} ({sampler}, balance {balance}) | {name} | {s['auc']:.3f} "
                f"[{s['auc_ci'][0]:.2f}, {s['auc_ci'][1]:.2f}] | {s['label_auc']:.3f} | {s['rho']:+.2f} "
                f"[{s['rho_ci'][0]:+.2f}, {s['rho_ci'][1]:+.2f}] | {s['exact']} of {seeds} | {seconds:.0f} |"
            )
    return lines, results
