"""Request files in and result files out, JSONL or Parquet, chosen by the name: a path ending in `.parquet` is
Parquet, any other JSONL (commands.jsonl). Used by `python -m engine score`, local and `--ray`.

Input. A Parquet input (a file, or a folder of Parquet files such as a previous output or Ray Data's
`write_parquet`) is read with pyarrow, the reader under Ray Data's `read_parquet`. Before any work: it must be
readable Parquet, the text columns (`context`, `continuation`) must be there and of string type (each a one-line
error naming the file), and every row must pass the same checks as a JSONL line, its error naming `file:row N`
(N counted from 1, as lines are). Rows are (where, row) pairs: where is the line number (JSONL) or `row N`.

Output. Every input field passes through, followed by the result fields (RESULT_TYPES). A Parquet output is a
folder of part files `part-000000.parquet`, `part-000001.parquet`, ... in input order (one table to pyarrow, pandas,
Ray Data and Spark), each written whole under a hidden temporary name and then renamed, so a killed run leaves only
complete parts and a rerun resumes after them, as it does after a JSONL output's complete lines. Its columns keep
the input's Parquet types (a JSONL input's are inferred from all its rows before any work); a Parquet input written
as JSONL must hold JSON values only (checked before any work).
"""

from __future__ import annotations

import math
import os
import re

from engine.errors import UserError

from .cli_args import check_output_file
from .jsonl import ResultWriter, dump_line, read_jsonl
from .jsonl import read_results as read_jsonl_results
from .output_lock import FolderLock

PART = re.compile(r"part-(\d{6,})\.parquet")
ROWS_PER_PART = 256


RESULT_FIELDS = ("logprob", "token_logprobs", "num_tokens", "is_greedy")  # what `python -m engine score` adds


def result_types():
    """RESULT_FIELDS with their Parquet types."""
    import pyarrow as pa

    types = (pa.float64(), pa.list_(pa.float64()), pa.int64(), pa.bool_())
    return dict(zip(RESULT_FIELDS, types))


def write_result(out, row: dict, res, input_path: str, where) -> None:
    """Appends an input row with its ScoreResult's RESULT_FIELDS to `out`. A NaN or infinite log-prob is never
    written (strict JSON): a UserError at the input row, the rows before it kept."""
    try:
        out.write({**row, **{k: getattr(res, k) for k in RESULT_FIELDS}})
    except ValueError:
        raise UserError(
            f"log-prob {res.logprob} is not finite (corrupt weights?); the rows before it are kept", input_path, where
        ) from None


def is_parquet(path) -> bool:
    return str(path).lower().rstrip("/").endswith(".parquet")


# ---- input ------------------------------------------------------------------------------------------------------
def read_rows(path, text_fields: tuple[str, ...], validate):
    """((where, row) pairs, the Parquet schema or None for JSONL); every row checked by `validate` (row -> message
    or None) before any work."""
    path = str(path)
    if not is_parquet(path):
        return read_jsonl(path, validate=validate, with_lines=True), None
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not os.path.exists(path):
        raise UserError("no such file", path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"not a readable Parquet file ({str(e).splitlines()[0]})", path) from None
    for name in text_fields:
        if name not in table.column_names:
            raise UserError(f"missing column {name!r} (columns: {', '.join(table.column_names)})", path)
        kind = table.schema.field(name).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise UserError(f"column {name!r} is of type {kind}, expected string", path)
    rows = []
    for n, row in enumerate(table.to_pylist(), 1):
        problem = validate(row)
        if problem:
            raise UserError(problem, path, f"row {n}")
        rows.append((f"row {n}", row))
    return rows, table.schema


