"""Signal-detection metrics of an evaluator's binary labels against the audited truth (label 1 = "correct").

Computed from the confusion counts and, for AUC, from ranks (the Mann-Whitney statistic), so that a round with a
single class gives NaN for the undefined quantities instead of an exception; tests check them against scikit-learn.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import rankdata


def confusion(y_true, y_pred) -> dict:
    """Counts tp, fp, tn, fn with 1 as the positive class. fp: labelled correct though wrong; fn: the reverse."""
    t = np.asarray(y_true, dtype=int)
    p = np.asarray(y_pred, dtype=int)
    if t.shape != p.shape:
        raise ValueError(f"y_true and y_pred differ in length: {t.shape} vs {p.shape}")
    return dict(
        tp=int(np.sum((t == 1) & (p == 1))),
        fp=int(np.sum((t == 0) & (p == 1))),
        tn=int(np.sum((t == 0) & (p == 0))),
        fn=int(np.sum((t == 1) & (p == 0))),
    )


def f1(y_true, y_pred) -> float:
    """F1 of the positive class; 0.0 when there is no positive label and no positive prediction (as sklearn's
    zero_division=0)."""
    c = confusion(y_true, y_pred)
    denom = 2 * c["tp"] + c["fp"] + c["fn"]
    return 2 * c["tp"] / denom if denom else 0.0


def auc(y_true, scores) -> float:
    """Area under the ROC curve: P(score of a random positive > score of a random negative), ties counting
    half. NaN when only one class is present."""
    t = np.asarray(y_true, dtype=int)
    s = np.asarray(scores, dtype=float)
    n_pos, n_neg = int(np.sum(t == 1)), int(np.sum(t == 0))
    if n_pos == 0 or n_neg == 0:
        return math.nan
    ranks = rankdata(s)  # average ranks for ties
    u = float(np.sum(ranks[t == 1])) - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)


def cohen_kappa(a, b) -> float:
    """Cohen's kappa between two binary labelings (agreement beyond chance). 1.0 when both are the same constant
    labeling, where sklearn gives NaN (0/0)."""
    a = np.asarray(a, dtype=int)
    b = np.asarray(b, dtype=int)
    if a.shape != b.shape:
        raise ValueError(f"labelings differ in length: {a.shape} vs {b.shape}")
    n = len(a)
    if n == 0:
        return math.nan
    observed = float(np.mean(a == b))
    expected = float(np.mean(a == 1) * np.mean(b == 1) + np.mean(a == 0) * np.mean(b == 0))
    if expected == 1.0:
        return 1.0 if observed == 1.0 else math.nan
    return (observed - expected) / (1 - expected)


def summarize(y_true, y_pred, p_correct) -> dict:
    """accuracy, precision, recall, F1, AUC and the error counts of one evaluation pass."""
    c = confusion(y_true, y_pred)
    n = sum(c.values())
    return dict(
        n=n,
        accuracy=(c["tp"] + c["tn"]) / n if n else math.nan,
        precision=c["tp"] / (c["tp"] + c["fp"]) if c["tp"] + c["fp"] else 0.0,
        recall=c["tp"] / (c["tp"] + c["fn"]) if c["tp"] + c["fn"] else 0.0,
        f1=f1(y_true, y_pred),
        auc=auc(y_true, p_correct),
        errors=c["fp"] + c["fn"],
        false_positives=c["fp"],
        false_negatives=c["fn"],
        positives=c["tp"] + c["fn"],
    )
