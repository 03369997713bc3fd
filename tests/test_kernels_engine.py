"""End to end: the engine with the interpreted Triton kernels (and the native ops) forced on gives the log-probs
of the torch path (fp32), on tiny random models and on SmolLM2 with a short text."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernels.*_triton module is imported

import pytest  # noqa: E402
import torch  # noqa: E402

import kernels  # noqa: E402
from engine import Engine  # noqa: E402
from engine.loader import load_model_files  # noqa: E402

pytest.importorskip("triton")

REQUESTS = [
    ("The quick brown fox", " jumps over the lazy dog."),
    ("The quick brown fox", " sleeps."),
    ("Question: what is 2 + 2?\nAnswer:", " 4"),
    ("", "Hello"),
]


@pytest.fixture(autouse=True)
def reset_backend():
    yield
    kernels.set_backend(None)


def _score(engine, backend, requests):
    kernels.set_backend(backend)
    return engine.score(requests)


def _assert_same(got, ref, tol):
    for g, r in zip(got, ref):
        assert g.num_tokens == r.num_tokens
        assert g.token_logprobs == pytest.approx(r.token_logprobs, abs=tol)
        assert g.is_greedy == r.is_greedy


# the interpreter is slow: Triton on one tiny architecture (llama3: scaled RoPE) and on SmolLM2 below
CASES = [
    ("llama3", "triton"),
    ("qwen3", "triton"),
    ("llama", "native"),
    ("llama3", "native"),
    ("qwen2", "native"),
    ("qwen3", "native"),
    ("gemma3", "native"),
    ("gemma3", "triton"),
]


@pytest.mark.parametrize("arch,backend", CASES)
def test_tiny_model_kernels_match_torch(arch, backend, tiny_model_dirs):
    config, weights, tok = load_model_files(str(tiny_model_dirs[arch]))
    # a small token budget splits the texts into several steps, so cached segments are attended to
    engine = Engine(config, weights, tok, dtype=torch.float32, kv_tokens=512, token_budget=8)
    ref = _score(engine, "torch", REQUESTS)
    _assert_same(_score(engine, backend, REQUESTS), ref, 1e-5)


def test_smollm2_triton_matches_torch(smollm2_path):
    engine = Engine.load(str(smollm2_path), dtype="float32", kv_tokens=256)
    requests = [("The capital of France is", " Paris.")]
    ref = _score(engine, "torch", requests)
    _assert_same(_score(engine, "triton", requests), ref, 1e-5)
