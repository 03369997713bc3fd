"""Random attention problems with the engine's layouts, shared by the kernel tests and benchmarks: packed new
tokens of several sequences (the causal self part), and for the cascade a one-layer paged cache and its segments
(a prefix shared by all sequences, then a private cached segment per sequence)."""

from __future__ import annotations

import torch

from kernels.attention import AttentionPlan, AttentionWindow, Segment


def _packed(seq_lens, H, Hkv, D, dtype, gen):
    T = sum(seq_lens)
    cu = [0]
    for n in seq_lens:
        cu.append(cu[-1] + n)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    return rand(T, H, D), rand(T, Hkv, D), rand(T, Hkv, D), cu, rand


def varlen_problem(seq_lens, H, Hkv, D, dtype=torch.float32, seed=0):
    """Arguments of varlen_causal_attention: the new tokens of len(seq_lens) sequences packed back to back."""
    q, k, v, cu, _ = _packed(seq_lens, H, Hkv, D, dtype, torch.Generator().manual_seed(seed))
    return dict(q=q, k=k, v=v, cu_seqlens=cu, scale=D**-0.5)


def cascade_problem(seq_lens, shared_len, own_lens, H, Hkv, D, dtype=torch.float32, seed=0):
    """Arguments of cascade_attention: a cached segment of shared_len tokens below all sequences (none when 0)
    and one of own_lens[b] tokens below sequence b alone (none when 0), at scattered cache slots."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, cu, rand = _packed(seq_lens, H, Hkv, D, dtype, gen)
    num_slots = shared_len + sum(own_lens) + 7
    slots = torch.randperm(num_slots, generator=gen)
    segments, used = [], 0
    if shared_len:
        segments.append(Segment(torch.arange(cu[-1]), slots[:shared_len]))
        used = shared_len
    for b, n in enumerate(own_lens):
        if n:
            segments.append(Segment(torch.arange(cu[b], cu[b + 1]), slots[used : used + n]))
            used += n
    return dict(
        q=q,
        k_new=k,
        v_new=v,
        k_cache=rand(num_slots, Hkv, D),
        v_cache=rand(num_slots, Hkv, D),
        plan=AttentionPlan(cu, segments),
        scale=D**-0.5,
    )


def with_segments(problem: dict, segments: list[Segment]) -> dict:
    """A cascade problem with other segments over the same sequences (a fresh plan)."""
    return dict(problem, plan=AttentionPlan(problem["plan"].cu_seqlens, segments))


def upcast(problem: dict) -> dict:
    """The same problem in fp32 (to compare a bf16 kernel with the fp32 reference), with a fresh plan."""

    def f(x):
        return x.float() if torch.is_tensor(x) and x.is_floating_point() else x

    out = {k: f(x) for k, x in problem.items()}
    if "plan" in out:
        out["plan"] = AttentionPlan(problem["plan"].cu_seqlens, list(problem["plan"].segments))
    return out


def cascade_window(p: dict, shared_len: int, own_lens: list[int], size: int):
    """The AttentionWindow of a cascade_problem: its shared segment at positions 0.., each sequence's own cached
    segment after it, then its new tokens."""
    slot_positions = torch.full((p["k_cache"].shape[0],), -(10**6), dtype=torch.long)
    segs = iter(p["plan"].segments)
    if shared_len:
        slot_positions[next(segs).slots] = torch.arange(shared_len)
    positions = []
    cu = p["plan"].cu_seqlens
    for b, n in enumerate(own_lens):
        if n:
            slot_positions[next(segs).slots] = torch.arange(shared_len, shared_len + n)
        positions.append(torch.arange(cu[b + 1] - cu[b]) + shared_len + n)
    return AttentionWindow(size, torch.cat(positions), slot_positions)
