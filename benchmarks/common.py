"""Shared helpers of the engine benchmarks: timing (wall and CPU), peak RSS, the naive transformers runner, the
llama.cpp runner (llama-cpp-python, an optional benchmark extra), and markdown tables.

Both baselines compute log P(continuation | context) the naive way, one request at a time with no cache: a full
forward over context + continuation, logits at every position, log-softmax, gather. Requests are tokenized by the
engine's own rule (engine.encoding.encode_pair), so all three runners see the same token ids."""

from __future__ import annotations

import os
import resource
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # hf_reference: the transformers model holding our weights

from engine.encoding import encode_pair  # noqa: E402


@dataclass
class Timing:
    wall: float = 0.0  # seconds
    cpu: float = 0.0  # process CPU seconds, all threads: steadier than wall time on a shared machine


@contextmanager
def timed():
    """`with timed() as t: ...` -> t.wall, t.cpu in seconds."""
    t = Timing()
    w, c = time.perf_counter(), time.process_time()
    try:
        yield t
    finally:
        t.wall, t.cpu = time.perf_counter() - w, time.process_time() - c


def load_average() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def machine() -> str:
    return f"{os.cpu_count()} CPUs, torch {torch.__version__} with {torch.get_num_threads()} threads"


# ---- memory ------------------------------------------------------------------------------------------------
def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux: /proc/self/clear_refs), so that the next
    peak_rss() is the peak of what follows. False where it cannot be reset (then peak_rss is the process peak)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    """Peak resident set size in bytes (VmHWM; resource.getrusage where /proc is absent)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss() -> int:
    """Resident set size now, in bytes (0 where /proc is absent)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def engine_weight_bytes(engine) -> int:
    """Bytes of the tensors the engine's model holds (a tensor held twice, as a tied LM head, counted once; a
    prepacked weight by its blocked copy)."""
    from kernels.linear import Packed

    seen: dict[int, torch.Tensor] = {}

    def visit(value):
        if isinstance(value, Packed):
            value = value.blocked
        if isinstance(value, torch.Tensor):
            seen[id(value)] = value
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v)

    visit(list(vars(engine.model).values()))
    return sum(t.numel() * t.element_size() for t in seen.values())


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


# ---- baselines -----------------------------------------------------------------------------------------------
def hf_model(config, weights, dtype: torch.dtype, device=None):
    """transformers' own Llama (AutoModelForCausalLM.from_config) holding our weights, with its default SDPA
    attention, as lm-evaluation-harness loads it (on `device`, default the CPU)."""
    from hf_reference import hf_model_from_weights

    model = hf_model_from_weights(config, weights, dtype=dtype, device=device)
    model.set_attn_implementation("sdpa")
    return model


def hf_naive(model, tokenizer, requests) -> list[float]:
    """Continuation log-probs from transformers, one full forward per request (lm-evaluation-harness with
    --batch_size 1): logits at every position, log-softmax, gather."""
    from hf_reference import hf_logprobs

    return [r.logprob for r in hf_logprobs(model, tokenizer, requests)]


@torch.inference_mode()
def hf_batched(model, tokenizer, requests, batch_size: int, seconds: float | None = None) -> list[float | None]:
    """Continuation log-probs from transformers the way lm-evaluation-harness's hf backend computes them with
    --batch_size N: the requests sorted longest first, each group of N right-padded into one forward, logits at
    every position, log-softmax over the vocabulary (in the logits' dtype), gather. With `seconds`, no new group
    is started once that much time has passed: the requests left out get None (a sample in random order stays a
    random sample)."""
    import torch.nn.functional as F

    pairs = [encode_pair(tokenizer, c, y) for c, y in requests]
    order = sorted(range(len(pairs)), key=lambda i: -sum(map(len, pairs[i])))
    out: list[float | None] = [None] * len(pairs)
    start = time.perf_counter()
    for g in range(0, len(order), batch_size):
        if seconds is not None and g and time.perf_counter() - start > seconds:
            break
        group = order[g : g + batch_size]
        seqs = [(pairs[i][0] + pairs[i][1])[:-1] for i in group]
        width = max(map(len, seqs))
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s)], mask[r, : len(s)] = torch.tensor(s), 1
        logp = F.log_softmax(model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device)).logits, -1)
        for r, i in enumerate(group):
            ctx, cont = pairs[i]
            rows = logp[r, len(ctx) - 1 : len(ctx) + len(cont) - 1]
            out[i] = float(rows.gather(1, torch.tensor(cont, device=rows.device)[:, None]).float().sum())
    return out


def llama_cpp_available() -> str | None:
    """None when llama-cpp-python is importable, else why not."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as e:
        return f"llama-cpp-python is not installed ({e}); it is the optional extra `pip install -e '.[bench]'`"
    return None


class LlamaCpp:
    """llama.cpp through llama-cpp-python on the GGUF file itself (its own quantized kernels), logits_all=True:
    per request a reset and one eval of context + continuation, log-probs from the returned logits.

    `extra_buffers` lets llama.cpp repack weights into its extra buffer types (AMX, repacked quants). Off by
    default: on the benchmark machine the AMX matmul of llama-cpp-python 0.3.36 dies of a general protection fault
    at `ldtilecfg`, so llama.cpp runs its ordinary AVX-512 kernels."""

    def __init__(self, gguf_path, n_ctx: int, threads: int | None = None, extra_buffers: bool = False):
        import llama_cpp.llama as llama_module
        from llama_cpp import Llama

        defaults = llama_module.llama_cpp.llama_model_default_params

        def model_params():
            params = defaults()
            params.use_extra_bufts = extra_buffers
            return params

        llama_module.llama_cpp.llama_model_default_params = model_params  # Llama() has no argument for it
        try:
            self.llm = Llama(
                model_path=str(gguf_path),
                n_ctx=n_ctx,
                n_batch=min(n_ctx, 2048),
                logits_all=True,
                n_threads=threads or torch.get_num_threads(),
                verbose=False,
            )
        finally:
            llama_module.llama_cpp.llama_model_default_params = defaults

    def score(self, tokenizer, requests) -> list[float]:
        out = []
        for context, continuation in requests:
            ctx, cont = encode_pair(tokenizer, context, continuation)
            self.llm.reset()
            self.llm.eval(ctx + cont)
            logits = np.asarray(self.llm.scores[len(ctx) - 1 : len(ctx) + len(cont) - 1], dtype=np.float64)
            top = logits.max(axis=1, keepdims=True)
            logz = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
            out.append(float((logits[np.arange(len(cont)), cont] - logz).sum()))
        return out


def request_tokens(tokenizer, requests) -> list[int]:
    """Tokens each request feeds a forward (context + continuation minus the last): what a naive runner computes."""
    return [sum(map(len, encode_pair(tokenizer, c, y))) - 1 for c, y in requests]


def max_abs_diff(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))))


# ---- output --------------------------------------------------------------------------------------------------
def table(headers: list[str], rows: list[list]) -> str:
    """A markdown table; floats printed to about 3 significant digits, with thousands separators."""

    def fmt(v):
        if not isinstance(v, float):
            return f"{v:,}" if isinstance(v, int) else str(v)
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
