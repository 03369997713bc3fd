"""Prefix-sharing Llama-family inference engine: continuation log-probs and generation on a paged KV cache.

The names below are imported on first use (PEP 562), so that `engine.errors` and the other light modules load
without torch: a command line answers `--help` and argument errors before any model code is imported."""

from importlib import import_module

_EXPORTS = {
    "Engine": "engine",
    "Generation": "engine",
    "RequestHandle": "engine",
    "ScoreResult": "engine",
    "TokenEvent": "engine",
    "UserError": "errors",
    "EngineProtocol": "protocol",
    "JobEngine": "protocol",
    "EngineStats": "stats",
    "RequestError": "validation",
}

__all__ = [
    "Engine",
    "ScoreResult",
    "Generation",
    "TokenEvent",
    "RequestHandle",
    "UserError",
    "RequestError",
    "EngineStats",
    "EngineProtocol",
    "JobEngine",
]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
