"""User-facing errors: one line, printed by the CLIs as `error: ...`, exit status 2."""

import difflib


class UserError(Exception):
    """Bad input from the user (a file, a flag, a request). The message is one line and says what is wrong."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        if path is not None and not str(path).isprintable():  # a newline in a file name must not split the line
            path = ascii(str(path))[1:-1]
        where = f"{path}:{line}: " if path is not None and line is not None else f"{path}: " if path else ""
        super().__init__(f"{where}{message}")
        self.path, self.line = path, line


class EngineFailure(RuntimeError):
    """An internal failure (an engine bug, not the caller's input): the requests it hit fail with it, and a server
    answers 500."""


def did_you_mean(word, known) -> str:
    """' (did you mean 'labels'?)' for a close known name (difflib), else '': for the message of an unknown name."""
    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
