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

ARCHS = ("llama", "mistral", "qwen2", "llama3", "smollm")
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
    """A tiny config.json for `arch` (llama | mistral | qwen2 | llama3 | smollm)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; choose from {ARCHS}")
    model_type = {"llama3": "llama", "smollm": "llama"}.get(arch, arch)
    cls = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}[model_type]
    cfg = {
        "architectures": [cls], "model_type": model_type, "vocab_size": 384, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": arch == "smollm", "hidden_act": "silu", "bos_token_id": 0, "eos_token_id": [1, 3],
    }
    if model_type == "llama":
        cfg["attention_bias"] = False
    if model_type == "mistral":
        cfg["sliding_window"] = None
    if model_type == "qwen2":
        cfg.update(use_sliding_window=False, attention_bias=True)
    if arch == "llama3":  # with head_dim 16 and an original context of 64, the three llama3 bands all occur
        cfg.update(rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})
    cfg.update(overrides)
    return cfg


def random_weights(cfg: dict, seed: int = 0, std: float = 0.05) -> dict[str, torch.Tensor]:
    """HF-named float32 weights; norms are 1 + noise so a wrong norm weight shows in the outputs."""
    gen = torch.Generator().manual_seed(seed)
    h, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def normal(*shape, scale=std):
        return torch.randn(*shape, generator=gen) * scale

    w = {"model.embed_tokens.weight": normal(v, h, scale=2 * std), "model.norm.weight": 1 + normal(h, scale=0.1)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update({
            p + "input_layernorm.weight": 1 + normal(h, scale=0.1),
            p + "post_attention_layernorm.weight": 1 + normal(h, scale=0.1),
            p + "self_attn.q_proj.weight": normal(q, h), p + "self_attn.k_proj.weight": normal(kv, h),
            p + "self_attn.v_proj.weight": normal(kv, h), p + "self_attn.o_proj.weight": normal(h, q),
            p + "mlp.gate_proj.weight": normal(inter, h), p + "mlp.up_proj.weight": normal(inter, h),
            p + "mlp.down_proj.weight": normal(h, inter),
        })
        if cfg.get("attention_bias"):
            w.update({p + "self_attn.q_proj.bias": normal(q), p + "self_attn.k_proj.bias": normal(kv),
                      p + "self_attn.v_proj.bias": normal(kv)})
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(v, h, scale=2 * std)
    return w


def train_tokenizer(vocab_size: int):
    """A byte-level BPE with exactly `vocab_size` tokens, trained on TEXT (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT.splitlines(keepends=True), trainer)
    if tok.get_vocab_size() != vocab_size:
        raise ValueError(f"the tiny tokenizer text only yields {tok.get_vocab_size()} tokens, not {vocab_size}")
    # As for Llama, HF's own tokenizer adds BOS; engine.tokenizer.Tokenizer.encode never does.
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 0)])
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
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
               "add_bos_token": True, "chat_template": CHATML_TEMPLATE}
    (path / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    return path
