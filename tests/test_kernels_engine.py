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


@pytest.mark.parametrize("arch,parts", [("llama3", 1), ("llama3", 4), ("gemma3", 4)])
def test_fixed_shape_decode_on_triton_generates_what_the_torch_cascade_does(arch, parts, tiny_model_dirs, monkeypatch):
    """The decode-graph path's steps (engine/decode_graphs.py, eager here) on the Triton paged-decode kernel, each
    row's keys whole or cut into parts as if the device had room for them (`decode_splits` told of 64
    multiprocessors: 2 rows x 1-2 KV heads leave them idle), each step launched before the one before it is read
    (overlap, a GPU's default), against the torch path's cascade read step by step: the same greedy tokens,
    log-probs to fp32 rounding. Gemma-3: a window of 8 keys, shorter than the prompts."""
    from kernels import attention_triton

    config, weights, tok = load_model_files(str(tiny_model_dirs[arch]))
    prompts = [list(range(5, 45)), [9, 8, 7, 6, 5, 4, 3]]
    kernels.set_backend("torch")
    ref = Engine(config, weights, tok, dtype=torch.float32, kv_tokens=1024).generate(prompts, max_tokens=6)
    kernels.set_backend("triton")
    monkeypatch.setattr(attention_triton, "_multiprocessors", lambda device: 64 if parts > 1 else 1)
    monkeypatch.setattr(attention_triton, "SPLIT_MIN_KEYS", 256 // parts)  # the first table's 256 slots: `parts`
    split = attention_triton.paged_decode_attention_split
    used = []
    monkeypatch.setattr(attention_triton, "paged_decode_attention_split", lambda *a: used.append(a[-1]) or split(*a))
    fixed = Engine(config, weights, tok, dtype=torch.float32, kv_tokens=1024, decode_graphs=True, overlap=True)
    got = fixed.generate(prompts, max_tokens=6)
    assert set(used) == {parts}
    assert [g.token_ids for g in got] == [g.token_ids for g in ref]
    diff = max(abs(a - b) for g, r in zip(got, ref) for a, b in zip(g.token_logprobs, r.token_logprobs))
    assert diff < 1e-4, diff
