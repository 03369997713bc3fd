"""The model's tokenizer: a `tokenizers.Tokenizer` plus the special tokens, BOS policy and chat template.

Also builds the tokenizers a GGUF file describes, as llama.cpp stores them: byte-level BPE (tokens + merges +
token types + pre-tokenizer name) and SentencePiece BPE (tokens + scores + token types), and caches built
tokenizers on disk as tokenizer.json files.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from .errors import UserError

# Tokens that llama.cpp also treats as end of generation when the vocabulary has them as special tokens.
END_OF_GENERATION_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>")


class Tokenizer:
    """Text <-> token ids. `encode` never adds BOS: whether a sequence starts with `bos_id` is the engine's call,
    guided by `add_bos` (what the model was trained with)."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_id: int | None,
        eos_ids: Sequence[int],
        add_bos: bool,
        chat_template: str | None = None,
        source: str | None = None,
    ):
        self.backend, self.source = backend, source  # source: the file it came from, for messages
        self.bos_id = bos_id
        self.eos_ids = list(dict.fromkeys(i for i in eos_ids if i is not None))
        self.eos_id = self.eos_ids[0] if self.eos_ids else None
        self.add_bos = bool(add_bos)
        self.chat_template = chat_template or None
        self._template = None
        self._max_token_chars: int | None = None

    def with_add_bos(self, add_bos: bool) -> "Tokenizer":
        """This tokenizer with another BOS policy: a new Tokenizer sharing the backend (immutable once built) and
        the special tokens, this one unchanged (a front that overrides the model's policy, as lm-eval's
        add_bos_token, encodes with its own copy instead of changing the engine's)."""
        return Tokenizer(
            self.backend,
            bos_id=self.bos_id,
            eos_ids=self.eos_ids,
            add_bos=add_bos,
            chat_template=self.chat_template,
            source=self.source,
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def max_text_chars(self, n_tokens: int) -> int:
        """The most characters a text of `n_tokens` tokens can have, so that a longer one is refused without
        tokenizing it: a token stands for at most as many characters as its vocabulary string holds (byte-level BPE
        writes one character per byte, SentencePiece the text itself or `<0xNN>` for a byte); with a normalizer,
        4x that (NFC joins up to three characters into one, as a Hangul syllable)."""
        if self._max_token_chars is None:
            self._max_token_chars = max(map(len, self.backend.get_vocab(with_added_tokens=True)), default=1)
        return n_tokens * self._max_token_chars * (1 if self.backend.normalizer is None else 4)

    def encode(self, text: str) -> list[int]:
        with rust_errors("cannot tokenize this text", self.source):
            return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """encode() of many texts at once (the Rust backend spreads them over threads)."""
        with rust_errors("cannot tokenize this text", self.source):
            return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        with rust_errors("cannot decode these tokens", self.source):
            return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        """Render the model's chat template the way transformers does (sandboxed jinja2, trim_blocks, lstrip_blocks)."""
        if self.chat_template is None:
            raise UserError("this model has no chat template")
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        bos = self.id_to_token(self.bos_id) if self.bos_id is not None else ""
        eos = self.id_to_token(self.eos_id) if self.eos_id is not None else ""
        from jinja2.exceptions import TemplateError

        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos,
                eos_token=eos,
                **variables,
            )
        except UserError:
            raise
        except (
            TemplateError,
            TypeError,
            ValueError,
            KeyError,
            IndexError,
            AttributeError,
            ArithmeticError,
            RecursionError,
            MemoryError,
        ) as e:  # the model's template is input: a sandbox refusal is not a crash
            raise UserError(
                f"the model's chat template fails to render ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
            ) from None


def is_rust_panic(e: BaseException) -> bool:
    """A panic of a Rust extension (pyo3_runtime.PanicException: a BaseException, not an Exception)."""
    return type(e).__name__ == "PanicException"


@contextmanager
def rust_errors(what: str, source: str | None, building: bool = False):
    """The tokenizers library's failures inside the block (its exceptions and its panics) as one UserError line:
    `what` (the tokenizer's fault, e.g. a regex past its retry limit), naming the tokenizer's file. A TypeError
    is the caller's (not text) unless `building` (a tokenizer made from a file's values)."""
    try:
        yield
    except UserError:
        raise
    except BaseException as e:
        if not (is_rust_panic(e) or isinstance(e, Exception)) or (isinstance(e, TypeError) and not building):
            raise  # Ctrl-C and exits are not the tokenizer's
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise UserError(f"the model's tokenizer fails: {what} ({reason})", source) from None


# Probe texts a loaded tokenizer must encode: long runs of each kind of character and their mixtures, the inputs
# on which a backtracking pre-tokenizer regex blows up (`(\w+\s?)*$` on a word run ending in punctuation).
PROBES = tuple(
    run * 48 + end
    for run in ("a", "a ", "7", " ", "\n", "!", "\u00e9", "\u4e2d", "a1")
    for end in ("", "!", " ", "\n", "a")
)
MAX_REGEX_CHARS = 4096  # a split pattern (Llama 3's is 157 characters)
MAX_TOKENIZER_BYTES = 256 << 20  # a tokenizer.json (Gemma 3's, with 262k tokens, is 33 MB)


