"""Fuzz of a model's header (issue 40): hypothesis mutates the GGUF metadata and the config.json fields of tiny
models (a size, a token id, a rope parameter, a window... set to an edge value, a value of another type, or
removed), and every mutated model either loads and scores, with finite scores (equal to the original's when the
field cannot change them), or `python -m engine score` fails with one line `error: FILE: ...` and exit 2. Each case
runs in a worker process under a memory limit (RLIMIT_AS, MEMORY_LIMIT) and a time limit (CASE_SECONDS), so that a
header that makes the loader allocate without bound fails the test instead of the machine. The figures (cases,
loaded / refused, the worker's peak memory) are printed: run with -s to see them."""

from __future__ import annotations

import json
import math
import os
import resource
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_header_validation import rewrite_gguf
from tiny_models import make_tiny_gguf, make_tiny_model

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = 60
MEMORY_LIMIT = 3 << 30  # bytes of address space for the worker (torch and a tiny model need about 1.5 GiB of it)
CASE_SECONDS = 60  # a case that takes longer (a loader spinning on a huge count) fails the test
T = gguf.GGUFValueType
REMOVE = object()
PAIRS = [
    {"context": "The quality of a demonstration", "continuation": " is judged by how much"},
    {"context": "", "continuation": "Reading is a quiet way"},
]

INTS = st.one_of(
    st.sampled_from(
        [
            0,
            1,
            2,
            3,
            4,
            15,
            16,
            17,
            63,
            64,
            65,
            383,
            384,
            385,
            512,
            4096,
            65536,
            -1,
            -5,
            2**31 - 1,
            2**31,
            2**32 - 1,
            2**63 - 1,
            10**18,
        ]
    ),
    st.integers(0, 600),
    st.integers(-(2**31), 2**32 - 1),
)
FLOATS = st.one_of(
    st.sampled_from([0.0, -1.0, 0.5, 1.0, 1e-30, 1e-6, 1e6, 1e30, math.inf, -math.inf, math.nan]),
    st.floats(-1e40, 1e40),
)
STRINGS = st.sampled_from(["", "linear", "llama3", "yarn", "default", "x" * 1000, "64"])
VALUES = st.one_of(INTS, FLOATS, STRINGS, st.booleans(), st.just(REMOVE))

GGUF_KEYS = {  # per GGUF architecture: the metadata a loader reads sizes, ids and rope parameters from
    "llama": [
        "llama.context_length",
        "llama.embedding_length",
        "llama.block_count",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
        "llama.attention.key_length",
        "llama.attention.value_length",
        "llama.rope.freq_base",
        "llama.attention.layer_norm_rms_epsilon",
        "llama.rope.dimension_count",
        "llama.rope.scaling.type",
        "llama.rope.scaling.factor",
        "llama.vocab_size",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.add_bos_token",
        "general.alignment",
    ],
    "gemma3": [
        "gemma3.context_length",
        "gemma3.embedding_length",
        "gemma3.block_count",
        "gemma3.attention.head_count",
        "gemma3.attention.head_count_kv",
        "gemma3.attention.key_length",
        "gemma3.attention.sliding_window",
        "gemma3.attention.sliding_window_pattern",
        "gemma3.rope.freq_base",
        "gemma3.rope.scaling.factor",
        "gemma3.attention.layer_norm_rms_epsilon",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
    ],
}
for _keys in GGUF_KEYS.values():
    _keys += ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"]
ARRAYS = {
    "tokenizer.ggml.tokens": T.STRING,
    "tokenizer.ggml.token_type": T.INT32,  # the tokenizer's arrays, cut
    "tokenizer.ggml.merges": T.STRING,
}  # short or grown (the writer writes no empty array; a template is text)
CONFIG_FIELDS = [
    "max_position_embeddings",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "rms_norm_eps",
    "rope_theta",
    "bos_token_id",
    "eos_token_id",
    "tie_word_embeddings",
    "sliding_window",
    "sliding_window_pattern",
    "query_pre_attn_scalar",
    "rope_scaling",
    "rope_local_base_freq",
    "attention_bias",
    "hidden_act",
    "model_type",
    "torch_dtype",
]
CONFIG_VALUES = st.one_of(
    VALUES,
    st.none(),
    st.lists(INTS, max_size=3),
    st.fixed_dictionaries({"rope_type": STRINGS, "factor": st.one_of(FLOATS, INTS)}),
    st.fixed_dictionaries(
        {
            "rope_type": st.just("llama3"),
            "factor": FLOATS,
            "low_freq_factor": FLOATS,
            "high_freq_factor": FLOATS,
            "original_max_position_embeddings": INTS,
        }
    ),
)
NEUTRAL = ("context_length", "max_position_embeddings")  # fields that cannot change the scores of PAIRS, if accepted


def _gguf_value(value):
    """(value, GGUF type) as a GGUF file stores it."""
    if isinstance(value, bool):
        return value, T.BOOL
    if isinstance(value, int):
        if value < 0:
            return value, T.INT32 if value >= -(2**31) else T.INT64
        return value, T.UINT32 if value < 2**32 else T.UINT64
    if isinstance(value, float):
        return value, T.FLOAT32 if not math.isfinite(value) or abs(value) < 3e38 else T.FLOAT64
    return value, T.STRING


