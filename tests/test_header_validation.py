"""A model's header is input: every size, token id and rope parameter in a GGUF file's metadata, a config.json or
a tokenizer is checked before anything is allocated from it, one error line naming the file, the field and the
range (engine/config.py ModelConfig.validate, engine/tokenizer.py check_tokenizer); the rotary tables are sized by
the engine's limits (--kv-tokens), not by the header's context length."""

from __future__ import annotations

import json
import shutil

import gguf
import pytest
from tiny_models import make_tiny_gguf

from engine.errors import UserError
from engine.loader import load_model_files, load_model_info

T = gguf.GGUFValueType


def rewrite_gguf(src, dst, changes: dict | None = None, remove: tuple = ()):
    """A copy of the GGUF file `src` at `dst` with metadata `changes` ({key: (value, GGUFValueType)}, or (value,
    ARRAY, the items' GGUFValueType)) and without the keys in `remove` (the tensors copied as they are)."""
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(str(src))
    arch = reader.get_field("general.architecture").contents()
    writer = gguf.GGUFWriter(str(dst), arch=arch)
    new = {k: MetadataDetails(t, v, sub_type=sub[0] if sub else None) for k, (v, t, *sub) in (changes or {}).items()}
    copy_with_new_metadata(reader, writer, new, list(remove))
    return dst


@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ggufs")
    return {arch: make_tiny_gguf(root / f"{arch}.gguf", arch)[0] for arch in ("llama", "gemma3", "qwen2")}


def _one_line_error(model, match, *, info: bool = True) -> str:
    """load_model_files (and load_model_info) of `model` raise one UserError line matching `match`, naming it."""
    for load in (load_model_files, load_model_info) if info else (load_model_files,):
        with pytest.raises(UserError, match=match) as e:
            load(model)
        message = str(e.value)
        assert "\n" not in message and str(model) in message, message
    return message


GGUF_CASES = [  # (arch, changes, removed keys, what the error says)
    (
        "llama",
        {"llama.context_length": (4294967295, T.UINT32)},
        (),
        r"llama\.context_length must be an integer in 1\.\.16,777,216, got 4294967295",
    ),
    ("qwen2", {"qwen2.context_length": (4294967295, T.UINT32)}, (), r"qwen2\.context_length must be an integer"),
    ("gemma3", {"gemma3.context_length": (4294967295, T.UINT32)}, (), r"gemma3\.context_length must be an integer"),
    (
        "gemma3",
        {"gemma3.attention.sliding_window": (0, T.UINT32)},
        (),
        r"gemma3\.attention\.sliding_window must be an integer in 1\.\.512, got 0",
    ),
    (
        "gemma3",
        {"gemma3.attention.sliding_window": (2**32 - 1, T.UINT32)},
        (),
        r"gemma3\.attention\.sliding_window must be an integer in 1\.\.512, got 4294967295",
    ),
    (
        "gemma3",
        {"gemma3.attention.sliding_window_pattern": (0, T.UINT32)},
        (),
        r"gemma3\.attention\.sliding_window_pattern must be an integer in 1\.\.1,024, got 0",
    ),
    (
        "llama",
        {"tokenizer.ggml.eos_token_id": (10**6, T.UINT32)},
        (),
        r"tokenizer\.ggml\.eos_token_id.* must be an integer in 0\.\.383, got 1000000",
    ),
    (
        "llama",
        {"tokenizer.ggml.bos_token_id": (-5, T.INT32)},
        (),
        r"tokenizer\.ggml\.bos_token_id must be an integer in 0\.\.383, got -5",
    ),
    (
        "llama",
        {"llama.rope.scaling.type": ("linear", T.STRING), "llama.rope.scaling.factor": (0.0, T.FLOAT32)},
        (),
        r"llama\.rope\.scaling\.factor must be a number in \[1, 1024\], got 0\.0",
    ),
    ("llama", {"llama.rope.freq_base": (0.5, T.FLOAT32)}, (), r"llama\.rope\.freq_base must be a number in \(1, "),
    (
        "llama",
        {"llama.attention.head_count": (2**20, T.UINT32)},
        (),
        r"llama\.attention\.head_count must be an integer in 1\.\.1,024, got 1048576",
    ),
    (
        "llama",
        {"llama.embedding_length": ("64", T.STRING)},
        (),
        r"llama\.embedding_length must be an integer in 1\.\.65,536, got '64'",
    ),
    (
        "llama",
        {"llama.block_count": (10**9, T.UINT32)},
        (),
        r"llama\.block_count must be an integer in 1\.\.1,024, got 1000000000",
    ),
]


