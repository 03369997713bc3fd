"""The lm-evaluation-harness backend (`icqs-engine`) against lm-eval's own `hf` backend on the same weights (a tiny
random Llama HF directory), through lm_eval.simple_evaluate on local task files written here: a few-shot
multiple-choice task, a rolling log-likelihood (perplexity) task and a greedy generation task."""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Local data files only: nothing may reach a hub.
for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_EVALUATE_OFFLINE"):
    os.environ[var] = "1"

lm_eval = pytest.importorskip("lm_eval")

from tiny_models import TEXT  # noqa: E402

from engine.errors import UserError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MAX_LENGTH = 128  # the perplexity documents span several rolling windows; the few-shot prompts fit

MC_TRAIN = [
    {"question": "How many days are in a leap year?", "choices": ["365", "366", "367"], "label": 1},
    {"question": "What does the judge write?", "choices": ["a verdict", "a poem", "a table"], "label": 0},
    {"question": "What rose by 3.5% in March?", "choices": ["days", "prices", "ratings"], "label": 1},
    {"question": "What makes light work?", "choices": ["many hands", "too many cooks", "time"], "label": 0},
]
MC_TEST = [
    {"question": "When should you call?", "choices": ["before 10:30 am", "after noon", "never"], "label": 0},
    {"question": "What is stored in a table?", "choices": ["questions", "clouds", "broth"], "label": 0},
    {"question": "Who asked why?", "choices": ["he", "she", "the model"], "label": 1},
    {"question": "What spoils the broth?", "choices": ["many hands", "too many cooks"], "label": 1},
    {"question": "What is a quiet way of thinking?", "choices": ["Reading", "Writing", "Judging", "Time"], "label": 0},
    {"question": "How is the table sorted?", "choices": [" by the rating", "by the date"], "label": 0},
]
PPL_DOCS = [{"text": TEXT}, {"text": TEXT[: len(TEXT) // 3]}] + [{"text": line} for line in TEXT.splitlines()[:6]]
GEN_DOCS = [{"prompt": line[: len(line) // 2], "answer": line[len(line) // 2 :]} for line in TEXT.splitlines()[:8]]


def _write_task(root: Path, name: str, splits: dict[str, list[dict]], config: dict) -> None:
    files = {}
    for split, docs in splits.items():
        files[split] = str(root / f"{name}_{split}.jsonl")
        Path(files[split]).write_text("".join(json.dumps(d) + "\n" for d in docs))
    task = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": files, "cache_dir": str(root / "datasets_cache")},
        **config,
    }
    (root / f"{name}.yaml").write_text(json.dumps(task, indent=1))  # JSON is YAML


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    from lm_eval.tasks import TaskManager

    root = tmp_path_factory.mktemp("lm_eval_tasks")
    _write_task(
        root,
        "icqs_tiny_mc",
        {"train": MC_TRAIN, "test": MC_TEST},
        {
            "output_type": "multiple_choice",
            "training_split": "train",
            "fewshot_split": "train",
            "test_split": "test",
            "num_fewshot": 2,
            "doc_to_text": "Question: {{question}}\nAnswer:",
            "doc_to_choice": "{{choices}}",
            "doc_to_target": "label",
            "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}],
        },
    )
    _write_task(
        root,
        "icqs_tiny_ppl",
        {"test": PPL_DOCS},
        {
            "output_type": "loglikelihood_rolling",
            "test_split": "test",
            "doc_to_text": "",
            "doc_to_target": "{{text}}",
            "metric_list": [{"metric": "word_perplexity"}, {"metric": "byte_perplexity"}, {"metric": "bits_per_byte"}],
        },
    )
    _write_task(
        root,
        "icqs_tiny_gen",
        {"test": GEN_DOCS},
        {
            "output_type": "generate_until",
            "test_split": "test",
            "doc_to_text": "{{prompt}}",
            "doc_to_target": "{{answer}}",
            "generation_kwargs": {"until": ["."], "max_gen_toks": 10, "do_sample": False},
            "metric_list": [{"metric": "exact_match"}],
        },
    )
    return TaskManager(include_path=str(root), include_defaults=False)


def evaluate(model: str, model_args: dict, tasks, names: list[str]) -> dict:
    import frontends.lm_eval  # noqa: F401  (registers icqs-engine)

    return lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=names,
        task_manager=tasks,
        log_samples=True,
        device="cpu",
        batch_size=1,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )


@pytest.fixture(scope="module")
def both(tiny_model_dir, tasks):
    """(icqs-engine results, hf results) for the three tasks, float32 on the same tiny weights."""
    names = ["icqs_tiny_mc", "icqs_tiny_ppl", "icqs_tiny_gen"]
    ours = evaluate(
        "icqs-engine", {"model": str(tiny_model_dir), "dtype": "float32", "max_length": MAX_LENGTH}, tasks, names
    )
    theirs = evaluate(
        "hf", {"pretrained": str(tiny_model_dir), "dtype": "float32", "max_length": MAX_LENGTH}, tasks, names
    )
    return ours, theirs


def _samples(results: dict, task: str) -> list[dict]:
    return sorted(results["samples"][task], key=lambda s: s["doc_id"])


def test_multiple_choice_few_shot_matches_hf(both):
    ours, theirs = both
    a, b = _samples(ours, "icqs_tiny_mc"), _samples(theirs, "icqs_tiny_mc")
    assert len(a) == len(MC_TEST) and [s["doc_id"] for s in a] == [s["doc_id"] for s in b]
    n = 0
    for x, y in zip(a, b):
        assert [r[0] for r in x["arguments"]] == [r[0] for r in y["arguments"]]  # same few-shot prompts
        assert x["arguments"][0][0].count("Question:") == 3  # 2 shots + the question
        for (lp_x, greedy_x), (lp_y, greedy_y) in zip([r[0] for r in x["resps"]], [r[0] for r in y["resps"]]):
            assert abs(lp_x - lp_y) < 1e-4, (lp_x, lp_y)
            assert greedy_x == greedy_y
            n += 1
        assert x["acc"] == y["acc"] and x["acc_norm"] == y["acc_norm"]
    assert n == sum(len(d["choices"]) for d in MC_TEST)
    for metric in ("acc,none", "acc_norm,none"):
        assert ours["results"]["icqs_tiny_mc"][metric] == theirs["results"]["icqs_tiny_mc"][metric]


def test_rolling_perplexity_matches_hf(both, tiny_model_dir):
    ours, theirs = both
    a, b = _samples(ours, "icqs_tiny_ppl"), _samples(theirs, "icqs_tiny_ppl")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert max(len(tok(d["text"]).input_ids) for d in PPL_DOCS) > 2 * MAX_LENGTH  # several windows
    for x, y in zip(a, b):
        assert abs(x["resps"][0][0] - y["resps"][0][0]) < 1e-4 * max(1.0, abs(y["resps"][0][0]))
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        mine, ref = ours["results"]["icqs_tiny_ppl"][metric], theirs["results"]["icqs_tiny_ppl"][metric]
        assert math.isfinite(ref) and abs(mine - ref) <= 1e-4 * abs(ref), (metric, mine, ref)


def test_greedy_generation_matches_hf(both, tiny_model_dir):
    ours, theirs = both
    a, b = _samples(ours, "icqs_tiny_gen"), _samples(theirs, "icqs_tiny_gen")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    outputs = [x["resps"][0][0] for x in a]
    assert outputs == [y["resps"][0][0] for y in b]
    assert [tok(s, add_special_tokens=False).input_ids for s in outputs] == [
        tok(y["resps"][0][0], add_special_tokens=False).input_ids for y in b
    ]
    assert sum(len(s) for s in outputs) > 0
    assert (
        ours["results"]["icqs_tiny_gen"]["exact_match,none"] == theirs["results"]["icqs_tiny_gen"]["exact_match,none"]
    )


def test_engine_stats_in_results(both):
    ours, _ = both
    stats = ours["config"]["engine_stats"]
    assert set(stats) == {"loglikelihood", "loglikelihood_rolling", "generate_until"}
    mc = stats["loglikelihood"]
    assert mc["requests"] == sum(len(d["choices"]) for d in MC_TEST)
    # each question's few-shot context is computed once for all its choices
    assert 0 < mc["tokens_computed"] < mc["tokens_requested"] / 2  # 2 to 4 choices a question
    assert stats["generate_until"]["tokens_computed"] > 0


@pytest.mark.parametrize("extra", [{"prefix_token_id": 3}, {"add_bos_token": False}, {"add_bos_token": True}])
def test_prefix_token_and_bos_as_hf(tiny_model_dir, extra):
    """prefix_token_id and add_bos_token change the token ids as they do in lm-eval's hf backend."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from frontends.lm_eval import EngineLM

    ours = EngineLM(model=str(tiny_model_dir), dtype="float32", max_length=MAX_LENGTH, **extra)
    # add_bos_token is this backend's own tokenizer's policy; the engine's keeps the model's (the tiny model: BOS)
    assert ours.engine.tokenizer.add_bos is True and ours.tok.add_bos is extra.get("add_bos_token", True)
    hf = HFLM(pretrained=str(tiny_model_dir), dtype="float32", device="cpu", max_length=MAX_LENGTH, **extra)
    ll = [
        Instance("loglikelihood", {}, ("", " The quality of a demonstration"), 0),
        Instance("loglikelihood", {}, ("A good example is ", "clear, short and correct"), 1),
    ]
    roll = [Instance("loglikelihood_rolling", {}, (TEXT[:700],), 0)]
    for (a, greedy_a), (b, greedy_b) in zip(
        ours.loglikelihood(ll, disable_tqdm=True), hf.loglikelihood(ll, disable_tqdm=True)
    ):
        assert abs(a - b) < 1e-4 and greedy_a == greedy_b
    (a,), (b,) = ours.loglikelihood_rolling(roll, disable_tqdm=True), hf.loglikelihood_rolling(roll, True)
    assert abs(a - b) < 1e-4 * abs(b)


def test_sampled_generation(tiny_model_dir):
    """do_sample with a seed: the same text twice, stop strings cut it; unsupported generation kwargs are refused."""
    from lm_eval.api.instance import Instance

    from frontends.lm_eval import EngineLM

    lm = EngineLM(model=str(tiny_model_dir), dtype="float32")
    kwargs = {"until": ["e"], "do_sample": True, "temperature": 1.5, "top_p": 0.9, "seed": 7, "max_gen_toks": 12}
    reqs = [Instance("generate_until", {}, ("The judge reads both responses", kwargs), i) for i in range(4)]
    first, second = lm.generate_until(reqs, disable_tqdm=True), lm.generate_until(reqs, disable_tqdm=True)
    assert first == second and len(set(first)) > 1 and not any("e" in t for t in first)
    with pytest.raises(UserError, match="top_k"):
        lm.generate_until([Instance("generate_until", {}, ("The", {"top_k": 5, "until": []}), 0)])


def test_model_args_checked(tiny_model_dir, caplog):
    from frontends.lm_eval import EngineLM

    with pytest.raises(UserError, match="unknown model_args pretrained"):
        EngineLM(pretrained=str(tiny_model_dir))
    with pytest.raises(UserError, match="token_budget='lots': expected an integer >= 1"):
        EngineLM(model=str(tiny_model_dir), token_budget="lots")
    with pytest.raises(UserError, match="max_length=100000"):
        EngineLM(model=str(tiny_model_dir), max_length=100000)
    with pytest.raises(UserError, match="prefix_token_id=99999"):
        EngineLM(model=str(tiny_model_dir), prefix_token_id=99999)
    with pytest.raises(UserError, match="add_bos_token='maybe'"):
        EngineLM(model=str(tiny_model_dir), add_bos_token="maybe")
    lm = EngineLM(
        model=str(tiny_model_dir),
        dtype="float32",
        device="cuda",
        batch_size=8,
        max_batch_size=64,
        add_bos_token=False,
        token_budget=64,
        kv_tokens=1024,
        threads=1,
    )
    from engine.engine import Engine, EngineOptions

    if "deterministic" in inspect.signature(Engine.load).parameters or "deterministic" in vars(EngineOptions()):
        assert EngineLM(model=str(tiny_model_dir), deterministic="True").engine is not None
    else:
        with pytest.raises(UserError, match="no deterministic mode"):
            EngineLM(model=str(tiny_model_dir), deterministic="True")
    import torch

    if not torch.cuda.is_available():  # cuda falls back to the cpu, with a warning
        assert str(lm.device) == "cpu" and "no CUDA GPU is available on this machine; running on cpu" in caplog.text
    assert lm.tok.add_bos is False and lm.engine.tokenizer.add_bos is True and lm.engine.options.token_budget == 64


def test_command_line(tiny_model_dir, tmp_path):
    """`python -m frontends.lm_eval` is lm-eval's CLI with icqs-engine registered, run as the README runs it: the local
    task shipped in examples/lm_eval (no network), results named after the model and the task."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "datasets_cache"),
    }
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "frontends.lm_eval",
            "run",
            "--model",
            "icqs-engine",
            "--model_args",
            f"model={tiny_model_dir},dtype=float32,max_length={MAX_LENGTH}",
            "--tasks",
            "icqs_capitals",
            "--include_path",
            "examples/lm_eval",
            "--output_path",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "icqs-engine loglikelihood" in run.stderr and "cache hits" in run.stderr
    assert "icqs_capitals" in run.stdout
    written = [p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*.json")]
    assert len(written) == 1 and written[0].parent == Path(tiny_model_dir.name), written  # named after the model
    assert written[0].name.startswith("icqs_capitals_"), written  # and the task (lm-eval adds the date)
    results = json.loads((tmp_path / "out" / written[0]).read_text())["results"]["icqs_capitals"]
    assert 0.0 <= results["acc,none"] <= 1.0


def test_command_line_bad_model_args(tiny_model_dir, tasks, capsys):
    from frontends.lm_eval import main

    include = tasks.include_path if isinstance(tasks.include_path, str) else tasks.include_path[0]
    rc = main(
        [
            "run",
            "--model",
            "icqs-engine",
            "--model_args",
            f"model={tiny_model_dir},flavour=sweet",
            "--tasks",
            "icqs_tiny_mc",
            "--include_path",
            str(include),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("error: icqs-engine: unknown model_args flavour")