# ---- output -----------------------------------------------------------------------------------------------------
def check_output(output: str, input_path: str, rows, schema):
    """Before any work: `output` can be written, and the rows can be written to it. Returns the output's Parquet
    schema (None for JSONL)."""
    if not is_parquet(output):
        check_output_file(output, (input_path,))
        if schema is not None:  # Parquet in, JSONL out
            for where, row in rows:
                try:
                    dump_line(row)
                except (TypeError, ValueError) as e:
                    raise UserError(
                        f"cannot be written to a JSONL output ({e}); write Parquet instead", input_path, where
                    ) from None
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    if os.path.exists(output) and not os.path.isdir(output):
        raise UserError(
            "exists and is a file: a Parquet output is a folder of part files (remove it or choose another name)",
            output,
        )
    if os.path.isdir(output):
        if os.path.exists(input_path) and os.path.samefile(input_path, output):
            raise UserError("is also the input; expected a separate output", output)
        stray = sorted(n for n in os.listdir(output) if not PART.fullmatch(n) and not n.startswith("."))
        if stray:
            raise UserError(
                f"holds {stray[0]!r}, not a part file of this command's output (choose another name)", output
            )
        check_output_file(os.path.join(output, "part-000000.parquet"), (input_path,))  # the folder is writable
    else:
        check_output_file(output, (input_path,))
    try:
        if schema is None:  # JSONL in: the columns' types from every row
            schema = pa.Table.from_pylist([row for _, row in rows]).schema
        extra = result_types()
        schema = pa.schema([f for f in schema if f.name not in extra] + [pa.field(k, t) for k, t in extra.items()])
        pq.write_table(schema.empty_table(), pa.BufferOutputStream())  # a type Parquet cannot hold fails here
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
        raise UserError(
            f"the rows do not make one Parquet table ({str(e).splitlines()[0]}); write JSONL instead", input_path
        ) from None
    return schema


def _parts(folder: str) -> list[str]:
    found = [(int(m.group(1)), n) for n in os.listdir(folder) if (m := PART.fullmatch(n))]
    return [os.path.join(folder, n) for _, n in sorted(found)]


def read_results(output) -> list[dict]:
    """The rows an output holds ([] if absent): a JSONL output's complete lines, a Parquet output's parts."""
    output = str(output)
    if not is_parquet(output):
        return read_jsonl_results(output)
    if not os.path.isdir(output):
        return []
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for part in _parts(output):
        try:
            rows += pq.read_table(part).to_pylist()
        except (pa.ArrowException, OSError) as e:
            raise UserError(
                f"not a readable Parquet file ({str(e).splitlines()[0]}); remove the folder to start over", part
            ) from None
    return rows


class ParquetParts:
    """An append-only Parquet output: `write(row)` buffers, every ROWS_PER_PART rows (and on close) the buffer
    becomes the next part file. A row whose log-prob is not finite raises ValueError, as the JSONL writer does."""

    def __init__(self, path: str, schema, rows_per_part: int = ROWS_PER_PART):
        self.path, self.schema, self.rows_per_part = str(path), schema, rows_per_part
        self.buffer: list[dict] = []
        self._created = not os.path.isdir(self.path)
        os.makedirs(self.path, exist_ok=True)
        self._lock = FolderLock(self.path)  # a second writer of this folder stops naming the holder
        self.parts = len(_parts(self.path))
        for name in os.listdir(self.path):  # what a killed write left under its temporary name
            if name.startswith(".part-"):
                os.remove(os.path.join(self.path, name))

    def write(self, row: dict) -> None:
        if not math.isfinite(row["logprob"]):
            raise ValueError(f"log-prob {row['logprob']} is not finite")
        self.buffer.append(row)
        if len(self.buffer) >= self.rows_per_part:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.buffer:
            return
        name = f"part-{self.parts:06d}.parquet"
        tmp, final = os.path.join(self.path, f".{name}.tmp"), os.path.join(self.path, name)
        with open(tmp, "wb") as f:
            pq.write_table(pa.Table.from_pylist(self.buffer, schema=self.schema), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        self.parts += 1
        self.buffer = []

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._lock.close()
            if self._created and not os.listdir(self.path):  # a failure before the first part: no empty output
                os.rmdir(self.path)

    def __enter__(self) -> "ParquetParts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_results(output: str, schema):
    """The writer of an output checked by check_output (its `schema`: None for JSONL)."""
    if schema is None:
        return ResultWriter(output, key=lambda row: None)
    return ParquetParts(output, schema)
