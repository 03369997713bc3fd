"""Model hyper-parameters, read from an HF config.json or from GGUF metadata (same field names as HF).

A header is input: every size, id and rope parameter is checked when it is read (`ModelConfig.validate`), before
anything is allocated from it, against RANGES (the largest released Llama-family models, with room to spare) and
against the other fields; the message is one line naming the file, the field as the file spells it and the range.
(The weights' shapes are checked against the config next: engine/loader.py `check_weights`.)
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields

from .errors import UserError, did_you_mean

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
ROPE_TYPES = ("default", "linear", "llama3")

# ModelConfig's integer fields: (smallest, largest) a header may hold. The largest released models of the family
# have a vocabulary of 262,144, 16,384 hidden units, 53,248 MLP units, 126 layers, 128 heads of 256 dims and a
# context of 10M tokens; a larger number is a damaged or hostile header, not a model this engine can hold.
RANGES = {
    "vocab_size": (1, 1 << 22),
    "hidden_size": (1, 1 << 16),
    "intermediate_size": (1, 1 << 18),
    "num_layers": (1, 1024),
    "num_heads": (1, 1024),
    "num_kv_heads": (1, 1024),
    "head_dim": (2, 1024),
    "max_position": (1, 1 << 24),
    "sliding_window": (1, 1 << 24),
}
# float fields: (low, high, whether low itself is allowed)
NUMBER_RANGES = {
    "rms_norm_eps": (0.0, 0.5, False),
    "rope_theta": (1.0, 1e12, False),
    "rope_local_theta": (1.0, 1e12, False),
    "query_pre_attn_scalar": (0.0, 1e6, False),
}
MAX_ROPE_FACTOR = 1024.0
# the names config.json gives ModelConfig's fields (GGUF metadata names: engine/gguf_loader.py)
HF_NAMES = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "rms_norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "rope_scaling": "rope_scaling",
    "max_position": "max_position_embeddings",
    "sliding_window": "sliding_window",
    "sliding_layers": "layer_types",
    "rope_local_theta": "rope_local_base_freq",
    "query_pre_attn_scalar": "query_pre_attn_scalar",
    "bos_token_id": "bos_token_id",
    "eos_token_ids": "eos_token_id",
}


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_int(value, name: str, low: int, high: int, source: str) -> int:
    """`value` if it is an integer in low..high, else a one-line UserError naming `name` (the file's field)."""
    if not is_int(value) or not low <= value <= high:
        raise UserError(f"{name} must be an integer in {low:,}..{high:,}, got {_shown(value)}", source)
    return value


def check_number(value, name: str, low: float, high: float, source: str, low_included: bool = False) -> float:
    if not is_number(value) or not (low <= value if low_included else low < value) or value > high:
        interval = f"{'[' if low_included else '('}{low:g}, {high:g}]"
        raise UserError(f"{name} must be a number in {interval}, got {_shown(value)}", source)
    return float(value)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass
class ModelConfig:
    arch: str  # "llama" | "mistral" | "qwen2" | "qwen3" | "gemma3"
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
    qk_norm: bool = False  # per-head RMSNorm of queries and keys before RoPE (Qwen3, Gemma-3)
    # Gemma-3: keys with query position - key position >= sliding_window are masked on the layers marked True in
    # sliding_layers, which rotate with rope_local_theta (no scaling); attention scale query_pre_attn_scalar ** -0.5
    sliding_window: int | None = None
    sliding_layers: tuple[bool, ...] = ()
    rope_local_theta: float | None = None
    query_pre_attn_scalar: float | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_hf(cls, cfg: dict, source: str = "config.json") -> "ModelConfig":
        """The config of an HF config.json (a KeyError for a missing required key: the loader names it)."""
        if cfg.get("model_type") == "gemma3":  # the multimodal checkpoint: its weights are named otherwise
            raise UserError("multimodal gemma3 checkpoints are not supported; use a gemma3_text one", source)
        if cfg.get("model_type") == "gemma3_text":
            return cls._from_gemma3(cfg, source)
        arch = cfg.get("model_type", "")
        if arch not in SUPPORTED_ARCHS:
            raise UserError(
                f"unsupported architecture {_shown(arch)} (supported: {', '.join(SUPPORTED_ARCHS)})", source
            )
        if arch in ("qwen2", "qwen3") and cfg.get("use_sliding_window"):
            raise UserError(f"{arch} with use_sliding_window is not supported", source)
        return cls(
            arch=arch,
            **_hf_common(
                cfg, source, default_eps=1e-5, default_theta=10000.0, default_position=2048, default_head_dim=None
            ),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
            qk_norm=arch == "qwen3",
        ).validate(source)

    @classmethod
    def _from_gemma3(cls, cfg: dict, source: str) -> "ModelConfig":
        if cfg.get("final_logit_softcapping") or cfg.get("attn_logit_softcapping"):
            raise UserError("gemma3 with logit softcapping is not supported", source)
        if cfg.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise UserError(f"gemma3 hidden_activation {_shown(cfg['hidden_activation'])} is not supported", source)
        n = check_int(cfg["num_hidden_layers"], "num_hidden_layers", *RANGES["num_layers"], source)
        types = cfg.get("layer_types")
        if types is None:
            pattern = check_int(
                cfg.get("sliding_window_pattern", 6), "sliding_window_pattern", 1, RANGES["num_layers"][1], source
            )
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
        if (
            not isinstance(types, list)
            or len(types) != n
            or not all(t in ("sliding_attention", "full_attention") for t in types)
        ):
            raise UserError("gemma3 layer_types must name sliding_attention or full_attention for every layer", source)
        return cls(
            arch="gemma3",
            **_hf_common(
                cfg, source, default_eps=1e-6, default_theta=1000000.0, default_position=131072, default_head_dim=256
            ),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            qk_norm=True,
            sliding_window=cfg.get("sliding_window", 4096),
            sliding_layers=tuple(t == "sliding_attention" for t in types),
            rope_local_theta=cfg.get("rope_local_base_freq", 10000.0),
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar", 256),
        ).validate(source)

    @classmethod
    def from_dict(cls, d, source: str) -> "ModelConfig":
        """A config in its own field names (`dataclasses.asdict`'s form, as a server's /v1/tokenizer sends it),
        checked like a file's: a missing or unknown name, a value of the wrong type or out of range is a UserError."""
        if not isinstance(d, dict):
            raise UserError(f"the model config must be an object, got {_shown(d)}", source)
        known = {f.name: f for f in fields(cls)}
        for key in d:
            if key not in known:
                raise UserError(f"unknown model config field {_shown(key)}{did_you_mean(key, known)}", source)
        for f in known.values():
            if f.name not in d and f.default is MISSING and f.default_factory is MISSING:
                raise UserError(f"the model config has no {f.name}", source)
        if d["arch"] not in SUPPORTED_ARCHS:
            raise UserError(
                f"unsupported architecture {_shown(d['arch'])} (supported: {', '.join(SUPPORTED_ARCHS)})", source
            )
        layers = d.get("sliding_layers", ())
        flags = {k: d[k] for k in ("tie_embeddings", "attention_bias", "qk_norm") if k in d}
        if not isinstance(layers, (list, tuple)) or not all(isinstance(v, bool) for v in [*layers, *flags.values()]):
            raise UserError(
                "the model config's flags (tie_embeddings, attention_bias, qk_norm, sliding_layers) must be booleans",
                source,
            )
        return cls(**{**d, "sliding_layers": tuple(layers)}).validate(source, names={})

    def validate(self, source: str, names: dict[str, str] = HF_NAMES) -> "ModelConfig":
        """Every field in its range and consistent with the others (module doc); `names`: how the file calls each
        field, for the messages. Returns self."""

        def name(f: str) -> str:
            return names.get(f, f)

        for f, (low, high) in RANGES.items():
            if f != "sliding_window":  # (at most the context: below)
                check_int(getattr(self, f), name(f), low, high, source)
        if self.num_kv_heads > self.num_heads or self.num_heads % self.num_kv_heads:
            raise UserError(
                f"{name('num_heads')} {self.num_heads} is not a multiple of {name('num_kv_heads')} {self.num_kv_heads}",
                source,
            )
        if self.head_dim % 2:
            raise UserError(
                f"{name('head_dim')} must be even (rotary embeddings turn pairs of dimensions), got {self.head_dim}",
                source,
            )
        if self.sliding_window is not None:
            check_int(self.sliding_window, name("sliding_window"), 1, self.max_position, source)
        for f, (low, high, low_included) in NUMBER_RANGES.items():
            value = getattr(self, f)
            if value is not None or f not in ("rope_local_theta", "query_pre_attn_scalar"):
                check_number(value, name(f), low, high, source, low_included)
        if self.sliding_layers and len(self.sliding_layers) != self.num_layers:
            raise UserError(
                f"{name('sliding_layers')} has {len(self.sliding_layers)} entries for {self.num_layers} layers", source
            )
        top = self.vocab_size - 1
        if self.bos_token_id is not None:
            check_int(self.bos_token_id, name("bos_token_id"), 0, top, source)
        if not isinstance(self.eos_token_ids, list):
            raise UserError(f"{name('eos_token_ids')} must be a token id or a list of them", source)
        for token in self.eos_token_ids:
            check_int(token, name("eos_token_ids"), 0, top, source)
        self._check_rope_scaling(name("rope_scaling"), source)
        return self

    def _check_rope_scaling(self, key: str, source: str) -> None:
        s = self.rope_scaling
        if s is None:
            return
        if not isinstance(s, dict):
            raise UserError(f"{key} must be an object or null, got {_shown(s)}", source)
        kind = s.get("rope_type", s.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise UserError(f"{key}: unsupported rope type {_shown(kind)} (supported: {', '.join(ROPE_TYPES)})", source)
        if kind == "default":
            return
        check_number(s.get("factor"), f"{key}.factor", 1.0, MAX_ROPE_FACTOR, source, low_included=True)
        if kind == "llama3":
            low = check_number(s.get("low_freq_factor"), f"{key}.low_freq_factor", 0.0, MAX_ROPE_FACTOR, source)
            check_number(s.get("high_freq_factor"), f"{key}.high_freq_factor", low, MAX_ROPE_FACTOR, source)
            check_number(
                s.get("original_max_position_embeddings"),
                f"{key}.original_max_position_embeddings",
                0.0,
                float(RANGES["max_position"][1]),
                source,
            )

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    def to_hf(self) -> dict:
        """The equivalent HF config.json dict (used to build reference models in tests)."""
        hf_arch = {
            "llama": "LlamaForCausalLM",
            "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM",
            "gemma3": "Gemma3ForCausalLM",
        }
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
        if self.arch == "gemma3":
            del d["hidden_act"]
            d.update(
                model_type="gemma3_text",
                hidden_activation="gelu_pytorch_tanh",
                attention_bias=self.attention_bias,
                sliding_window=self.sliding_window,
                layer_types=["sliding_attention" if s else "full_attention" for s in self.sliding_layers],
                rope_local_base_freq=self.rope_local_theta,
                query_pre_attn_scalar=self.query_pre_attn_scalar,
                final_logit_softcapping=None,
                attn_logit_softcapping=None,
            )
        return d


def token_ids(value, key: str, source: str) -> list:
    """A token id or a list of them (None: none); their range is checked by ModelConfig.validate."""
    if value is None:
        return []
    if is_int(value):
        return [value]
    if isinstance(value, list):
        return list(value)
    raise UserError(f"{key} must be a token id or a list of them, got {_shown(value)}", source)


def _hf_common(
    cfg: dict,
    source: str,
    *,
    default_eps: float,
    default_theta: float,
    default_position: int,
    default_head_dim: int | None,
) -> dict:
    """The ModelConfig fields every config.json architecture spells alike (a KeyError for a missing one). The head
    count is checked first: the head size may be derived from it."""
    heads = check_int(cfg["num_attention_heads"], "num_attention_heads", *RANGES["num_heads"], source)
    kv_heads = cfg.get("num_key_value_heads")
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        head_dim = (
            default_head_dim or check_int(cfg["hidden_size"], "hidden_size", *RANGES["hidden_size"], source) // heads
        )
    return dict(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=heads if kv_heads is None else kv_heads,
        head_dim=head_dim,
        rms_norm_eps=cfg.get("rms_norm_eps", default_eps),
        rope_theta=cfg.get("rope_theta", default_theta),
        rope_scaling=cfg.get("rope_scaling"),
        max_position=cfg.get("max_position_embeddings", default_position),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=token_ids(cfg.get("eos_token_id"), "eos_token_id", source),
    )
