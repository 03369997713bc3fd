"""A score run: the methods of icqs.methods computed for every candidate into a run directory (icqs.run.RunDir),
then scored and ranked. Used by `icqs score`, `icqs demo` and the benchmarks.

A score run directory holds run.json (task, candidates' digest, model, sampler, methods asked for, the engine's
stats per method), candidates.jsonl, the raw results as append-only logs (loglik.jsonl, icl.jsonl, judge.jsonl: a
killed run resumes from them), and the derived scores.jsonl, leaderboard.txt and leaderboard.json, written whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from engine.encoding import encode_pairs
from engine.errors import UserError
from engine.validation import RequestError, check_generate_length, check_score_length

from . import audit_state
from .aggregate import format_leaderboards, leaderboard
from .candidates import candidate_row, read_candidates
from .io import ResultWriter, atomic_write, read_results, strict_json
from .logs import run_task_schema, score_log_validator, validator
from .methods import DEFAULT_METHODS, METHODS, ordered
from .run import MeteredEngine, RunDir, read_run_json
from .task import task_from_dict, task_to_dict


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def score_run_dir(out, task, candidates, model: str, sampler: str, methods, draws: int = 1) -> RunDir:
    """The run directory of a score run, checked (an existing one must be for the same task, candidates, model,
    sampler and demo draws); nothing is written until it starts."""
    settings = {
        "task": task_to_dict(task),
        "candidates": _digest([candidate_row(c) for c in candidates]),
        "model": model,
        "sampler": sampler,
        "draws": draws,
    }
    return RunDir(out, "score", settings, accumulate={"methods": list(methods)})


SLACK = 8  # tokens: a BOS, and what tokenizing two texts apart rather than joined can change at the seam


def check_lengths(engine, task, candidates, methods, sampler: str, path: str | None = None) -> None:
    """Every request the methods will send fits the model (and the KV cache); else a one-line UserError naming
    the candidate's file:line, before any work. The shared prefixes (demo sets) and each candidate's own part are
    tokenized once each; only requests whose two parts come within SLACK tokens of the limit are tokenized whole."""
    limits, tok = engine.limits, engine.tokenizer
    for name in ordered(methods):
        jobs = METHODS[name].requests(task, candidates, sampler)
        texts = list(dict.fromkeys([j.shared for j in jobs] + [j.rest + j.continuation for j in jobs]))
        length = dict(zip(texts, map(len, tok.encode_batch(texts))))
        near = [
            j
            for j in jobs
            if length[j.shared] + length[j.rest + j.continuation] + j.generated + SLACK > limits.max_request_tokens
        ]
        encoded = encode_pairs(tok, [(j.context, j.continuation) for j in near])
        for j, (ctx, cont) in zip(near, encoded):
            try:  # the engine's own checks: a scored prompt, or a prompt and the tokens generated after it
                if j.generated:
                    check_generate_length(len(ctx) + len(cont), j.generated, limits)
                else:
                    check_score_length(len(ctx), len(cont), limits)
            except RequestError as e:
                raise UserError(
                    f"candidate {j.candidate.id!r}: its {name} prompt (demos, x and y): {e.reason}; "
                    "shorten it or use fewer demos (--N)",
                    path,
                    j.candidate.line,
                ) from None


def describe_model(model: str | None, engine) -> dict:
    """What a run records of its model (run.json's `model_info`): a readable name, its file (or server), and its
    parameter count from the engine's config (the headline scales time estimates by it)."""
    from commands.fetch import MODELS
    from engine.loader import DEFAULT_GGUF, resolve_model_path

    config = getattr(engine, "config", None)
    params = None
    if config is not None:
        from .headline import model_params

        params = model_params(config)
    if model is not None and str(model).startswith(("http://", "https://")):
        return {"name": f"server {model}", "file": None, "params": params}
    if model in MODELS:
        name = MODELS[model].title
    elif model is None:
        name = "SmolLM2-135M-Instruct (GGUF, Q4_1; the default)"
    else:
        name = Path(model).name
    try:
        file = str(resolve_model_path(model))
    except UserError:
        file = None
    return {"name": name, "file": file or DEFAULT_GGUF, "params": params}


def score_run(
    engine,
    task,
    candidates,
    out,
    methods=DEFAULT_METHODS,
    sampler: str = "coupled",
    model: str = "default",
    progress: bool = True,
    path: str | None = None,
    draws: int = 1,
    audit: bool = True,
    model_info: dict | None = None,
) -> list[dict]:
    """Compute (or resume) the methods for every candidate into `out` (a directory or a RunDir from score_run_dir)
    and write scores.jsonl; returns the score rows, of these methods and of those earlier runs in `out` computed.
    `draws`: independent demo draws (seeds seed, seed + 1, ...) for the methods whose scores depend on them; a row
    per (method, draw, candidate). `audit`: also audit every method on the task's pool (icqs.audit) into
    audit.json. The engine's work per method is added to run.json (run.meta["engine_stats"], the audit's to
    "audit_stats"). `path`: the candidates file, named by errors; `model_info` (describe_model) is recorded in
    run.json."""
    methods = ordered(methods)
    run = out if isinstance(out, RunDir) else score_run_dir(out, task, candidates, model, sampler, methods, draws)
    check_lengths(engine, task, candidates, methods, sampler, path)
    rows = []
    with run.start():
        if model_info is not None:
            run.meta["model_info"] = model_info
            run.save()
        audit_state.start(run.meta, audit)  # before any work: a run killed from here on reads as pending
        run.save()
        atomic_write(
            run.path / "candidates.jsonl",
            "".join(json.dumps(candidate_row(c), ensure_ascii=False) + "\n" for c in candidates),
        )
        for name in ordered(run.meta["methods"]):
            method = METHODS[name]
            metered = MeteredEngine(engine, on_call=lambda stats, name=name: run.add_stats(name, stats))
            parts = []
            for d in range(draws if method.demos else 1):
                task_d = draw_task(task, d)
                check = score_log_validator(name, task_d, [c.id for c in candidates], sampler)
                if name in methods:
                    with ResultWriter(run.path / draw_log(method, d), method.key, check) as writer:
                        method.compute(metered, task_d, candidates, writer, sampler, progress)
                        results = writer.rows  # passed on, not read back
                else:  # asked for by an earlier run in this directory
                    results = read_results(run.path / draw_log(method, d), check)
                parts.append(_score_rows(name, candidates, method.score(task_d, candidates, results, sampler), d))
            rows += _complete(parts)
        atomic_write(
            run.path / "scores.jsonl", "".join(json.dumps(strict_json(r), ensure_ascii=False) + "\n" for r in rows)
        )
        if audit:
            from .audit import compute_audit

            entries = compute_audit(
                engine,
                task,
                run,
                run.meta["methods"],
                sampler,
                draws,
                progress=progress,
                rows=rows,
                candidates=candidates,
            )
            audit_state.finish(run.meta, entries)
            run.save()
    return rows


def draw_task(task, draw: int):
    """The task as demo draw `draw` sees it: the same, with the seed moved on by `draw`."""
    return task if draw == 0 else dataclasses.replace(task, seed=task.seed + draw)


def draw_log(method, draw: int) -> str:
    """A method's result log for demo draw `draw` (draw 0: the log a single-draw run writes)."""
    return method.log if draw == 0 else method.log.replace(".jsonl", f".draw{draw}.jsonl")


def _complete(parts: list[list[dict]]) -> list[dict]:
    """A method's score rows over its demo draws, or none while some draw is incomplete."""
    return [r for part in parts for r in part] if all(parts) else []


def _score_rows(method: str, candidates, scores, draw: int = 0) -> list[dict]:
    base = [{"id": c.id, "model": c.model, "truth": c.truth, "truth_dist": c.truth_dist} for c in candidates]
    return [] if scores is None else [{"method": method, "draw": draw, **b, **s} for b, s in zip(base, scores)]


def load_scores(out) -> tuple:
    """(task, candidates, score rows, run.json) of a run directory, for every method whose results are complete."""
    out = Path(out)
    meta = read_run_json(out, "score")
    sampler, methods = meta.get("sampler"), meta.get("methods")
    if not isinstance(sampler, str) or not isinstance(methods, list) or not set(methods) <= set(METHODS):
        raise _corrupt(out, "its sampler or methods")
    task = _recorded_task(meta.get("task"), out)
    candidates = read_candidates(out / "candidates.jsonl")
    draws = meta.get("draws", 1)
    if not isinstance(draws, int) or isinstance(draws, bool) or draws < 1:
        raise _corrupt(out, "its draws")
    rows, incomplete = [], {}
    ids = [c.id for c in candidates]
    for name in ordered(methods):
        method = METHODS[name]
        parts, missing = [], 0
        for d in range(draws if method.demos else 1):
            task_d = draw_task(task, d)
            results = read_results(out / draw_log(method, d), score_log_validator(name, task_d, ids, sampler))
            scores = method.score(task_d, candidates, results, sampler)
            parts.append(_score_rows(name, candidates, scores, d))
            if scores is None:
                missing += missing_candidates(method, task_d, candidates, results, sampler)
        rows += _complete(parts)
        if missing:
            incomplete[name] = {"missing": missing, "of": len(candidates) * len(parts)}
    return task, candidates, rows, {**meta, INCOMPLETE: incomplete}


INCOMPLETE = "_incomplete"  # load_scores' count of the (candidate, draw) results each incomplete method lacks


def missing_candidates(method, task, candidates, results: list[dict], sampler: str) -> int:
    """How many candidates lack (some of) their results in one draw's log of `method` (a torn or lost line)."""
    by_id: dict = {}
    for r in results:
        by_id.setdefault(r["id"], []).append(r)
    return sum(method.score(task, [c], by_id.get(c.id, []), sampler) is None for c in candidates)


def check_complete(meta: dict, out, partial: bool) -> str | None:
    """A run with missing results: a UserError naming each method and how many results it lacks, unless `partial`
    (then the line that marks the partial leaderboard). None when nothing is missing."""
    incomplete = meta.get(INCOMPLETE) or {}
    if not incomplete:
        return None
    what = "; ".join(f"{name} lacks {v['missing']} of {v['of']} candidate results" for name, v in incomplete.items())
    if not partial:
        raise UserError(
            f"{what} (a killed run, or a torn or lost log line): run `icqs score` again to finish it, or "
            "ask for a leaderboard of the complete methods alone with --partial",
            str(out),
        )
    return f"PARTIAL leaderboard: {what}"


def _corrupt(out: Path, what: str) -> UserError:
    return UserError(
        f"corrupt run.json ({what} is not what `icqs score` writes); remove the run directory to start over",
        str(out / "run.json"),
    )


TYPES = {"str": str, "int": int, "bool": bool}  # Task fields of these (annotated) types are checked


def _recorded_task(d, out: Path):
    """The task run.json recorded, checked as far as the scoring reads it (the file may be damaged or edited)."""
    bad = validator(run_task_schema())(d) if isinstance(d, dict) else "not an object"
    if bad:
        raise _corrupt(out, f"its task ({bad})")
    try:
        task = task_from_dict(d)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise _corrupt(out, "its task") from None
    for f in dataclasses.fields(task):
        value, kind = getattr(task, f.name), TYPES.get(f.type)
        if kind is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise _corrupt(out, f"its task's {f.name}")
    texts = [t for e in task.good + task.bad for t in (e.x, e.y)] + list(task.labels)
    if (
        min(task.M, task.N, task.L) < 1
        or not task.good
        or not task.bad
        or not all(isinstance(t, str) for t in texts)
        or task.template.count("{x}") != 1
        or task.template.count("{y}") != 1
    ):
        raise _corrupt(out, "its task")
    return task


def leaderboards(rows: list[dict], engine_stats: dict | None = None) -> list[dict]:
    """One leaderboard per method that has rows, with the engine's stats for it."""
    boards = []
    for name in ordered({r["method"] for r in rows}):
        board = leaderboard(rows, name)
        if engine_stats and name in engine_stats:
            board["engine_stats"] = engine_stats[name]
        boards.append(board)
    return boards


def write_leaderboard(
    out, rows: list[dict], task, engine_stats: dict | None = None, head: dict | None = None, partial: str | None = None
) -> str:
    """leaderboard.txt and leaderboard.json in `out` (measures the audit marks carry ! or ?, measures without an
    audit are marked pending (icqs.audit_state); the headline first when given; `partial`: the line that marks a
    leaderboard of the complete methods alone); returns the leaderboard's text (without the headline)."""
    from .audit import flagged
    from .headline import format_headline

    boards = leaderboards(rows, engine_stats)
    status = audit_state.audit_status(out, read_run_json(out, "score"))
    flags = {**status.pending_flags(boards), **flagged(status.entries)}
    title = f"task {task.name}, {len({r['id'] for r in rows})} candidates"
    if task.calibrate:
        title += (
            f"\ncalibrated scores: each answer's log-likelihood minus its log-likelihood after the "
            f"content-free input {task.content_free!r} (task key content_free)"
        )
    if partial:  # marked in the text and in every board of leaderboard.json
        title += f"\n{partial}"
        boards = [{**b, "partial": partial} for b in boards]
    text = format_leaderboards(boards, title=title, flags=flags)
    atomic_write(Path(out) / "leaderboard.txt", (format_headline(head) + "\n" if head else "") + text)
    atomic_write(Path(out) / "leaderboard.json", json.dumps(strict_json(boards), indent=1, ensure_ascii=False))
    return text


def run_headline(out, rows: list[dict], task, meta: dict) -> dict:
    """The headline of a score run directory (icqs.headline), from its audit and its leaderboards."""
    from .audit import read_audit
    from .headline import headline

    return headline(read_audit(out), leaderboards(rows, meta.get("engine_stats")), task, meta)


def record_headline(run: RunDir, head: dict) -> None:
    """run.json's `headline`: the headline's fields, its lines as `text`."""
    with run.start():
        run.meta["headline"] = {k: v for k, v in head.items() if k != "lines"} | {"text": head["lines"]}
        run.save()
