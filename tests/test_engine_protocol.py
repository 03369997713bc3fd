"""The engine's declared interfaces (engine/protocol.py): Engine implements the loop's (EngineProtocol), Engine, the
HTTP Client and DistributedEngine the closed-job one (JobEngine), with the protocol's signatures (names, order and
defaults of its parameters); the fronts (the asyncio front, the server) use nothing of the engine but the protocol's
members."""

from __future__ import annotations

import ast
import inspect
import json
import sys
from pathlib import Path

import pytest

from engine import Engine
from engine.protocol import EngineProtocol, JobEngine
from engine.stats import COUNTER, COUNTERS, JOB, NAMES, PEAK, STATE, EngineStats, describe, kind

ROOT = Path(__file__).resolve().parent.parent


def members(proto) -> set[str]:
    """The public names a Protocol declares (its own and its protocol bases')."""
    names = set()
    for cls in proto.__mro__:
        if getattr(cls, "_is_protocol", False) and cls.__module__ == proto.__module__:
            names |= {n for n in (*cls.__dict__, *cls.__dict__.get("__annotations__", {})) if not n.startswith("_")}
    return names


def signature_problems(impl: type, proto) -> list[str]:
    """Where impl's methods differ from the protocol's: a missing method, a missing or renamed parameter, another
    default, a positional parameter at another place, or an extra parameter without a default."""
    problems = []
    for name in sorted(members(proto)):
        want = inspect.getattr_static(proto, name, None)
        if not callable(want) or isinstance(want, property):
            continue
        got = getattr(impl, name, None)
        if not callable(got):
            problems.append(f"{impl.__name__}.{name}: missing")
            continue
        w = list(inspect.signature(want).parameters.values())[1:]
        g = list(inspect.signature(got).parameters.values())[1:]
        by_name = {p.name: p for p in g}
        for i, p in enumerate(w):
            q = by_name.get(p.name)
            if q is None:
                problems.append(f"{impl.__name__}.{name}: no parameter {p.name!r}")
            elif q.default != p.default:
                problems.append(
                    f"{impl.__name__}.{name}({p.name}): default {q.default!r}, the protocol's {p.default!r}"
                )
            elif p.kind is p.POSITIONAL_OR_KEYWORD and (i >= len(g) or g[i].name != p.name):
                problems.append(f"{impl.__name__}.{name}({p.name}): not parameter {i + 1}")
        extra = [
            q.name
            for q in g
            if q.name not in {p.name for p in w}
            and q.default is q.empty
            and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)
        ]
        problems += [f"{impl.__name__}.{name}: extra parameter {n!r} without a default" for n in extra]
    return problems


@pytest.fixture(scope="module")
def eng(tiny_model_dir):
    return Engine.load(str(tiny_model_dir), dtype="float32", threads=1, kv_tokens=4096)


def test_engine_implements_the_loop_and_the_job_protocols(eng):
    assert isinstance(eng, EngineProtocol) and isinstance(eng, JobEngine)
    assert isinstance(eng.stats, EngineStats) and isinstance(eng.last_stats, EngineStats)
    assert signature_problems(Engine, EngineProtocol) == []


def test_client_implements_the_job_protocol(eng):
    from live_server import live_server

    from engine.async_engine import AsyncEngine
    from frontends.client import Client
    from frontends.server.app import create_app

    assert signature_problems(Client, JobEngine) == []
    with live_server(create_app(eng, model_name="tiny")) as url:
        client = Client(url)
        try:
            assert isinstance(client, JobEngine) and not isinstance(client, EngineProtocol)
            assert client.limits == eng.limits and client.max_request_tokens == eng.max_request_tokens
            assert client.score([("a b", " c")])[0].logprob == pytest.approx(
                eng.score([("a b", " c")])[0].logprob, abs=1e-4
            )
            assert isinstance(client.last_stats, EngineStats) and client.last_stats.requests >= 1
        finally:
            client.close()
    assert AsyncEngine  # the server's front ran on the engine


def test_distributed_engine_implements_the_job_protocol(tiny_model_dir, monkeypatch):
    from engine import hf_loader
    from frontends.ray_runner import Cluster, DistributedEngine

    assert signature_problems(DistributedEngine, JobEngine) == []
    monkeypatch.setattr(hf_loader, "_load_weights", lambda *a: pytest.fail("the driver loaded the weights"))
    d = DistributedEngine(Cluster(str(tiny_model_dir), {"kv_tokens": 4096}))
    assert isinstance(d, JobEngine) and d.limits.max_request_tokens == min(d.config.max_position, 4096)
    assert isinstance(d.last_stats, EngineStats)


def test_the_signature_check_sees_a_mismatch():
    class Wrong:
        def score(self, requests, progress=False, share_prefix=True):  # two parameters swapped
            pass

        def generate(
            self, prompts, max_tokens=64, temperature=0.0, top_p=1.0, seed=None, stop=None, progress=False, *, extra
        ):
            pass

    problems = signature_problems(Wrong, JobEngine)
    assert "Wrong.score(share_prefix): not parameter 2" in problems
    assert "Wrong.generate(max_tokens): default 64, the protocol's 128" in problems
    assert "Wrong.generate: extra parameter 'extra' without a default" in problems


