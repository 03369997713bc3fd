"""Load a llama.cpp GGUF file (architectures llama, qwen2, qwen3, gemma3): config from the metadata, weights in HF
naming and layout (a LazyWeights: each tensor dequantized to float32, or kept as F32/F16/BF16 as stored, only when
the model asks for it, and its pages of the memory-mapped file then dropped), and the tokenizer rebuilt from the
vocabulary (byte-level or SentencePiece BPE, cached on disk).

llama.cpp's converter interleaves the two rotary halves of each Q and K head of `llama` models (its RoPE rotates
adjacent pairs); the loader undoes that so the weights match HF's rotate-half layout. qwen2 and qwen3 files are
not permuted. llama.cpp's converter stores Gemma's RMSNorm weights as 1 + w (what the norm multiplies by); the
loader subtracts the 1 so that they are HF's w (as transformers does when it reads such a file).
"""

from __future__ import annotations

import hashlib
import re
import struct
import sys
from pathlib import Path

import gguf
import numpy as np
import torch

from .config import RANGES, ModelConfig, check_int
from .errors import UserError
from .tokenizer import (
    PRE_TOKENIZERS,
    Tokenizer,
    byte_level_bpe,
    cached_tokenizer,
    check_tokenizer,
    end_of_generation_ids,
    rust_errors,
    sentencepiece_bpe,
)
from .weights import LazyWeights, release_pages

SUPPORTED_GGUF_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
TOKENIZER_FORMAT = "icqs-tok-1"  # part of the tokenizer cache key: bump when a builder changes

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}
# gemma3 names its norms otherwise: ffn_norm is the pre-MLP norm, and there are norms after attention and the MLP
_GEMMA3_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")


def load_gguf(path: str | Path) -> tuple[ModelConfig, LazyWeights, Tokenizer]:
    path = Path(path)
    source = str(path)
    meta, arch, tensors, config = _header(path)
    by_name = {}
    for name, t in tensors.items():
        if name == "rope_freqs.weight":  # llama3 frequency factors: already in config.rope_scaling
            continue
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise UserError(
                f"unsupported tensor type {t.tensor_type.name} in {t.name} (supported: {', '.join(SUPPORTED_TYPES)})",
                source,
            )
        by_name[_hf_name(name, source, _GEMMA3_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES)] = t
    rotary_heads = {}  # llama: undo the converter's interleaving of the rotary halves of Q and K
    if arch == "llama":
        for i in range(config.num_layers):
            for proj, heads in (("q_proj", config.num_heads), ("k_proj", config.num_kv_heads)):
                for kind in ("weight", "bias"):
                    rotary_heads[f"model.layers.{i}.self_attn.{proj}.{kind}"] = heads

    def read(name: str, dtype: torch.dtype | None) -> torch.Tensor:
        t = by_name[name]
        if arch == "gemma3" and name.endswith("norm.weight"):  # stored as 1 + w
            w = _dequantize(t).float() - 1
        else:
            w = _dequantize(t, dtype)
        release_pages(t.data)
        return unpermute_rotary(w, rotary_heads[name]) if name in rotary_heads else w

    shapes = {name: tuple(int(d) for d in reversed(t.shape)) for name, t in by_name.items()}
    return config, LazyWeights(shapes, read), _tokenizer(meta, config)


def load_gguf_tokenizer(path: str | Path) -> Tokenizer:
    """Only the tokenizer of a GGUF file (no weights are read)."""
    return load_gguf_info(path)[1]


def load_gguf_info(path: str | Path) -> tuple[ModelConfig, Tokenizer]:
    """The config and tokenizer of a GGUF file, from its metadata: no tensor data is read or dequantized (the
    tensor list is the file's header; only a llama3 `rope_freqs` vector, if any, is read)."""
    meta, _, _, config = _header(Path(path))
    return config, _tokenizer(meta, config)


def load_gguf_config(path: str | Path) -> ModelConfig:
    """The checked config of a GGUF file, from its metadata (the tokenizer is not built)."""
    return _header(Path(path))[3]


def _header(path: Path):
    """(metadata, architecture, tensor infos by GGUF name, config) of a GGUF file whose architecture is supported;
    no tensor data is read."""
    reader = open_gguf(path)
    meta = _Metadata(reader, str(path))
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHS:
        raise UserError(f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_GGUF_ARCHS)})", str(path))
    tensors = {t.name: t for t in reader.tensors}
    return meta, arch, tensors, _config(meta, arch, tensors)


