"""Kernel and step microbenchmarks (pytest-benchmark): each CPU op the dispatch can pick, its native version
against its torch reference, on the engine's shapes (bench_kernels.op_cases: SmolLM2), the fp32 and bf16 linears in
each weight form against F.linear (bench_kernels.linear_cases), and one engine scoring step with the native ops against
the torch references.

    .venv/bin/python -m pytest benchmarks/ --benchmark-only --benchmark-autosave   # table saved in .benchmarks/

`make test` collects tests/ only, so CI never runs these. Compare two saved runs with
`pytest-benchmark compare`."""

from __future__ import annotations

import functools

import pytest
import torch
from bench_kernels import impl, linear_cases, op_cases

import kernels
from kernels import dispatch, native_ops

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
CASES = 10  # cases of bench_kernels.op_cases (test_all_op_cases_collected checks); an index past its end is skipped


@functools.cache
def cases(dtype: str) -> list:
    return list(op_cases(DTYPES[dtype]))


@pytest.mark.parametrize("backend", ["torch", "native"])
@pytest.mark.parametrize("case", range(CASES))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_op(benchmark, dtype, case, backend):
    if case >= len(cases(dtype)):
        pytest.skip("no such case")
    op, label, kwargs = cases(dtype)[case]
    if op not in dispatch.IMPLS or backend not in dispatch.IMPLS[op]:
        pytest.skip(f"{op} has no {backend} version")
    if backend == "native" and not native_ops.load():
        pytest.skip("the native library is not built")
    benchmark.group = f"{op}: {label}, {dtype}"
    benchmark.extra_info.update(op=op, backend=backend, picked_by_auto=backend == _auto_pick(op))
    benchmark(impl(op, backend), **kwargs)


def test_all_op_cases_collected():
    assert all(len(cases(d)) <= CASES for d in DTYPES), "raise CASES to the number of bench_kernels.op_cases"


@functools.cache
def _linear_cases(dtype: str) -> list:
    return list(linear_cases(getattr(torch, dtype)))


@pytest.mark.parametrize("form", ["F.linear", "oneDNN", "panels"])
@pytest.mark.parametrize("case", range(14))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_linear(benchmark, dtype, case, form):
    from kernels.linear import linear

    if case >= len(_linear_cases(dtype)):
        pytest.skip("no such case")
    label, x, forms = _linear_cases(dtype)[case]
    if form not in forms:
        pytest.skip(f"no {form} weight here")
    benchmark.group = f"{dtype} linear {label}"
    benchmark(linear, x, forms[form])


def _auto_pick(op: str) -> str:
    kernels.set_backend(None)
    fn = dispatch.resolve(op, torch.device("cpu"))
    return next((b for b in ("native", "torch") if b in dispatch.IMPLS[op] and impl(op, b) is fn), "torch")


@functools.cache
def _engine():
    from engine import Engine

    return Engine.load(None, dtype="bfloat16")


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_engine_scoring_step(benchmark, backend):
    """40 requests on a ~600-token shared context (bench_kernels.bench_engine's job): prefill of the context once,
    then the candidates' tokens, LM-head rows included."""
    engine = _engine()
    context = " ".join(f"Item {i}: a short sentence about topic number {i}." for i in range(40))
    requests = [(context + "\nRating:", f" {i}") for i in range(1, 11)]
    requests += [(context + f"\nCandidate {i} says:", " this is a fine answer to the question.") for i in range(30)]
    kernels.set_backend(backend)
    try:
        benchmark.group = "engine scoring job, bf16"
        benchmark.pedantic(engine.score, args=(requests,), rounds=3, warmup_rounds=1)
    finally:
        kernels.set_backend(None)
