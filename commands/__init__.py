"""The application layer above the engine: the `python -m engine` command line and `serve`, their argument helpers
and engine factory, table/JSONL I/O with output locks, models by name, and the Ray score runner. It imports the
engine; the engine never imports it (tests/test_layering.py)."""
