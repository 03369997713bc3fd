"""An OpenAI-compatible scoring server on the engine loop: `create_app(engine)` (FastAPI), run by
`python -m engine serve`."""
from .app import create_app

__all__ = ["create_app"]
