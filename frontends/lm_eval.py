"""lm-evaluation-harness backend: the model `icqs-engine`, lm-eval's `LM` interface on the engine.

    python -m frontends.lm_eval run --model icqs-engine --model_args model=PATH,dtype=float32 --tasks ...

lm-eval 0.4.13 finds models only in its own registry (no plugin entry point), so this module registers
`icqs-engine` when it is imported, and `python -m frontends.lm_eval ARGS` registers it and then runs lm-eval's own
command line with ARGS. From Python: `import frontends.lm_eval` before `lm_eval.simple_evaluate(model="icqs-engine")`.

- `loglikelihood`: all of a task's requests go to one `Engine.score` call, so few-shot contexts and the choices
  of a question share their prefixes in the KV cache. Text becomes token ids by the engine's own convention
  (engine/encoding.py), which is lm-eval's.
- `loglikelihood_rolling`: lm-eval's rolling windows (its own get_rolling_token_windows / make_disjoint_window over
  the text's token ids, with the prefix token), all windows of all documents scored in one call.
- `generate_until`: one `Engine.generate` call per distinct set of generation kwargs; `until` stop strings,
  `max_gen_toks`, greedy (`do_sample=False`) or sampled (`temperature`, `top_p`, `seed`).
The engine's counters (tokens requested vs computed, cache hits) are logged after each call and their totals
per request type are added to lm-eval's results under `config.engine_stats`."""

from __future__ import annotations

import inspect
import logging
import re
import sys
from pathlib import Path

import lm_eval.models  # noqa: F401  (lm-eval's own models: get_model imports them only into an empty registry)
import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from engine.device import resolve_device
from engine.encoding import encode_pairs, start_token, with_bos
from engine.engine import Engine, EngineOptions
from engine.errors import UserError
from engine.stats import EngineStats
from engine.validation import RequestError

NAME = "icqs-engine"
log = logging.getLogger("lm_eval.icqs_engine")  # under lm-eval's logger, so its command line shows these lines
MODEL_ARGS = (
    "model",
    "dtype",
    "device",
    "token_budget",
    "kv_tokens",
    "threads",
    "deterministic",
    "max_length",
    "add_bos_token",
    "prefix_token_id",
    "batch_size",
    "max_batch_size",
)
GEN_KWARGS = {"until", "max_gen_toks", "do_sample", "temperature", "top_p", "seed"}


def _flag(name: str, value) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise UserError(f"{NAME}: {name}={value!r}: expected True or False")


def _int(name: str, value, minimum: int) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < minimum:
        raise UserError(f"{NAME}: {name}={value!r}: expected an integer >= {minimum}")
    return number


def check_model_args(model_args: dict) -> None:
    unknown = sorted(set(model_args) - set(MODEL_ARGS))
    if unknown:
        raise UserError(f"{NAME}: unknown model_args {', '.join(unknown)} (accepted: {', '.join(MODEL_ARGS)})")


