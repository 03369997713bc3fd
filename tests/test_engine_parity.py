"""Engine log-probs against HF transformers (naive: one forward per request) on the same weights."""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():  # the Triton cases run in the interpreter: on before kernels.*_triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

from hf_reference import hf_logprobs, hf_model_from_weights  # noqa: E402
from tensor_reads import refused_tensor_reads  # noqa: E402
from tiny_models import ARCHS  # noqa: E402

import kernels  # noqa: E402
from engine import Engine  # noqa: E402
from engine.loader import load_model_files  # noqa: E402
from kernels import native_ops  # noqa: E402

SENTENCES = [
    ("The capital of France is", " Paris."),
    ("Water boils at", " 100 degrees Celsius at sea level."),
    ("Question: What is 2 + 2?\nAnswer:", " 4"),
    ("The quick brown fox", " jumps over the lazy dog."),
    ("In 1969, the first humans", " landed on the Moon."),
    ("Photosynthesis converts sunlight into", " chemical energy stored in glucose."),
    ("def add(a, b):\n    return", " a + b"),
    ("Shakespeare wrote", " Hamlet, Macbeth and King Lear."),
    ("The largest planet in our solar system is", " Jupiter."),
    ("Translate to French: cat ->", " chat"),
    ("Sentence: I loved this film.\nSentiment:", " positive"),
    ("Sentence: The plot was dull and slow.\nSentiment:", " negative"),
    ("My favourite colour is", " blue, because it reminds me of the sea."),
    ("The speed of light is about", " 300,000 kilometres per second."),
    ("A triangle has", " three sides."),
    ("Rain falls from", " clouds when droplets grow heavy."),
    ("The opposite of hot is", " cold."),
    ("Dogs are known for their", " loyalty."),
    ("Mount Everest is located in", " the Himalayas."),
    ("", "Hello world"),
    ("Once upon a time, ", "there was a princess."),
    ("1, 2, 3, 4,", " 5, 6"),
]


def _random_requests(vocab: int, n: int, seed: int = 0):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(4, vocab) for _ in range(rng.randrange(3, 40))] for _ in range(3)]
    reqs = []
    for _ in range(n):
        ctx = rng.choice(prefixes) + [rng.randrange(4, vocab) for _ in range(rng.randrange(0, 6))]
        reqs.append((ctx, [rng.randrange(4, vocab) for _ in range(rng.randrange(1, 5))]))
    return reqs


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_models_match_transformers(arch, tiny_model_dirs):
    config, weights, tok = load_model_files(str(tiny_model_dirs[arch]))
    hf = hf_model_from_weights(config, weights)
    reqs = _random_requests(config.vocab_size, 16, seed=len(arch)) + [("Reading is a quiet", " way of thinking")]
    ref = hf_logprobs(hf, tok, reqs)
    eng = Engine(config, weights, tok, dtype=torch.float32, kv_tokens=2048, token_budget=48)
    got = eng.score(reqs)
    for g, r in zip(got, ref):
        assert g.num_tokens == r.num_tokens
        assert g.logprob == pytest.approx(r.logprob, abs=1e-4)
        assert g.token_logprobs == pytest.approx(r.token_logprobs, abs=1e-4)
        assert g.is_greedy == r.is_greedy


def test_gemma3_deterministic_mode_matches_transformers(tiny_model_dirs):
    """Sliding-window layers in the deterministic mode (each row's fixed KV chunks cut at its window, merged by
    the native op), with prompts and shared prefixes longer than the window of 8."""
    config, weights, tok = load_model_files(str(tiny_model_dirs["gemma3"]))
    hf = hf_model_from_weights(config, weights)
    reqs = _random_requests(config.vocab_size, 12, seed=5)
    ref = hf_logprobs(hf, tok, reqs)
    got = Engine(config, weights, tok, dtype=torch.float32, kv_tokens=2048, token_budget=16, deterministic=True).score(
        reqs
    )
    for g, r in zip(got, ref):
        assert g.token_logprobs == pytest.approx(r.token_logprobs, abs=1e-4)


@pytest.mark.parametrize("deterministic", [False, True], ids=["cascade", "deterministic"])
def test_gemma3_triton_window_matches_transformers(tiny_model_dirs, monkeypatch, deterministic):
    """The interpreted Triton kernels with the window (the cascade's self part and segments; the deterministic
    mode's merges with a first key per row) on Gemma-3's local layers: prefixes of 12-30 tokens shared by several
    requests, longer than the window of 8, cached over several steps (token budget 16). Spies on the Triton entry
    points check that the windowed kernels, not a reference fallback, ran: in the cascade with each row's first
    key found from the step's host facts, in the deterministic mode a chunk position's merges in one launch."""
    pytest.importorskip("triton")
    from kernels import attention, attention_triton

    config, weights, tok = load_model_files(str(tiny_model_dirs["gemma3"]))
    assert config.sliding_window == 8 and any(config.sliding_layers)
    rng = random.Random(11)
    prefixes = [[rng.randrange(4, config.vocab_size) for _ in range(n)] for n in (12, 30)]
    reqs = [
        (
            p + [rng.randrange(4, config.vocab_size) for _ in range(rng.randrange(0, 4))],
            [rng.randrange(4, config.vocab_size) for _ in range(rng.randrange(1, 4))],
        )
        for p in prefixes * 3
    ]
    ref = hf_logprobs(hf_model_from_weights(config, weights), tok, reqs)
    windowed = {"cascade": 0, "host starts": 0, "merge": 0}
    cascade, waves = attention_triton.cascade_attention_triton, attention_triton.wave_merge_triton
    host_starts = attention._window_starts_on_host

    def cascade_spy(q, k_new, v_new, k_cache, v_cache, plan, scale, window=None):
        windowed["cascade"] += window is not None
        return cascade(q, k_new, v_new, k_cache, v_cache, plan, scale, window)

    def host_starts_spy(*args):
        windowed["host starts"] += 1
        return host_starts(*args)

    def waves_spy(q, k_cache, v_cache, wave, scale, out, lse, plan=None):
        windowed["merge"] += wave.starts is not None
        return waves(q, k_cache, v_cache, wave, scale, out, lse, plan)

    monkeypatch.setattr(attention_triton, "cascade_attention_triton", cascade_spy)
    monkeypatch.setattr(attention, "_window_starts_on_host", host_starts_spy)
    monkeypatch.setattr(attention_triton, "wave_merge_triton", waves_spy)
    kernels.set_backend("triton")  # also forgets the functions dispatch resolved before the spies
    try:
        got = Engine(
            config, weights, tok, dtype=torch.float32, kv_tokens=1024, token_budget=16, deterministic=deterministic
        ).score(reqs)
    finally:
        kernels.set_backend(None)
    if deterministic:
        assert windowed["merge"] > 0, windowed
    else:
        assert windowed["cascade"] > 0 and windowed["host starts"] > 0, windowed
    for g, r in zip(got, ref):
        assert g.token_logprobs == pytest.approx(r.token_logprobs, abs=1e-4)