class Worker:
    """tests/header_fuzz_worker.py under RLIMIT_AS; one JSON request and answer a case."""

    def __init__(self):
        def limit():
            resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "header_fuzz_worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            preexec_fn=limit,
        )
        self.cases, self.outcomes, self.peak_mib = 0, {"loaded": 0, "refused": 0}, 0.0

    def score(self, model: Path, inp: Path, out: Path) -> dict:
        self.proc.stdin.write(json.dumps({"model": str(model), "input": str(inp), "output": str(out)}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], CASE_SECONDS)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            pytest.fail(
                f"{model}: no answer within {CASE_SECONDS} s (the worker "
                f"{'ended' if self.proc.poll() is not None else 'is stuck'}: over its memory limit?)"
            )
        answer = json.loads(line)
        self.cases += 1
        self.peak_mib = max(self.peak_mib, answer["peak_rss_mib"])
        return answer

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    root = tmp_path_factory.mktemp("originals")
    (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    models = {("gguf", arch): make_tiny_gguf(root / f"{arch}.gguf", arch)[0] for arch in GGUF_KEYS}
    models.update({("hf", arch): make_tiny_model(root / f"hf-{arch}", arch=arch) for arch in ("llama", "gemma3")})
    return root, models


@pytest.fixture(scope="module")
def worker(originals):
    root, models = originals
    w = Worker()
    t0 = time.perf_counter()
    w.reference = {}
    for key, model in models.items():
        answer = w.score(model, root / "pairs.jsonl", root / f"ref-{key[0]}-{key[1]}.jsonl")
        assert answer["status"] == 0, answer
        w.reference[key] = answer["logprobs"]
    yield w
    w.close()
    print(
        f"\nheader fuzz: {w.cases} cases ({len(models)} originals, {w.outcomes['loaded']} mutated models loaded and "
        f"scored, {w.outcomes['refused']} refused in one line), worker peak RSS {w.peak_mib:.0f} MiB under an "
        f"address-space limit of {MEMORY_LIMIT >> 30} GiB, {time.perf_counter() - t0:.0f} s"
    )


def _mutate(data, originals, where: Path) -> tuple[Path, list]:
    """A mutated copy of one of the originals; the model's path and the changes made."""
    root, models = originals
    kind, arch = data.draw(st.sampled_from(sorted(models)), label="model")
    if kind == "gguf":
        keys = data.draw(st.lists(st.sampled_from(GGUF_KEYS[arch]), min_size=1, max_size=2, unique=True), label="keys")
        changes = {k: data.draw(STRINGS if k == "tokenizer.chat_template" else VALUES, label=k) for k in keys}
        new = {k: _gguf_value(v) for k, v in changes.items() if v is not REMOVE}
        array = data.draw(st.sampled_from([None, *ARRAYS]), label="array")
        if array is not None and array in gguf.GGUFReader(str(models[kind, arch])).fields:
            items = list(gguf.GGUFReader(str(models[kind, arch])).get_field(array).contents())
            n = data.draw(
                st.sampled_from([1, 2, len(items) // 2, len(items) - 1, len(items) + 1, len(items) + 300]),
                label=f"{array} entries",
            )
            new[array] = (
                (items * 2)[:n] if n <= 2 * len(items) else items + items[-1:] * (n - len(items)),
                T.ARRAY,
                ARRAYS[array],
            )
            changes[array] = f"<{n} of {len(items)} entries>"
        model = rewrite_gguf(
            models[kind, arch], where / "m.gguf", new, tuple(k for k, v in changes.items() if v is REMOVE)
        )
    else:
        keys = data.draw(st.lists(st.sampled_from(CONFIG_FIELDS), min_size=1, max_size=2, unique=True), label="keys")
        changes = {k: data.draw(CONFIG_VALUES, label=k) for k in keys}
        model = shutil.copytree(models[kind, arch], where / "m")
        config = json.loads((model / "config.json").read_text())
        for k, v in changes.items():
            if v is REMOVE:
                config.pop(k, None)
            else:
                config[k] = v
        (model / "config.json").write_text(json.dumps(config))
    return model, (kind, arch), [(k, "<removed>" if v is REMOVE else v) for k, v in changes.items()]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_mutated_header_loads_and_scores_or_fails_in_one_line(data, originals, worker, tmp_path_factory):
    where = tmp_path_factory.mktemp("case")
    model, key, changes = _mutate(data, originals, where)
    answer = worker.score(model, originals[0] / "pairs.jsonl", where / "out.jsonl")
    note = f"{key[0]} {key[1]} with {changes}: {answer}"
    if answer["status"] == 0:
        worker.outcomes["loaded"] += 1
        assert all(isinstance(lp, float) and math.isfinite(lp) for lp in answer["logprobs"]), note
        if all(k.split(".")[-1] in NEUTRAL for k, _ in changes):
            assert answer["logprobs"] == pytest.approx(worker.reference[key], abs=1e-4), note
    else:
        worker.outcomes["refused"] += 1
        lines = answer["stderr"].splitlines()
        named = (f"error: {model}", f"error: {originals[0] / 'pairs.jsonl'}:")  # the model, or a pair it cannot hold
        assert answer["status"] == 2 and len(lines) == 1 and lines[0].startswith(named), note