@register_model(NAME)
class EngineLM(LM):
    """`--model_args` model (a .gguf file or an HF model dir; default: the embedded SmolLM2), dtype, device,
    token_budget, kv_tokens, threads, deterministic, max_length, add_bos_token, prefix_token_id."""

    def __init__(
        self,
        model: str | None = None,
        dtype: str = "bfloat16",
        device: str | None = None,
        token_budget: int = 1024,
        kv_tokens: int = 65536,
        threads: int | None = None,
        deterministic=None,
        max_length: int | None = None,
        add_bos_token=None,
        prefix_token_id: int | None = None,
        batch_size=None,
        max_batch_size=None,
        **unknown,
    ):
        super().__init__()
        check_model_args(unknown)
        token_budget, kv_tokens = _int("token_budget", token_budget, 1), _int("kv_tokens", kv_tokens, 1)
        threads, max_length = _int("threads", threads, 1), _int("max_length", max_length, 2)
        prefix_token_id = _int("prefix_token_id", prefix_token_id, 0)
        deterministic, add_bos_token = _flag("deterministic", deterministic), _flag("add_bos_token", add_bos_token)
        if batch_size not in (None, 1, "1") or max_batch_size is not None:
            log.info(
                "%s: batch_size=%s max_batch_size=%s have no effect: the engine packs all of a task's "
                "requests into forward steps of token_budget=%s tokens",
                NAME,
                batch_size,
                max_batch_size,
                token_budget,
            )
        options = dict(
            dtype="bfloat16" if dtype == "auto" else dtype,
            token_budget=token_budget,
            kv_tokens=kv_tokens,
            device=resolve_device(device, cpu_fallback=True),
        )
        if threads is not None:
            options["threads"] = threads
        if deterministic is not None:
            accepted = set(inspect.signature(Engine.load).parameters) | set(EngineOptions.__dataclass_fields__)
            if "deterministic" not in accepted:
                raise UserError(f"{NAME}: deterministic: this version of the engine has no deterministic mode")
            options["deterministic"] = deterministic
        self.engine = Engine.load(model, **options)
        self.model_path = model
        self._device = self.engine.device
        tok = self.engine.tokenizer
        if add_bos_token is not None:  # the model's own BOS policy, overridden for every text this backend encodes
            if add_bos_token and tok.bos_id is None:
                raise UserError(f"{NAME}: add_bos_token=True: this model's tokenizer has no BOS token")
            tok = tok.with_add_bos(add_bos_token)  # a copy: the engine's own tokenizer keeps the model's policy
        self.tok = tok  # encodes every text of lm-eval's; the engine gets token ids only
        self.limit = self.engine.max_request_tokens
        self.max_length = max_length or self.limit
        if self.max_length > self.limit:
            raise UserError(
                f"{NAME}: max_length={self.max_length}: more than {self.limit} (the model's maximum and kv_tokens)"
            )
        default_prefix = start_token(tok)
        self.custom_prefix = prefix_token_id is not None
        self.prefix_token_id = prefix_token_id if self.custom_prefix else default_prefix
        if self.prefix_token_id >= tok.vocab_size:
            raise UserError(
                f"{NAME}: prefix_token_id={self.prefix_token_id}: not a token id of this model "
                f"(vocabulary of {tok.vocab_size})"
            )
        self.totals: dict[str, EngineStats] = {}  # request type -> summed engine counters

    # ---- lm-eval's LM interface ----------------------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        args = [req.args for req in requests]
        encoded = encode_pairs(self.tok, args)
        if self.custom_prefix:  # an empty context is the prefix token alone
            encoded = [
                ([self.prefix_token_id], cont) if ctx_text == "" else (ctx, cont)
                for (ctx_text, _), (ctx, cont) in zip(args, encoded)
            ]
        results = self._score(self._truncate(encoded), "loglikelihood", disable_tqdm)
        out = [(r.logprob, r.is_greedy) for r in results]
        for a, o in zip(args, out):
            self.cache_hook.add_partial("loglikelihood", a, o)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        tok = self.tok
        texts = [req.args[0] for req in requests]
        window = min(self.max_length, self.limit - 1)  # a window and its prefix token fit in the engine
        windows, owner = [], []
        for i, ids in enumerate(tok.encode_batch(texts) if texts else []):
            for ctx, pred in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    token_list=with_bos(tok, ids), prefix_token=self.prefix_token_id, max_seq_len=window, context_len=1
                ),
            ):
                windows.append((ctx, pred))
                owner.append(i)
        totals = [0.0] * len(texts)
        for i, r in zip(owner, self._score(windows, "loglikelihood_rolling", disable_tqdm)):
            totals[i] += r.logprob
        for text, total in zip(texts, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        tok = self.tok
        eos = tok.decode([tok.eos_id]) if tok.eos_id is not None else None
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(repr(sorted(req.args[1].items())), []).append(i)
        out = [""] * len(requests)
        for indices in groups.values():
            kwargs = dict(normalize_gen_kwargs(requests[indices[0]].args[1], default_max_gen_toks=256))
            unknown = set(kwargs) - GEN_KWARGS
            if unknown:
                raise UserError(
                    f"{NAME}: generation kwargs {', '.join(sorted(unknown))} are not supported "
                    f"(supported: {', '.join(sorted(GEN_KWARGS))})"
                )
            until = handle_stop_sequences(kwargs["until"], eos=eos)
            max_gen = int(kwargs["max_gen_toks"])
            if max_gen >= self.max_length:
                raise UserError(
                    f"{NAME}: max_gen_toks={max_gen} leaves no room for a prompt under max_length={self.max_length}"
                )
            contexts = [requests[i].args[0] for i in indices]
            keep = self.max_length - max_gen
            prompts = [with_bos(tok, ids) or [self.prefix_token_id] for ids in tok.encode_batch(contexts)]
            if any(len(p) > keep for p in prompts):
                log.warning(
                    "%s: prompts longer than max_length - max_gen_toks = %d tokens are truncated on the left",
                    NAME,
                    keep,
                )
                prompts = [p[-keep:] for p in prompts]
            temperature = float(kwargs["temperature"]) if kwargs["do_sample"] else 0.0
            gens = self.engine.generate(
                prompts,
                max_tokens=max_gen,
                temperature=temperature,
                top_p=float(kwargs.get("top_p", 1.0)),
                seed=int(kwargs.get("seed", torch.initial_seed())),
                stop=[s for s in until if s],
                progress=not disable_tqdm,
            )
            self._record("generate_until", len(prompts))
            for i, context, g in zip(indices, contexts, gens):
                out[i] = postprocess_generated_text(g.text, until, None)
                self.cache_hook.add_partial("generate_until", (context, requests[i].args[1]), out[i])
        return out

    # ---- chat templates (`--apply_chat_template`) ----------------------------------------------------------
    @property
    def tokenizer_name(self) -> str:
        return str(self.model_path or "default").replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tok.chat_template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tok.apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt)

    def get_model_info(self) -> dict:
        """Added to lm-eval's results["config"]."""
        e = self.engine
        return {
            "model_path": self.model_path or "default",
            "dtype": str(e.dtype).removeprefix("torch."),
            "engine_device": str(e.device),
            "token_budget": e.options.token_budget,
            "kv_tokens": e.options.kv_tokens,
            "engine_stats": {k: v.counters() for k, v in self.totals.items()},
        }

    # ---- helpers -------------------------------------------------------------------------------------------
    def _score(self, encoded, kind: str, disable_tqdm: bool):
        results = self.engine.score(encoded, share_prefix=True, progress=not disable_tqdm) if encoded else []
        if encoded:
            self._record(kind, len(encoded))
        return results

    def _record(self, kind: str, n: int) -> None:
        stats = self.engine.last_stats
        self.totals[kind] = self.totals.get(kind, EngineStats()).plus(stats)
        log.info(
            "%s %s: %d requests, %d tokens requested, %d computed, %d cache hits, %d forward steps",
            NAME,
            kind,
            n,
            stats.tokens_requested,
            stats.tokens_computed,
            stats.cache_hit_tokens,
            stats.forward_steps,
        )

    def _truncate(self, encoded: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[int]]]:
        """lm-eval's rule for a request longer than max_length: the model reads the last max_length tokens of
        context + continuation (within what the engine holds), so the context loses tokens on the left."""
        keep, out, cut = min(self.max_length + 1, self.limit), [], 0
        for i, (ctx, cont) in enumerate(encoded):
            if len(cont) >= keep:  # not even one token of context would be left
                raise RequestError(
                    f"a continuation of {len(cont)} tokens does not fit in max_length={self.max_length}",
                    index=i,
                    field="continuation",
                    label=f"{NAME}: request {i}",
                )
            if len(ctx) + len(cont) > keep:
                ctx, cut = ctx[len(ctx) + len(cont) - keep :], cut + 1
            out.append((ctx, cont))
        if cut:
            log.warning(
                "%s: %d of %d requests exceed max_length=%d: their contexts are truncated on the left",
                NAME,
                cut,
                len(out),
                self.max_length,
            )
        return out


