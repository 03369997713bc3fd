"""An OpenAI-compatible scoring server on the engine loop: `create_app(engine)` (FastAPI), run by
`python -m engine serve`. FastAPI is imported on first use of `create_app`, so the other commands never need it."""

DEFAULT_MAX_TOKENS = 512  # a chat request without max_tokens generates at most this many (and what its context holds)


def __getattr__(name):
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)


__all__ = ["create_app"]
