"""Scoring on a Ray cluster with the prefix sharing kept: `python -m engine score --ray [ADDRESS] --workers N`
and `icqs ... --ray` (commands.factory.engine_from_args returns a DistributedEngine: the Engine's `score`).

1. The driver reads and validates the job (for the CLI: commands/engine_cli.py's own checks, so the same one-line
   `file:line` errors, exit 2, before any worker starts), tokenizes it and checks every request's length.
2. It plans shards along the prefix tree. A request's key is its top prefix: the first `depth` tokens of its context
   (for an ICQS job: the demo set), `depth` the multiple of a KV page that gives the smallest largest shard.
   Requests sorted by their tokens are the prefix tree in depth-first order, so a key's requests are consecutive;
   consecutive keys are cut into shards of equal unique tokens (the prefix tree's size), so a key never spans two
   shards, and the only tokens computed twice are the prefixes that neighbouring shards share at a cut.
   `naive=True` deals the requests round-robin instead (what a key-blind split does): every shard then recomputes
   nearly every prefix.
3. The workers are Ray actors, one `EngineWorker` (one Engine) each, `num_gpus=1` per actor on GPUs, else
   `--threads` CPUs: started on a DistributedEngine's first call and kept until `close()` (or the end of a `with`
   block), so a job of many calls (`icqs score --ray` makes one per chunk of candidates) loads the model once per
   worker. A `ray.util.ActorPool` feeds them the shards, one in flight per actor, the next shard to the first actor
   that is free; each actor keeps its cache across shards and calls, so two shards of one subtree on the same actor
   share their prefix too.
4. The driver takes the results in any order and keeps each request's first result. A killed actor is restarted
   and the shard it was scoring is retried on it (max_restarts / max_task_retries = -1): a shard's result is only
   seen once it has finished, so no request is lost, and none is duplicated.

`score_rows` (the CLI, after commands/engine_cli.py's checks) appends each result to the output in input order as soon as
the rows before it are done, with every input field passed through: the local path's output, and its resumption
(a rerun skips the rows already written).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace

from engine.encoding import encode_pairs, prompt_ids
from engine.engine import Engine, EngineOptions
from engine.errors import UserError
from engine.loader import load_model_info
from engine.results import Generation, ScoreResult
from engine.stats import NAMES, EngineStats
from engine.validation import Limits, check_generate, check_scores

SHARDS_PER_WORKER = 2


# ---- planning: shards along the prefix tree ---------------------------------------------------------------------
def common_prefix(a, b) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def unique_tokens(seqs) -> int:
    """Tokens in the prefix tree of `seqs` (sorted): each token counted once per distinct prefix."""
    total, prev = 0, []
    for s in seqs:
        total += len(s) - common_prefix(prev, s)
        prev = s
    return total


@dataclass
class Plan:
    shard: list[int]  # request -> shard
    depth: int  # key length in tokens (0: naive)
    keys: int  # distinct keys
    shard_tokens: list[int]  # unique tokens per shard (what each shard's engine computes)

    @property
    def shards(self) -> int:
        return len(self.shard_tokens)

    @property
    def total(self) -> int:
        return sum(self.shard_tokens)


def plan_shards(
    encoded: list[tuple[list[int], list[int]]], shards: int, page_size: int = 16, naive: bool = False
) -> Plan:
    """Shard each (context ids, continuation ids) request; see the module docstring. The key depth: of the page
    multiples that give at least `shards` keys, the one whose largest shard is smallest (the job's makespan),
    then whose total is smallest."""
    seqs = [ctx + cont[:-1] for ctx, cont in encoded]  # the tokens the engine computes for a request
    if naive:
        shard = [i % shards for i in range(len(seqs))]
        return Plan(shard, 0, len(seqs), [unique_tokens(sorted(seqs[s::shards])) for s in range(shards)])
    order = sorted(range(len(seqs)), key=seqs.__getitem__)  # the prefix tree in depth-first order
    lengths = [len(seqs[i]) for i in order]
    added = [n - common_prefix(seqs[a], seqs[b]) for n, a, b in zip(lengths, [order[0]] + order, order)]
    added[0] = lengths[0]  # added[k]: the tokens request order[k] adds to the tree of those before it
    ctx_len = [len(encoded[i][0]) for i in order]
    ctx_shared = [common_prefix(encoded[a][0], encoded[b][0]) for a, b in zip(order, order[1:])]

    def cut(starts: list[int], depth: int) -> Plan:
        """Consecutive keys (starting at sorted positions `starts`) cut at equal shares of the unique tokens."""
        ends = starts[1:] + [len(order)]
        weights = [sum(added[a:b]) for a, b in zip(starts, ends)]
        total, done, shard, tokens = max(1, sum(weights)), 0, [0] * len(seqs), [0] * shards
        for a, b, w in zip(starts, ends, weights):
            s = min(shards - 1, (2 * done + w) * shards // (2 * total))
            first = not tokens[s]  # a shard's first request brings its whole prefix
            for k in range(a, b):
                shard[order[k]] = s
            tokens[s] += (lengths[a] if first else added[a]) + sum(added[a + 1 : b])
            done += w
        return Plan(shard, depth, len(starts), tokens)

    best, levels, longest = None, set(), max(ctx_len)
    for depth in range(page_size, longest + page_size, page_size):
        starts = [0] + [
            k + 1 for k, c in enumerate(ctx_shared) if c < min(depth, ctx_len[k]) or c < min(depth, ctx_len[k + 1])
        ]
        if len(starts) in levels or (len(starts) < shards and depth < longest):
            continue  # a deeper key with as many keys splits the requests the same way
        levels.add(len(starts))
        plan = cut(starts, depth)
        if best is None or (max(plan.shard_tokens), plan.total) < (max(best.shard_tokens), best.total):
            best = plan
    return best


# ---- the workers ------------------------------------------------------------------------------------------------
class EngineWorker:
    """One Engine per Ray actor; `run` scores (or generates for) one block of requests per call."""

    def __init__(self, model, engine_options: dict):
        self.engine = Engine.load(model, **engine_options)
        self.worker = f"{os.uname().nodename}:{os.getpid()}"

    def name(self) -> str:
        return self.worker

    def run(self, batch, op: str = "score", options: dict | None = None):
        """(the results: one row per request of the block, `_row` its index in the job; the call: one row of
        call_schema(): this worker's name, the call's seconds and its engine's EngineStats as one struct)."""
        import time

        import pyarrow as pa

        start = time.perf_counter()
        rows = batch.column("_row").to_pylist()
        if op == "score":
            reqs = list(zip(batch.column("context").to_pylist(), batch.column("continuation").to_pylist()))
            out = [asdict(r) for r in self.engine.score(reqs, share_prefix=True)]
        else:
            out = [asdict(g) for g in self.engine.generate(batch.column("prompt").to_pylist(), **(options or {}))]
        table = pa.Table.from_pylist(out).append_column("_row", pa.array(rows, pa.int64()))
        call = {
            "worker": self.worker,
            "seconds": time.perf_counter() - start,
            "stats": self.engine.last_stats.to_dict(),
        }
        return table, pa.Table.from_pylist([call], schema=call_schema())


def call_schema():
    """The Arrow schema of a worker call's record: its worker, its seconds and its engine's counters (a struct of
    EngineStats' fields, built from them: a field added there is carried here)."""
    import pyarrow as pa

    stats = pa.struct([pa.field(name, pa.int64(), nullable=False) for name in NAMES])
    return pa.schema(
        [
            pa.field("worker", pa.string(), nullable=False),
            pa.field("seconds", pa.float64(), nullable=False),
            pa.field("stats", stats, nullable=False),
        ]
    )


def read_call(call) -> tuple[str, float, EngineStats]:
    """(worker, seconds, EngineStats) of a worker call's record (`EngineWorker.run`'s second table)."""
    (record,) = call.to_pylist()
    return record["worker"], record["seconds"], EngineStats.from_dict(record["stats"])


# ---- the cluster ------------------------------------------------------------------------------------------------
def init_local_cluster(**options):
    """Start a local Ray cluster that listens on 127.0.0.1 only. Ray turns a loopback node address into the
    machine's own and binds there, unless it takes itself for a single-machine cluster (its default on Windows and
    macOS), which RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 selects: for Ray's own processes through the environment,
    for this one through the constant read at import."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False
    ray.init(
        _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False, configure_logging=False, **options
    )


def connect(address: str | None, workers: int, threads: int, gpus: bool):
    """Join the Ray cluster at `address`, or start a local one ('local'), unless this process is connected."""
    import ray

    if not ray.is_initialized():
        local = address in (None, "local")
        try:
            if local:
                init_local_cluster(num_cpus=max(os.cpu_count() or 1, workers * threads))
            else:
                ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise UserError(f"--ray {address}: cannot connect to a Ray cluster: {e}".splitlines()[0]) from None
    available = ray.cluster_resources().get("GPU" if gpus else "CPU", 0)
    need = workers * (1 if gpus else threads)
    if available < need:
        what = "GPUs" if gpus else "CPUs"
        raise UserError(f"--workers {workers}: the Ray cluster has {available:g} {what}, {need} are needed")


@dataclass
class Cluster:
    """Where and how the workers run: the options of `--ray [ADDRESS] --workers N` and the engine's."""

    model: str | None
    engine_options: dict  # Engine.load keyword arguments for every worker
    address: str | None = None
    workers: int = 2
    naive: bool = False

    @property
    def threads(self) -> int:
        return self.engine_options.get("threads") or 1


class DistributedEngine:
    """The Engine's closed-job interface (engine/protocol.py's JobEngine) over a pool of Ray actors: `score`,
    `generate`, `last_stats`, `tokenizer`, `config`, `limits`. The driver reads the model's config and tokenizer
    only (no weights) and validates every request as a worker's Engine would (engine/validation.py, the workers'
    limits), before any worker starts; the workers hold the engines, from the first call to `close()` (also a
    context manager)."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.config, self.tokenizer = load_model_info(cluster.model)
        self.options = EngineOptions.checked(
            **{k: v for k, v in cluster.engine_options.items() if k in ("kv_tokens", "token_budget", "keep_cache")}
        )  # each worker's
        self.limits = Limits.of(self.config, self.options.kv_tokens, self.options.page_size)
        self.last_stats = EngineStats()
        self.busy_seconds: dict[str, float] = {}  # the last call's seconds in the workers' engines, per worker
        self.last_plan: Plan | None = None
        self._gpus = str(cluster.engine_options.get("device")).startswith("cuda")
        self._workers = None  # the Ray actors, once started

    def encode(self, requests) -> list[tuple[list[int], list[int]]]:
        """Token ids of every request, checked as Engine.score checks them (same errors as the local path)."""
        encoded = encode_pairs(self.tokenizer, requests)
        check_scores(encoded, 0, self.limits)
        return encoded

    @property
    def max_request_tokens(self) -> int:
        return self.limits.max_request_tokens

    def _run_blocks(self, tables, op: str = "score", options: dict | None = None):
        """An iterator of each block's result table (the worker's output columns) as the workers finish them: one
        block in flight per worker, the next block to the first worker that is free. The workers are started on the
        first call (after the cluster's resources are checked: before this returns) and kept for the next ones."""
        from ray.util import ActorPool

        if self._workers is None:
            c = self.cluster
            connect(c.address, c.workers, c.threads, self._gpus)
            self._workers = self._start_workers()
        pool = ActorPool(self._workers)  # a fresh pool per call: an aborted call leaves no submission behind
        return pool.map_unordered(lambda worker, table: worker.run.remote(table, op, options), tables)

    def start(self) -> list[str]:
        """Start the workers now (else the first call does) and wait until each has loaded its model; returns their
        names (host:pid)."""
        import ray

        self._run_blocks([])
        return ray.get([worker.name.remote() for worker in self._workers])

    def _start_workers(self) -> list:
        """One EngineWorker actor per worker. Ray restarts an actor whose process dies, and retries the call it was
        running on the restarted one (max_restarts / max_task_retries = -1); an error raised by the model is not
        retried."""
        import ray

        c = self.cluster
        actor = ray.remote(EngineWorker).options(
            num_cpus=1 if self._gpus else c.threads,
            num_gpus=1 if self._gpus else 0,
            max_restarts=-1,
            max_task_retries=-1,
        )
        return [actor.remote(c.model, c.engine_options) for _ in range(c.workers)]

    def close(self) -> None:
        """Stop the workers (a later call starts new ones). Dropping the DistributedEngine stops them too."""
        import ray

        for worker in (self._workers or ()) if ray.is_initialized() else ():
            ray.kill(worker, no_restart=True)
        self._workers = None

    def __enter__(self) -> "DistributedEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _count_call(self, call, unique_tokens: int | None = None) -> str:
        """Add a worker call's counters to last_stats and its seconds to busy_seconds; its worker's name. A scoring
        job's unique tokens are the plan's (what its shards' engines compute), not the sum of the workers' own."""
        worker, seconds, stats = read_call(call)
        self.last_stats = self.last_stats.plus(stats)
        if unique_tokens is not None:
            self.last_stats = replace(self.last_stats, unique_tokens=unique_tokens)
        self.busy_seconds[worker] = self.busy_seconds.get(worker, 0.0) + seconds
        return worker

    def score(
        self, requests, share_prefix: bool = True, progress: bool = False, done=(), on_result=None
    ) -> list[ScoreResult | None]:
        """log P(continuation | context) for each request, computed on the workers. `done`: indices to skip
        (their result is None); `on_result(i, result, worker)` is called as each result arrives."""
        import pyarrow as pa

        from engine.progress import progress_bar

        if not share_prefix:
            raise UserError("--ray always shares prefixes (--no-share is for single-process comparisons)")
        encoded = self.encode(requests)
        c, done = self.cluster, set(done)
        todo = [i for i in range(len(encoded)) if i not in done]
        results: list[ScoreResult | None] = [None] * len(encoded)
        self.last_stats = EngineStats()  # the workers' counters summed, as their results come
        self.busy_seconds = {}
        if not todo:
            return results
        plan = self.last_plan = plan_shards([encoded[i] for i in todo], c.workers * SHARDS_PER_WORKER, naive=c.naive)
        members = [[] for _ in range(plan.shards)]
        for i, s in zip(todo, plan.shard):
            members[s].append(i)
        tables = [
            pa.table(
                {
                    "_row": pa.array(m, pa.int64()),
                    "context": [encoded[i][0] for i in m],
                    "continuation": [encoded[i][1] for i in m],
                }
            )
            for m in members
            if m
        ]
        blocks = self._run_blocks(tables)
        bar = progress_bar(
            total=len(todo), unit="req", desc=f"scoring on {c.workers} Ray workers", disable=not progress
        )
        for table, call in blocks:
            worker = self._count_call(call, unique_tokens=sum(plan.shard_tokens))
            for row in table.to_pylist():
                i = row["_row"]
                if results[i] is None:  # the first result of a request; a retried task's is the same
                    results[i] = ScoreResult(**{f.name: row[f.name] for f in fields(ScoreResult)})
                    if on_result:
                        on_result(i, results[i], worker)
                    bar.update(1)
        bar.close()
        missing = [i for i in todo if results[i] is None]
        if missing:  # cannot happen while Ray retries: say so rather than write a hole
            raise RuntimeError(f"{len(missing)} requests came back without a result (first: {missing[0]})")
        return results

    def generate(
        self,
        prompts,
        max_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        progress: bool = False,
    ):
        """Engine.generate on the workers: the prompts cut into contiguous shards of the sorted order (prompts
        sharing a prefix stay together), each checked here first. Sampling with a seed follows the shard, not the
        whole list."""
        import pyarrow as pa

        if not prompts:
            return []
        for i, p in enumerate(prompts):
            check_generate(
                prompt_ids(self.tokenizer, p, i, f"prompt {i}"),
                max_tokens,
                temperature,
                top_p,
                seed,
                self.limits,
                index=i,
                label=f"prompt {i}",
            )
        options = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, stop=stop)
        c = self.cluster
        order = sorted(range(len(prompts)), key=lambda i: prompts[i])
        n = c.workers * SHARDS_PER_WORKER
        parts = [order[k * len(order) // n : (k + 1) * len(order) // n] for k in range(n)]
        tables = [pa.table({"_row": pa.array(p, pa.int64()), "prompt": [prompts[i] for i in p]}) for p in parts if p]
        out = [None] * len(prompts)
        self.last_stats, self.busy_seconds = EngineStats(), {}
        for table, call in self._run_blocks(tables, "generate", options):
            self._count_call(call)
            for row in table.to_pylist():
                out[row["_row"]] = out[row["_row"]] or Generation(**{f.name: row[f.name] for f in fields(Generation)})
        return out
