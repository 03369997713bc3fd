"""The fixed-shape decode path (engine/decode_graphs.py, the engine option `decode_graphs`): on a CPU it runs
eagerly, the very steps a GPU records in CUDA graphs and replays, so here it is checked against the engine's own
cascade path (the same greedy tokens, log-probs to fp32 rounding), for each architecture (Gemma-3's sliding window
shorter than the prompts included), with padding rows, a slot table that grows, and steps that are not pure decode.
On a GPU the test of the capture itself is benchmarks/gpu_check.py (parity and decode speed)."""

from __future__ import annotations

import pytest
import torch
from hf_reference import hf_model_from_weights

from engine import Engine
from engine.decode_graphs import FIRST_WIDTH
from engine.errors import UserError
from engine.loader import load_model_files

PROMPTS = [[5, 17, 99, 23], [5, 17, 99, 23, 41, 7], [200, 3, 8]]  # 3 rows: a bucket of 4, one padding row


def engines(model_dir, **opts):
    config, weights, tok = load_model_files(str(model_dir))
    kw = dict(dtype=torch.float32, **{"kv_tokens": 2048, **opts})
    return Engine(config, weights, tok, **kw), Engine(config, weights, tok, decode_graphs=True, **kw)


def assert_same(a, b, tol=2e-4):
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    diff = max(abs(x - y) for g, h in zip(a, b) for x, y in zip(g.token_logprobs, h.token_logprobs))
    assert diff < tol, diff


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_fixed_shape_decode_generates_what_the_cascade_does(tiny_model_dirs, arch):
    eager, fixed = engines(tiny_model_dirs[arch])
    for kw in (dict(max_tokens=12), dict(max_tokens=12, temperature=0.9, top_p=0.95, seed=4)):
        assert_same(eager.generate(PROMPTS, **kw), fixed.generate(PROMPTS, **kw))
    stats = fixed.graphs.stats()
    # every step after the prompts' shared tokens is one of the fixed path's: the prompt's last token (a sequence's
    # own first node) and 11 sampled ones, 12 a call
    assert stats["fixed_shape_steps_eager"] == 24 and stats["replays"] == 0 and stats["capture_failed"] is None
    fixed.check_pages()
    assert fixed.kv.used_pages == 0


def test_greedy_fixed_shape_decode_matches_transformers(tiny_model_dirs):
    """Gemma-3 (a window of 8 keys, local and global layers): the fixed path against transformers' generate."""
    config, weights, tok = load_model_files(str(tiny_model_dirs["gemma3"]))
    hf = hf_model_from_weights(config, weights)
    eng = Engine(config, weights, tok, dtype=torch.float32, kv_tokens=2048, decode_graphs=True)
    for p, g in zip(PROMPTS, eng.generate(PROMPTS, max_tokens=10)):
        ref = hf.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=-1, pad_token_id=0)
        assert g.token_ids == ref[0, len(p) :].tolist()


def test_the_slot_table_grows_past_its_first_width(tiny_model_dirs):
    eager, fixed = engines(tiny_model_dirs["llama"], kv_tokens=4096)
    prompts = [list(range(10, 10 + FIRST_WIDTH - 20)), [7, 8, 9]]
    assert_same(eager.generate(prompts, max_tokens=40), fixed.generate(prompts, max_tokens=40))
    assert fixed.graphs.stats()["table_width"] == 2 * FIRST_WIDTH


def test_steps_that_are_not_pure_decode_run_the_cascade(tiny_model_dirs, monkeypatch):
    """A step computing a prompt (several new tokens of a sequence) or scoring, and a decode step with more rows
    than the largest bucket, go to the model's own forward."""
    eager, fixed = engines(tiny_model_dirs["llama"], token_budget=4096, kv_tokens=16384)
    calls = []
    forward = fixed.model.forward
    monkeypatch.setattr(
        fixed.model, "forward", lambda batch, kv: calls.append(len(batch.token_ids)) or forward(batch, kv)
    )
    assert [r.logprob for r in fixed.score([("a b c", " d")])] == [r.logprob for r in eager.score([("a b c", " d")])]
    assert calls and fixed.graphs.stats()["fixed_shape_steps_eager"] == 0
    many = [[5 + i % 50, 9, i % 7 + 1] for i in range(300)]  # 300 sequences decoding: over the 256-row bucket
    calls.clear()
    assert_same(eager.generate(many, max_tokens=2), fixed.generate(many, max_tokens=2))
    assert 300 in calls


