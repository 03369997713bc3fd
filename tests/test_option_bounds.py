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
    monkeypatch.setattr(
        engine.loader, "load_model_config", lambda *a, **k: pytest.fail("the model was read"), raising=False
    )


@pytest.mark.parametrize("draws", [10**9, 2**63])
@pytest.mark.parametrize("command", ["score", "demo", "preview"])
def test_draws_bounded(command, draws, tmp_path, capsys, no_model):
    from icqs.cli import main

    args = {
        "score": ["score", "task.yaml", "c.jsonl", "--out", tmp_path / "run"],
        "demo": ["demo", "--out", tmp_path / "run"],
        "preview": ["preview", "task.yaml"],
    }[command]
    status, err = _run(main, [*args, "--draws", draws], capsys)
    assert status == 2 and err.count("\n") == 1, err
    assert "argument --draws: expected an integer of at most 100 (each draw repeats the demo methods' work)" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--threads", 100000, "argument --threads: expected an integer of at most 1,024 (CPU threads), got '100000'"),
        ("--threads", 3, "--threads 3 is more than this machine's 2 CPU cores"),
        (
            "--workers",
            10**6,
            "argument --workers: expected an integer of at most 256 (Ray actors, each a whole engine)",
        ),
    ],
)
def test_engine_counts_bounded(option, value, expected, inputs, tmp_path, capsys, monkeypatch, no_model):
    import commands.factory
    from commands.engine_cli import main

    monkeypatch.setattr(commands.factory, "machine_cores", lambda: 2)
    extra = ["--ray"] if option == "--workers" else []
    status, err = _run(
        main, ["score", "--input", inputs, "--output", tmp_path / "o.jsonl", option, value, *extra], capsys
    )
    assert status == 2 and err.count("\n") == 1 and expected in err, err
    assert not (tmp_path / "o.jsonl").exists()


def test_threads_up_to_the_cores_accepted(inputs, tmp_path, monkeypatch):
    import commands.factory
    from commands.engine_cli import build_parser

    monkeypatch.setattr(commands.factory, "machine_cores", lambda: 2)
    args = build_parser().parse_args(
        ["score", "--input", str(inputs), "--output", "o", "--threads", "2", "--device", "cpu"]
    )
    assert commands.factory.engine_options(args)["threads"] == 2


def test_seed_bounded(tmp_path, capsys, no_model):
    from icqs.cli import main

    status, err = _run(main, ["score", "task.yaml", "c.jsonl", "--out", tmp_path / "run", "--seed", 2**64], capsys)
    assert (
        status == 2
        and "argument --seed: expected an integer of at most 9,223,372,036,854,775,807 (a 63-bit seed)" in err
    ), err


BIG = 10**12
ICQS_BOUNDS = [  # (arguments, the option's message)
    (
        ["judge", "in.jsonl", "--out", "o", "--runs", 101],
        "argument --runs: expected an integer of at most 100 (each run judges every item again)",
    ),
    (
        ["judge", "in.jsonl", "--out", "o", "--max-tokens", BIG],
        "argument --max-tokens: expected an integer of at most "
        "1,048,576 (tokens to generate; the model's context bounds them too)",
    ),
    (
        ["judge", "in.jsonl", "--out", "o", "--demo-tokens", BIG],
        "argument --demo-tokens: expected an integer of at most 1,048,576",
    ),
    (
        ["judge", "in.jsonl", "--out", "o", "--batch", BIG],
        "argument --batch: expected an integer of at most 65,536 (items held in memory together)",
    ),
    (
        ["pairwise", "in.jsonl", "--out", "o", "--bootstrap", BIG],
        "argument --bootstrap: expected an integer of at most 100,000 (each resample refits the leaderboard)",
    ),
    (
        ["allure", "run", "in.jsonl", "--out", "o", "--rounds", 101],
        "argument --rounds: expected an integer of at most 100 (each round evaluates every item again)",
    ),
    (
        ["allure", "run", "in.jsonl", "--out", "o", "--clusters", 257],
        "argument --clusters: expected an integer of at most 256 (each cluster is ablated with a full evaluation)",
    ),
    (
        ["allure", "run", "in.jsonl", "--out", "o", "--max-icl", BIG],
        "argument --max-icl: expected an integer of at most 65,536 (ICL examples in one prompt)",
    ),
    (
        ["score", "task.yaml", "c.jsonl", "--out", "o", "--kv-tokens", BIG],
        "argument --kv-tokens: expected an integer of at most 1,073,741,824 (the memory is checked too)",
    ),
    (
        ["score", "task.yaml", "c.jsonl", "--out", "o", "--token-budget", BIG],
        "argument --token-budget: expected an integer of at most 1,048,576 (tokens held in one step)",
    ),
]


@pytest.mark.parametrize(
    "argv, expected", ICQS_BOUNDS, ids=[" ".join(map(str, a[:1] + a[-2:-1])) for a, _ in ICQS_BOUNDS]
)
def test_icqs_counts_bounded(argv, expected, tmp_path, capsys, monkeypatch, no_model):
    from icqs.cli import main

    monkeypatch.chdir(tmp_path)
    status, err = _run(main, argv, capsys)
    assert status == 2 and err.count("\n") == 1 and expected in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "option, value, expected",
    [
        ("--max-queue", BIG, "argument --max-queue: expected an integer of at most 1,048,576 (requests held at once)"),
        ("--port", 70000, "argument --port: expected an integer of at most 65,535 (a TCP port)"),
        ("--port", -1, "argument --port: expected a >= 0 integer, got -1"),
        ("--default-max-tokens", BIG, "argument --default-max-tokens: expected an integer of at most 1,048,576"),
    ],
)
def test_serve_counts_bounded(option, value, expected, capsys, no_model):
    from commands.engine_cli import main

    status, err = _run(main, ["serve", option, value], capsys)
    assert status == 2 and err.count("\n") == 1 and expected in err, err


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["allure", "run", "items.jsonl", "--sweep", "0,4,1000000"], "--sweep: at most 64 values of at most 65,536"),
        (["allure", "run", "items.jsonl", "--sweep", ",".join(map(str, range(65)))], "got 65 values"),
        (["judge", "in.jsonl", "--shots", ",".join(map(str, range(65)))], "--shots: 65 K values; at most 64"),
    ],
)
def test_list_options_bounded_before_any_work(argv, expected, tmp_path, capsys, monkeypatch, no_model):
    from icqs.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "items.jsonl").write_text(json.dumps({"id": "a", "response": "4", "answer": "4"}) + "\n")
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps({"id": f"q{i}", "question": "q", "response": "r"}) + "\n" for i in range(3))
    )
    status, err = _run(main, [*argv, "--out", tmp_path / "run"], capsys)
    assert status == 2 and err.count("\n") == 1 and expected in err, err
    assert not (tmp_path / "run").exists()