@pytest.mark.parametrize(
    "arch, changes, removed, match",
    GGUF_CASES,
    ids=[f"{c[0]}-{next(iter(c[1]))}={next(iter(c[1].values()))[0]}" for c in GGUF_CASES],
)
def test_gguf_metadata_out_of_range_is_one_line(tiny_ggufs, tmp_path, arch, changes, removed, match):
    bad = rewrite_gguf(tiny_ggufs[arch], tmp_path / "bad.gguf", changes, removed)
    _one_line_error(bad, match)


def test_gguf_token_types_of_another_length(tiny_ggufs, tmp_path):
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(str(tiny_ggufs["llama"]))
    writer = gguf.GGUFWriter(str(tmp_path / "b.gguf"), arch="llama")
    copy_with_new_metadata(
        reader, writer, {"tokenizer.ggml.token_type": MetadataDetails(T.ARRAY, [1] * 10, sub_type=T.INT32)}, []
    )
    _one_line_error(tmp_path / "b.gguf", r"tokenizer\.ggml\.token_type has 10 entries for 384 tokens")


HF_CASES = [  # (arch, config.json changes, what the error says)
    (
        "llama",
        {"max_position_embeddings": 10**18},
        r"max_position_embeddings must be an integer in 1\.\.16,777,216, got 1000000000000000000",
    ),
    ("gemma3", {"max_position_embeddings": 2**32 - 1}, r"max_position_embeddings must be an integer"),
    ("gemma3", {"sliding_window": 0}, r"sliding_window must be an integer in 1\.\.512, got 0"),
    ("gemma3", {"sliding_window": 2**32 - 1}, r"sliding_window must be an integer in 1\.\.512, got 4294967295"),
    ("llama", {"eos_token_id": 10**6}, r"eos_token_id must be an integer in 0\.\.383, got 1000000"),
    ("llama", {"eos_token_id": [1, 400]}, r"eos_token_id must be an integer in 0\.\.383, got 400"),
    ("llama", {"bos_token_id": -5}, r"bos_token_id must be an integer in 0\.\.383, got -5"),
    (
        "llama",
        {"rope_scaling": {"rope_type": "linear", "factor": 0}},
        r"rope_scaling\.factor must be a number in \[1, 1024\], got 0",
    ),
    (
        "llama",
        {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
        r"rope_scaling: unsupported rope type 'dynamic' \(supported: default, linear, llama3\)",
    ),
    (
        "llama3",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 4.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 64,
            }
        },
        r"rope_scaling\.high_freq_factor must be a number in \(4, 1024\], got 1\.0",
    ),
    ("llama", {"head_dim": 15}, r"head_dim must be even"),
    ("llama", {"num_key_value_heads": 0}, r"num_key_value_heads must be an integer in 1\.\.1,024, got 0"),
    ("llama", {"rope_theta": float("inf")}, r"rope_theta must be a number in \(1, 1e\+12\], got inf"),
    ("qwen3", {"query_pre_attn_scalar": 0}, None),  # not a qwen3 field: ignored, loads
]


@pytest.mark.parametrize("arch, change, match", HF_CASES, ids=[f"{c[0]}-{json.dumps(c[1])[:40]}" for c in HF_CASES])
def test_config_json_out_of_range_is_one_line(tiny_model_dirs, tmp_path, arch, change, match):
    bad = shutil.copytree(tiny_model_dirs[arch], tmp_path / "m")
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, **change}))
    if match is None:
        load_model_files(bad)
        return
    message = _one_line_error(bad, match)
    assert str(bad / "config.json") in message


