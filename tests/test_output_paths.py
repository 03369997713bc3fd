"""An empty or root path is refused for every output, and an empty one for every input (issue 40): `icqs init ''`
wrote into the current folder and printed next steps for `/task.yaml`, and `icqs preview task.yaml ''` previewed
without the candidates. One check (commands/cli_args.check_output_path) where outputs are validated: each output
option's argparse type, and the file and folder checks under it; `input_path` for what a command reads. One line,
exit 2, nothing written."""

from __future__ import annotations

import pytest

from engine.errors import UserError

OUTPUTS = [  # (the command line's main, its arguments with {} where the output path goes)
    ("icqs", ["init", "{}"]),
    ("icqs", ["score", "task.yaml", "c.jsonl", "--out", "{}"]),
    ("icqs", ["demo", "--out", "{}"]),
    ("icqs", ["report", "run", "--output", "{}"]),
    ("icqs", ["judge", "in.jsonl", "--out", "{}"]),
    ("icqs", ["pairwise", "in.jsonl", "--out", "{}"]),
    ("icqs", ["allure", "run", "items.jsonl", "--out", "{}"]),
    ("icqs", ["allure", "run", "items.jsonl", "--out", "o", "--memory", "{}"]),
    ("icqs", ["allure", "report", "run", "--out", "{}"]),
    ("engine", ["score", "--input", "in.jsonl", "--output", "{}"]),
]


def _main(name):
    if name == "icqs":
        from icqs.cli import main
    else:
        from commands.engine_cli import main
    return main


def _parse(name, argv):
    if name == "icqs":
        from icqs.cli import build_parser

        return build_parser(argv).parse_args(argv)
    from commands.engine_cli import build_parser

    return build_parser().parse_args(argv)


@pytest.mark.parametrize("name, argv", OUTPUTS, ids=[" ".join(a[:2]) for _, a in OUTPUTS])
def test_an_empty_output_is_refused(name, argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # where an empty path would write
    try:
        status = _main(name)(["" if a == "{}" else a for a in argv])
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr()
    assert status == 2 and err.err.count("\n") == 1 and "an empty path" in err.err, err
    assert "next" not in err.out and not list(tmp_path.iterdir())  # nothing written, no next steps printed


@pytest.mark.parametrize("path", ["/", "/..", "//"])
@pytest.mark.parametrize("name, argv", OUTPUTS, ids=[" ".join(a[:2]) for _, a in OUTPUTS])
def test_a_root_output_is_refused_where_it_is_parsed(name, argv, path, capsys):
    """Parsed only (a command that got past its options would write into / on a machine where that is allowed)."""
    with pytest.raises(SystemExit) as e:
        _parse(name, [path if a == "{}" else a for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "is the file system's root" in err, err


@pytest.mark.parametrize("path", ["", "  ", "/", "//", "/tmp/.."])
def test_the_file_and_folder_checks_refuse_them_too(path):
    from commands.cli_args import check_output_file
    from icqs.run import check_output_dir

    for check in (check_output_file, check_output_dir):
        with pytest.raises(UserError, match="an empty path|the file system's root"):
            check(path)


def test_the_current_folder_named_is_accepted(tmp_path, monkeypatch):
    from commands.cli_args import check_output_path

    monkeypatch.chdir(tmp_path)
    assert check_output_path(".") == "." and check_output_path("out/run") == "out/run"


INPUTS = [  # the paths a command reads: '' read the current folder, or (preview's optional CANDIDATES) no file at all
    ("icqs", ["preview", "task.yaml", ""], "argument candidates"),
    ("icqs", ["preview", "", "c.jsonl"], "argument task"),
    ("icqs", ["score", "task.yaml", "", "--out", "run"], "argument candidates"),
    ("icqs", ["leaderboard", ""], "argument dir"),
    ("icqs", ["report", ""], "argument dir"),
    ("icqs", ["judge", "", "--out", "run"], "argument input"),
    ("icqs", ["judge", "in.jsonl", "--out", "run", "--demos", ""], "argument --demos"),
    ("icqs", ["pairwise", "in.jsonl", "--out", "run", "--rubric", ""], "argument --rubric"),
    ("icqs", ["allure", "run", "", "--out", "run"], "argument items"),
    ("icqs", ["allure", "run", "items.jsonl", "--out", "run", "--template", ""], "argument --template"),
    ("icqs", ["allure", "report", ""], "argument run_dir"),
    ("icqs", ["score", "task.yaml", "c.jsonl", "--out", "run", "--model", ""], "argument --model"),
    ("engine", ["score", "--input", "", "--output", "o.jsonl"], "argument --input"),
]


@pytest.mark.parametrize("name, argv, option", INPUTS, ids=[f"{a[0]} {o}" for _, a, o in INPUTS])
def test_an_empty_input_path_is_refused(name, argv, option, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        _parse(name, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == f"error: {option}: an empty path; name the file or folder to read\n", err
