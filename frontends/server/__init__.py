"""An OpenAI-compatible scoring server on the engine loop: `frontends.server.app.create_app(engine)` (FastAPI), run by
`python -m engine serve`. Nothing is imported here, so the command line reads the server's bounds (limits.py) without
importing FastAPI."""
