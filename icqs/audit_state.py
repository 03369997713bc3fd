"""Whether a score run's evaluator audit exists, recorded in run.json when the run starts (`audit`):

  pending         the audit was asked for and has not finished (the run is running, or was killed before or during
                  its audit: the next `icqs score` in the directory finishes it)
  done            audit.json holds it
  skipped: WHY    the audit could not run (e.g. the pool is too small to cross-validate)
  off             the run was made with --no-audit

Every command that reads the run back (`icqs leaderboard | audit | report`) tells these apart with `audit_status`:
a run whose audit is missing (killed, audit.json removed or emptied) says so and keeps its leaderboard marks
pending; it never reads as a run made with --no-audit. A method of the run that the audit does not cover is named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KEY = "audit"
PENDING, DONE, OFF = "pending", "done", "off"
PENDING_MARK = "not audited yet (the audit is pending)"  # the leaderboard's mark for a measure without an audit


def start(meta: dict, asked: bool) -> None:
    """Record the audit's state in run.json's `meta` as the run starts: pending when asked for; else an earlier
    run's state is kept (a --no-audit rerun does not undo an audit), and a new directory's is off."""
    if asked:
        meta[KEY] = PENDING
    elif KEY not in meta:
        meta[KEY] = OFF


def finish(meta: dict, entries: list[dict]) -> None:
    """The state once compute_audit returned its entries: done, or skipped with the audit's own reason."""
    skipped = [e for e in entries if e.get("verdict") == "skipped"]
    if entries and len(skipped) == len(entries):
        meta[KEY] = f"skipped: {skipped[0].get('note') or 'no reason recorded'}"[:4000]
    else:
        meta[KEY] = DONE


@dataclass
class AuditStatus:
    state: str  # pending | done | skipped: ... | off | unknown (a run.json from before the state was recorded)
    entries: list[dict] | None  # audit.json's entries (None: no usable audit)
    missing: list[str] = field(default_factory=list)  # methods of the run that the audit does not cover

    @property
    def complete(self) -> bool:
        return self.entries is not None and not self.missing

    def describe(self) -> str | None:
        """The line a command prints when the audit is not all there (None when it is)."""
        again = "run the same `icqs score` command again to finish it"
        if self.state == OFF and self.entries is None:
            return "evaluator audit: none in this run directory (it ran with --no-audit)"
        if self.state.startswith("skipped"):
            return f"evaluator audit: {self.state}"
        if self.entries is None:
            why = (
                "the run ended before its audit finished"
                if self.state == PENDING
                else "audit.json is missing or empty"
                if self.state == DONE
                else "no audit.json, and run.json does not say why"
            )
            return f"evaluator audit: PENDING ({why}); every leaderboard mark is pending: {again}"
        if self.missing:
            return (
                f"evaluator audit: no audit of {', '.join(self.missing)} (its leaderboard marks are pending); {again}"
            )
        return None

    def pending_flags(self, boards: list[dict]) -> dict:
        """{(method, measure): PENDING_MARK} for the leaderboards' measures that have no audit entry, unless the run
        has no audit by choice (off) or by necessity (skipped)."""
        if self.state == OFF and self.entries is None or self.state.startswith("skipped"):
            return {}
        covered = {(e["method"], e["measure"]) for e in self.entries or []}
        return {
            (b["method"], m): PENDING_MARK for b in boards for m in b["measures"] if (b["method"], m) not in covered
        }


def audit_status(out, meta: dict) -> AuditStatus:
    """The audit of the run directory `out` (run.json's `meta`): its state, its entries (audit.json, checked) and the
    run's methods it does not cover."""
    from .audit import read_audit

    entries = read_audit(out) or None  # `[]` holds no audit
    state = meta.get(KEY, "unknown")
    methods = [m for m in meta.get("methods", []) if isinstance(m, str)]
    covered = {e["method"] for e in entries or []}
    missing = [m for m in methods if m not in covered] if entries is not None else []
    return AuditStatus(state, entries, missing)
