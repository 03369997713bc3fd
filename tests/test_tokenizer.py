"""Tokenizers built from GGUF vocabularies: SmolLM2's against transformers' own GGUF tokenizer, the tiny GGUF's
against the tokenizer.json it came from, pre-tokenizer choices, the on-disk cache, and chat templates."""

from __future__ import annotations

import pytest
import tokenizers
from tiny_models import make_tiny_gguf

import engine.gguf_loader as gguf_loader
from engine.errors import UserError
from engine.gguf_loader import load_gguf_tokenizer
from engine.loader import load_model_files
from engine.tokenizer import Tokenizer, byte_level_bpe

TEXTS = [
    "Hello world",
    " Hello world",
    "Hello  world",
    "   three leading spaces",
    "trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nend",
    "12345 and 3.14159 and 1,000,000",
    "2024-11-22T03:04:05Z",
    "x1y22z333",
    "don't you'll we've I'M THEY'RE it's",
    "naïve café résumé Ærøskøbing",
    "日本語のテキストです。",
    "Привет, мир!",
    "emoji 😀👍🏽 and ❤️ ok",
    "مرحبا بالعالم",
    "a\u00a0non-breaking\u200bzero-width",
    "ALLCAPS lowercase MiXeD",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '<div class="x">&amp;</div>',
    "https://example.com/path?q=1&r=2#frag",
    "user@example.com",
    "$19.99 (USD) — 50% off!!!",
    "[[A]] is better than [[B]]",
    "Rating: 10/10",
    "<|endoftext|>",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>more<|im_start|>",
    "",
    " ",
    "\n",
    "x" * 80 + " " + "ab" * 30,
    "The end.",
]
MESSAGES = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ],
]


@pytest.fixture(scope="module")
def smollm2_tokenizers(smollm2_path):
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(smollm2_path.parent, gguf_file=smollm2_path.name)
    return load_gguf_tokenizer(smollm2_path), theirs


@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_ids_equal_transformers_gguf_tokenizer(smollm2_tokenizers, text):
    ours, theirs = smollm2_tokenizers
    ids = ours.encode(text)
    assert ids == theirs(text, add_special_tokens=False)["input_ids"]
    assert ours.decode(ids) == text  # byte-level BPE is lossless


def test_smollm2_special_tokens_and_chat_template(smollm2_tokenizers):
    ours, theirs = smollm2_tokenizers
    assert (ours.bos_id, ours.eos_id, ours.add_bos, ours.vocab_size) == (1, 2, False, 49152)
    assert ours.eos_ids == [2, 0]  # <|im_end|>, then <|endoftext|> which also ends a generation
    assert ours.id_to_token(1) == "<|im_start|>" and ours.token_to_id("<|im_end|>") == 2
    ids = ours.encode("<|im_start|>user\nHi<|im_end|>")
    assert ours.decode(ids, skip_special_tokens=True) == "user\nHi"
    for messages in MESSAGES:
        for add in (True, False):
            assert ours.apply_chat_template(messages, add_generation_prompt=add) == theirs.apply_chat_template(
                messages, add_generation_prompt=add, tokenize=False
            )