def test_decode_graphs_and_the_deterministic_mode_are_refused_together(tiny_model_dirs):
    config, weights, tok = load_model_files(str(tiny_model_dirs["llama"]))
    with pytest.raises(UserError, match="decode_graphs and deterministic"):
        Engine(config, weights, tok, dtype=torch.float32, decode_graphs=True, deterministic=True)
    det = Engine(config, weights, tok, dtype=torch.float32, deterministic=True)
    with pytest.raises(UserError, match="decode_graphs and deterministic"):
        det.use_decode_graphs(True)
    assert det.decode_graph_stats() is None


def test_padding_rows_write_only_the_scratch_slot(tiny_model_dirs):
    """A 3-row step runs as 4 rows; the padding row's K/V go to the cache's scratch slot, past every page's."""
    _, fixed = engines(tiny_model_dirs["llama"])
    kv = fixed.kv
    assert kv.scratch_slot == kv.num_pages * kv.page_size and kv.k.shape[1] == kv.scratch_slot + 1
    kv.k[:, kv.scratch_slot].fill_(float("nan"))
    fixed.generate(PROMPTS, max_tokens=3)
    assert not torch.isnan(kv.k[:, kv.scratch_slot]).any()  # the padding row wrote it
    assert fixed.graphs.stats()["fixed_shape_steps_eager"] == 3


def test_the_command_line_flag_reaches_the_engine(tiny_model_dirs):
    import argparse

    from commands.factory import add_engine_args, engine_from_args

    p = argparse.ArgumentParser()
    add_engine_args(p, dtype="float32")
    model = ["--model", str(tiny_model_dirs["llama"]), "--device", "cpu"]
    eng = engine_from_args(p.parse_args([*model, "--decode-graphs", "--overlap", "on"]))
    eng.generate(PROMPTS, max_tokens=3)
    assert eng.decode_graph_stats()["fixed_shape_steps_eager"] == 3 and eng.overlaps
    eng.use_decode_graphs(False)
    assert eng.decode_graph_stats() is None
    assert not engine_from_args(p.parse_args(model)).overlaps  # auto: on a GPU only
    assert not engine_from_args(p.parse_args([*model, "--overlap", "off"])).overlaps


def test_capturing_every_bucket_writes_only_the_scratch_slot(tiny_model_dirs, monkeypatch):
    """capture_all (what the engine runs on a GPU when the option is turned on) runs each bucket's step on padding
    rows: on a CPU eagerly, once a bucket, writing no slot but the scratch one."""
    _, fixed = engines(tiny_model_dirs["llama"])
    kv = fixed.kv
    kv.k.fill_(float("nan"))
    rows, forward = [], fixed.model.forward_decode
    monkeypatch.setattr(fixed.model, "forward_decode", lambda ids, *a: rows.append(len(ids)) or forward(ids, *a))
    fixed.graphs.capture_all()
    assert rows == [256, 128, 64, 32, 16, 8, 4, 2, 1]
    assert len(fixed.graphs.buckets) == 9 and fixed.graphs.stats()["fixed_shape_steps_eager"] == 0
    assert torch.isnan(kv.k[:, : kv.scratch_slot]).all() and not torch.isnan(kv.k[:, kv.scratch_slot]).any()
    kv.k.zero_()
    assert_same(
        engines(tiny_model_dirs["llama"])[0].generate(PROMPTS, max_tokens=5), fixed.generate(PROMPTS, max_tokens=5)
    )


def test_fixed_shape_decode_takes_the_overlapped_steps_tokens(tiny_model_dirs):
    """With overlap (each step launched before the step before it is read), the fixed-shape steps take
    their input tokens from the step in flight on the device: the cascade's tokens, read first."""
    eager, _ = engines(tiny_model_dirs["llama"])
    _, fixed = engines(tiny_model_dirs["llama"], overlap=True)
    for kw in (dict(max_tokens=12), dict(max_tokens=12, temperature=0.9, top_p=0.95, seed=4)):
        assert_same(eager.generate(PROMPTS, **kw), fixed.generate(PROMPTS, **kw))
    assert fixed.graphs.stats()["fixed_shape_steps_eager"] == 24
    fixed.check_pages()
