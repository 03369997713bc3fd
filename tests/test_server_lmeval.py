"""lm-evaluation-harness's own `local-completions` model against a live server (tiny float32 model) on a small
local multiple-choice task: every per-request log-likelihood equals the in-process engine's (<= 1e-5) and the
accuracy is the same, with lm-eval's HF tokenizer and with the server's tokenizer endpoints ("remote")."""

import json

import pytest
from live_server import live_server

from engine import Engine
from engine.encoding import encode_pairs
from engine.tokenizer import Tokenizer
from frontends.server.app import create_app

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("tenacity", reason="lm-eval[api] (tenacity) is needed by its local-completions model")

DOCS = [
    {"question": "The capital of France is", "choices": ["Paris", "Rome", "Berlin"], "answer": 0},
    {"question": "Two plus two equals", "choices": ["four", "five", "three apples"], "answer": 0},
    {"question": "The cat sat on the", "choices": ["mat", "moon", "quantum field"], "answer": 0},
    {"question": "Water is", "choices": ["wet", "dry"], "answer": 1},
    {"question": "Once upon a", "choices": ["time", "tree", "long way down"], "answer": 2},
    {"question": "The sky is", "choices": ["blue", "green", "made of cheese"], "answer": 0},
]
TASK = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lmeval_task")
    (d / "docs.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (d / "tiny_mc.yaml").write_text(TASK.format(data=d / "docs.jsonl"))
    return d


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    engine = Engine.load(str(tiny_model_dir), dtype="float32", keep_cache=True)
    with live_server(create_app(engine, model_name="tiny")) as url:
        yield url


def _arguments(sample):
    """lm-eval's (context, continuation) of each choice, as logged with the sample."""
    args = sample["arguments"]
    if isinstance(args, dict):
        args = [(a["arg_0"], a["arg_1"]) for a in args.values()]
    return [tuple(a) for a in args]


@pytest.mark.parametrize("backend", ["huggingface", "remote"])
def test_local_completions_equals_in_process(served, task_dir, tiny_model_dir, backend, monkeypatch):
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_args = {
        "model": "tiny",
        "base_url": f"{served}/v1/completions",
        "tokenizer_backend": backend,
        "tokenized_requests": True,
        "num_concurrent": 4,
        "max_retries": 1,
        "timeout": 60,
    }
    if backend == "huggingface":  # lm-eval's own tokenizer, BOS added as the model asks
        model_args.update(tokenizer=str(tiny_model_dir), add_bos_token=True)
    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=model_args,
        tasks=["tiny_mc"],
        task_manager=TaskManager(include_path=str(task_dir)),
        log_samples=True,
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
        fewshot_random_seed=0,
    )
    samples = sorted(out["samples"]["tiny_mc"], key=lambda s: s["doc_id"])
    assert len(samples) == len(DOCS)

    reference = Engine.load(str(tiny_model_dir), dtype="float32")
    tok = reference.tokenizer
    if backend == "remote":  # lm-eval's remote tokenizer encodes without BOS
        tok = Tokenizer(tok.backend, bos_id=tok.bos_id, eos_ids=tok.eos_ids, add_bos=False)
    correct = 0
    for sample in samples:
        pairs = _arguments(sample)
        want = reference.score(encode_pairs(tok, pairs))
        got = [r[0] for r in sample["resps"]]
        for (ll, greedy), w in zip(got, want):
            assert ll == pytest.approx(w.logprob, abs=1e-5)
            assert greedy == w.is_greedy
        lls = [w.logprob for w in want]
        correct += lls.index(max(lls)) == sample["doc"]["answer"]
    assert out["results"]["tiny_mc"]["acc,none"] == pytest.approx(correct / len(DOCS))