def test_generation_config_eos_outside_the_vocabulary(tiny_model_dir, tmp_path):
    bad = shutil.copytree(tiny_model_dir, tmp_path / "m")
    (bad / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 99999]}))
    message = _one_line_error(bad, r"eos_token_id must be an integer in 0\.\.383, got 99999")
    assert "generation_config.json" in message


# --- tokenizers ---------------------------------------------------------------------------------------------------


def _with_tokenizer(src, dst, change):
    from tokenizers import Tokenizer

    bad = shutil.copytree(src, dst)
    tok = Tokenizer.from_file(str(bad / "tokenizer.json"))
    change(tok)
    tok.save(str(bad / "tokenizer.json"))
    return bad


def test_tokenizer_larger_than_the_models_vocabulary(tiny_model_dir, tmp_path):
    bad = _with_tokenizer(tiny_model_dir, tmp_path / "m", lambda t: t.add_tokens([f"<extra_{i}>" for i in range(10)]))
    message = _one_line_error(bad, r"the tokenizer has 394 tokens but the model's vocabulary \(its embedding\) has 384")
    assert "tokenizer.json" in message


BACKTRACKING = r"(\w+\s?)*$"  # onig gives up past its retry limit on a word run that ends in punctuation


def _split_by(pattern):
    from tokenizers import Regex, pre_tokenizers

    def change(tok):
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    return change


def test_tokenizer_regex_that_backtracks_is_refused_at_load(tiny_model_dir, tmp_path, capfd):
    bad = _with_tokenizer(tiny_model_dir, tmp_path / "m", _split_by(BACKTRACKING))
    _one_line_error(bad, r"tokenizer\.json: the model's tokenizer fails: it fails on a probe text")
    assert "panicked" not in capfd.readouterr().err  # the Rust panic's own message is kept off stderr


def test_tokenizer_panic_on_a_request_text_is_one_line(tiny_model_dir, tmp_path):
    """A panic on a text that no probe foresaw (the tokenizer built past check_tokenizer): a UserError naming
    the tokenizer, for encode, encode_batch and the engine's request encoding alike."""
    from tokenizers import Tokenizer as Backend

    from engine.encoding import encode_pairs
    from engine.tokenizer import Tokenizer

    bad = _with_tokenizer(tiny_model_dir, tmp_path / "m", _split_by(BACKTRACKING))
    tok = Tokenizer(
        Backend.from_file(str(bad / "tokenizer.json")), bos_id=0, eos_ids=[1], add_bos=True, source="tok.json"
    )
    text = "word " * 40 + "!"
    for call in (
        lambda: tok.encode(text),
        lambda: tok.encode_batch(["fine", text]),
        lambda: encode_pairs(tok, [(text, " x")]),
    ):
        with pytest.raises(UserError, match=r"^tok\.json: the model's tokenizer fails: cannot tokenize this text"):
            call()
    assert (
        tok.encode("fine")
        == Backend.from_file(str(tiny_model_dir / "tokenizer.json")).encode("fine", add_special_tokens=False).ids
    )


def test_tokenizer_regex_size_limit(tiny_model_dir, tmp_path):
    bad = _with_tokenizer(tiny_model_dir, tmp_path / "m", _split_by("|".join(f"x{i}" for i in range(1500))))
    _one_line_error(bad, r"a tokenizer regex of 7,889 characters \(the limit is 4,096\)")


