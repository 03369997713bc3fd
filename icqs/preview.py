"""`icqs preview TASK [CANDIDATES]`: what the model will see and what a run will cost, without scoring anything.

Per method: one fully rendered request (the context, then the scored continuation after `|||`), its tokens; the
engine requests the run would send (every demo draw) and the audit after it; the unique tokens among them (the
engine computes a shared prefix once: the tokens of all requests less their longest common prefix with another
request); and a time estimate from this machine's measured rate on a small sample of them.
"""

from __future__ import annotations

import time

from .audit import audit_skipped, folds
from .candidates import Candidate
from .methods import METHODS, ordered
from .score_run import draw_task


def _requests(task, candidates, methods, sampler: str, draws: int, audit: bool) -> dict:
    """{method: (run requests, audit requests)} as (context, continuation, tokens generated) tuples."""
    out = {}
    for name in ordered(methods):
        method = METHODS[name]
        run, aud = [], []
        for d in range(draws if method.demos else 1):
            run += [
                (r.context, r.continuation, r.generated)
                for r in method.requests(draw_task(task, d), candidates, sampler)
            ]
            if audit:
                for train, cands in folds(task, d):
                    aud += [(r.context, r.continuation, r.generated) for r in method.requests(train, cands, sampler)]
        out[name] = (run, aud)
    return out


def unique_tokens(token_lists: list[list[int]]) -> int:
    """Tokens a prefix-sharing engine computes for these sequences: each sequence's length less its longest common
    prefix with any other (after sorting, the neighbour's)."""
    seqs = sorted(set(map(tuple, token_lists)))
    total, prev = 0, ()
    for s in seqs:
        common = 0
        for a, b in zip(s, prev):
            if a != b:
                break
            common += 1
        total += len(s) - common
        prev = s
    return total


def _tokens(tokenizer, requests) -> list[list[int]]:
    texts = [ctx + cont for ctx, cont, _ in requests]
    return tokenizer.encode_batch(texts) if texts else []


def measure_rate(engine, requests, size: int = 48) -> float:
    """Tokens computed per second on `size` requests spread over the plan (the first two warm up)."""
    step = max(1, len(requests) // size)
    sample = [(ctx, cont) for ctx, cont, _ in requests[::step][:size]]
    n = sum(len(ctx) + len(cont) for ctx, cont in sample) // 4
    engine.score(sample[:2], share_prefix=True)
    t0 = time.perf_counter()
    engine.score(sample, share_prefix=True)
    seconds = time.perf_counter() - t0
    stats = getattr(engine, "last_stats", None)
    computed = stats.get("tokens_computed", 0) if isinstance(stats, dict) else getattr(stats, "tokens_computed", 0)
    if not computed:
        computed = max(n, 1)
    return computed / max(seconds, 1e-6)


def preview(engine, task, candidates: list[Candidate], methods, sampler: str, draws: int, audit: bool) -> str:
    tok = engine.tokenizer
    skipped = audit_skipped(task, sampler, draws) if audit else None  # as `icqs score` would skip it
    plan = _requests(task, candidates, methods, sampler, draws, audit and skipped is None)
    all_requests = [r for run, aud in plan.values() for r in run + aud]
    rate = measure_rate(engine, all_requests) if all_requests else 0.0
    lines = [
        f"preview of task {task.name}: {len(candidates)} candidates, M = {task.M}, N = {task.N}, "
        f"L = {task.L}, {sampler} demo sets, {draws} demo draw(s), audit "
        f"{'off' if not audit else f'skipped ({skipped})' if skipped else 'on'}; "
        f"measured rate on this machine: {rate:,.0f} tokens/s",
        "prompt layout: "
        + (f"the header {task.header!r}, then " if task.header else "")
        + f"the demos, each followed by the separator {task.separator!r}, then the candidate",
    ]
    generated_total = sum(g for _, _, g in all_requests)
    total_tokens = unique_tokens(_tokens(tok, all_requests)) + generated_total  # methods share requests
    for name, (run, aud) in plan.items():
        if not run:
            continue
        ctx, cont, _ = run[0]
        tokens = len(tok.encode(ctx + cont))
        run_u = unique_tokens(_tokens(tok, run))
        aud_u = unique_tokens(_tokens(tok, aud))
        generated = sum(g for _, _, g in run + aud)
        seconds = (run_u + aud_u + generated) / rate if rate else float("nan")
        lines += [
            "",
            f"== {name}: {METHODS[name].title}",
            f"one request ({tokens} tokens; the scored continuation after |||):",
            "  " + (ctx + "|||" + cont).replace("\n", "\n  "),
            f"requests: {len(run):,} for the run + {len(aud):,} for the audit; unique tokens to compute: "
            f"{run_u:,} + {aud_u:,}"
            + (f"; {generated:,} generated" if generated else "")
            + f"; estimated time: {seconds:.0f} s",
        ]
    lines.append("")
    lines.append(
        f"total (requests the methods share counted once): about {total_tokens:,} tokens, "
        f"{total_tokens / rate if rate else float('nan'):.0f} s on this machine (an estimate: the "
        f"measured rate moves with the machine's load)"
    )
    return "\n".join(lines) + "\n"
