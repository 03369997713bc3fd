"""The README's snippets work: every `icqs` command line parses, every Python block compiles, the openai client
block runs against a live server, the ALLURE template block loads, and every docs/ link exists. (The lm-eval
command is run as the README gives it by tests/test_lm_eval.py::test_command_line.)"""

import ast
import re
import shlex
from pathlib import Path

import pytest

from icqs.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^( *)```(\w*)\n(.*?)^\1```", README, re.S | re.M)


def blocks(language: str) -> list[str]:
    return [
        "\n".join(line[len(indent) :] for line in body.splitlines())
        for indent, lang, body in BLOCKS
        if lang == language
    ]


def icqs_lines() -> list[str]:
    return [
        line.split("#", 1)[0].strip()
        for body in blocks("")
        for line in body.splitlines()
        if re.match(r"icqs [a-z]", line)
    ]  # a command, not a table row ("icqs        score ...")


def test_the_readme_has_the_snippets_these_tests_read():
    assert len(icqs_lines()) >= 4 and len(blocks("python")) >= 2 and blocks("yaml")
    assert README.count("make demo") >= 1 and README.count("make test") >= 1
    setup = [line for body in blocks("") for line in body.splitlines() if line.startswith("make ")]
    assert [line.split()[1] for line in setup] == ["demo", "test"]  # exactly two set-up commands


@pytest.mark.parametrize("line", icqs_lines())
def test_icqs_command_lines_parse(line):
    argv = shlex.split(line)[1:]
    build_parser(argv).parse_args(argv)  # an unknown option or a missing argument exits here


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_blocks_compile(index):
    compile(blocks("python")[index], f"README python block {index}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def test_the_openai_block_runs_against_a_live_server(tiny_model_dir):
    from live_server import live_server

    from engine import Engine
    from frontends.server.app import create_app

    code = next(b for b in blocks("python") if "from openai import OpenAI" in b)
    engine = Engine.load(str(tiny_model_dir), dtype="float32", keep_cache=True)
    with live_server(create_app(engine, model_name="tiny")) as url:
        scope = {}
        exec(code.replace("http://127.0.0.1:8000", url), scope)  # noqa: S102  (the README's own snippet)
    assert scope["model"] == "tiny"


def test_the_allure_template_block_loads(tmp_path):
    from icqs.allure.template import load_template

    block = next(b for b in blocks("yaml") if "label_prefix" in b)
    (tmp_path / "t.yaml").write_text(block)
    template = load_template(str(tmp_path / "t.yaml"))
    assert template.match.kind == "exact" and template.fields == ["question", "response", "answer"]


def test_links_to_the_repository_exist():
    for target in re.findall(r"\]\(((?:docs|benchmarks|examples)/[^)#]+)", README):
        assert (ROOT / target).exists(), target
