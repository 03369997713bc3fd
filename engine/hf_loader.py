"""Load a Hugging Face model directory: config.json, safetensors weights (single or sharded), tokenizer.json.

Weights come back as stored (names and layout are already HF's), as a LazyWeights: safetensors tensors are read
one at a time with pread (no mapping of the file, so no page of it stays resident) when the model asks for them.
`.bin` checkpoints are read only with `torch.load(weights_only=True, mmap=True)`: nothing is ever unpickled.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import ModelConfig, check_int, token_ids
from .errors import UserError
from .tokenizer import MAX_TOKENIZER_BYTES, Tokenizer, check_tokenizer, end_of_generation_ids, rust_errors
from .weights import LazyWeights


def load_hf_dir(path: str | Path) -> tuple[ModelConfig, LazyWeights, Tokenizer]:
    path = Path(path)
    config = _load_config(path)
    weights = _load_weights(path)
    return config, weights, _load_tokenizer(path, config)


def load_hf_info(path: str | Path) -> tuple[ModelConfig, Tokenizer]:
    """The config and tokenizer of an HF model directory; the weight files are not opened."""
    path = Path(path)
    config = _load_config(path)
    return config, _load_tokenizer(path, config)


def load_hf_config(path: str | Path) -> ModelConfig:
    """The checked config of an HF model directory (nothing else is read)."""
    return _load_config(Path(path))


def _load_config(path: Path) -> ModelConfig:
    if not path.is_dir():
        raise UserError("no such model directory", str(path))
    try:
        return ModelConfig.from_hf(_hf_config(path), source=str(path / "config.json"))
    except KeyError as e:
        raise UserError(f"config.json lacks {e}", str(path / "config.json")) from None
    except (TypeError, ValueError, ZeroDivisionError) as e:  # e.g. "num_attention_heads": 0 or "64"
        raise UserError(f"a config value of the wrong type or range ({e})", str(path / "config.json")) from None


def _read_json(path: Path, required: bool = True) -> dict | None:
    if not path.is_file():
        if required:
            raise UserError(f"missing {path.name}", str(path.parent))
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        raise UserError(f"not valid JSON: {e}", str(path)) from None
    except OSError as e:
        raise UserError(f"cannot read: {e.strerror or e}", str(path)) from None
    if not isinstance(value, dict):
        raise UserError(f"expected a JSON object, got {type(value).__name__}", str(path))
    return value


def _hf_config(path: Path) -> dict:
    cfg = _read_json(path / "config.json")
    # transformers >= 5 writes `rope_parameters` (theta + scaling in one dict) instead of rope_theta/rope_scaling.
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict):  # per layer type (Gemma-3)
        cfg = dict(cfg)
        full, local = rope["full_attention"], rope.get("sliding_attention") or {}
        cfg.setdefault("rope_theta", full.get("rope_theta", 1000000.0))
        cfg.setdefault("rope_local_base_freq", local.get("rope_theta", 10000.0))
        if full.get("rope_type", "default") != "default":
            cfg.setdefault("rope_scaling", {k: v for k, v in full.items() if k != "rope_theta"})
    elif isinstance(rope, dict):
        cfg = dict(cfg)
        cfg.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
        if rope.get("rope_type", "default") != "default":
            cfg.setdefault("rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"})
    return cfg


def _load_weights(path: Path) -> LazyWeights:
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = _read_json(path / index_name, required=False)
        if index is not None:
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise UserError("index has no weight_map (tensor name -> shard file)", str(path / index_name))
            files = [
                _shard_file(path, name, str(path / index_name)) for name in sorted(set(map(str, weight_map.values())))
            ]
            return _lazy_weights(files)
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (path / name).is_file():
            return _lazy_weights([path / name])
    raise UserError("no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin)", str(path))


def _shard_file(path: Path, name: str, index: str) -> Path:
    """The shard an index names, which must lie inside the model directory: a name with `..`, an absolute path or
    a symlink leading elsewhere is refused (an index must not make the loader read arbitrary files). In a Hugging
    Face hub cache, snapshot files are symlinks to the repository's blobs/, which counts as inside."""
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise UserError(f"shard {name!r} is outside the model directory", index)
    file = path / name
    root = path.resolve()
    if root.parent.name == "snapshots":  # <cache>/models--org--name/snapshots/<revision>/ -> ../../blobs/<hash>
        root = root.parent.parent
    if not file.resolve().is_relative_to(root):
        raise UserError(f"shard {name!r} links outside the model directory (to {file.resolve()})", index)
    return file


