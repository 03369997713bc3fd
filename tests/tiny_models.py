"""Tiny random models for tests: HF directories (every supported architecture) and GGUF files (every supported
tensor type), small enough to build in well under a second and to run a forward pass on CPU in milliseconds.

make_tiny_model(dir, arch)       -> HF dir: config.json, model.safetensors, tokenizer.json, tokenizer_config.json
make_tiny_gguf(file, arch, qtype) -> (GGUF file as llama.cpp's converter writes it, the weights a loader must return)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

ARCHS = ("llama", "mistral", "qwen2", "llama3", "smollm", "qwen3", "gemma3")
SPECIAL_TOKENS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]  # ids 0..3
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
    " + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The training text of the tiny tokenizer: plain English with numbers, punctuation and a little code.
TEXT = """\
The quality of a demonstration is judged by how much it helps a model answer the next question. A good example
is clear, short and correct; a poor one is vague, long or wrong. When we score an answer, we ask the model how
likely the continuation is, given the context, and we compare that with the likelihood without the example.
In 2024 there were 365 days in a normal year and 366 in a leap year; the ratio is 1.0027. Prices rose by 3.5%
in March, fell by 1.25% in April, and stayed at $19.99 through June. Call 555-0123 before 10:30 am.
Reading is a quiet way of thinking with someone else's mind. Writers who revise their drafts three or four
times often find that the final version is shorter than the first, and better for it. The judge reads both
responses, weighs their helpfulness, accuracy and depth, and then writes a verdict: [[A]], [[B]] or [[C]].
def score(context, continuation):
    total = 0.0
    for token in continuation:
        total += log_prob(token, context)
        context = context + [token]
    return total
