"""The ICL examples memory: a persistent SQLite store of the evaluator's corrected mistakes.

Each example keeps the generated response, the task's correct answer, the correct label, the rendered ICL turns
(exactly what goes into the evaluator's prompt), the failure-mode tag and its provenance (run, round, task file,
model, template). An example is 'pending' until a human audit accepts or rejects it (`icqs allure review`) when the
run asks for review, else 'accepted' at once; only accepted examples are shown to the evaluator.
"""

from __future__ import annotations

import json
import os
import sqlite3
import urllib.parse
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from engine.errors import UserError
from icqs.logs import allure_memory_schema, validator

STATUSES = ("pending", "accepted", "rejected")
SCHEMA_VERSION = 1
_MEMORY_CHECK = validator(allure_memory_schema())

_SCHEMA = """
CREATE TABLE IF NOT EXISTS examples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    item_id TEXT NOT NULL,
    user_text TEXT NOT NULL,
    assistant_text TEXT NOT NULL,
    response TEXT NOT NULL,
    answer TEXT,
    correct_label INTEGER NOT NULL CHECK (correct_label IN (0, 1)),
    evaluator_label INTEGER,
    evaluator_prob REAL,
    error_kind TEXT,
    failure_mode TEXT,
    status TEXT NOT NULL CHECK (status IN ('pending', 'accepted', 'rejected')),
    run_id TEXT,
    round INTEGER,
    provenance TEXT NOT NULL,
    created_at TEXT NOT NULL,
    reviewed_at TEXT,
    UNIQUE (user_text, assistant_text)
);
CREATE INDEX IF NOT EXISTS examples_run ON examples (run_id, round);
"""


@dataclass
class Example:
    item_id: str
    user_text: str
    assistant_text: str
    response: str
    answer: str | None
    correct_label: int
    evaluator_label: int | None = None
    evaluator_prob: float | None = None
    error_kind: str | None = None
    failure_mode: str | None = None
    status: str = "accepted"
    run_id: str | None = None
    round: int | None = None
    provenance: dict = field(default_factory=dict)
    created_at: str = ""
    reviewed_at: str | None = None
    id: int | None = None

    @property
    def turns(self) -> tuple[str, str]:
        return self.user_text, self.assistant_text


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _checked(d: dict, path: str) -> dict:
    """A memory row with its provenance parsed, checked against icqs.logs' memory schema (a damaged or edited
    database is a one-line error naming the example, never a traceback or a silently different prompt)."""
    try:
        d["provenance"] = json.loads(d["provenance"]) if isinstance(d.get("provenance"), str) else None
    except ValueError:
        d["provenance"] = None
    problem = _MEMORY_CHECK(d)
    if problem:
        raise UserError(f"corrupt example {d.get('id')!r} in the ICL memory ({problem})", path)
    return d


class Memory:
    def __init__(self, path):
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path)
            self.db.row_factory = sqlite3.Row
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise UserError(f"memory schema version {version}, this program reads {SCHEMA_VERSION}", self.path)
            self.db.executescript(_SCHEMA)
            self.db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self.db.commit()
        except sqlite3.DatabaseError as e:
            raise UserError(f"not an ICL memory database ({e})", self.path) from None

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Memory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, ex: Example) -> int | None:
        """Store an example; returns its id, or None when the same ICL turns are already stored."""
        if ex.status not in STATUSES:
            raise ValueError(f"unknown status {ex.status!r}")
        if ex.correct_label not in (0, 1):
            raise ValueError(f"a label is 0 or 1, got {ex.correct_label!r}")
        row = asdict(ex)
        row.pop("id")
        row["provenance"] = json.dumps(ex.provenance, sort_keys=True)
        row["created_at"] = ex.created_at or _now()
        cols = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        with self.db:
            cur = self.db.execute(
                f"INSERT INTO examples ({cols}) VALUES ({marks}) ON CONFLICT (user_text, assistant_text) DO NOTHING",
                row,
            )
        return cur.lastrowid if cur.rowcount else None

    @staticmethod
    def check(path) -> None:
        """An existing memory file, read only (nothing is created or changed): an SQLite database of this schema
        version whose every example passes icqs.logs' memory schema; else a one-line UserError."""
        uri = "file:" + urllib.parse.quote(os.path.abspath(str(path))) + "?mode=ro"
        try:
            db = sqlite3.connect(uri, uri=True)
        except sqlite3.Error as e:
            raise UserError(f"not an ICL memory database ({e})", str(path)) from None
        try:
            db.row_factory = sqlite3.Row
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise UserError(f"memory schema version {version}, this program reads {SCHEMA_VERSION}", str(path))
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "examples" in tables:
                for r in db.execute("SELECT * FROM examples ORDER BY id"):
                    _checked(dict(r), str(path))
        except sqlite3.DatabaseError as e:
            raise UserError(f"not an ICL memory database ({e})", str(path)) from None
        finally:
            db.close()

    def _example(self, r: sqlite3.Row) -> Example:
        return Example(**_checked(dict(r), self.path))

    def get(self, example_id: int) -> Example:
        r = self.db.execute("SELECT * FROM examples WHERE id = ?", (int(example_id),)).fetchone()
        if r is None:
            raise UserError(f"no example with id {example_id} in the memory", self.path)
        return self._example(r)

    def examples(
        self, status: str | None = None, run_id: str | None = None, round: int | None = None, ids=None
    ) -> list[Example]:
        """Examples in insertion order, filtered by status, run, round and/or a set of ids."""
        where, args = [], []
        for column, value in (("status", status), ("run_id", run_id), ("round", round)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = "SELECT * FROM examples" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        out = [self._example(r) for r in self.db.execute(sql, args)]
        if ids is not None:
            wanted = {int(i) for i in ids}
            out = [e for e in out if e.id in wanted]
        return out

    def accepted(self) -> list[Example]:
        """The examples the evaluator is shown."""
        return self.examples(status="accepted")

    def review(self, example_id: int, status: str) -> None:
        """A human audit decision: 'accepted' or 'rejected' (or back to 'pending')."""
        if status not in STATUSES:
            raise UserError(f"unknown review decision {status!r} (use one of {', '.join(STATUSES)})")
        self.get(example_id)
        with self.db:
            self.db.execute(
                "UPDATE examples SET status = ?, reviewed_at = ? WHERE id = ?", (status, _now(), int(example_id))
            )

    def tag(self, example_id: int, failure_mode: str | None) -> None:
        self.get(example_id)
        with self.db:
            self.db.execute("UPDATE examples SET failure_mode = ? WHERE id = ?", (failure_mode, int(example_id)))

    def counts(self) -> dict:
        got = dict(self.db.execute("SELECT status, COUNT(*) FROM examples GROUP BY status").fetchall())
        return {s: got.get(s, 0) for s in STATUSES}
