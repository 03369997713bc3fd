"""Top-k in the fused target log-prob: the reference against a full log-softmax, the Triton kernel (interpreter,
fp32, small shapes) against the reference; the target's own value is bit-identical to its entry in the top k."""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from kernels.logprob import target_logprobs_ref  # noqa: E402

TOL = dict(atol=1e-5, rtol=1e-5)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def problem(k):
    hidden, weight = randn(19, 40), randn(301, 40, seed=1)
    weight[77] = weight[12]  # two tokens with equal logits everywhere: the lower id comes first
    logits = hidden @ weight.T
    targets = logits.topk(k, dim=-1).indices[:, k // 2]  # targets inside the top k ...
    targets[::3] = torch.randint(0, 301, (7,), generator=torch.Generator().manual_seed(2))  # ... and anywhere
    targets[0] = 300
    return hidden, weight, targets


def check_top(ids, vals, lp, hidden, weight, targets, k):
    full = torch.log_softmax(hidden @ weight.T, dim=-1)
    want_vals, _ = full.topk(k, dim=-1)
    torch.testing.assert_close(vals, want_vals, **TOL)
    torch.testing.assert_close(full.gather(1, ids), vals, **TOL)  # each id carries its own log-prob
    for r in range(len(ids)):
        row = ids[r].tolist()
        if 12 in row and 77 in row:
            assert row.index(12) < row.index(77)
        if int(targets[r]) in row:  # the very same number, not merely close
            assert vals[r, row.index(int(targets[r]))].item() == lp[r].item()
    assert torch.equal(vals, vals.sort(dim=-1, descending=True).values)


@pytest.mark.parametrize("k", [1, 5, 8])
def test_reference_top_k(k):
    hidden, weight, targets = problem(k)
    out = target_logprobs_ref(hidden, weight, targets, k, vocab_tile=64, row_tile=8)
    lp, greedy, ids, vals = out.logprob, out.greedy, out.top_ids, out.top_logprobs
    check_top(ids, vals, lp, hidden, weight, targets, k)
    plain = target_logprobs_ref(hidden, weight, targets, vocab_tile=64, row_tile=8)
    assert plain.top_ids is None and plain.top_logprobs is None
    assert torch.equal(lp, plain.logprob) and torch.equal(greedy, plain.greedy)
    assert torch.equal(greedy, ids[:, 0] == targets) or k == 1


@pytest.mark.parametrize("splits,k", [(1, 5), (3, 5), (3, 1), (2, 8)])
def test_triton_top_k_matches_reference(splits, k):
    pytest.importorskip("triton")
    from kernels.logprob_triton import target_logprobs_triton

    hidden, weight, targets = problem(k)
    out = target_logprobs_triton(hidden, weight, targets, k, splits=splits)
    lp, greedy, ids, vals = out.logprob, out.greedy, out.top_ids, out.top_logprobs
    ref = target_logprobs_ref(hidden, weight, targets, k, vocab_tile=64, row_tile=8)
    torch.testing.assert_close(lp, ref.logprob, **TOL)
    assert torch.equal(greedy, ref.greedy)
    torch.testing.assert_close(vals, ref.top_logprobs, **TOL)
    check_top(ids, vals, lp, hidden, weight, targets, k)