def test_window_starts_from_the_hosts_facts_equal_the_devices(tiny_model_dirs, monkeypatch):
    """On Gemma-3's local layers the cascade finds each row's first key in a segment from the step's host facts
    (the segments' first positions and row ranges, the sequences' first positions), reading no tensor back: the
    same starts as reading the positions from the device, where a row that sees none of a segment keeps a start
    past its last key instead of leaving the segment, and a segment no row sees is dropped by both."""
    from kernels import attention

    if kernels.dispatch.resolve("cascade_attention", torch.device("cpu")) is not native_ops.cascade_attention_native:
        pytest.skip("the CPU cascade that windows segments is the native op's (not built, or another backend)")
    config, weights, tok = load_model_files(str(tiny_model_dirs["gemma3"]))
    rng = random.Random(12)
    prefixes = [[rng.randrange(4, config.vocab_size) for _ in range(n)] for n in (12, 30, 45)]
    reqs = [(p + [rng.randrange(4, config.vocab_size)], [rng.randrange(4, config.vocab_size)]) for p in prefixes * 3]
    calls, real = [], attention.segment_starts

    def spy(segments, window, plan=None):
        with refused_tensor_reads("the window's starts"):
            out = real(segments, window, plan)
        calls.append((segments, window, out))
        return out

    monkeypatch.setattr(attention, "segment_starts", spy)
    monkeypatch.setattr("kernels.native_ops.segment_starts", spy)  # the CPU cascade calls it by the name it imported
    Engine(config, weights, tok, dtype=torch.float32, kv_tokens=2048, token_budget=16).score(reqs)
    assert calls
    for segments, window, host in calls:
        read = real(segments, window)  # from the device's positions
        assert [s.slots.data_ptr() for s in host] == [s.slots.data_ptr() for s in read]  # the same segments kept
        for h, r in zip(host, read):
            got = dict(zip(h.rows.tolist(), h.starts.tolist()))
            want = dict(zip(r.rows.tolist(), r.starts.tolist()))
            assert {k: v for k, v in got.items() if v < h.slots.numel()} == want
            assert all(v == h.slots.numel() for k, v in got.items() if k not in want)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma3"])
def test_greedy_generation_matches_transformers(tiny_model_dirs, arch):
    config, weights, tok = load_model_files(str(tiny_model_dirs[arch]))
    hf = hf_model_from_weights(config, weights)
    eng = Engine(config, weights, tok, dtype=torch.float32, kv_tokens=2048)
    prompts = [[5, 17, 99, 23], [5, 17, 99, 23, 41, 7], [200, 3, 8]]
    out = eng.generate(prompts, max_tokens=10)
    for p, g in zip(prompts, out):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=-1, pad_token_id=0)[
            0, len(p) :
        ].tolist()
        assert g.token_ids == ref[: len(g.token_ids)]
        assert g.finish_reason == "length" or g.finish_reason == "eos"
    assert eng.kv.used_pages == 0


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    config, weights, tok = load_model_files(str(smollm2_path))
    return config, weights, tok


def test_smollm2_matches_transformers_fp32(smollm2):
    config, weights, tok = smollm2
    hf = hf_model_from_weights(config, weights)
    ref = hf_logprobs(hf, tok, SENTENCES)
    eng = Engine(config, weights, tok, dtype=torch.float32, kv_tokens=4096)
    got = eng.score(SENTENCES)
    errs = [abs(g.logprob - r.logprob) for g, r in zip(got, ref)]
    assert max(errs) < 1e-4, errs
    assert [g.is_greedy for g in got] == [r.is_greedy for r in ref]
    gen = eng.generate(["The capital of France is", "List three fruits:"], max_tokens=12)
    for prompt, g in zip(["The capital of France is", "List three fruits:"], gen):
        ids = tok.encode(prompt)
        want = hf.generate(
            torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=tok.eos_ids, pad_token_id=tok.eos_id
        )[0, len(ids) :].tolist()
        want = [t for t in want if t not in tok.eos_ids]
        assert g.token_ids == want[: len(g.token_ids)] and len(g.token_ids) >= min(len(want), 1)
