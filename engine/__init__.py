"""Prefix-sharing Llama-family inference engine: continuation log-probs and generation on a paged KV cache."""
from .engine import Engine, Generation, RequestHandle, ScoreResult, TokenEvent
from .errors import UserError
from .protocol import EngineProtocol, JobEngine
from .stats import EngineStats
from .requests import RequestError

__all__ = ["Engine", "ScoreResult", "Generation", "TokenEvent", "RequestHandle", "UserError", "RequestError",
           "EngineStats", "EngineProtocol", "JobEngine"]