Questions, answers and ratings from 1 to 10 are stored in a table with one row per example. The table is sorted
by the rating, then by the length of the answer, and the top ten rows are shown to the reader. "Why?" she asked.
"Because the model learns from the pattern of the examples, not only from their content," he replied.
Many hands make light work, but too many cooks spoil the broth. Every cloud has a silver lining. Time flies!
"""


def hf_config(arch: str = "llama", **overrides) -> dict:
    """A tiny config.json for `arch` (one of ARCHS)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose from {ARCHS}")
    model_type = {"llama3": "llama", "smollm": "llama"}.get(arch, arch)
    cls = {
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "gemma3": "Gemma3ForCausalLM",
    }[model_type]
    cfg = {
        "architectures": [cls],
        "model_type": model_type,
        "vocab_size": 384,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": arch in ("smollm", "qwen3", "gemma3"),
        "hidden_act": "silu",
        "bos_token_id": 0,
        "eos_token_id": [1, 3],
    }
    if model_type == "llama":
        cfg["attention_bias"] = False
    if model_type == "mistral":
        cfg["sliding_window"] = None
    if model_type == "qwen2":
        cfg.update(use_sliding_window=False, attention_bias=True)
    if model_type == "qwen3":  # per-head q/k norms, no qkv bias, its own rope base
        cfg.update(use_sliding_window=False, attention_bias=False, rope_theta=1000000.0)
    if model_type == "gemma3":  # a window shorter than most prompts, local and global layers, a query scale
        # other than head_dim, each layer type with its own rope base
        del cfg["hidden_act"]
        cfg.update(
            model_type="gemma3_text",
            hidden_activation="gelu_pytorch_tanh",
            num_hidden_layers=3,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            sliding_window=8,
            query_pre_attn_scalar=24,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            attention_bias=False,
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
            rms_norm_eps=1e-6,
        )
    if arch == "llama3":  # with head_dim 16 and an original context of 64, the three llama3 bands all occur
        cfg.update(
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    cfg.update(overrides)
    return cfg


def random_weights(
    cfg: dict, seed: int = 0, std: float = 0.05, device=None, dtype=torch.float32
) -> dict[str, torch.Tensor]:
    """HF-named weights (float32 on the CPU unless told: real model shapes are drawn on the GPU in bf16, as the
    GPU check does); norms are 1 + noise so a wrong norm weight shows in the outputs."""
    gen = torch.Generator(device=device or "cpu").manual_seed(seed)
    h, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def normal(*shape, scale=std):
        return torch.randn(*shape, generator=gen, device=device or "cpu", dtype=dtype) * scale

    w = {"model.embed_tokens.weight": normal(v, h, scale=2 * std), "model.norm.weight": 1 + normal(h, scale=0.1)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update(
            {
                p + "input_layernorm.weight": 1 + normal(h, scale=0.1),
                p + "post_attention_layernorm.weight": 1 + normal(h, scale=0.1),
                p + "self_attn.q_proj.weight": normal(q, h),
                p + "self_attn.k_proj.weight": normal(kv, h),
                p + "self_attn.v_proj.weight": normal(kv, h),
                p + "self_attn.o_proj.weight": normal(h, q),
                p + "mlp.gate_proj.weight": normal(inter, h),
                p + "mlp.up_proj.weight": normal(inter, h),
                p + "mlp.down_proj.weight": normal(h, inter),
            }
        )
        if cfg.get("attention_bias"):
            w.update(
                {
                    p + "self_attn.q_proj.bias": normal(q),
                    p + "self_attn.k_proj.bias": normal(kv),
                    p + "self_attn.v_proj.bias": normal(kv),
                }
            )
        if cfg["model_type"] == "qwen3":  # far from 1, so that a missing or misplaced q/k norm shows
            w.update(
                {
                    p + "self_attn.q_norm.weight": 1 + normal(hd, scale=0.5),
                    p + "self_attn.k_norm.weight": 1 + normal(hd, scale=0.5),
                }
            )
        if cfg["model_type"] == "gemma3_text":  # Gemma stores w and applies (1 + w): noise around 0, q/k far from it
            w.update(
                {
                    p + "self_attn.q_norm.weight": normal(hd, scale=0.5),
                    p + "self_attn.k_norm.weight": normal(hd, scale=0.5),
                    p + "pre_feedforward_layernorm.weight": normal(h, scale=0.1),
                    p + "post_feedforward_layernorm.weight": normal(h, scale=0.1),
                }
            )
            for name in ("input_layernorm", "post_attention_layernorm"):
                w[p + name + ".weight"] -= 1
    if cfg["model_type"] == "gemma3_text":
        w["model.norm.weight"] -= 1
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(v, h, scale=2 * std)
    return w


def train_tokenizer(vocab_size: int, text: str = TEXT, exact: bool = True):
    """A byte-level BPE with exactly `vocab_size` tokens (at most that many when not `exact`), trained on `text`
    (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(text.splitlines(keepends=True), trainer)
    if exact and tok.get_vocab_size() != vocab_size:
        raise ValueError(f"the tiny tokenizer text only yields {tok.get_vocab_size()} tokens, not {vocab_size}")
    # As for Llama, HF's own tokenizer adds BOS; engine.tokenizer.Tokenizer.encode never does.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)]
    )
    return tok


def make_tiny_model(path, arch: str = "llama", seed: int = 0, **config_overrides) -> Path:
    """Write a tiny random HF model directory for `arch` at `path` and return the path."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(arch, **config_overrides)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(random_weights(cfg, seed), str(path / "model.safetensors"))
    train_tokenizer(cfg["vocab_size"]).save(str(path / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "add_bos_token": True,
        "chat_template": CHATML_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    return path


# --- GGUF ------------------------------------------------------------------------------------------------------

# Block types gguf-py cannot quantize: random blocks are written instead, with their fp16 scales (at these byte
# offsets of each block) set so that values stay around +-0.1.
RANDOM_BLOCK_SCALES = {
    "Q2_K": ((80, 82), 2e-3),
    "Q3_K": ((108,), 8e-4),
    "Q4_K": ((0, 2), 1e-4),
    "Q5_K": ((0, 2), 5e-5),
    "Q6_K": ((208,), 2.5e-5),
    "IQ4_NL": ((0,), 1e-3),
}  # a type the engine does not load, for its error
_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}


_GEMMA3_GGUF_NAMES = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def gguf_name(hf_name: str, gemma3: bool = False) -> str:
    if hf_name in _GGUF_NAMES:
        return _GGUF_NAMES[hf_name]
    if gemma3 and hf_name.split(".", 3)[-1] in _GEMMA3_GGUF_NAMES:
        return gguf_name(hf_name.rsplit(".", 2)[0] + ".self_attn.q_norm.weight").replace(
            "attn_q_norm.weight", _GEMMA3_GGUF_NAMES[hf_name.split(".", 3)[-1]]
        )
    _, _, layer, rest = hf_name.split(".", 3)
    if rest.startswith("self_attn.") and rest[10] in "qkv" and rest[11:17] == "_proj.":
        return f"blk.{layer}.attn_{rest[10]}.{rest[17:]}"
    return f"blk.{layer}.{_GGUF_NAMES[rest]}"


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter: per head, interleave the two rotary halves of the rows (for its pairwise RoPE)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg: dict) -> np.ndarray:
    """The `rope_freqs.weight` llama.cpp's converter writes for Llama 3 rope scaling (divisors of each frequency)."""
    rs, hd = cfg["rope_scaling"], cfg["head_dim"]
    factors = []
    for freq in 1.0 / cfg["rope_theta"] ** (np.arange(0, hd, 2) / hd):
        wavelen = 2 * np.pi / freq
        low_wavelen = rs["original_max_position_embeddings"] / rs["low_freq_factor"]
        high_wavelen = rs["original_max_position_embeddings"] / rs["high_freq_factor"]
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(rs["factor"])
        else:
            smooth = (rs["original_max_position_embeddings"] / wavelen - rs["low_freq_factor"]) / (
                rs["high_freq_factor"] - rs["low_freq_factor"]
            )
            factors.append(1 / ((1 - smooth) / rs["factor"] + smooth))
    return np.array(factors, dtype=np.float32)


def reference_dequantize(blocks: np.ndarray, qtype: str, shape) -> torch.Tensor:
    """Dequantize with an implementation other than gguf-py's where one exists: transformers' torch kernels
    (Q4_0, Q4_1, Q8_0, K-quants); gguf-py's own for Q5_0 and Q5_1, which transformers lacks."""
    import gguf
    from transformers.integrations.gguf import dequant

    type_id = int(gguf.GGMLQuantizationType[qtype])
    if type_id in dequant.GGML_BLOCK:
        return dequant.dequantize(torch.from_numpy(blocks.copy()).flatten(), type_id).reshape(shape)
    return torch.from_numpy(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype])).reshape(shape)


