"""Every count an option carries is bounded where it is parsed, with the reason in the message: one line, exit 2,
before any model is loaded or any file written."""
from __future__ import annotations

import json

import pytest


def _run(main, argv, capsys) -> tuple[int, str]:
    try:
        status = main([str(a) for a in argv])
    except SystemExit as e:  # argparse errors
        status = e.code
    return status, capsys.readouterr().err


@pytest.fixture
def inputs(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"context": "a", "continuation": " b"}) + "\n")
    return pairs


@pytest.fixture
def no_model(monkeypatch):
    """Any attempt to load a model fails the test."""
    import commands.factory
    import engine.loader

    monkeypatch.setattr(commands.factory, "engine_from_args", lambda *a, **k: pytest.fail("the model was loaded"))
    monkeypatch.setattr(engine.loader, "load_model_config", lambda *a, **k: pytest.fail("the model was read"),
                        raising=False)


@pytest.mark.parametrize("draws", [10 ** 9, 2 ** 63])
@pytest.mark.parametrize("command", ["score", "demo", "preview"])
def test_draws_bounded(command, draws, tmp_path, capsys, no_model):
    from icqs.cli import main

    args = {"score": ["score", "task.yaml", "c.jsonl", "--out", tmp_path / "run"], "demo": ["demo", "--out",
            tmp_path / "run"], "preview": ["preview", "task.yaml"]}[command]
    status, err = _run(main, [*args, "--draws", draws], capsys)
    assert status == 2 and err.count("\n") == 1, err
    assert "argument --draws: expected an integer of at most 100 (each draw repeats the demo methods' work)" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option, value, expected", [
    ("--threads", 100000, "argument --threads: expected an integer of at most 1,024 (CPU threads), got '100000'"),
    ("--threads", 3, "--threads 3 is more than this machine's 2 CPU cores"),
    ("--workers", 10 ** 6, "argument --workers: expected an integer of at most 256 (Ray actors, each a whole engine)"),
])
def test_engine_counts_bounded(option, value, expected, inputs, tmp_path, capsys, monkeypatch, no_model):
    import commands.factory
    from commands.engine_cli import main

    monkeypatch.setattr(commands.factory, "machine_cores", lambda: 2)
    extra = ["--ray"] if option == "--workers" else []
    status, err = _run(main, ["score", "--input", inputs, "--output", tmp_path / "o.jsonl", option, value, *extra],
                       capsys)
    assert status == 2 and err.count("\n") == 1 and expected in err, err
    assert not (tmp_path / "o.jsonl").exists()


def test_threads_up_to_the_cores_accepted(inputs, tmp_path, monkeypatch):
    import commands.factory
    from commands.engine_cli import build_parser

    monkeypatch.setattr(commands.factory, "machine_cores", lambda: 2)
    args = build_parser().parse_args(["score", "--input", str(inputs), "--output", "o", "--threads", "2",
                                      "--device", "cpu"])
    assert commands.factory.engine_options(args)["threads"] == 2


def test_seed_bounded(tmp_path, capsys, no_model):
    from icqs.cli import main

    status, err = _run(main, ["score", "task.yaml", "c.jsonl", "--out", tmp_path / "run", "--seed", 2 ** 64], capsys)
    assert status == 2 and "argument --seed: expected an integer of at most 9,223,372,036,854,775,807 (a 63-bit seed)" \
        in err, err
