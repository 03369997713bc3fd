"""frontends.ray_runner on a local Ray cluster (2 CPUs, no dashboard, a small object store), started once for this
module and shut down after it, listening on 127.0.0.1 only (frontends.ray_runner.init_local_cluster). Shown: the same scores as the single-process engine
(float32, 1e-5), the same `icqs` leaderboard, a killed worker actor, resumption, and bad input refused before any
worker starts. Plus the shard planner and the --device rules, which need no cluster."""

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from commands.engine_cli import main as engine_main
from commands.factory import resolve_device
from engine import Engine
from engine.errors import UserError
from frontends import ray_runner
from frontends.ray_runner import Cluster, DistributedEngine, plan_shards, unique_tokens

ray = pytest.importorskip("ray")
sys.path.insert(0, str(Path(__file__).parent))
from test_icqs_cli import TASK  # noqa: E402


def rows_of(demo_sets=3, questions=6):
    """Requests in three demo-set families (a long shared prefix each), answers of 1-3 tokens."""
    rows = []
    for s in range(demo_sets):
        demos = "".join(f"Q: item {s}-{k} is it fine?\nA: {'yes' if (s + k) % 2 else 'no'}\n" for k in range(8))
        rows += [
            {
                "id": f"s{s}q{q}",
                "extra": [s, q],
                "context": demos + f"Q: question {q}?\nA:",
                "continuation": [" yes", " no", " maybe not"][q % 3],
            }
            for q in range(questions)
        ]
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_jsonl(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


@pytest.fixture(scope="module")
def cluster():
    ray_runner.init_local_cluster(num_cpus=2, object_store_memory=96 * 1024**2)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def time_limit():
    """Each test here is bounded: a hung cluster fails the test instead of the suite."""

    def expire(*_):
        raise TimeoutError("test_distributed: over 240 s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(240)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def no_workers(monkeypatch):
    """Starting a worker fails the test: what is checked here must be refused before."""
    monkeypatch.setattr(DistributedEngine, "_start_workers", lambda self: pytest.fail("a worker was started"))


def engine_args(model, *extra):
    return ["--model", str(model), "--dtype", "float32", *extra]


# ---- no cluster -------------------------------------------------------------------------------------------------
def test_plan_keeps_each_key_on_one_shard_and_counts_the_prefix_tree(tiny_model_dir):
    eng = Engine.load(str(tiny_model_dir), dtype="float32")
    rows = rows_of(demo_sets=4, questions=5)
    reqs = [(r["context"], r["continuation"]) for r in rows]
    from engine.encoding import encode_pairs

    encoded = encode_pairs(eng.tokenizer, reqs)
    eng.score(reqs)
    one = plan_shards(encoded, 1)
    assert one.shard_tokens == [eng.last_stats.tokens_computed]  # the planner's count is the engine's
    plan = plan_shards(encoded, 4)
    key_shard = {}
    for (ctx, _), s in zip(encoded, plan.shard):
        assert key_shard.setdefault(tuple(ctx[: plan.depth]), s) == s  # a key never spans two shards
    assert plan.keys >= 4 and len(set(plan.shard)) == 4
    assert sum(plan.shard_tokens) <= 1.1 * one.shard_tokens[0]
    assert max(plan.shard_tokens) <= 2 * min(plan.shard_tokens)  # balanced by tokens
    naive = plan_shards(encoded, 4, naive=True)
    assert sum(naive.shard_tokens) > 2.5 * one.shard_tokens[0]  # each shard recomputes nearly every demo set
    assert unique_tokens([[1, 2, 3], [1, 2, 4], [1, 5]]) == 5


def test_device_rules(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == "cpu" and resolve_device("auto") == "cpu" and resolve_device("cpu") == "cpu"
    for bad in ("tpu", "cpu:0", "cuda:x", "cuda", "cuda:0"):
        with pytest.raises(UserError, match="--device"):
            resolve_device(bad)
    # Ray workers: the form is checked here, the GPUs by the cluster; one GPU per worker, so no index
    assert resolve_device("cuda", local=False) == "cuda" and resolve_device("cpu", local=False) == "cpu"
    with pytest.raises(UserError, match="GPU of its own"):
        resolve_device("cuda:1", local=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device(None) == "cuda" and resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(UserError, match="2 CUDA device"):
        resolve_device("cuda:2")


def test_ray_threads_default_to_a_share_of_the_cores():
    import argparse

    from commands.engine_cli import main  # noqa: F401  (the parser with the engine options)
    from commands.factory import add_engine_args, engine_options

    p = argparse.ArgumentParser()
    add_engine_args(p)
    opts = engine_options(p.parse_args(["--device", "cpu", "--ray", "--workers", "2"]))
    assert opts["threads"] == max(1, (os.cpu_count() or 1) // 2)
    assert engine_options(p.parse_args(["--device", "cpu", "--ray", "--threads", "3"]))["threads"] == 3
    assert "threads" not in engine_options(p.parse_args(["--device", "cpu"]))


# ---- on the cluster ---------------------------------------------------------------------------------------------
def test_ray_scores_equal_local_and_pass_fields_through(cluster, tiny_model_dir, tmp_path, capsys):
    src = write_jsonl(tmp_path / "in.jsonl", rows_of())
    assert (
        engine_main(
            ["score", "--input", str(src), "--output", str(tmp_path / "local.jsonl"), *engine_args(tiny_model_dir)]
        )
        == 0
    )
    assert (
        engine_main(
            [
                "score",
                "--input",
                str(src),
                "--output",
                str(tmp_path / "ray.jsonl"),
                "--ray",
                "--workers",
                "2",
                *engine_args(tiny_model_dir),
            ]
        )
        == 0
    )
    assert "on 2 Ray workers" in capsys.readouterr().err
    local, dist = read_jsonl(tmp_path / "local.jsonl"), read_jsonl(tmp_path / "ray.jsonl")
    assert len(local) == len(dist) == 18
    for a, b in zip(local, dist):
        assert a.keys() == b.keys() and {k: a[k] for k in ("id", "extra", "context", "continuation")} == {
            k: b[k] for k in ("id", "extra", "context", "continuation")
        }
        assert abs(a["logprob"] - b["logprob"]) <= 1e-5
        assert max(abs(x - y) for x, y in zip(a["token_logprobs"], b["token_logprobs"])) <= 1e-5
        assert (a["num_tokens"], a["is_greedy"]) == (b["num_tokens"], b["is_greedy"])


def test_rerun_skips_the_rows_already_written(cluster, tiny_model_dir, tmp_path, capsys):
    """A run killed after 7 rows (and in the middle of the 8th): the rerun on Ray keeps them and scores the rest."""
    rows = rows_of()
    src, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    local = Engine.load(str(tiny_model_dir), dtype="float32").score([(r["context"], r["continuation"]) for r in rows])
    done = [{**r, **res.__dict__} for r, res in zip(rows[:7], local)]
    done[3]["logprob"] = 123.0  # marked: a recomputation would overwrite it
    out.write_text("".join(json.dumps(r) + "\n" for r in done) + '{"id": "s1q1", "logp')  # torn line
    assert engine_main(["score", "--input", str(src), "--output", str(out), "--ray", *engine_args(tiny_model_dir)]) == 0
    assert "resuming: 7 rows" in capsys.readouterr().err
    got = read_jsonl(out)
    assert [r["id"] for r in got] == [r["id"] for r in rows] and got[3]["logprob"] == 123.0
    assert all(abs(g["logprob"] - w.logprob) <= 1e-5 for i, (g, w) in enumerate(zip(got, local)) if i != 3)
    assert all(g["extra"] == r["extra"] for g, r in zip(got, rows))


def test_a_killed_worker_loses_no_request_and_duplicates_none(cluster, tiny_model_dir, monkeypatch):
    rows = rows_of(demo_sets=4, questions=6)
    reqs = [(r["context"], r["continuation"]) for r in rows]
    expected = Engine.load(str(tiny_model_dir), dtype="float32").score(reqs)
    monkeypatch.setattr(ray_runner, "SHARDS_PER_WORKER", 6)  # 12 shards: the pool is busy when the kill lands
    seen, killed = [], []

    def on_result(i, result, worker):
        seen.append((i, worker))
        if not killed:  # the first result: SIGKILL the actor that produced it, now on its next shard
            killed.append(int(worker.rsplit(":", 1)[1]))
            os.kill(killed[0], signal.SIGKILL)

    with DistributedEngine(Cluster(str(tiny_model_dir), {"dtype": "float32", "threads": 1, "keep_cache": True})) as eng:
        results = eng.score(reqs, on_result=on_result)
    assert killed and sorted(i for i, _ in seen) == list(range(len(reqs)))  # every request exactly once
    with pytest.raises(ProcessLookupError):
        os.kill(killed[0], 0)
    for got, want in zip(results, expected):
        assert abs(got.logprob - want.logprob) <= 1e-5 and got.num_tokens == want.num_tokens


def test_icqs_score_on_ray_writes_the_same_run(cluster, tiny_model_dir, tmp_path, capsys):
    from icqs.cli import main as icqs_main

    (tmp_path / "task.yaml").write_text(TASK)
    cands = [
        {"id": f"{m}{i}", "model": m, "x": x, "y": y, "truth": 1.0 if m == "good" else 0.0}
        for m, answers in (("good", ["yes", "no"]), ("bad", ["no", "yes"]))
        for i, (x, y) in enumerate(zip(["four", "five"], answers))
    ]
    write_jsonl(tmp_path / "c.jsonl", cands)
    common = [
        str(tmp_path / "task.yaml"),
        str(tmp_path / "c.jsonl"),
        "--method",
        "icqs",
        "epistemic",
        "judge",
        "--L",
        "1",
        "--quiet",
        *engine_args(tiny_model_dir),
    ]  # judge: Engine.generate on the workers
    assert icqs_main(["score", *common, "--out", str(tmp_path / "local")]) == 0
    assert icqs_main(["score", *common, "--out", str(tmp_path / "ray"), "--ray", "--workers", "2"]) == 0
    local, dist = tmp_path / "local", tmp_path / "ray"

    def board(run):  # the leaderboard without its timings: the engine counters' line (tokens, seconds) and the
        # next step's time estimate for a larger model (this run's engine seconds scaled)
        timing = re.compile(r"about .+? for this run on this machine \(this run's \S+ s of engine time")
        return [
            timing.sub("(timing)", x)
            for x in (run / "leaderboard.txt").read_text().splitlines()
            if not x.strip().startswith("engine:")
        ]

    assert board(local) == board(dist) and len(board(local)) > 10
    a, b = read_jsonl(local / "scores.jsonl"), read_jsonl(dist / "scores.jsonl")
    assert [(r["method"], r["id"]) for r in a] == [(r["method"], r["id"]) for r in b]
    for x, y in zip(a, b):
        assert x["score"] == pytest.approx(y["score"], abs=1e-5)
    ll = {(r["l"], r["id"]): r["loglik"] for r in read_jsonl(local / "loglik.jsonl")}
    for r in read_jsonl(dist / "loglik.jsonl"):
        assert max(abs(p - q) for p, q in zip(r["loglik"], ll[(r["l"], r["id"])])) <= 1e-5


BAD = {
    "not json": '{"context": "a", "continuation": " b"}\n{oops\n',
    "missing field": '{"context": "a", "continuation": " b"}\n{"context": "a"}\n',
    "empty continuation": '{"context": "a", "continuation": ""}\n',
    "too long": json.dumps({"context": "word " * 600, "continuation": " b"}) + "\n",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_same_error_before_any_worker(case, cluster, tiny_model_dir, tmp_path, capsys, monkeypatch):
    src = tmp_path / "in.jsonl"
    src.write_text(BAD[case])
    no_workers(monkeypatch)
    errors = []
    for extra in ([], ["--ray", "--workers", "2"]):
        out = tmp_path / f"out{len(extra)}.jsonl"
        assert (
            engine_main(["score", "--input", str(src), "--output", str(out), *engine_args(tiny_model_dir), *extra]) == 2
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) >= 1 and err[-1].startswith("error: ")
        errors.append(err[-1])
        assert not out.exists()
    assert errors[0] == errors[1]
    if case != "too long":
        assert f"{src}:" in errors[0]


def test_more_gpus_asked_than_the_cluster_has(cluster, tiny_model_dir, tmp_path, capsys, monkeypatch):
    src = write_jsonl(tmp_path / "in.jsonl", rows_of(1, 2))
    no_workers(monkeypatch)
    assert (
        engine_main(
            [
                "score",
                "--input",
                str(src),
                "--output",
                str(tmp_path / "o.jsonl"),
                "--ray",
                "--device",
                "cuda",
                "--workers",
                "2",
                *engine_args(tiny_model_dir),
            ]
        )
        == 2
    )
    assert (
        capsys.readouterr().err.strip().splitlines()[-1]
        == "error: --workers 2: the Ray cluster has 0 GPUs, 2 are needed"
    )


def test_workers_are_started_once_and_kept_across_calls(cluster, tiny_model_dir, monkeypatch):
    """One DistributedEngine loads the model once per worker, however many calls it serves (an `icqs score --ray`
    run makes one per chunk); close() stops them."""
    rows = rows_of(demo_sets=2, questions=3)
    reqs = [(r["context"], r["continuation"]) for r in rows]
    starts = []
    start = DistributedEngine._start_workers
    monkeypatch.setattr(DistributedEngine, "_start_workers", lambda self: starts.append(1) or start(self))
    with DistributedEngine(Cluster(str(tiny_model_dir), {"dtype": "float32", "threads": 1, "keep_cache": True})) as eng:
        names = eng.start()  # started and ready: each has loaded the model
        first = eng.score(reqs)
        workers = set(eng.busy_seconds)
        assert workers == set(names)
        again = eng.score(reqs[::-1])
        assert set(eng.busy_seconds) <= workers  # the same processes
        assert eng.last_stats.tokens_computed < eng.last_stats.tokens_requested  # their caches were kept
        texts = eng.generate(["Q: one?\nA:", "Q: two?\nA:"], max_tokens=2)
    assert len(starts) == 1 and len(workers) == 2 and all(t.text is not None for t in texts)
    assert all(abs(a.logprob - b.logprob) <= 1e-5 for a, b in zip(first, again[::-1]))
    assert eng._workers is None
    pids = [int(name.rsplit(":", 1)[1]) for name in names]
    deadline = time.monotonic() + 60
    while pids and time.monotonic() < deadline:  # ray.kill is asynchronous: the processes end soon after
        pids = [p for p in pids if alive(p)]
        time.sleep(0.2)
    assert not pids  # stopped, not restarted


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---- Parquet ----------------------------------------------------------------------------------------------------
def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    table = table.append_column("weight", pa.array([0.5 * i for i in range(len(rows))], pa.float32()))
    pq.write_table(table, path)
    return table


def test_parquet_in_parquet_out_equals_jsonl_and_resumes(cluster, tiny_model_dir, tmp_path, capsys):
    """Parquet in -> Parquet out on Ray: every input column passed through with its type, scores as the JSONL run's.
    The first 7 rows are scored by the local path first (Parquet too): the Ray run resumes after them."""
    import pyarrow.parquet as pq

    rows = rows_of()
    src, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    table = write_parquet(src, rows)
    write_parquet(tmp_path / "first7.parquet", rows[:7])
    assert (
        engine_main(
            [
                "score",
                "--input",
                str(write_jsonl(tmp_path / "in.jsonl", rows)),
                "--output",
                str(tmp_path / "local.jsonl"),
                *engine_args(tiny_model_dir),
            ]
        )
        == 0
    )
    assert (
        engine_main(
            [
                "score",
                "--input",
                str(tmp_path / "first7.parquet"),
                "--output",
                str(out),
                "--quiet",
                *engine_args(tiny_model_dir),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        engine_main(
            [
                "score",
                "--input",
                str(src),
                "--output",
                str(out),
                "--ray",
                "--workers",
                "2",
                "--quiet",
                *engine_args(tiny_model_dir),
            ]
        )
        == 0
    )
    assert "resuming: 7 rows" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["part-000000.parquet", "part-000001.parquet"]
    got = pq.read_table(out)
    assert got.schema.names == table.schema.names + ["logprob", "token_logprobs", "num_tokens", "is_greedy"]
    assert got.select(table.schema.names).equals(table)  # every input column, its values and types
    for a, b in zip(read_jsonl(tmp_path / "local.jsonl"), got.to_pylist()):
        assert abs(a["logprob"] - b["logprob"]) <= 1e-5
        assert max(abs(x - y) for x, y in zip(a["token_logprobs"], b["token_logprobs"])) <= 1e-5
        assert (a["num_tokens"], a["is_greedy"]) == (b["num_tokens"], b["is_greedy"])
    assert engine_main(["score", "--input", str(src), "--output", str(out), "--ray", *engine_args(tiny_model_dir)]) == 0
    assert "already holds all 18 rows" in capsys.readouterr().err


BAD_PARQUET = {  # rows -> the error after the file name
    "missing column": ([{"context": "a"}], " missing column 'continuation' (columns: context)"),
    "wrong type": ([{"context": "a", "continuation": 3}], " column 'continuation' is of type int64, expected string"),
    "empty continuation": (
        [{"context": "a", "continuation": " b"}, {"context": "a", "continuation": ""}],
        "row 2: empty continuation: nothing to score",
    ),
    "null": (
        [{"context": "a", "continuation": " b"}, {"context": None, "continuation": " b"}],
        "row 2: missing or non-text field 'context'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_PARQUET))
def test_bad_parquet_same_error_before_any_worker(case, cluster, tiny_model_dir, tmp_path, capsys, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, error = BAD_PARQUET[case]
    src = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    no_workers(monkeypatch)
    for extra in ([], ["--ray", "--workers", "2"]):
        for out in (tmp_path / "out.parquet", tmp_path / "out.jsonl"):
            assert (
                engine_main(["score", "--input", str(src), "--output", str(out), *engine_args(tiny_model_dir), *extra])
                == 2
            )
            assert capsys.readouterr().err.splitlines() == [f"error: {src}:{error}"]
            assert not out.exists()


def test_no_share_is_refused_on_ray_before_anything_is_written(tiny_model_dir, tmp_path, capsys, monkeypatch):
    src, out = write_jsonl(tmp_path / "in.jsonl", rows_of(1, 2)), tmp_path / "o.jsonl"
    no_workers(monkeypatch)
    assert (
        engine_main(
            ["score", "--input", str(src), "--output", str(out), "--ray", "--no-share", *engine_args(tiny_model_dir)]
        )
        == 2
    )
    assert capsys.readouterr().err.splitlines() == [
        "error: --ray always shares prefixes (--no-share is for single-process comparisons)"
    ]
    assert not out.exists()
