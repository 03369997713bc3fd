"""Model hyper-parameters, read from an HF config.json or from GGUF metadata (same field names as HF)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UserError

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class ModelConfig:
    arch: str  # "llama" | "mistral" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # HF form, e.g. {"rope_type": "llama3", "factor": 8.0, ...}
    max_position: int = 2048
    tie_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # per-head RMSNorm of queries and keys before RoPE (Qwen3)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "ModelConfig":
        arch = cfg.get("model_type", "")
        if arch not in SUPPORTED_ARCHS:
            raise UserError(f"unsupported architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})", source)
        if arch in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
            raise UserError(f"{arch} with use_sliding_window is not supported", source)
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        return cls(
            arch=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=cfg.get("rope_theta", 10000.0),
            rope_scaling=cfg.get("rope_scaling"),
            max_position=cfg.get("max_position_embeddings", 2048),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
            qk_norm=arch == "qwen3",
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos,
        )

    def to_hf(self) -> dict:
        """The equivalent HF config.json dict (used to build reference models in tests)."""
        hf_arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                   "qwen3": "Qwen3ForCausalLM"}
        d = {
            "architectures": [hf_arch[self.arch]],
            "model_type": self.arch,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position,
            "tie_word_embeddings": self.tie_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else self.eos_token_ids or None,
            "hidden_act": "silu",
        }
        if self.arch in ("llama", "qwen3"):
            d["attention_bias"] = self.attention_bias
        if self.arch == "qwen3":
            d["use_sliding_window"] = False
        return d
