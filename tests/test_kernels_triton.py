"""Every Triton kernel under the Triton interpreter (fp32, small shapes) against its torch reference (<= 1e-5).

TRITON_INTERPRET must be on when the kernels are decorated, i.e. before kernels.*_triton is imported."""
import os

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from kernels import attention_triton as AT  # noqa: E402
from kernels.attention import cascade_attention_ref  # noqa: E402
from kernels.dequant import dequantize_ref  # noqa: E402
from kernels.dequant_triton import dequantize_triton  # noqa: E402
from kernels.kv_store import store_kv_ref  # noqa: E402
from kernels.kv_store_triton import store_kv_triton  # noqa: E402
from kernels.logprob import target_logprobs_ref  # noqa: E402
from kernels.logprob_triton import target_logprobs_triton  # noqa: E402
from kernels.paged_attention import paged_prefill_attention_lse_ref  # noqa: E402
from kernels.problems import cascade_problem, paged_problem  # noqa: E402
from kernels.rmsnorm import rms_norm_ref  # noqa: E402
from kernels.rmsnorm_triton import rms_norm_triton  # noqa: E402
from kernels.rope import apply_rope_ref, rope_cos_sin  # noqa: E402
from kernels.rope_triton import apply_rope_triton  # noqa: E402
from kernels.swiglu import silu_and_mul_ref  # noqa: E402
from kernels.swiglu_triton import silu_and_mul_triton  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(with_residual):
    x, w = randn(5, 37), randn(37, seed=1)
    res = randn(5, 37, seed=2) if with_residual else None
    out, new_res = rms_norm_triton(x, w, 1e-5, res)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-5, res)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(new_res, ref_res, **TOL)


@pytest.mark.parametrize("scaling", [None, LLAMA3], ids=["default", "llama3"])
def test_rope_in_place(scaling):
    cos, sin = rope_cos_sin(20, 10000.0, scaling, 300)
    q, k = randn(7, 6, 20), randn(7, 2, 20, seed=1)
    positions = torch.tensor([0, 1, 2, 150, 299, 64, 5])
    q_ref, k_ref = q.clone(), k.clone()
    apply_rope_ref(q_ref, k_ref, positions, cos, sin)
    apply_rope_triton(q, k, positions, cos, sin)
    torch.testing.assert_close(q, q_ref, **TOL)
    torch.testing.assert_close(k, k_ref, **TOL)


def test_silu_and_mul():
    gate_up = randn(3, 5, 2 * 23)
    torch.testing.assert_close(silu_and_mul_triton(gate_up), silu_and_mul_ref(gate_up), **TOL)


def test_store_kv_through_slots():
    k, v = randn(6, 3, 8), randn(6, 3, 8, seed=1)
    slots = torch.tensor([5, 0, 9, 3, 7, 11])
    caches = [torch.zeros(12, 3, 8) for _ in range(4)]
    store_kv_ref(k, v, caches[0], caches[1], slots)
    store_kv_triton(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


# odd lengths, an empty sequence, an empty prefix, prefixes shorter than, equal to and longer than a page
SEQ_LENS, PREFIX_LENS = [5, 1, 0, 19], [0, 17, 3, 40]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("ratio", [1, 3, 4])
def test_paged_prefill_attention(ratio, page_size):
    p = paged_problem(SEQ_LENS, PREFIX_LENS, H=ratio, Hkv=1, D=20, page_size=page_size, seed=ratio)
    out, lse = AT.paged_prefill_attention_lse_triton(**p)
    ref_out, ref_lse = paged_prefill_attention_lse_ref(**p)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)


@pytest.mark.parametrize("ratio", [1, 3, 4])
def test_cascade_attention(ratio):
    p = cascade_problem([3, 18, 1], shared_len=21, own_lens=[0, 5, 33], H=ratio, Hkv=1, D=20, seed=ratio)
    torch.testing.assert_close(AT.cascade_attention_triton(**p), cascade_attention_ref(**p), **TOL)


def test_cascade_attention_without_cache():
    p = cascade_problem([4, 7], shared_len=0, own_lens=[0, 0], H=2, Hkv=2, D=16)
    assert p["segments"] == []
    torch.testing.assert_close(AT.cascade_attention_triton(**p), cascade_attention_ref(**p), **TOL)


@pytest.mark.parametrize("splits", [1, 3])
def test_target_logprobs(splits):
    hidden, weight = randn(19, 40), randn(301, 40, seed=1)
    targets = torch.randint(0, 301, (19,), generator=torch.Generator().manual_seed(2))
    targets[0] = 300  # last vocabulary entry (in the last, partial tile)
    targets[1] = int((hidden[1] @ weight.T).argmax())  # one greedy row
    lp, greedy = target_logprobs_triton(hidden, weight, targets, splits=splits)
    ref_lp, ref_greedy = target_logprobs_ref(hidden, weight, targets, vocab_tile=64, row_tile=8)
    torch.testing.assert_close(lp, ref_lp, **TOL)
    assert torch.equal(greedy, ref_greedy) and bool(greedy[1])


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
def test_dequantize_matches_reference_and_gguf(qtype):
    gguf = pytest.importorskip("gguf")
    x = np.random.default_rng(0).standard_normal((3, 96)).astype(np.float32)
    kind = getattr(gguf.GGMLQuantizationType, qtype)
    raw = gguf.quants.quantize(x, kind)
    ref = dequantize_ref(torch.from_numpy(raw), qtype)
    np.testing.assert_array_equal(ref.numpy(), gguf.quants.dequantize(raw, kind))
    torch.testing.assert_close(dequantize_triton(torch.from_numpy(raw), qtype), ref, atol=0, rtol=0)