def engine_members_used(path: Path, names: tuple[str, ...]) -> set[str]:
    """The attributes a module reads on its engine (`<x>.engine.NAME` or `engine.NAME`)."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Attribute) and owner.attr in names) or (
                isinstance(owner, ast.Name) and owner.id in names
            ):
                used.add(node.attr)
    return used


@pytest.mark.parametrize(
    "front",
    [
        "engine/async_engine.py",
        "frontends/server/state.py",
        "frontends/server/app.py",
        "frontends/server/engine_api.py",
        "frontends/server/completions.py",
    ],
)
def test_the_fronts_use_only_the_protocol(front):
    used = engine_members_used(ROOT / front, ("engine",))
    assert used <= members(EngineProtocol), sorted(used - members(EngineProtocol))


def test_the_front_check_sees_a_reach_in(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f(self):\n    self.engine.scheduler.drop(1)\n    return self.engine.step()\n")
    assert engine_members_used(bad, ("engine",)) - members(EngineProtocol) == {"scheduler"}


# ---- EngineStats: one schema, on the wire and in Arrow --------------------------------------------------------------


def distinct_stats(base: int = 1) -> EngineStats:
    """Every field a different value, so that a field dropped, swapped or zeroed on the way shows."""
    return EngineStats(**{name: base + i for i, name in enumerate(NAMES)})


def test_engine_stats_have_one_wire_form_that_refuses_another_schema():
    s = distinct_stats()
    assert EngineStats.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    wire = s.to_dict()
    with pytest.raises(ValueError, match="engine stats: missing requests$"):
        EngineStats.from_dict({k: v for k, v in wire.items() if k != "requests"})
    with pytest.raises(ValueError, match="engine stats: unknown in_flight, queue_depth$"):
        EngineStats.from_dict({**wire, "queue_depth": 0, "in_flight": 0})
    with pytest.raises(ValueError, match="tokens_computed: 1.5 is not an integer"):
        EngineStats.from_dict({**wire, "tokens_computed": 1.5})
    with pytest.raises(ValueError, match="tokens_computed: True is not an integer"):
        EngineStats.from_dict({**wire, "tokens_computed": True})
    with pytest.raises(ValueError, match="expected an object of counters, got NoneType"):
        EngineStats.from_dict(None)


def test_every_engine_stats_field_says_how_it_combines_and_what_it_counts():
    a, b = distinct_stats(1), distinct_stats(100)
    total, growth = a.plus(b), b.since(a)
    for name in NAMES:
        assert describe(name) and "\n" not in describe(name)
        x, y = getattr(a, name), getattr(b, name)
        want = {COUNTER: x + y, JOB: x + y, PEAK: max(x, y), STATE: y}[kind(name)]
        assert getattr(total, name) == want, name
        assert getattr(growth, name) == (y - x if kind(name) == COUNTER else y), name
    assert tuple(a.counters()) == COUNTERS and a.counters()["requests"] == a.requests


def test_a_field_without_a_kind_fails_at_import(tmp_path, monkeypatch):
    """A field added to EngineStats as a bare `int = 0` would be left out of what readers derive from the kinds: the
    module refuses it when it is imported."""
    import importlib.util

    source = (ROOT / "engine/stats.py").read_text()
    planted = tmp_path / "planted_stats.py"
    planted.write_text(source.replace("class EngineStats:\n", "class EngineStats:\n    extra: int = 0\n", 1))
    spec = importlib.util.spec_from_file_location("planted_stats", planted)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "planted_stats", module)  # dataclasses reads the class's module
    with pytest.raises(TypeError, match=r"without a kind: \['extra'\]"):
        spec.loader.exec_module(module)


def test_the_ray_worker_returns_its_stats_as_one_arrow_struct(tiny_model_dir):
    """EngineWorker.run (called here without Ray) answers a block with its results (the ScoreResult fields and the
    row index, no per-counter columns) and one call record whose `stats` struct is built from EngineStats' fields
    and reads back to the engine's very last_stats."""
    pa = pytest.importorskip("pyarrow")
    from dataclasses import fields

    from engine.results import ScoreResult
    from frontends.ray_runner import EngineWorker, call_schema, read_call

    assert [f.name for f in call_schema().field("stats").type] == list(NAMES)
    worker = EngineWorker(str(tiny_model_dir), {"dtype": "float32", "threads": 1})
    batch = pa.table(
        {"_row": pa.array([4, 7], pa.int64()), "context": [[1, 11, 12], [1, 11]], "continuation": [[13], [14]]}
    )
    table, call = worker.run(batch)
    assert table.column_names == [f.name for f in fields(ScoreResult)] + ["_row"]
    assert table.column("_row").to_pylist() == [4, 7]
    assert call.schema.equals(call_schema())
    name, seconds, stats = read_call(call)
    assert name == worker.name() and seconds > 0
    assert stats == worker.engine.last_stats and stats.requests == 2 and stats.tokens_computed > 0
    sink = pa.BufferOutputStream()  # through Arrow's IPC format, as Ray's object store carries it
    with pa.ipc.new_stream(sink, call.schema) as writer:
        writer.write_table(call)
    assert read_call(pa.ipc.open_stream(sink.getvalue()).read_all()) == (name, seconds, stats)