def test_tokenizer_json_that_does_not_parse_is_one_line(tiny_model_dir, tmp_path):
    bad = shutil.copytree(tiny_model_dir, tmp_path / "m")
    (bad / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": 5}}')
    _one_line_error(bad, r"tokenizer\.json: the model's tokenizer fails: not a readable tokenizer\.json")


# --- allocations sized by the engine's limits, not by the header ------------------------------------------------


def test_rope_tables_sized_by_kv_tokens_not_the_header(tmp_path, tiny_model_dir):
    """A header may claim millions of positions: the rotary tables hold what one request can use (the smaller of the
    context length and --kv-tokens), and the scores are those of the same model with a short context."""
    from engine.engine import Engine

    long = shutil.copytree(tiny_model_dir, tmp_path / "long")
    cfg = json.loads((long / "config.json").read_text())
    (long / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 1 << 20}))
    pair = [("The quality of a demonstration is judged", " by how much it helps")]
    engines = [Engine.load(str(m), dtype="float32", threads=1, kv_tokens=200) for m in (long, tiny_model_dir)]
    assert [e.model.cos.shape[0] for e in engines] == [208, 208]  # 200 rounded up to whole pages of 16
    assert engines[0].limits.max_request_tokens == 208
    a, b = (e.score(pair)[0].logprob for e in engines)
    assert a == b


def test_gemma3_local_rope_table_sized_by_kv_tokens(tmp_path, tiny_model_dirs):
    from engine.engine import Engine

    eng = Engine.load(str(tiny_model_dirs["gemma3"]), dtype="float32", threads=1, kv_tokens=64)
    assert eng.model.cos.shape[0] == eng.model.local_cos.shape[0] == 64


# --- a command with nothing left to do still checks the model --------------------------------------------------


def test_empty_config_json_refused_even_with_nothing_to_do(tiny_model_dir, tmp_path, capsys):
    from commands.engine_cli import main

    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"context": "The judge reads", "continuation": " both"}) + "\n")
    out = tmp_path / "o.jsonl"
    model = shutil.copytree(tiny_model_dir, tmp_path / "m")
    args = [
        "score",
        "--model",
        str(model),
        "--input",
        str(rows),
        "--output",
        str(out),
        "--dtype",
        "float32",
        "--threads",
        "1",
        "--quiet",
    ]
    assert main(args) == 0
    for text in ("", "{}"):
        (model / "config.json").write_text(text)
        capsys.readouterr()
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "config.json" in err, err


# ---- a config from a server's answer (frontends/client.py reads /v1/tokenizer's `config` with from_dict) ----------
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_config_from_a_servers_answer_round_trips(tiny_model_dirs, arch):
    from dataclasses import asdict

    from engine.config import ModelConfig

    config = load_model_info(str(tiny_model_dirs[arch]))[0]
    wire = json.loads(json.dumps(asdict(config)))  # as the server sends it: tuples become lists
    assert ModelConfig.from_dict(wire, "server") == config


@pytest.mark.parametrize(
    "change, match",
    [
        ({"vocab_size": -1}, "vocab_size"),
        ({"num_layers": 10**9}, "num_layers"),
        ({"head_dim": "64"}, "head_dim"),
        ({"arch": "gpt2"}, "unsupported architecture"),
        ({"num_heds": 4}, "unknown model config field 'num_heds' \\(did you mean 'num_heads'\\?\\)"),
        ({"qk_norm": "yes"}, "must be booleans"),
        ({"sliding_layers": 3}, "must be booleans"),
    ],
)
def test_config_from_a_servers_answer_is_checked(tiny_model_dir, change, match):
    from dataclasses import asdict

    from engine.config import ModelConfig

    wire = json.loads(json.dumps(asdict(load_model_info(str(tiny_model_dir))[0])))
    with pytest.raises(UserError, match=f"^http://server/v1/tokenizer: .*{match}") as e:
        ModelConfig.from_dict({**wire, **change}, "http://server/v1/tokenizer")
    assert "\n" not in str(e.value)
    missing = {k: v for k, v in wire.items() if k != "hidden_size"}
    with pytest.raises(UserError, match="has no hidden_size"):
        ModelConfig.from_dict(missing, "server")
    with pytest.raises(UserError, match="must be an object"):
        ModelConfig.from_dict([1, 2], "server")