def test_gguf_tokenizer_cache(smollm2_path, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = load_gguf_tokenizer(smollm2_path)
    cached = list((tmp_path / "icqs-engine" / "tokenizers").glob("*.json"))
    assert len(cached) == 1

    def no_build(*args):
        raise AssertionError("the tokenizer was rebuilt although it is cached")

    monkeypatch.setattr(gguf_loader, "byte_level_bpe", no_build)
    second = load_gguf_tokenizer(smollm2_path)
    assert [second.encode(t) for t in TEXTS] == [first.encode(t) for t in TEXTS]
    cached[0].write_text("{ damaged")  # a damaged entry is rebuilt, not fatal
    monkeypatch.undo()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert load_gguf_tokenizer(smollm2_path).encode("Hello world") == first.encode("Hello world")


def test_tiny_gguf_tokenizer_equals_its_tokenizer_json(tiny_model_dir, tmp_path):
    path, _ = make_tiny_gguf(tmp_path / "m.gguf")
    ours = load_gguf_tokenizer(path)
    reference = tokenizers.Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    for text in TEXTS + ["<s>a</s><|im_start|>"]:
        assert ours.encode(text) == reference.encode(text, add_special_tokens=False).ids, text
        assert ours.decode(ours.encode(text)) == text
    assert ours.chat_template == load_model_files(tiny_model_dir)[2].chat_template


def _pieces(pre: str, text: str, vocab=(), merges=()) -> list[str]:
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok = byte_level_bpe(alphabet + list(vocab), list(merges), [], pre)
    return [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(text)]


@pytest.mark.parametrize(
    "pre, pieces",
    [
        ("gpt2", ["abc", "Ġ12345", "Ġdon", "'t"]),
        ("default", ["abc", "Ġ12345", "Ġdon", "'t"]),
        ("smollm", ["abc", "Ġ", "1", "2", "3", "4", "5", "Ġdon", "'t"]),
        ("llama-bpe", ["abc", "Ġ", "123", "45", "Ġdon", "'t"]),
        ("qwen2", ["abc", "Ġ", "1", "2", "3", "4", "5", "Ġdon", "'t"]),
    ],
)
def test_pre_tokenizers(pre, pieces):
    assert _pieces(pre, "abc 12345 don't") == pieces


def test_llama3_vocab_takes_whole_words_before_merges():
    """llama-bpe (Llama 3) sets ignore_merges: a pre-token found in the vocabulary is one token, merges or not."""
    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    for pre, expected in (("llama-bpe", ["hello"]), ("gpt2", ["h", "e", "l", "l", "o"])):
        tok = Tokenizer(byte_level_bpe(alphabet + ["hello"], [], [], pre), bos_id=None, eos_ids=[], add_bos=False)
        assert [tok.id_to_token(i) for i in tok.encode("hello")] == expected


def test_encode_never_adds_bos_and_template_errors(tiny_model_dir):
    _, _, tok = load_model_files(tiny_model_dir)
    assert tok.add_bos and tok.encode("Hello")[0] != tok.bos_id  # tokenizer.json itself would add <s>
    bare = Tokenizer(tok.backend, bos_id=0, eos_ids=[1], add_bos=True, chat_template=None)
    with pytest.raises(UserError, match="no chat template"):
        bare.apply_chat_template(MESSAGES[0])
    strict = Tokenizer(
        tok.backend, bos_id=0, eos_ids=[1], add_bos=True, chat_template="{{ raise_exception('roles must alternate') }}"
    )
    with pytest.raises(UserError, match="roles must alternate"):
        strict.apply_chat_template(MESSAGES[0])
    with_bos = Tokenizer(
        tok.backend, bos_id=0, eos_ids=[1], add_bos=True, chat_template="{{ bos_token }}{{ eos_token }}"
    )
    assert with_bos.apply_chat_template(MESSAGES[0]) == "<s></s>"


def test_with_add_bos_is_a_copy(tiny_model_dir):
    """Another BOS policy is a new tokenizer over the same backend; the original keeps its own."""
    from engine.encoding import encode_pair, prompt_ids

    _, _, tok = load_model_files(tiny_model_dir)
    bare = tok.with_add_bos(False)
    assert tok.add_bos is True and bare.add_bos is False and bare is not tok and bare.backend is tok.backend
    assert (bare.bos_id, bare.eos_ids, bare.chat_template, bare.source) == (
        tok.bos_id,
        tok.eos_ids,
        tok.chat_template,
        tok.source,
    )
    assert prompt_ids(tok, "Hello") == [tok.bos_id] + prompt_ids(bare, "Hello")
    assert encode_pair(tok, "A good", " example")[0] == [tok.bos_id] + encode_pair(bare, "A good", " example")[0]
    assert tok.with_add_bos(True).add_bos is True and tok.add_bos is True


def test_sentencepiece_gguf_tokenizer_equals_transformers(tmp_path):
    """llama.cpp's `llama` (SentencePiece) vocabulary: scores instead of merges, <0xXX> byte fallback."""
    from transformers import AutoTokenizer

    path, _ = make_tiny_gguf(tmp_path / "spm.gguf", vocab="spm")
    ours = load_gguf_tokenizer(path)
    theirs = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    assert (ours.bos_id, ours.eos_id, ours.add_bos) == (1, 2, True)
    assert any(len(ours.id_to_token(i)) > 2 for i in ours.encode("The quality of the example"))  # merges applied
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == theirs(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ids) == theirs.decode(ids)