def _lazy_weights(files: list[Path]) -> LazyWeights:
    """The tensors of all shards by name (RoPE frequency buffers of older checkpoints left out: they are
    recomputed from the config), read when asked for."""
    shapes, readers = {}, {}
    for file in files:
        read = _shard_reader(file)
        for name, shape in read.shapes.items():
            if not name.endswith("rotary_emb.inv_freq"):
                shapes[name], readers[name] = shape, read
    return LazyWeights(shapes, lambda name, dtype: readers[name](name))  # read as stored, cast after


class _Safetensors:
    """One safetensors shard, opened for pread: its header is checked now, each tensor read when called."""

    def __init__(self, file: Path):
        from safetensors import SafetensorError, safe_open

        self.file = file
        try:
            self.handle = safe_open(str(file), framework="pt", backend="pread")
            self.shapes = {name: tuple(self.handle.get_slice(name).get_shape()) for name in self.handle.keys()}
        except (SafetensorError, OSError) as e:
            raise UserError(f"not a readable safetensors file ({e})", str(file)) from None

    def __call__(self, name: str) -> torch.Tensor:
        return self.handle.get_tensor(name)


class _TorchCheckpoint:
    """One `.bin` shard: torch.load(weights_only=True) over a memory map of the file."""

    def __init__(self, file: Path):
        try:
            state = torch.load(str(file), map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # pickle.UnpicklingError for anything beyond plain tensors, RuntimeError if corrupt
            raise UserError(
                f"cannot read as a plain tensor checkpoint (weights_only=True): {e}".splitlines()[0], str(file)
            ) from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise UserError("checkpoint is not a name -> tensor dict", str(file))
        self.state = state
        self.shapes = {name: tuple(t.shape) for name, t in state.items()}

    def __call__(self, name: str) -> torch.Tensor:
        return self.state[name].clone()


def _shard_reader(file: Path):
    if not file.is_file():
        raise UserError("missing weight shard", str(file))
    return _Safetensors(file) if file.suffix == ".safetensors" else _TorchCheckpoint(file)


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _load_tokenizer(path: Path, config: ModelConfig) -> Tokenizer:
    import tokenizers

    file = path / "tokenizer.json"
    if not file.is_file():
        raise UserError("missing tokenizer.json (only fast tokenizers are supported)", str(path))
    if file.stat().st_size > MAX_TOKENIZER_BYTES:
        raise UserError(f"larger than the {MAX_TOKENIZER_BYTES >> 20} MiB a tokenizer.json may hold", str(file))
    with rust_errors("not a readable tokenizer.json", str(file)):
        backend = tokenizers.Tokenizer.from_file(str(file))
    spec = json.loads(backend.to_str())
    check_tokenizer(backend, config.vocab_size, str(file), spec)
    tok_cfg = _read_json(path / "tokenizer_config.json", required=False) or {}
    gen_cfg = _read_json(path / "generation_config.json", required=False) or {}

    bos_text = _token_text(tok_cfg.get("bos_token"))
    bos_id = backend.token_to_id(bos_text) if bos_text else None
    bos_id = config.bos_token_id if bos_id is None else bos_id
    eos_text = _token_text(tok_cfg.get("eos_token"))
    gen_file = str(path / "generation_config.json")
    gen_eos = [
        check_int(i, "eos_token_id", 0, config.vocab_size - 1, gen_file)
        for i in token_ids(gen_cfg.get("eos_token_id"), "eos_token_id", gen_file)
    ]
    declared = list(config.eos_token_ids) + gen_eos + [backend.token_to_id(eos_text) if eos_text else None]
    add_bos = tok_cfg.get("add_bos_token")
    if add_bos is None:
        add_bos = _post_processor_adds_bos(spec.get("post_processor"), bos_text)
    return Tokenizer(
        backend,
        bos_id=bos_id,
        eos_ids=end_of_generation_ids(backend, declared),
        add_bos=bool(add_bos),
        chat_template=_chat_template(path, tok_cfg),
        source=str(file),
    )


def _post_processor_adds_bos(proc: dict | None, bos_text: str | None) -> bool:
    """Fast tokenizers add BOS through a TemplateProcessing post-processor (e.g. Llama 3: `<|begin_of_text|> $A`)."""
    if not proc or not bos_text:
        return False
    if proc.get("type") == "Sequence":
        return any(_post_processor_adds_bos(p, bos_text) for p in proc.get("processors", []))
    if proc.get("type") != "TemplateProcessing" or not proc.get("single"):
        return False
    first = proc["single"][0]
    return first.get("SpecialToken", {}).get("id") == bos_text


def _chat_template(path: Path, tok_cfg: dict) -> str | None:
    jinja = path / "chat_template.jinja"  # where transformers >= 4.43 may save it
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tok_cfg.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default", next(iter(named.values()), None))
    return template