def _encode_tensor(w: torch.Tensor, qtype: str, rng: np.random.Generator):
    """(array to write, GGML type, the float32 tensor a reader must get back)."""
    import gguf

    if w.ndim == 1 or qtype == "F32":
        return w.numpy(), gguf.GGMLQuantizationType.F32, w
    if qtype == "F16":
        return w.numpy().astype(np.float16), gguf.GGMLQuantizationType.F16, w.half().float()
    kind = gguf.GGMLQuantizationType[qtype]
    if qtype == "BF16":
        return gguf.quants.quantize(w.numpy(), kind), kind, w.bfloat16().float()
    if qtype in RANDOM_BLOCK_SCALES:
        offsets, scale = RANDOM_BLOCK_SCALES[qtype]
        block_elems, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        rows, cols = w.shape
        blocks = rng.integers(0, 256, (rows, cols // block_elems, block_bytes), dtype=np.uint8)
        for off in offsets:
            d = rng.uniform(0.5 * scale, scale, blocks.shape[:2]).astype(np.float16)
            blocks[:, :, off : off + 2] = d[..., None].view(np.uint8)
        blocks = blocks.reshape(rows, -1)
    else:
        blocks = gguf.quants.quantize(w.numpy(), kind)
    return blocks, kind, reference_dequantize(blocks, qtype, tuple(w.shape))


def make_tiny_gguf(
    path, arch: str = "llama", qtype: str = "F32", seed: int = 0, vocab: str = "bpe", **config_overrides
):
    """Write a tiny random GGUF the way llama.cpp's converter would (Q/K rows permuted for llama, norms and
    biases in F32, every matrix in `qtype`, ChatML template). `arch`: llama, mistral, llama3 (rope_freqs.weight),
    smollm (tied embeddings) -> GGUF arch llama; qwen2. K-quant types widen the model to 256-wide rows.
    `vocab`: "bpe" (byte-level, the tokenizer.json of make_tiny_model) or "spm" (SentencePiece with byte tokens).
    Returns (path, the HF-layout float32 weights a loader must return)."""
    import gguf

    path = Path(path)
    if qtype in RANDOM_BLOCK_SCALES:
        config_overrides = {"hidden_size": 256, "intermediate_size": 512, "head_dim": 64, **config_overrides}
    cfg = hf_config(arch, **config_overrides)
    gemma3 = cfg["model_type"] == "gemma3_text"
    gguf_arch = "gemma3" if gemma3 else cfg["model_type"] if cfg["model_type"] in ("qwen2", "qwen3") else "llama"
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), gguf_arch)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if gemma3:  # llama.cpp writes the window; the layer pattern (every 6th global) and local rope base are implied
        w.add_sliding_window(cfg["sliding_window"])
    if vocab == "spm":
        _add_sentencepiece_vocab(w, cfg["vocab_size"])
    else:
        _add_vocab(w, train_tokenizer(cfg["vocab_size"]))
    expected = {}
    for name, tensor in random_weights(cfg, seed).items():
        data, kind, expected[name] = _encode_tensor(tensor, qtype, rng)
        if gguf_arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            data = llama_cpp_permute(data, cfg["num_attention_heads" if ".q_proj." in name else "num_key_value_heads"])
        if gemma3 and name.endswith("norm.weight"):  # llama.cpp's converter stores Gemma's norms as 1 + w
            data = data + 1
        w.add_tensor(gguf_name(name, gemma3), data, raw_dtype=kind)
    if arch == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, expected


