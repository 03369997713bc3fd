"""An OpenAI-compatible scoring server on the engine loop: `create_app(engine)` (FastAPI), run by
`python -m engine serve`. FastAPI is imported on first use of `create_app`, so the other commands never need it."""


def __getattr__(name):
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)


__all__ = ["create_app"]
