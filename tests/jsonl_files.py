"""Writing JSONL input files for the command-line tests."""
import json


def write_jsonl(path, rows) -> str:
    """rows as one JSON object per line at path; returns the path as a string (a command-line argument)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