def unpermute_rotary(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's `permute`: rows of each head go from (pairs, 2) interleaved to (2, halves)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape).contiguous()


# --- reading -----------------------------------------------------------------------------------------------------


class _FastReader(gguf.GGUFReader):
    """GGUFReader parses each metadata array element into numpy views of the file; views of a np.memmap cost
    ~10 us each in memmap.__array_finalize__, which makes a 49k-token vocabulary take seconds. Slicing a plain
    ndarray view of the same mapping instead is ~3x faster; the data stays memory-mapped."""

    def _get(self, offset, dtype, count=1, override_order=None):
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        dtype = np.dtype(dtype)
        arr = plain[offset : offset + dtype.itemsize * int(count)].view(dtype)
        order = self.byte_order if override_order is None else override_order
        native = order == "I" or (order == "<" and sys.byteorder == "little")
        return arr if native else arr.view(dtype.newbyteorder(order))


class _LeanReader(_FastReader):
    """The loader's reader: each metadata array is kept as one byte view of the file (its element type and count
    beside it) instead of a numpy view per element, and decoded only when asked (`array_values`). A 49k-token
    vocabulary and its merges would otherwise cost ~40 MiB of small objects while the file is open, and the
    heap they leave behind stays resident after the load; on a tokenizer-cache hit they are never decoded."""

    def _get_field_parts(self, orig_offs, raw_type):
        if raw_type != gguf.GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        itype, count = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        start, n = orig_offs + 12, int(count[0])
        sub = gguf.GGUFValueType(int(itype[0]))
        if sub == gguf.GGUFValueType.STRING:
            end = start
            prefix = self._order_char() + "Q"
            for _ in range(n):  # each element: a uint64 length, then that many bytes
                end += 8 + struct.unpack_from(prefix, self.data, end)[0]
        elif sub in self.gguf_scalar_to_np:
            end = start + np.dtype(self.gguf_scalar_to_np[sub]).itemsize * n
        else:  # arrays of arrays: the per-element parse
            return super()._get_field_parts(orig_offs, raw_type)
        if end > len(self.data):
            raise ValueError(f"array at offset {orig_offs} runs past the end of the file")
        return (
            end - orig_offs,
            [itype, count, self._get(start, np.uint8, end - start)],
            [2],
            [gguf.GGUFValueType.ARRAY, sub],
        )

    @staticmethod
    def compact(field) -> bool:
        """Whether this reader kept the field as one block (every array but an array of arrays)."""
        return (
            len(field.types) == 2
            and field.types[0] == gguf.GGUFValueType.ARRAY
            and field.types[1] != gguf.GGUFValueType.ARRAY
        )

    def _order_char(self) -> str:
        swapped = self.byte_order == "S"
        return (">" if sys.byteorder == "little" else "<") if swapped else "="

    def array_values(self, field) -> list:
        """The elements of an array field parsed by this reader (strings decoded as UTF-8)."""
        sub, block = field.types[-1], field.parts[field.data[0]]
        n = int(field.parts[field.data[0] - 1][0])
        if sub != gguf.GGUFValueType.STRING:
            dtype = np.dtype(self.gguf_scalar_to_np[sub]).newbyteorder(self._order_char())
            return np.frombuffer(block, dtype=dtype, count=n).tolist()
        raw, prefix, pos, out = block.tobytes(), self._order_char() + "Q", 0, []
        for _ in range(n):
            length = struct.unpack_from(prefix, raw, pos)[0]
            out.append(raw[pos + 8 : pos + 8 + length].decode("utf-8"))
            pos += 8 + length
        return out


def open_gguf(path: Path) -> gguf.GGUFReader:
    if not path.is_file():
        raise UserError("no such file", str(path))
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise UserError("not a GGUF file (no GGUF magic)", str(path))
    try:
        reader = _LeanReader(path)
        for t in reader.tensors:  # a truncated file yields short tensor views
            if t.data.nbytes != t.n_bytes:
                raise ValueError(f"tensor {t.name} is cut short")
    except Exception as e:  # GGUFReader raises ValueError, KeyError, IndexError, ... on damaged files
        raise UserError(
            f"corrupt or truncated GGUF file ({type(e).__name__}: {e})".splitlines()[0], str(path)
        ) from None
    return reader


class _Metadata:
    def __init__(self, reader, source: str):
        self.reader, self.fields, self.source = reader, reader.fields, source

    def __contains__(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default=KeyError):
        field = self.fields.get(key)
        if field is None:
            if default is KeyError:
                raise UserError(f"missing metadata {key}", self.source)
            return default
        if _LeanReader.compact(field):
            return self.reader.array_values(field)
        return field.contents()

    def length(self, key: str) -> int:
        """Number of elements of an array field (0 if absent), without decoding them."""
        field = self.fields.get(key)
        if field is None:
            return 0
        return int(field.parts[field.data[0] - 1][0]) if _LeanReader.compact(field) else len(field.data)

    def raw_bytes(self, key: str) -> bytes:
        """The field as stored in the file (for hashing without decoding 49k strings)."""
        field = self.fields.get(key)
        if field is None:
            return b""
        last = field.parts[-1]
        end = last.ctypes.data - self.reader.data.ctypes.data + last.nbytes
        return self.reader.data[field.offset : end].tobytes()


def _hf_name(name: str, source: str, layer_names: dict[str, str] = _LAYER_NAMES) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_RE.fullmatch(name)
    if m and m.group(2) in layer_names:
        return f"model.layers.{m.group(1)}.{layer_names[m.group(2)]}"
    raise UserError(f"unexpected tensor {name} (an unsupported variant of this architecture)", source)


DEQUANTIZE_BYTES = 2 << 20  # float32 bytes of one block of rows dequantized at a time (its temporaries: ~3x)


def _dequantize(t, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The tensor in memory of its own, in `dtype` (None: F32 and F16 as stored, BF16 as bfloat16, quantized types
    as float32). Quantized types are dequantized by the gguf package a block of rows at a time (each row is whole
    quant blocks, so this is the same arithmetic), converted into the output as they come and their file pages
    dropped: a 150k x 896 embedding never exists in float32 on its way to bfloat16."""
    kind = t.tensor_type.name
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dims innermost first; HF is [out, in]
    if kind in ("F32", "F16", "BF16"):
        raw = np.array(t.data)
        w = torch.from_numpy(raw.view(np.int16) if kind == "BF16" else raw).reshape(shape)
        w = w.view(torch.bfloat16) if kind == "BF16" else w
        return w if dtype is None else w.to(dtype)
    data = t.data if t.data.ndim >= 2 else t.data.reshape(1, -1)  # a 1-D tensor: one row of whole blocks
    out = torch.empty(shape, dtype=dtype or torch.float32)
    rows = out.view(data.shape[0], -1)
    step = max(1, DEQUANTIZE_BYTES // (4 * rows.shape[1]))
    for start in range(0, data.shape[0], step):
        block = data[start : start + step]
        values = gguf.quants.dequantize(block, t.tensor_type)
        rows[start : start + step].copy_(torch.from_numpy(values.astype(np.float32, copy=False)).view(len(block), -1))
        release_pages(block)
    return out


# --- config ------------------------------------------------------------------------------------------------------


def _config(meta: _Metadata, arch: str, tensors: dict) -> ModelConfig:
    try:
        return _read_config(meta, arch, tensors)
    except (TypeError, ValueError, ZeroDivisionError) as e:  # e.g. head_count 0, a string where a number belongs
        raise UserError(f"metadata of the wrong type or range ({e})", meta.source) from None


def gguf_names(arch: str) -> dict[str, str]:
    """The metadata keys of ModelConfig's fields in a GGUF file of `arch` (for the messages of its checks)."""
    a = arch
    return {
        "vocab_size": "tokenizer.ggml.tokens (its length)",
        "hidden_size": f"{a}.embedding_length",
        "intermediate_size": f"{a}.feed_forward_length",
        "num_layers": f"{a}.block_count",
        "num_heads": f"{a}.attention.head_count",
        "num_kv_heads": f"{a}.attention.head_count_kv",
        "head_dim": f"{a}.attention.key_length",
        "rms_norm_eps": f"{a}.attention.layer_norm_rms_epsilon",
        "rope_theta": f"{a}.rope.freq_base",
        "rope_scaling": f"{a}.rope.scaling",
        "max_position": f"{a}.context_length",
        "sliding_window": f"{a}.attention.sliding_window",
        "sliding_layers": f"{a}.attention.sliding_window_pattern",
        "rope_local_theta": f"{a}.rope.freq_base_swa",
        "query_pre_attn_scalar": f"{a}.attention.key_length",
        "bos_token_id": "tokenizer.ggml.bos_token_id",
        "eos_token_ids": "tokenizer.ggml.eos_token_id (or eot, eom)",
    }


def _read_config(meta: _Metadata, arch: str, tensors: dict) -> ModelConfig:
    """The config from the metadata as stored (no coercion: a count stored as a string or a float is refused),
    checked by ModelConfig.validate before anything is sized from it."""
    names, source = gguf_names(arch), meta.source

    def bounded(field: str, default=KeyError) -> int:  # a size needed before validate: checked now
        return check_int(meta.get(names[field], default), names[field], *RANGES[field], source)

    heads = bounded("num_heads")
    hidden = bounded("hidden_size")
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id", None) for k in ("eos", "eot", "eom")]
    vocab = meta.length("tokenizer.ggml.tokens")
    config = ModelConfig(
        arch=arch,
        vocab_size=vocab or meta.get(f"{arch}.vocab_size"),
        hidden_size=hidden,
        intermediate_size=meta.get(names["intermediate_size"]),
        num_layers=bounded("num_layers"),
        num_heads=heads,
        num_kv_heads=meta.get(names["num_kv_heads"], heads),
        head_dim=meta.get(names["head_dim"], hidden // heads),
        rms_norm_eps=meta.get(names["rms_norm_eps"], 1e-5),
        rope_theta=meta.get(names["rope_theta"], 10000.0),
        max_position=meta.get(names["max_position"], 2048),
        tie_embeddings="output.weight" not in tensors,  # no output matrix: the embedding's is shared
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm=arch in ("qwen3", "gemma3"),
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id", None),
        eos_token_ids=[i for i in eos if i is not None],
    )
    if arch == "gemma3":  # llama.cpp's and transformers' defaults where the file says nothing: every 6th layer
        # global, local rope base 10000, attention scale 1/sqrt(head_dim) (query_pre_attn_scalar = head_dim)
        pattern = check_int(
            meta.get(names["sliding_layers"], 6), names["sliding_layers"], 1, RANGES["num_layers"][1], source
        )
        config.sliding_window = meta.get(names["sliding_window"])
        config.sliding_layers = tuple(bool((i + 1) % pattern) for i in range(config.num_layers))
        config.rope_local_theta = meta.get(names["rope_local_theta"], 10000.0)
        config.query_pre_attn_scalar = config.head_dim
        config.rms_norm_eps = meta.get(names["rms_norm_eps"], 1e-6)
    config.validate(source, names)  # before the rope factors are fitted at the config's head size
    config.rope_scaling = _rope_scaling(meta, arch, config, tensors.get("rope_freqs.weight"))
    return config.validate(source, names)


def _rope_scaling(meta: _Metadata, arch: str, config: ModelConfig, freqs) -> dict | None:
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if freqs is not None:
        if kind not in ("none", "linear") or meta.get(f"{arch}.rope.scaling.factor", 1.0) != 1.0:
            raise UserError("rope_freqs together with rope scaling metadata is not supported", meta.source)
        factors = np.array(freqs.data, dtype=np.float64).reshape(-1)
        if factors.size != config.head_dim // 2 or not np.isfinite(factors).all() or (factors <= 0).any():
            raise UserError(
                f"rope_freqs.weight must hold {config.head_dim // 2} positive factors (one per "
                f"frequency of the head size {config.head_dim})",
                meta.source,
            )
        return llama3_rope_from_factors(factors, config, meta.source)
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": meta.get(f"{arch}.rope.scaling.factor")}
    raise UserError(f"unsupported rope scaling {kind!r} (supported: none, linear, llama3)", meta.source)


def llama3_rope_from_factors(factors: np.ndarray, config: ModelConfig, source: str) -> dict | None:
    """llama.cpp stores Llama 3 rope scaling as per-frequency divisors (`rope_freqs.weight`), not its parameters.
    Recover HF's (factor, low/high_freq_factor, original_max_position_embeddings): the medium band obeys
    1/f = (1-s)/factor + s with s = (orig/wavelen - low)/(high - low), linear in 1/wavelen; only orig/(high-low)
    and low/(high-low) matter, so low_freq_factor = 1 loses nothing. The result is checked against the factors."""
    from kernels.rope import rope_inv_freq

    inv = 1.0 / config.rope_theta ** (np.arange(0, config.head_dim, 2) / config.head_dim)
    factor = float(factors.max())
    if factor <= 1.0 + 1e-6:
        return None
    x = inv / (2 * np.pi)  # 1 / wavelength
    s = (1 / factors - 1 / factor) / (1 - 1 / factor)
    medium = (s > 1e-4) & (s < 1 - 1e-4)
    if medium.sum() >= 2:
        slope, intercept = np.polyfit(x[medium], s[medium], 1)
        if intercept >= 0:
            raise UserError("rope_freqs.weight does not follow Llama 3 rope scaling (unsupported)", source)
        low = 1.0
        high, orig = low - low / intercept, -slope * low / intercept
    else:  # too few points to fit: Meta's band (1, 4) with the context from the point or between the band edges
        low, high = 1.0, 4.0
        wavelen = 1 / x
        if medium.any():
            orig = (s[medium][0] * (high - low) + low) * wavelen[medium][0]
        else:
            longest_kept = wavelen[factors < 1 + 1e-6].max(initial=0.0)
            shortest_scaled = wavelen[factors > 1 + 1e-6].min()
            orig = np.sqrt(high * longest_kept * shortest_scaled) if longest_kept else shortest_scaled / 2
    high, orig = (round(v) if abs(v - round(v)) < 1e-3 * v else float(v) for v in (high, orig))
    scaling = {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": float(low),
        "high_freq_factor": float(high),
        "original_max_position_embeddings": orig,
    }
    got = rope_inv_freq(config.head_dim, config.rope_theta, scaling).double().numpy()
    if not np.allclose(inv / got, factors, rtol=1e-3):
        raise UserError("rope_freqs.weight does not follow Llama 3 rope scaling (unsupported)", source)
    return scaling


# --- tokenizer ---------------------------------------------------------------------------------------------------


def _tokenizer(meta: _Metadata, config: ModelConfig) -> Tokenizer:
    model = meta.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise UserError(
            f"GGUF tokenizer model {model!r} is not supported (supported: byte-level BPE 'gpt2', "
            "SentencePiece BPE 'llama')",
            meta.source,
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if model == "gpt2" and pre not in PRE_TOKENIZERS:
        raise UserError(f"unsupported pre-tokenizer {pre!r} (supported: {', '.join(PRE_TOKENIZERS)})", meta.source)
    space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    digest = hashlib.sha256(f"{TOKENIZER_FORMAT}\0{model}\0{pre}\0{space_prefix}\0".encode())
    for key in (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.unknown_token_id",
    ):
        digest.update(meta.raw_bytes(key))

    def build():
        tokens, types = meta.get("tokenizer.ggml.tokens"), meta.get("tokenizer.ggml.token_type", [])
        if model == "gpt2":
            return byte_level_bpe(tokens, meta.get("tokenizer.ggml.merges"), types, pre)
        return sentencepiece_bpe(
            tokens,
            meta.get("tokenizer.ggml.scores"),
            types,
            space_prefix,
            meta.get("tokenizer.ggml.unknown_token_id", None),
        )

    n = meta.length("tokenizer.ggml.tokens")
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if key in meta and meta.length(key) != n:
            raise UserError(f"{key} has {meta.length(key):,} entries for {n:,} tokens", meta.source)
    if model == "llama" and meta.length("tokenizer.ggml.scores") != n:
        raise UserError("a SentencePiece vocabulary needs tokenizer.ggml.scores (one per token)", meta.source)
    unk = meta.get("tokenizer.ggml.unknown_token_id", None)
    if unk is not None:
        check_int(unk, "tokenizer.ggml.unknown_token_id", 0, n - 1, meta.source)
    with rust_errors("its vocabulary does not make a tokenizer", meta.source, building=True):
        backend, _ = cached_tokenizer(digest.hexdigest()[:32], build)
    check_tokenizer(backend, config.vocab_size, meta.source)
    return Tokenizer(
        backend,
        bos_id=config.bos_token_id,
        eos_ids=end_of_generation_ids(backend, config.eos_token_ids),
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", model == "llama")),
        chat_template=meta.get("tokenizer.chat_template", None),
        source=meta.source,
    )