def check_tokenizer(backend: tokenizers.Tokenizer, vocab_size: int, source: str, spec: dict | None = None) -> None:
    """A tokenizer a model may use: no token id beyond the model's vocabulary of `vocab_size` (its embedding
    rows), regexes of at most MAX_REGEX_CHARS, and the PROBES encoded without failing (the Rust library's panic
    message is kept off stderr while probing). `spec`: the tokenizer's JSON, when the caller parsed it already."""
    size = backend.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise UserError(
            f"the tokenizer has {size:,} tokens but the model's vocabulary (its embedding) has {vocab_size:,}", source
        )
    for pattern in _regexes(spec if spec is not None else json.loads(backend.to_str())):
        if len(pattern) > MAX_REGEX_CHARS:
            raise UserError(
                f"a tokenizer regex of {len(pattern):,} characters (the limit is {MAX_REGEX_CHARS:,})", source
            )
    with (
        _quiet_stderr(),
        rust_errors("it fails on a probe text (a pre-tokenizer regex that backtracks without bound?)", source),
    ):
        backend.encode_batch(list(PROBES), add_special_tokens=False)


def _regexes(node) -> list[str]:
    """Every {"Regex": pattern} of a tokenizer's JSON (pre-tokenizers and normalizers), depth-first."""
    found, stack = [], [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("Regex"), str):
                found.append(item["Regex"])
            stack.extend(
                item.get(k)
                for k in ("pre_tokenizer", "normalizer", "pattern", "pretokenizers", "normalizers")
                if k in item
            )
        elif isinstance(item, list):
            stack.extend(item)
    return found


@contextmanager
def _quiet_stderr():
    """File descriptor 2 sent to /dev/null inside the block (a Rust panic writes its message there itself)."""
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _compile_template(source: str):
    import json
    from datetime import datetime

    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise UserError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as e:
        raise UserError(f"chat template does not compile: {e}") from None


def end_of_generation_ids(backend: tokenizers.Tokenizer, declared: Sequence[int | None]) -> list[int]:
    """The declared EOS/EOT ids first, then the special tokens whose text marks an end of turn."""
    specials = {tok.content: i for i, tok in backend.get_added_tokens_decoder().items() if tok.special}
    found = [specials[t] for t in END_OF_GENERATION_TEXTS if t in specials]
    return list(dict.fromkeys([i for i in declared if i is not None] + found))


# --- tokenizers from a GGUF vocabulary -------------------------------------------------------------------------

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# llama.cpp's `tokenizer.ggml.pre` names -> how text is split before BPE: "gpt2" (GPT-2 regex), "digits" (each
# digit alone, then the GPT-2 regex: SmolLM, StarCoder), or a split regex applied before a regex-free byte level.
PRE_TOKENIZERS = {
    "default": "gpt2",
    "gpt2": "gpt2",
    "smollm": "digits",
    "starcoder": "digits",
    "refact": "digits",
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
# Llama 3 vocabularies take a whole pre-token from the vocabulary before applying merges (llama.cpp does too).
IGNORE_MERGES_PRE = ("llama-bpe", "llama3", "llama-v3", "smaug-bpe")
CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types


def byte_level_bpe(
    tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int], pre: str
) -> tokenizers.Tokenizer:
    """The byte-level BPE tokenizer that llama.cpp's `gpt2` tokenizer model with pre-tokenizer `pre` describes."""
    split = PRE_TOKENIZERS[pre]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in IGNORE_MERGES_PRE))
    if split == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif split == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    _add_special_tokens(tok, tokens, list(token_types) or [1] * len(tokens))
    return tok


def sentencepiece_bpe(
    tokens: Sequence[str],
    scores: Sequence[float],
    token_types: Sequence[int],
    add_space_prefix: bool,
    unk_id: int | None,
) -> tokenizers.Tokenizer:
    """llama.cpp's `llama` tokenizer model (SentencePiece BPE): spaces are written "▁", the adjacent pair whose
    merged piece scores highest is merged first, and bytes missing from the vocabulary become <0xXX> tokens.
    As a tokenizers BPE: every split of a normal piece into two vocabulary pieces is a merge, ranked by score."""
    types = list(token_types) or [1] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}  # a repeated piece keeps its last id, as in llama.cpp
    ranked = []
    for i, (piece, kind) in enumerate(zip(tokens, types)):
        if kind != 1 or vocab[piece] != i:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], i, cut, left, right))
    ranked.sort()
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    tok = tokenizers.Tokenizer(
        models.BPE(vocab=vocab, merges=[(m[3], m[4]) for m in ranked], unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", split=False, prepend_scheme="first" if add_space_prefix else "never"
    )
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else [])
    )
    _add_special_tokens(tok, tokens, types)
    return tok


def _add_special_tokens(tok: tokenizers.Tokenizer, tokens: Sequence[str], types: Sequence[int]) -> None:
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, kind in zip(tokens, types) if kind == CONTROL]
    )
    # User-defined tokens (e.g. <think>) are matched whole in text, like llama.cpp does, but are not special.
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, kind in zip(tokens, types) if kind == USER_DEFINED]
    )


# --- on-disk cache of built tokenizers --------------------------------------------------------------------------


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "icqs-engine" / "tokenizers"


def cached_tokenizer(key: str, build: Callable[[], tokenizers.Tokenizer]) -> tuple[tokenizers.Tokenizer, bool]:
    """The tokenizer cached under `key` (a content hash), else `build()` saved there. Returns (tokenizer, hit).
    An unreadable cache entry is rebuilt; an unwritable cache directory only costs speed."""
    path = cache_dir() / f"{key}.json"
    if path.is_file():
        try:
            return tokenizers.Tokenizer.from_file(str(path)), True
        except Exception:  # a corrupt entry (e.g. from a tokenizers version change): rebuild it
            pass
    tok, tmp = build(), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        os.close(fd)
        tok.save(tmp)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return tok, False
