"""`icqs preview` (issue 22, part 3): the rendered prompt, requests, unique tokens and a time estimate per
method, without scoring anything or writing a run directory."""

from icqs.cli import main
from icqs.preview import unique_tokens


def test_unique_tokens_counts_shared_prefixes_once():
    assert unique_tokens([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [7]]) == 4 + 1 + 1 + 1
    assert unique_tokens([[1, 2], [1, 2]]) == 2  # the same request twice is computed once


def test_preview_prints_each_method_without_scoring(tmp_path, tiny_model_dir, capsys):
    assert main(["init", str(tmp_path / "ex")]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "preview",
                str(tmp_path / "ex" / "task.yaml"),
                str(tmp_path / "ex" / "candidates.jsonl"),
                "--model",
                str(tiny_model_dir),
                "--method",
                "icqs",
                "icl",
                "judge",
                "--draws",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for name in ("== icqs", "== icl", "== judge"):
        assert name in out
    assert out.count("one request (") == 3 and out.count("estimated time:") == 3
    assert "Review: " in out and "Sentiment: |||" in out  # the rendered demos and the scored continuation
    # 24 candidates (and 24 pool items) x 3 ratios x 1 repeat x 2 draws
    assert "requests: 144 for the run + 144 for the audit" in out
    assert sorted(p.name for p in (tmp_path / "ex").iterdir()) == ["candidates.jsonl", "task.yaml"]