def output_file(output_path: str, model: str | None, tasks) -> str:
    """Where `--output_path DIR` puts a run's results: DIR/MODEL/TASKS.json, which lm-eval writes as
    DIR/MODEL/TASKS_<date>.json with the samples (--log_samples) beside it, MODEL the model file's or folder's name
    (the embedded model's without --model_args model=) and TASKS the tasks joined by '+'. lm-eval's own name for
    the folder is the model argument's path with '/' as '__', or a random id without one. A path ending in .json
    is kept as given."""
    if output_path.endswith(".json"):
        return output_path
    from engine.loader import DEFAULT_GGUF

    name = Path(str(model).rstrip("/\\")).name if model else DEFAULT_GGUF
    name = re.sub(r"\.gguf$", "", name, flags=re.IGNORECASE) or "model"
    names = tasks.split(",") if isinstance(tasks, str) else list(tasks or [])
    task = "+".join(t.strip() for t in names if t.strip()) or "tasks"
    return str(Path(output_path) / _file_name(name) / f"{_file_name(task)}.json")


def _file_name(text: str) -> str:
    """`text` as one folder or file name: no separators, at most 120 characters."""
    return re.sub(r"[^\w.+=-]+", "_", text)[:120]


def main(argv: list[str] | None = None) -> int:
    """lm-eval's command line with `icqs-engine` registered. Its model_args are checked before lm-eval indexes its
    tasks; a bad option or input is one line `error: ...`, exit status 2. `--output_path DIR` is named after the
    model and the tasks (output_file)."""
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    sys.argv = [sys.argv[0]] + (sys.argv[1:] if argv is None else list(argv))
    setup_logging()
    cli = HarnessCLI()
    args = cli.parse_args()
    try:
        if getattr(args, "model", None) == NAME:
            model_args = args.model_args or {}
            check_model_args(model_args)
            if "device" in model_args:  # lm-eval passes its own --device beside the model_args: one of them
                args.device = model_args.pop("device")
            if getattr(args, "output_path", None):
                args.output_path = output_file(args.output_path, model_args.get("model"), args.tasks)
        cli.execute(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