def _add_vocab(w, tok) -> None:
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL_TOKENS else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    w.add_bos_token_id(SPECIAL_TOKENS.index("<s>"))
    w.add_eos_token_id(SPECIAL_TOKENS.index("</s>"))
    w.add_add_bos_token(True)
    w.add_chat_template(CHATML_TEMPLATE)


def _add_sentencepiece_vocab(w, vocab_size: int) -> None:
    """A llama-style SentencePiece vocabulary: <unk> <s> </s>, chat tokens, 256 byte tokens, then pieces trained
    on TEXT, each merged piece scored by its merge order (earlier = higher), as SentencePiece scores are."""
    from tokenizers import SentencePieceBPETokenizer

    specials = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    n_pieces = vocab_size - len(specials) - 256
    trainer = SentencePieceBPETokenizer()
    trainer.train_from_iterator(
        TEXT.splitlines(), vocab_size=n_pieces + 1, special_tokens=["<unk>"], show_progress=False
    )
    model = json.loads(trainer._tokenizer.to_str())["model"]
    pieces = [t for t in sorted(model["vocab"], key=model["vocab"].get) if t != "<unk>"]
    merged = {m if isinstance(m, str) else "".join(m): rank for rank, m in enumerate(model["merges"])}
    merged = {piece.replace(" ", ""): rank for piece, rank in merged.items()}
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + pieces
    scores = [0.0] * (len(specials) + 256) + [-float(merged.get(p, 1000 + i)) for i, p in enumerate(pieces)]
    types = [2] + [3] * (len(specials) - 1) + [6] * 256 + [1] * len(pieces)  # unknown, control, byte, normal
    assert len(tokens) == vocab_size, (len(tokens), vocab_size)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_space_prefix(True)
    w.add_chat_template(CHATML_TEMPLATE)
