"""ALLURE metrics against scikit-learn: F1, AUC (with ties), Cohen's kappa, accuracy, error counts."""

import math

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, cohen_kappa_score, f1_score, precision_score, recall_score, roc_auc_score

from icqs.allure.metrics import auc, cohen_kappa, confusion, f1, summarize


@pytest.mark.parametrize("seed", range(8))
def test_against_sklearn(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 60))
    y = rng.integers(0, 2, n)
    y[0], y[1] = 0, 1  # both classes present
    scores = np.round(rng.random(n), 1)  # coarse: many ties
    pred = (rng.random(n) < 0.5).astype(int)
    other = (rng.random(n) < 0.3).astype(int)
    assert f1(y, pred) == pytest.approx(f1_score(y, pred, zero_division=0))
    assert auc(y, scores) == pytest.approx(roc_auc_score(y, scores))
    assert cohen_kappa(pred, other) == pytest.approx(cohen_kappa_score(pred, other))
    s = summarize(y, pred, scores)
    assert s["accuracy"] == pytest.approx(accuracy_score(y, pred))
    assert s["precision"] == pytest.approx(precision_score(y, pred, zero_division=0))
    assert s["recall"] == pytest.approx(recall_score(y, pred, zero_division=0))
    assert s["errors"] == int(np.sum(y != pred)) == s["false_positives"] + s["false_negatives"]
    assert s["false_positives"] == int(np.sum((y == 0) & (pred == 1)))


def test_edge_cases():
    assert math.isnan(auc([1, 1, 1], [0.2, 0.5, 0.9]))  # one class: undefined, not an exception
    assert auc([0, 1], [0.3, 0.3]) == 0.5
    assert f1([0, 0], [0, 0]) == 0.0 == f1_score([0, 0], [0, 0], zero_division=0)
    assert cohen_kappa([1, 1, 1], [1, 1, 1]) == 1.0  # sklearn: nan (0/0); identical labelings agree fully
    assert cohen_kappa([1, 0, 1, 0], [0, 1, 0, 1]) == pytest.approx(cohen_kappa_score([1, 0, 1, 0], [0, 1, 0, 1]))
    assert confusion([1, 0, 1], [1, 1, 0]) == dict(tp=1, fp=1, tn=0, fn=1)
    with pytest.raises(ValueError):
        confusion([1, 0], [1])
