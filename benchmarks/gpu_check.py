"""One prepared check of the engine on a CUDA GPU: the chip's bounds, every Triton kernel against its reference,
log-prob parity with transformers, and speed against transformers, in one command of about 8 minutes on an H100.

    PYTHONPATH=. python benchmarks/gpu_check.py --out DIR           # the GPU machine (run it with a ~9 min limit)
    PYTHONPATH=. python benchmarks/gpu_check.py --out DIR --smoke   # the same at tiny sizes on the CPU (<1 min)

Made for the GPU machine as it is: run from the checkout (no install), nothing downloaded, no model files (random
weights from configs, tokenizers trained here), no native CPU library; it needs torch, triton, transformers,
tokenizers, numpy, PyYAML and pytest only (the engine's other dependencies are imported where they are used).

Each section runs in its own process with its own time cap (--cap NAME=SECONDS) and writes what it has measured as
it goes; when it ends, or is cut off at its cap, DIR/gpu_check.json and DIR/gpu_check.md are rewritten (atomically)
with every section so far, so a run stopped at any point still returns what finished. Its output is in
DIR/logs/NAME.log.

1. bounds    GPU, driver, versions; the measured bf16 matmul rate (8192^3, best of several runs) and the
             device-to-device copy bandwidth.
2. kernels   every Triton kernel against its torch reference at the engine's shapes (bench_kernels_gpu.cases: head
             dim 64 / 128 / 256 with GQA, the cascade over a shared prefix, the sliding window, its causal self part,
             the deterministic merge, the target log-prob over 128k and 262k vocabularies), fp32 and bf16, with the
             test suite's tolerances; the bf16 times of each against its reference and torch SDPA's flash backend
             where SDPA computes the same attention; then the suite's own kernel tests on the device
             (tests/test_kernels_triton.py under pytest).
3. parity    per-token log-probs of tiny random Llama, Qwen2, Qwen3 and Gemma-3 (window shorter than the prompts)
             against transformers on the same weights on the device: fp32 (<= 1e-4) and bf16 (no worse than
             twice transformers' own bf16 error plus the kernels' bf16 tolerance); greedy generation equal, and
             equal again with its decode steps replayed from CUDA graphs (the engine option decode_graphs); the
             deterministic mode bitwise the same for requests alone and inside mixed jobs of other sizes.
4. speed     bf16 at Llama-3-8B's and Llama-3.2-1B's shapes (random weights; sections speed_8b and speed_1b): the
             ICQS-shaped job of bench_icqs_workload against transformers run the way lm-evaluation-harness's hf
             backend runs it (padded batches, timed on a random sample and extrapolated), plain unshared scoring,
             and decode of 64 sequences against transformers' generate (and the same decode from CUDA graphs,
             decode_graphs). For each: tokens/s, requests/s, peak GPU memory and the model FLOP utilisation (the
             matmul FLOPs of the computed tokens, attention included, over the matmul rate of section 1); where
             the host's time goes (before the loop, launching steps, reading them), the device's busy share under
             torch.profiler and the lines that made the host wait for it.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "benchmarks", ROOT / "tests", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

# the greedy generation the parity section compares with transformers (test_greedy_generation_matches_transformers)
GREEDY_PROMPTS = [[5, 17, 99, 23], [5, 17, 99, 23, 41, 7], [200, 3, 8]]
# seconds per section on the GPU machine: together within --budget, leaving room in a 9-minute limit
CAPS = {"bounds": 25, "kernels": 150, "parity": 90, "speed_8b": 195, "speed_1b": 30}
SMOKE_CAPS = {"bounds": 60, "kernels": 120, "parity": 120, "speed_8b": 120, "speed_1b": 120}
SMOKE_SECTIONS = "bounds,kernels,parity,speed_8b"  # speed_1b runs the same tiny model as speed_8b in --smoke
BUDGET = 510  # seconds for the whole run: no section starts after it, and each is capped at what is left
PARITY_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
FP32_TOL = 1e-4
# the GPU suite's selection in --smoke (the interpreter is slow; the suite runs the whole file itself)
SMOKE_SUITE = "silu_and_mul or target_logprobs"
# Llama-3.2-1B (tied embeddings); Llama-3-8B is bench_load.LLAMA8B
LLAMA32_1B = dict(
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    tie_word_embeddings=True,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)


# ---- results: one JSON per section as it goes, merged into gpu_check.json and gpu_check.md -------------------
def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Recorder:
    """What a section has measured so far, rewritten to its part file after every put."""

    def __init__(self, path: Path):
        self.path, self.data = path, {}

    def put(self, *keys, value) -> None:
        node = self.data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
        write_atomic(self.path, json.dumps(self.data, indent=1, default=str))

    def get(self, *keys, default=None):
        node = self.data
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return default
            node = node[k]
        return node

    def attempt(self, part: str, fn, *args):
        """fn(*args); an exception is recorded under errors[part] (its last lines) and the section goes on."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001  (a check of many parts reports each failure and carries on)
            tail = traceback.format_exc().strip().splitlines()[-6:]
            print(f"{part}: {type(e).__name__}: {e}", flush=True)
            self.put("errors", part, value="\n".join(tail))
            return None


def merge(report: dict, part: dict) -> None:
    for k, v in part.items():
        if isinstance(v, dict) and isinstance(report.get(k), dict):
            merge(report[k], v)
        else:
            report[k] = v


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6):
            return f"{v:.3g}"
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def md_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows])


def _gib(v: dict, who: str) -> str:
    peak, work = v.get(f"{who}_peak_gib"), v.get(f"{who}_work_gib")
    return "-" if peak is None else f"{peak:.1f} ({work:.2f})" if work is not None else f"{peak:.1f}"


def markdown(r: dict) -> str:
    """The report as markdown tables, one block per section that has results."""
    out = [
        f"# GPU check: {r.get('device', '?')}{' (smoke run: tiny sizes, CPU)' if r.get('smoke') else ''}",
        "",
        f"`{r.get('command', '')}`, started {r.get('started', '?')} on {r.get('machine', '?')}",
        "",
    ]
    out.append(
        md_table(
            ["section", "status", "seconds", "cap s"],
            [[k, s.get("status"), s.get("seconds"), s.get("cap_s")] for k, s in r.get("sections", {}).items()],
        )
    )
    if r.get("versions"):
        out += ["", "versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items())]
    if "bounds" in r:
        b = r["bounds"]
        out += [
            "",
            "## Bounds",
            "",
            md_table(
                ["device", "matmul", "TFLOP/s", "copy", "GB/s"],
                [[r.get("device"), b.get("matmul"), b.get("matmul_tflops"), b.get("copy"), b.get("bandwidth_gbs")]],
            ),
        ]
        hc = b.get("host_copy")
        if hc:
            out += [
                "",
                f"reading a result back (kernels.HostCopy) with ~20 matmuls queued after it: "
                f"{hc['host_copy']['read_ms']:.2f} ms, against {hc['host_copy']['later_work_ms']:.1f} ms for that work "
                f"(a plain .tolist(): {hc['tolist']['read_ms']:.1f} ms); read before the later work: "
                f"{hc['reads_before_later_work']}",
            ]
    k = r.get("kernels", {})
    if k:
        out += [
            "",
            "## Kernels",
            "",
            f"passed {k.get('passed', 0)}, failed {k.get('failed', 0)} (engine shapes: "
            f"{k.get('cases_passed', 0)} passed, {k.get('cases_failed', 0)} failed; test suite: "
            f"{fmt(k.get('suite', {}).get('passed'))} passed, {fmt(k.get('suite', {}).get('failed'))} failed, "
            f"{fmt(k.get('suite', {}).get('skipped'))} skipped)",
        ]
        fails = [c for c in k.get("cases", []) if not c.get("ok")] + [
            {"model": "suite", "op": n} for n in k.get("suite", {}).get("failures", [])
        ]
        if fails:
            out += [
                "",
                "failed: "
                + "; ".join(
                    f"{c.get('model')} {c.get('op')} {c.get('case', '')} "
                    f"{c.get('dtype', '')} {c.get('error', '')}".strip()
                    for c in fails
                ),
            ]
        if k.get("note"):
            out += ["", f"note: {k['note']}"]
        if k.get("cases"):
            out += [
                "",
                md_table(
                    ["shape", "op", "case", "dtype", "max abs diff", "ok", "SDPA max abs diff"],
                    [
                        [
                            c["model"],
                            c["op"],
                            c["case"],
                            c["dtype"],
                            c.get("max_abs"),
                            c.get("ok"),
                            c.get("sdpa_max_abs"),
                        ]
                        for c in k["cases"]
                    ],
                ),
            ]
        if k.get("timings"):
            out += [
                "",
                "times, ms per call (bf16 on the GPU; smoke: fp32 on the interpreter, meaningless):",
                "",
                md_table(
                    [
                        "shape",
                        "op",
                        "case",
                        "Triton ms",
                        "torch ref ms",
                        "SDPA flash ms",
                        "Triton vs SDPA",
                        "Triton TFLOP/s or GB/s",
                    ],
                    [
                        [
                            t["model"],
                            t["op"],
                            t["case"],
                            t["triton_ms"],
                            t.get("torch_ms"),
                            t.get("sdpa_ms"),
                            t.get("vs_sdpa"),
                            t.get("rate"),
                        ]
                        for t in k["timings"]
                    ],
                ),
            ]
        if k.get("sdpa_skipped"):
            out += ["", f"SDPA: {k['sdpa_skipped']}"]
    p = r.get("parity", {})
    if p:
        out += [
            "",
            "## Parity with transformers",
            "",
            f"fp32 max abs {fmt(p.get('fp32_max_abs'))} (<= {FP32_TOL}), bf16 within tolerance: "
            f"{fmt(p.get('bf16_ok'))}, greedy generation equal: {fmt(p.get('greedy_equal'))} (from CUDA graphs: "
            f"{fmt(p.get('decode_graphs_equal'))}), deterministic "
            f"mode bitwise: {fmt(p.get('deterministic_bitwise'))}",
        ]
        if p.get("archs"):
            out += [
                "",
                md_table(
                    [
                        "model",
                        "requests",
                        "fp32 max abs",
                        "bf16 engine max abs",
                        "bf16 transformers max abs",
                        "bf16 tolerance",
                        "greedy equal",
                        "read first equal",
                        "from graphs equal",
                    ],
                    [
                        [
                            a,
                            v.get("requests"),
                            v.get("fp32_max_abs"),
                            v.get("bf16_max_abs"),
                            v.get("hf_bf16_max_abs"),
                            v.get("bf16_tol"),
                            v.get("greedy_equal"),
                            v.get("greedy_equal_read_first"),
                            v.get("decode_graphs_equal"),
                        ]
                        for a, v in p["archs"].items()
                    ],
                ),
            ]
        if p.get("deterministic"):
            out += [
                "",
                md_table(
                    ["deterministic mode", "dtype", "cases", "bitwise", "max diff"],
                    [[d["model"], d["dtype"], d["cases"], d["bitwise"], d["max_diff"]] for d in p["deterministic"]],
                ),
            ]
            broken = [
                f"{d['model']} {d['dtype']}: {name}"
                for d in p["deterministic"]
                for name, ok in d.get("cases_bitwise", {}).items()
                if not ok
            ]
            if broken:
                out += ["", "cases that changed a request's bits: " + "; ".join(broken)]
        if p.get("deterministic_ops"):
            out += [
                "",
                md_table(
                    ["deterministic op (one row alone vs in batches)", "dtype", "batches", "bitwise", "max diff"],
                    [
                        [d["op"], d["dtype"], d.get("batches"), d.get("bitwise", d.get("error")), d.get("max_diff")]
                        for d in p["deterministic_ops"]
                    ],
                ),
            ]
    s = r.get("speed", {})
    if s:
        out += [
            "",
            "## Speed (bf16)",
            "",
            md_table(
                [
                    "job",
                    "shape",
                    "requests",
                    "engine s",
                    "engine tokens computed",
                    "engine tok/s",
                    "engine req/s",
                    "engine MFU",
                    "engine peak GiB (run's own)",
                    "transformers req/s",
                    "transformers MFU",
                    "transformers peak GiB (run's own)",
                    "vs transformers (req/s)",
                    "max abs diff",
                ],
                [
                    [
                        name,
                        v.get("shape"),
                        v.get("requests"),
                        v.get("engine_s"),
                        v.get("tokens_computed"),
                        v.get("engine_tokens_per_s"),
                        v.get("engine_requests_per_s"),
                        v.get("mfu"),
                        _gib(v, "engine"),
                        v.get("hf_requests_per_s"),
                        v.get("hf_mfu"),
                        _gib(v, "hf"),
                        v.get("vs_hf"),
                        v.get("max_abs"),
                    ]
                    for name, v in s.items()
                ],
            ),
        ]
        notes = [f"{name}: {v['note']}" for name, v in s.items() if v.get("note")]
        notes += [
            f"{name}: host {v['host_before_loop_s']:.2f} s before the loop, then {v['loop_s']:.2f} s in it "
            f"({v['launch_s']:.2f} s launching steps, {v['finish_s']:.2f} s reading and recording them)"
            for name, v in s.items()
            if "loop_s" in v
        ]
        out += [""] + notes if notes else []
        for name, v in s.items():
            syncs = v.get("sync_points") or {}
            if "count" in syncs:
                where = ", ".join(f"{k} x{n}" for k, n in syncs["places"].items()) or "none"
                out += [
                    "",
                    f"{name}: {syncs['count']} waits for the device (part of the job, in sync debug mode): {where}",
                ]
        for name, v in s.items():
            prof = v.get("device_profile")
            if prof:
                out += [
                    "",
                    f"{name}, one more run under torch.profiler: {prof['wall_s']:.2f} s, the device busy "
                    f"{prof['device_busy_s']:.2f} s ({prof['device_busy_fraction']:.0%}); its largest kernels:",
                    "",
                    md_table(
                        ["kernel", "s", "share of busy", "calls"],
                        [[k["name"], k["s"], k["share"], k["calls"]] for k in prof["top"]],
                    ),
                ]
    if r.get("errors"):
        out += ["", "## Errors", ""] + [f"- {name}: `{e.splitlines()[-1]}`" for name, e in r["errors"].items()]
    return "\n".join(out) + "\n"


# ---- the run: one child process per section ----------------------------------------------------------------
def run_section(name: str, args, cap: float, env: dict, out: Path) -> dict:
    """Runs `name` in a child process (its own process group, killed at `cap` seconds); its output is echoed and
    kept in logs/NAME.log. -> the section's status."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--section",
        name,
        "--out",
        str(out),
        "--until",
        f"{time.time() + cap:.1f}",
    ] + (["--smoke"] if args.smoke else [])
    t0 = time.monotonic()
    log = open(out / "logs" / f"{name}.log", "w")
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    RUNNING[:] = [proc]
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            log.write(line)
            log.flush()
            lines.append(line)
            print(f"[{name} {time.monotonic() - t0:5.1f}s] {line}", end="", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=cap)
        status = "ok" if rc == 0 else f"failed (exit {rc})"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the section's own process group: it and what it started
        proc.wait()
        status = "cut off"
    RUNNING.clear()
    reader.join(timeout=5)
    log.close()
    result = {"status": status, "seconds": round(time.monotonic() - t0, 1), "cap_s": round(cap, 1)}
    if status.startswith("failed"):
        result["error"] = "".join(lines[-8:])
    return result


RUNNING: list = []  # the section's process, while one runs


def _stop(signum, frame):
    """SIGTERM / SIGINT: the running section's process group goes too (it runs in a session of its own)."""
    for proc in RUNNING:
        os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(128 + signum)


def orchestrate(args) -> int:
    import torch

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"error: --out {out}: exists and is not a folder", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("error: gpu_check.py needs a CUDA GPU (use --smoke for the tiny run on the CPU)", file=sys.stderr)
        return 2
    caps = dict(SMOKE_CAPS if args.smoke else CAPS)
    for item in args.cap:
        name, _, seconds = item.partition("=")
        if name not in caps or not re.fullmatch(r"\d+(\.\d+)?", seconds):
            print(f"error: --cap {item!r}: expected NAME=SECONDS with NAME one of {', '.join(caps)}", file=sys.stderr)
            return 2
        caps[name] = float(seconds)
    sections = (args.sections or (SMOKE_SECTIONS if args.smoke else ",".join(caps))).split(",")
    unknown = [s for s in sections if s not in caps]
    if unknown:
        print(f"error: --sections: unknown section {unknown[0]!r} (expected {', '.join(caps)})", file=sys.stderr)
        return 2
    (out / "parts").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    for name in caps:  # parts of an earlier run in this folder are not this run's
        (out / "parts" / f"{name}.json").unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if not cuda:
        env["TRITON_INTERPRET"] = "1"  # before triton is imported in the sections
    report = {
        "smoke": bool(args.smoke),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": " ".join(["python", "benchmarks/gpu_check.py"] + sys.argv[1:]),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, load average "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "sections": {},
    }
    write_atomic(out / "gpu_check.json", json.dumps(report, indent=1))  # no earlier run's results are read
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    t0 = time.monotonic()
    for name in sections:
        left = args.budget - (time.monotonic() - t0)
        if left < 5:
            report["sections"][name] = {"status": "not started (the run's budget was spent)", "cap_s": 0}
        else:
            report["sections"][name] = run_section(name, args, min(caps[name], left), env, out)
        part = out / "parts" / f"{name}.json"
        if part.is_file():
            merge(report, json.loads(part.read_text()))
        write_atomic(out / "gpu_check.json", json.dumps(report, indent=1, default=str))
        write_atomic(out / "gpu_check.md", markdown(report))
    print("\n" + markdown(report))
    return 0


class Context:
    """What a section knows: the device, smoke or not, its deadline, and what earlier sections measured."""

    def __init__(self, args):
        import torch

        self.smoke, self.until, self.out = args.smoke, args.until, Path(args.out)
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda" if self.cuda else "cpu")
        report = self.out / "gpu_check.json"
        self.report = json.loads(report.read_text()) if report.is_file() else {}

    def left(self) -> float:
        return self.until - time.time()

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()


def seconds_per_call(ctx: Context, fn, calls: int, repeat: int = 3) -> float:
    """The best over `repeat` runs of the mean seconds per call of `calls` back-to-back calls (after a warm-up)."""
    fn()
    ctx.sync()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        ctx.sync()
        best = min(best, (time.perf_counter() - t) / calls)
    return best


# ---- 1. bounds ---------------------------------------------------------------------------------------------
def section_bounds(rec: Recorder, ctx: Context) -> None:
    import torch
    import transformers
    import triton

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
    }
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        rec.put("device", value=props.name)
        rec.put(
            "gpu",
            value={
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "sms": props.multi_processor_count,
                "capability": f"{props.major}.{props.minor}",
            },
        )
        try:
            smi = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                timeout=20,
            )
            versions["nvidia-smi"] = smi.stdout.strip()
            versions["driver"] = smi.stdout.split(",")[1].strip() if smi.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, IndexError) as e:
            versions["driver"] = f"nvidia-smi not run ({e})"
    else:
        model = (
            next(
                (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                platform.machine(),
            )
            if os.path.exists("/proc/cpuinfo")
            else platform.machine()
        )
        rec.put("device", value=f"CPU ({model}, {os.cpu_count()} CPUs; no CUDA: smoke run)")
    rec.put("versions", value=versions)
    n = 8192 if ctx.cuda else 256
    a = torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16)
    s = seconds_per_call(ctx, functools.partial(torch.mm, a, b), 50 if ctx.cuda else 3, 5)
    tflops = 2 * n**3 / s / 1e12
    rec.put("matmul_tflops", value=tflops)
    rec.put("bounds", value={"matmul": f"bf16 {n}x{n}x{n}", "matmul_tflops": tflops})
    del a, b
    nbytes = 2**30 if ctx.cuda else 2**26
    src = torch.empty(nbytes, dtype=torch.uint8, device=ctx.device).fill_(1)
    dst = torch.empty_like(src)
    s = seconds_per_call(ctx, lambda: dst.copy_(src), 20 if ctx.cuda else 3, 5)
    rec.put("bounds", "copy", value=f"{nbytes // 2**20} MiB copy (read + write)")
    rec.put("bounds", "bandwidth_gbs", value=2 * nbytes / s / 1e9)
    if ctx.cuda:
        hc = rec.attempt("host_copy", host_copy_overlap, ctx)
        if hc:
            rec.put("bounds", "host_copy", value=hc)


def host_copy_overlap(ctx: Context) -> dict:
    """Whether kernels.HostCopy reads a result without waiting for work queued after it (what lets the pipelined
    loop record step N while step N + 1 runs): a small result is computed, copied back with HostCopy, then ~20
    matmuls of 8192^3 are queued; the read's time against that work's, and a plain .tolist() for comparison."""
    import torch

    from kernels import HostCopy

    a = torch.randn(8192, 8192, device=ctx.device, dtype=torch.bfloat16)
    torch.cuda.synchronize()

    def later_work():
        for _ in range(20):
            torch.mm(a, a)

    out = {}
    for how in ("host_copy", "tolist"):
        small = a[:64, :64].float().sum(1)
        copy = HostCopy(small) if how == "host_copy" else None
        t0 = time.perf_counter()
        later_work()
        queued = time.perf_counter()
        if copy is not None:
            copy.get()[0].tolist()
        else:
            small.tolist()
        read = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        out[how] = {"read_ms": (read - queued) * 1e3, "later_work_ms": (done - t0) * 1e3}
    out["reads_before_later_work"] = out["host_copy"]["read_ms"] < 0.5 * out["host_copy"]["later_work_ms"]
    return out


# ---- 2. kernels --------------------------------------------------------------------------------------------
def _clone(x):
    """A case's arguments with every tensor copied (in lists, tuples and the attention plan's segments too: a
    fresh plan, without what an implementation derived from the other one)."""
    import dataclasses

    import torch

    from kernels.attention import AttentionPlan

    if torch.is_tensor(x):
        return x.clone()
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, AttentionPlan):
        return AttentionPlan(list(x.cu_seqlens), _clone(x.segments), _clone(x.positions), _clone(x.write_slots))
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: _clone(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init})
    return x


def _tensors(x) -> list:
    """The tensors of a kernel's result: a tensor, a tuple of them or a dataclass of them (LogProbs)."""
    import dataclasses

    import torch

    if torch.is_tensor(x):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _tensors(item)]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [t for f in dataclasses.fields(x) for t in _tensors(getattr(x, f.name))]
    return []


def check_case(c, dtype, tol: dict) -> dict:
    """Runs the case's Triton kernel on its inputs and the reference on the same values in fp32; compares the
    returned tensors and every tensor argument written in place (the KV cache, the merge's out / lse)."""
    import torch
    from attention_problems import upcast
    from bench_kernels_gpu import impl

    a, b = _clone(c.kwargs), upcast(_clone(c.kwargs))
    got, want = impl(c.op, "triton")(**a), impl(c.op, "torch")(**b)
    pairs = list(zip(_tensors(got), _tensors(want)))
    pairs += [(a[k], b[k]) for k in a if torch.is_tensor(a[k]) and a[k].is_floating_point()]
    worst, ok = 0.0, True
    for x, y in pairs:
        if x.dtype == torch.bool or not x.is_floating_point():
            ok &= bool(torch.equal(x.cpu(), y.cpu()))
            continue
        x, y = x.float(), y.float()
        worst = max(worst, float((x - y).abs().max()) if x.numel() else 0.0)
        ok &= bool(torch.isclose(x, y, **tol).all())
    result = {"max_abs": worst, "ok": ok}
    if c.sdpa is not None:
        run = c.sdpa()
        if run is not None:
            ref, other = _tensors(want)[0].float(), run().float()
            result["sdpa_max_abs"] = float((other - ref).abs().max())
            result["sdpa_ok"] = bool(torch.isclose(other, ref, **tol).all())
    return result


def known_cause(error: str) -> str | None:
    """What is known of a kernel case's error that is not the kernel's fault, or None."""
    if "only 0-dimensional arrays can be converted" in error:  # seen with triton 3.6 and numpy 2.4
        from importlib.metadata import version

        return (
            f"the Triton interpreter of triton {version('triton')} cannot run a kernel's loops with numpy "
            f"{version('numpy')} (numpy >= 2.4 refuses int() of a 1-element array: triton-lang/triton#9171, fixed "
            "after triton 3.6): use numpy < 2.4 for a CPU run; on a GPU the kernels are compiled, not interpreted"
        )
    return None


def time_case(c, ctx: Context, model: str) -> dict:
    from bench_kernels_gpu import bench, impl

    row = {"model": model, "op": c.op, "case": c.case}
    for backend in ("triton", "torch"):
        fn = impl(c.op, backend)
        row[f"{backend}_ms"] = bench(lambda: fn(**c.kwargs))
    ms = row["triton_ms"]
    row["rate"] = f"{c.flops / ms / 1e9:.1f} TFLOP/s" if c.flops else f"{c.nbytes / ms / 1e6:.0f} GB/s"
    run = c.sdpa() if c.sdpa is not None else None  # on the CPU (smoke) its math backend: the code path only
    if run is not None:
        row["sdpa_ms"] = bench(run)
        row["vs_sdpa"] = row["sdpa_ms"] / ms
    return row


def run_suite(rec: Recorder, ctx: Context, seconds: float) -> None:
    """tests/test_kernels_triton.py under pytest on this device (verbose, parsed line by line, so that a run cut
    off still counts what finished)."""
    cmd = [sys.executable, "-m", "pytest", "-v", "--tb=short", "-p", "no:cacheprovider", "tests/test_kernels_triton.py"]
    if ctx.smoke:
        cmd += ["-k", SMOKE_SUITE]
    outcome = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "command": " ".join(cmd[1:])}
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")  # the file needs no plugin (nor their packages)
    try:
        run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=seconds)
        text, outcome["exit"] = run.stdout + run.stderr, run.returncode
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        outcome["cut_off_s"] = round(seconds)
    for test, result in re.findall(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", text, re.M):
        key = {"PASSED": "passed", "XPASS": "passed", "SKIPPED": "skipped", "XFAIL": "skipped"}.get(result, "failed")
        outcome[key] += 1
        if key == "failed":
            outcome["failures"].append(test.split("::", 1)[1])
    if outcome["failures"]:  # why they failed, in the log and the JSON: the GPU is not at hand to ask again
        report = text[text.find("= FAILURES =") :] if "= FAILURES =" in text else text
        outcome["failure_text"] = report[-4000:]
        print(outcome["failure_text"], flush=True)
    if outcome["passed"] + outcome["failed"] == 0:
        outcome["failed"] += 1
        outcome["failures"].append("no test ran: " + text.strip().splitlines()[-1] if text.strip() else "no output")
    rec.put("kernels", "suite", value=outcome)


def section_kernels(rec: Recorder, ctx: Context) -> None:
    import torch
    from bench_kernels_gpu import MODELS, SMOKE_MODEL, cases
    from test_kernels_triton import BF16_TOL, TOL

    shapes = {"smoke": SMOKE_MODEL} if ctx.smoke else MODELS
    dtypes = [torch.float32, torch.bfloat16] if ctx.cuda else [torch.float32]  # the interpreter has no bf16
    checked, timings = [], []
    if not ctx.cuda:
        rec.put(
            "kernels",
            "sdpa_skipped",
            value="no CUDA: torch SDPA's flash backend is CUDA-only (its layouts are "
            "checked on the CPU's math backend)",
        )

    def totals():
        suite = rec.get("kernels", "suite", default={})
        rec.put("kernels", "cases_passed", value=sum(c["ok"] for c in checked))
        rec.put("kernels", "cases_failed", value=sum(not c["ok"] for c in checked))
        rec.put("kernels", "passed", value=sum(c["ok"] for c in checked) + suite.get("passed", 0))
        rec.put("kernels", "failed", value=sum(not c["ok"] for c in checked) + suite.get("failed", 0))

    for model, shape in shapes.items():
        for dtype in dtypes:
            name = str(dtype).replace("torch.", "")
            for c in cases(shape, ctx.device, dtype, smoke=ctx.smoke):
                row = {"model": model, "op": c.op, "case": c.case, "dtype": name}
                try:
                    row.update(check_case(c, dtype, TOL if dtype == torch.float32 else BF16_TOL))
                except Exception as e:  # noqa: BLE001  (a kernel that fails to compile is a failed case)
                    row.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                print(f"{model} {name} {c.op} [{c.case}]: max abs {row.get('max_abs')}, ok {row['ok']}", flush=True)
                checked.append(row)
                timed = dtype == torch.bfloat16 if ctx.cuda else not timings  # smoke: one, for the code path
                if timed and row["ok"]:
                    row_t = rec.attempt(f"time {model} {c.op} {c.case}", time_case, c, ctx, model)
                    if row_t:
                        timings.append(row_t)
                ctx.sync()
            rec.put("kernels", "cases", value=checked)
            rec.put("kernels", "timings", value=timings)
            totals()
            if ctx.cuda:
                torch.cuda.empty_cache()
    causes = {known_cause(c.get("error", "")) for c in checked} - {None}
    if causes:
        rec.put("kernels", "note", value="; ".join(sorted(causes)))
    run_suite(rec, ctx, max(10.0, ctx.left() - 10))
    totals()


# ---- 3. parity ---------------------------------------------------------------------------------------------
def max_token_diff(got, want) -> float:
    return max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g.token_logprobs, w.token_logprobs))


def parity_arch(rec: Recorder, ctx: Context, arch: str, folder: Path) -> None:
    import torch
    from hf_reference import hf_logprobs, hf_model_from_weights
    from test_engine_parity import _random_requests
    from test_kernels_triton import BF16_TOL
    from tiny_models import ARCHS, make_tiny_model

    from engine import Engine
    from engine.loader import load_model_files

    config, weights, tok = load_model_files(str(make_tiny_model(folder / arch, arch=arch, seed=ARCHS.index(arch))))
    reqs = _random_requests(config.vocab_size, 6 if ctx.smoke else 16, seed=len(arch)) + [
        ("Reading is a quiet", " way of thinking")
    ]
    hf = hf_model_from_weights(config, weights, device=ctx.device)
    ref = hf_logprobs(hf, tok, reqs)
    engine = Engine(config, weights, tok, dtype=torch.float32, device=ctx.device, kv_tokens=2048, token_budget=48)
    got = engine.score(reqs)
    res = {
        "requests": len(reqs),
        "fp32_max_abs": max_token_diff(got, ref),
        "fp32_greedy_flags_equal": [g.is_greedy for g in got] == [r.is_greedy for r in ref],
    }
    prompts = GREEDY_PROMPTS
    gens = engine.generate(prompts, max_tokens=10)
    equal = 0
    for p, g in zip(prompts, gens):
        want = hf.generate(
            torch.tensor([p], device=ctx.device), max_new_tokens=10, do_sample=False, eos_token_id=-1, pad_token_id=0
        )[0, len(p) :].tolist()
        equal += g.token_ids == want[: len(g.token_ids)]
    res["greedy_equal"] = f"{equal}/{len(prompts)}"
    res["greedy_ok"] = equal == len(prompts)
    res["greedy_tokens"] = [g.token_ids for g in gens]
    res["greedy_logprobs"] = [g.token_logprobs for g in gens]
    # the same generation with each step's tokens read before the next is planned (overlap off; on a GPU
    # the default overlaps): a difference here points at the overlap, not the kernels
    engine.use_overlap(False)
    first = engine.generate(prompts, max_tokens=10)
    engine.use_overlap(None)
    res["greedy_equal_read_first"] = [g.token_ids for g in first] == res["greedy_tokens"]
    res["overlaps"] = engine.overlaps
    del engine
    bf16 = Engine(config, weights, tok, dtype=torch.bfloat16, device=ctx.device, kv_tokens=2048, token_budget=48)
    res["bf16_max_abs"] = max_token_diff(bf16.score(reqs), ref)
    res["hf_bf16_max_abs"] = max_token_diff(hf_logprobs(hf.to(torch.bfloat16), tok, reqs), ref)
    # bf16 rounds differently in every implementation: the engine's error against the fp32 reference may be
    # twice transformers' own bf16 error, plus the kernels' bf16 tolerance (tests/test_kernels_triton.py)
    res["bf16_tol"] = 2 * res["hf_bf16_max_abs"] + BF16_TOL["atol"]
    res["bf16_ok"] = res["bf16_max_abs"] <= res["bf16_tol"]
    rec.put("parity", "archs", arch, value=res)
    print(f"{arch}: {res}", flush=True)


def parity_graphs(rec: Recorder, ctx: Context, arch: str, folder: Path) -> None:
    """The greedy generation of parity_arch again with its decode steps replayed from CUDA graphs (the engine
    option decode_graphs, engine/decode_graphs.py): the same tokens as the cascade's steps. Run after every other
    parity part: a graph that faulted the device would end the section's process."""
    import torch

    from engine import Engine
    from engine.loader import load_model_files

    config, weights, tok = load_model_files(str(folder / arch))
    engine = Engine(
        config,
        weights,
        tok,
        dtype=torch.float32,
        device=ctx.device,
        kv_tokens=2048,
        token_budget=48,
        decode_graphs=True,
    )
    gens = engine.generate(GREEDY_PROMPTS, max_tokens=10)
    res = rec.get("parity", "archs", arch, default={})
    want_tokens, want_lps = res.get("greedy_tokens", []), res.get("greedy_logprobs", [])
    res["decode_graphs_equal"] = [g.token_ids for g in gens] == want_tokens
    res["decode_graphs_max_abs"] = max(
        (abs(a - b) for g, w in zip(gens, want_lps) for a, b in zip(g.token_logprobs, w)), default=None
    )
    res["decode_graphs"] = engine.decode_graph_stats()
    rec.put("parity", "archs", arch, value=res)
    print(f"{arch} decode graphs: {res['decode_graphs_equal']} {res['decode_graphs']}", flush=True)


def deterministic_case(rec: Recorder, ctx: Context, arch: str, dtype, folder: Path) -> None:
    """test_deterministic's job (requests alone, then mixed into others, shuffled, under other token budgets and
    without sharing): a request's token log-probs must keep their bits."""
    from test_deterministic import jobs
    from tiny_models import make_tiny_model

    from engine import Engine
    from engine.loader import load_model_files

    config, weights, tok = load_model_files(str(make_tiny_model(folder / f"det-{arch}", arch=arch, seed=3)))
    targets, others = jobs(config.vocab_size, seed=3 if arch == "gemma3" else 0)
    if ctx.smoke:
        targets, others, budgets = targets[:4], others[:16], (37, 1024)
    else:
        targets, others, budgets = (
            (targets, others, (5, 37, 1024)) if arch == "llama" else (targets[:8], others[:80], (7, 1024))
        )

    def engine(**opts):
        return Engine(
            config, weights, tok, dtype=dtype, device=ctx.device, deterministic=True, **{"kv_tokens": 16384, **opts}
        )

    alone = [r.token_logprobs for r in engine().score(targets)]
    mixed = targets + others
    order = list(range(len(mixed)))
    random.Random(1).shuffle(order)
    cases = {}
    for budget in budgets:
        got = engine(token_budget=budget).score([mixed[i] for i in order])
        back = {i: got[pos] for pos, i in enumerate(order)}
        cases[f"mixed, shuffled, budget {budget}"] = [back[i].token_logprobs for i in range(len(targets))]
    cases["mixed, sharing off"] = [r.token_logprobs for r in engine().score(mixed, share_prefix=False)[: len(targets)]]
    diff = max(abs(a - b) for got in cases.values() for x, y in zip(got, alone) for a, b in zip(x, y))
    row = {
        "model": arch,
        "dtype": str(dtype).replace("torch.", ""),
        "cases": len(cases),
        "requests": f"{len(targets)} alone, in jobs of {len(mixed)}",
        "bitwise": all(got == alone for got in cases.values()),
        "cases_bitwise": {name: got == alone for name, got in cases.items()},
        "max_diff": diff,
    }
    rec.put("parity", "deterministic", value=rec.get("parity", "deterministic", default=[]) + [row])
    print(f"deterministic {row}", flush=True)


def deterministic_ops(rec: Recorder, ctx: Context) -> None:
    """Each op the deterministic mode runs, one row computed alone and inside batches of other sizes (its place
    in them changing too): which op, if any, breaks a request's bits when the whole job does not keep them."""
    import torch

    import kernels
    from kernels import batch_invariant
    from kernels.linear_triton import linear_invariant_triton  # on a CPU the sections run under the interpreter

    gen = torch.Generator().manual_seed(5)
    sizes = (6, 37, 300, 700) if not ctx.smoke else (6, 37)
    width, inter, vocab, heads, kv_heads, d, keys = 256, 384, 5000, 8, 2, 64, 300

    def rand(*shape, dtype):
        return torch.randn(*shape, generator=gen).to(ctx.device, dtype)

    for dtype in (torch.float32, torch.bfloat16):
        x, res = rand(max(sizes), width, dtype=dtype), rand(max(sizes), width, dtype=dtype)
        w, head = rand(inter, width, dtype=dtype) * 0.05, rand(vocab, width, dtype=dtype) * 0.05
        norm_w, gu = rand(width, dtype=dtype), rand(max(sizes), 2 * inter, dtype=dtype)
        targets = torch.randint(0, vocab, (max(sizes),), generator=gen).to(ctx.device)
        q = rand(max(sizes), heads, d, dtype=dtype)
        kc, vc = rand(keys, kv_heads, d, dtype=dtype), rand(keys, kv_heads, d, dtype=dtype)
        slots = torch.randperm(keys, generator=gen).to(ctx.device)
        limits = torch.randint(0, keys, (max(sizes),), generator=gen).to(ctx.device)
        merge = kernels.dispatch.resolve("segment_attention_merge", q.device)

        def attend(rows):
            out = torch.zeros(q.shape, dtype=torch.float32, device=ctx.device)
            lse = torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=ctx.device)
            merge(q, rows, kc, vc, slots, d**-0.5, out, lse, limits[rows])
            return out[rows]

        ops = {
            "linear (row tiles)": lambda rows: batch_invariant.linear(x[rows], w),
            "linear (Triton, batch-invariant)": lambda rows: linear_invariant_triton(x[rows], w),
            "target_logprobs": lambda rows: batch_invariant.target_logprobs(x[rows], head, targets[rows]).logprob,
            "rms_norm + residual": lambda rows: kernels.rms_norm(x[rows], norm_w, 1e-5, res[rows])[0],
            "silu_and_mul": lambda rows: kernels.silu_and_mul(gu[rows]),
            "segment merge, row limits": attend,
        }
        row = 5
        for name, fn in ops.items():
            try:
                alone = fn(torch.tensor([row], device=ctx.device))[0]
                diffs = []
                for n in sizes:  # the row first, in the middle, last
                    for at in (0, n // 2, n - 1):
                        others = [r for r in range(n) if r != row]
                        rows = torch.tensor(others[:at] + [row] + others[at:], device=ctx.device)
                        got = fn(rows)[at]
                        diffs.append(float((got.float() - alone.float()).abs().max()))
                entry = {
                    "op": name,
                    "dtype": str(dtype).replace("torch.", ""),
                    "bitwise": max(diffs) == 0.0,
                    "max_diff": max(diffs),
                    "batches": len(diffs),
                }
            except Exception as e:  # noqa: BLE001  # one op's failure is its row, the others go on
                entry = {"op": name, "dtype": str(dtype).replace("torch.", ""), "error": f"{type(e).__name__}: {e}"}
            rec.put("parity", "deterministic_ops", value=rec.get("parity", "deterministic_ops", default=[]) + [entry])
            print(f"deterministic op {entry}", flush=True)


def section_parity(rec: Recorder, ctx: Context) -> None:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # generate's warning about the eos id -1 (never stop) it is given

    with tempfile.TemporaryDirectory() as tmp:
        for arch in PARITY_ARCHS:
            rec.attempt(f"parity {arch}", parity_arch, rec, ctx, arch, Path(tmp))
            archs = rec.get("parity", "archs", default={}).values()
            if archs:
                rec.put("parity", "fp32_max_abs", value=max(a["fp32_max_abs"] for a in archs))
                rec.put("parity", "bf16_ok", value=all(a["bf16_ok"] for a in archs))
                rec.put("parity", "greedy_equal", value=all(a["greedy_ok"] for a in archs))
                rec.put(
                    "parity",
                    "fp32_ok",
                    value=all(a["fp32_max_abs"] <= FP32_TOL for a in archs) and len(archs) == len(PARITY_ARCHS),
                )
        dets = [
            ("llama", torch.float32),
            ("gemma3", torch.bfloat16),
            ("llama", torch.bfloat16),
            ("gemma3", torch.float32),
        ]
        for arch, dtype in dets[:2] if ctx.smoke else dets:
            rec.attempt(f"deterministic {arch} {dtype}", deterministic_case, rec, ctx, arch, dtype, Path(tmp))
            rows = rec.get("parity", "deterministic", default=[])
            if rows:
                rec.put("parity", "deterministic_bitwise", value=all(r["bitwise"] for r in rows))
        rec.attempt("deterministic ops", deterministic_ops, rec, ctx)
        for arch in PARITY_ARCHS:  # last: the first run of CUDA graphs on the device
            if rec.get("parity", "archs", arch) is not None:
                rec.attempt(f"decode graphs {arch}", parity_graphs, rec, ctx, arch, Path(tmp))
        archs = rec.get("parity", "archs", default={}).values()
        if archs:
            rec.put("parity", "decode_graphs_equal", value=all(a.get("decode_graphs_equal") for a in archs))


# ---- 4. speed ----------------------------------------------------------------------------------------------
def speed_tokenizer():
    """A byte-level BPE trained here on the benchmarks' own texts (the ICQS job's sentences, the plain scoring
    sentences, the generation prompts) plus the tiny models' text, so that a word is about one token as with a
    real tokenizer; the model's vocabulary is larger and its other rows never read."""
    import bench_generation
    import bench_scoring
    from bench_icqs_workload import LABELS, sentences
    from tiny_models import CHATML_TEMPLATE, TEXT, train_tokenizer

    from engine.tokenizer import Tokenizer

    text = "\n".join(
        [TEXT]
        + [f"Sentence: {e.x}\nAnswer: {y}" for e in sentences() for y in LABELS]
        + list(bench_scoring.SENTENCES)
        + [f"Write a short paragraph for a curious child about {t}." for t in bench_generation.TOPICS]
    )
    backend = train_tokenizer(8192, text=text, exact=False)
    return Tokenizer(backend, bos_id=0, eos_ids=[1], add_bos=True, chat_template=CHATML_TEMPLATE)


def speed_config(which: str, smoke: bool) -> dict:
    from bench_load import LLAMA8B
    from tiny_models import hf_config

    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    if smoke:  # a tiny Llama 3 with the real vocabulary's order of size
        return hf_config("llama3", vocab_size=8192, max_position_embeddings=8192)
    shape = dict(LLAMA8B, tie_word_embeddings=False) if which == "8b" else dict(LLAMA32_1B)
    # Llama 3.1's long-context RoPE scaling (Llama-3-8B's compute; transformers wants a longer context than the
    # scaling's original one)
    return hf_config(
        "llama3", **{"rope_scaling": rope, "rope_theta": 500000.0, "max_position_embeddings": 131072, **shape}
    )


class Peak:
    """Peak memory while what runs inside runs: GPU memory allocated (torch's caching allocator; everything held,
    both models included), or RSS on the CPU; `work_gib` is the peak above what was held before (the run's own
    activations, logits and cache growth)."""

    def __init__(self, ctx: Context):
        self.ctx, self.gib, self.work_gib = ctx, None, None

    def _now(self) -> int:
        import torch
        from common import current_rss

        return torch.cuda.memory_allocated() if self.ctx.cuda else current_rss()

    def __enter__(self):
        import torch
        from common import reset_peak_rss

        self.ctx.sync()
        if self.ctx.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            reset_peak_rss()
        self.before = self._now()
        return self

    def __exit__(self, *exc):
        import torch
        from common import peak_rss

        self.ctx.sync()
        peak = torch.cuda.max_memory_allocated() if self.ctx.cuda else peak_rss()
        self.gib, self.work_gib = peak / 2**30, (peak - self.before) / 2**30


def speed_scoring(
    rec: Recorder,
    ctx: Context,
    key: str,
    shape: str,
    engine,
    hf,
    tok,
    ids: list,
    share: bool,
    sample: int,
    batch: int,
    hf_seconds: float,
    rate: float,
) -> None:
    """One scoring job: the engine on all of `ids`, transformers (padded batches) on a random sample of at most
    `sample` of them for at most `hf_seconds`, extrapolated per request."""
    from bench_bound import naive_flops
    from common import hf_batched, request_tokens

    config = engine.config
    got, run = timed_scoring(ctx, engine, ids, share, rate)
    res = {**rec.get("speed", key, default={}), "shape": shape, **run}
    rec.put("speed", key, value=res)
    res["device_profile"] = rec.attempt(
        f"{key}_profile", device_profile, ctx, lambda: engine.score(ids, share_prefix=share)
    )
    res["sync_points"] = rec.attempt(
        f"{key}_syncs", sync_points, ctx, lambda: engine.score(ids[: max(8, len(ids) // 4)], share_prefix=share)
    )
    rec.put("speed", key, value=res)
    picked = random.Random(0).sample(range(len(ids)), min(sample, len(ids)))
    hf_batched(hf, tok, [ids[i] for i in picked[:batch]], batch)  # warm-up
    with Peak(ctx) as peak, _timer(ctx) as t:
        scores = hf_batched(hf, tok, [ids[i] for i in picked], batch, seconds=hf_seconds)
    done = [(i, s) for i, s in zip(picked, scores) if s is not None]
    lengths = request_tokens(tok, [ids[i] for i, _ in done])
    res.update(
        hf_requests_timed=len(done),
        hf_s=t.s,
        hf_batch=batch,
        hf_peak_gib=peak.gib,
        hf_work_gib=peak.work_gib,
        hf_requests_per_s=len(done) / t.s,
        hf_tokens_per_s=sum(lengths) / t.s,
        hf_job_s=t.s / len(done) * len(ids),
        hf_tflops=naive_flops(config, lengths) / t.s / 1e12,
        max_abs=max(abs(got[i].logprob - s) for i, s in done),
    )
    res["hf_mfu"] = res["hf_tflops"] / rate
    res["vs_hf"] = res["engine_requests_per_s"] / res["hf_requests_per_s"]
    rec.put("speed", key, value=res)
    print(f"{key}: {res}", flush=True)
    return got


def timed_scoring(ctx: Context, engine, ids: list, share: bool, rate: float) -> tuple[list, dict]:
    """One timed Engine.score of `ids` after a warm-up: its results, and its figures (time, tokens, steps, peak
    memory, MFU over `rate`, where the host's time went in the pipelined loop)."""
    from bench_bound import job_flops

    engine.score(ids[:8], share_prefix=share)  # warm-up (kernels compiled)
    with Peak(ctx) as peak, _timer(ctx) as t, LoopTimeline(engine) as timeline:
        got = engine.score(ids, share_prefix=share)
    stats = engine.last_stats
    steps = list(engine.step_seconds)[-stats.forward_steps :] if stats.forward_steps else []
    linear, _, attention, lm_head = job_flops(engine.config, stats)
    tflops = (linear + attention + lm_head) / t.s / 1e12
    return got, {
        "requests": len(ids),
        "engine_s": t.s,
        "tokens_requested": stats.tokens_requested,
        "tokens_computed": stats.tokens_computed,
        "forward_steps": stats.forward_steps,
        "engine_tokens_per_s": stats.tokens_computed / t.s,
        "engine_requests_per_s": len(ids) / t.s,
        "engine_tflops": tflops,
        "engine_peak_gib": peak.gib,
        "engine_work_gib": peak.work_gib,
        "tokens_per_request": stats.tokens_requested / len(ids),
        # the loop's steps (plan, forward, LM head, record) against the whole call (adding, tokenizing checks)
        "engine_step_ms": sum(steps) / max(len(steps), 1) * 1e3,
        "engine_in_steps": sum(steps) / t.s,
        # the pipelined loop (Engine.run): the host's time before the first launch (tokenizing checks, adding the
        # requests), in launches (plan, forward and LM head enqueued, tree advanced) and in finishes (reading a
        # step's results, which waits for the device, and recording them), and from the first launch to the end
        **timeline.summary(t.t),
        "mfu": tflops / rate,
    }


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def speed_decode(
    rec: Recorder,
    ctx: Context,
    key: str,
    shape: str,
    engine,
    hf,
    tok,
    n: int,
    new_tokens: int,
    rate: float,
    bandwidth: float | None,
) -> None:
    """n prompts decoded greedily, `new_tokens` each: the engine against transformers' generate (batch n)."""
    from bench_bound import linear_params
    from bench_generation import engine_generate, hf_generate, prompts
    from common import engine_weight_bytes

    ids = prompts(tok, n)
    engine_generate(engine, ids[:2], 2)
    hf_generate(hf, tok, ids[:2], 2)
    with Peak(ctx) as peak, LoopTimeline(engine) as timeline:
        t0 = time.perf_counter()
        e_s, _, e_tokens, e_seqs = engine_generate(engine, ids, new_tokens)
    engine_peak, engine_work = peak.gib, peak.work_gib
    loop = timeline.summary(t0)
    read_first = decode_read_first(engine, ids, new_tokens, e_s, e_seqs)
    # where a decode step's time goes: the device's busy share, and the waits for it (a step's sampled tokens
    # are read before the next is planned: one wait a step is the floor)
    short = max(2, new_tokens // 8)
    profile = rec.attempt(f"{key}_profile", device_profile, ctx, lambda: engine.generate(ids, max_tokens=short))
    syncs = rec.attempt(f"{key}_syncs", sync_points, ctx, lambda: engine.generate(ids, max_tokens=short))
    with Peak(ctx) as peak:
        h_s, _, h_tokens, h_seqs = hf_generate(hf, tok, ids, new_tokens)
    config = engine.config
    steps = max(len(s) for s in e_seqs)
    weight_bytes = engine_weight_bytes(engine)
    res = {
        "shape": shape,
        "requests": n,
        "new_tokens": new_tokens,
        "engine_s": e_s,
        "tokens_computed": e_tokens,
        "engine_tokens_per_s": e_tokens / e_s,
        "engine_requests_per_s": n / e_s,
        "engine_peak_gib": engine_peak,
        "engine_work_gib": engine_work,
        "hf_s": h_s,
        "hf_tokens": h_tokens,
        "hf_tokens_per_s": h_tokens / h_s,
        "hf_requests_per_s": n / h_s,
        "hf_peak_gib": peak.gib,
        "hf_work_gib": peak.work_gib,
        "engine_ms_per_step": e_s / max(steps, 1) * 1e3,
        "sequences_equal": f"{sum(a == b for a, b in zip(e_seqs, h_seqs))}/{n}",
        # where the engine's and generate's greedy tokens part: at once would point at a bug, later at bf16
        # rounding between near-tied logits (random weights give near-flat logits)
        "first_token_equal": f"{sum(bool(a) and bool(b) and a[0] == b[0] for a, b in zip(e_seqs, h_seqs))}/{n}",
        "mean_common_prefix": sum(_common_prefix_len(a, b) for a, b in zip(e_seqs, h_seqs)) / max(n, 1),
    }
    flops = 2.0 * e_tokens * (linear_params(config) + config.vocab_size * config.hidden_size)
    res["mfu"] = flops / e_s / 1e12 / rate
    res["vs_hf"] = res["engine_tokens_per_s"] / res["hf_tokens_per_s"]
    if bandwidth:  # a decode step reads every weight once: its time bound at the measured copy bandwidth
        res["step_bound_ms"] = weight_bytes / (bandwidth * 1e9) * 1e3
        res["fraction_of_bandwidth_bound"] = res["step_bound_ms"] / res["engine_ms_per_step"]
    res.update(loop)
    if loop:
        res["launch_ms_per_step"] = loop["launch_s"] / max(steps, 1) * 1e3
        res["finish_ms_per_step"] = loop["finish_s"] / max(steps, 1) * 1e3
    res["device_profile"], res["sync_points"], res["read_first"] = profile, syncs, read_first
    res["note"] = (
        f"{n} x {new_tokens} tokens greedy; {res['engine_ms_per_step']:.1f} ms per engine step"
        + (f" against {res['step_bound_ms']:.2f} ms to read the weights once" if bandwidth else "")
        + (
            f"; greedy tokens equal to generate's: {res['sequences_equal']} whole sequences, "
            f"{res['first_token_equal']} first tokens, {res['mean_common_prefix']:.1f} tokens in common on average"
        )
        + (
            f"; each step's tokens read before the next is planned (overlap off): "
            f"{read_first['ms_per_step']:.1f} ms per step, the overlapped steps "
            f"{read_first['overlapped_vs_read_first']:.2f}x as fast, tokens equal: "
            f"{read_first['sequences_equal_overlapped']}"
            if "ms_per_step" in read_first
            else f"; overlap off: {read_first.get('error')}"
        )
    )
    rec.put("speed", key, value=res)
    print(f"{key}: {res}", flush=True)
    return e_s, e_seqs


def decode_read_first(engine, ids: list, new_tokens: int, overlapped_s: float, overlapped_seqs: list) -> dict:
    """The same decode with the option overlap off (each step's sampled tokens read before the next step is
    planned, as before the option): its time against the overlapped run's (`overlapped_s`, the default on a GPU),
    and its tokens against that run's."""
    from bench_generation import engine_generate

    was = engine.options.overlap
    engine.use_overlap(False)
    try:
        s, _, _, seqs = engine_generate(engine, ids, new_tokens)
    except Exception as e:  # noqa: BLE001  # recorded, the overlapped row stands
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    finally:
        engine.use_overlap(was)
    steps = max(len(x) for x in seqs)
    return {
        "engine_s": s,
        "ms_per_step": s / max(steps, 1) * 1e3,
        "overlapped_vs_read_first": s / overlapped_s,
        "sequences_equal_overlapped": f"{sum(a == b for a, b in zip(seqs, overlapped_seqs))}/{len(ids)}",
    }


def decode_with_graphs(rec: Recorder, ctx: Context, key: str, engine, tok, n: int, new_tokens: int, eager) -> None:
    """speed_decode's decode again with the option decode_graphs on (engine/decode_graphs.py: each step's
    launches replayed from a CUDA graph per batch size; on the CPU the same fixed-shape steps eagerly): its time
    against the eager steps' and its tokens against theirs (`eager`: speed_decode's seconds and sequences), into
    speed[key]["graphs"]. Run last in its section: a graph that faulted the device would end the process."""
    from bench_generation import engine_generate, prompts

    eager_s, eager_seqs = eager
    ids = prompts(tok, n)
    with _timer(ctx) as capture:  # every bucket's graph captured (on a GPU)
        engine.use_decode_graphs(True)
    try:
        with _timer(ctx) as warm:  # a bucket recaptured after the slot table grew is recaptured here
            engine_generate(engine, ids, new_tokens)
        with LoopTimeline(engine) as timeline:
            t0 = time.perf_counter()
            g_s, _, _, g_seqs = engine_generate(engine, ids, new_tokens)
        stats = engine.decode_graph_stats()
    finally:
        engine.use_decode_graphs(False)
    steps = max(len(s) for s in g_seqs)
    out = {
        "engine_s": g_s,
        "ms_per_step": g_s / max(steps, 1) * 1e3,
        "vs_eager": eager_s / g_s,
        "sequences_equal_eager": f"{sum(a == b for a, b in zip(g_seqs, eager_seqs))}/{len(ids)}",
        "first_tokens_equal_eager": f"{sum(a[:1] == b[:1] for a, b in zip(g_seqs, eager_seqs))}/{len(ids)}",
        "capture_s": capture.s,
        "warm_up_s": warm.s,
        "stats": stats,
        **timeline.summary(t0),
    }
    res = rec.get("speed", key, default={})
    res["graphs"] = out
    res["note"] = (res.get("note") or "") + (
        f"; with decode_graphs ({stats['replays']} steps replayed from CUDA graphs, capture error: "
        f"{stats['capture_failed'] or 'none'}): {out['ms_per_step']:.1f} ms per step, {out['vs_eager']:.2f}x the "
        f"eager steps, tokens equal to theirs: {out['sequences_equal_eager']}"
    )
    rec.put("speed", key, value=res)
    print(f"decode graphs: {out}", flush=True)


def device_profile(ctx: Context, fn, top: int = 8) -> dict:
    """One more run of `fn` under torch.profiler: how much of the wall the device was busy (the kernels' own time,
    summed: one stream, so they do not overlap) and the kernels that took most of it. On the CPU (the smoke run)
    the ops' own CPU time stands in for the device's."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.cuda else [])
    with profile(activities=activities) as prof:
        ctx.sync()
        t0 = time.perf_counter()
        fn()
        ctx.sync()
        wall = time.perf_counter() - t0
    if ctx.cuda:  # the device's own events (kernels, copies); an op's row repeats its kernels' time
        from torch.autograd import DeviceType

        rows = [
            (e.key, (getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)) / 1e6, e.count)
            for e in prof.key_averages()
            if e.device_type == DeviceType.CUDA
        ]
    else:
        rows = [(e.key, e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()]
    rows = sorted((r for r in rows if r[1] > 0), key=lambda r: -r[1])
    busy = sum(r[1] for r in rows)
    return {
        "wall_s": wall,
        "device_busy_s": busy,
        "device_busy_fraction": busy / wall if wall else None,
        "top": [{"name": n[:80], "s": t, "share": t / busy, "calls": c} for n, t, c in rows[:top]],
    }


def sync_points(ctx: Context, fn, most: int = 12) -> dict:
    """Where `fn` made the host wait for the device: torch's CUDA sync debug mode warns at every synchronising
    call (a read of a device value, a blocking copy), attributed to the Python line that made it; the lines with
    their counts. The pipelined loop should wait only where it reads a step's results (head.py). Not on the CPU."""
    import warnings
    from collections import Counter

    import torch

    if not ctx.cuda:
        return {"skipped": "no CUDA device"}
    places: Counter = Counter()

    def seen(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        ours = [f for f in traceback.extract_stack()[:-1] if re.search(r"/(engine|kernels)/", f.filename)]
        f = ours[-1] if ours else traceback.FrameSummary(filename, lineno, "?")  # the innermost line of ours
        places[f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} ({f.name})"] += 1

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = seen
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {"count": sum(places.values()), "places": dict(places.most_common(most))}


class LoopTimeline:
    """Times the engine loop's launches and finishes during one call (Engine._launch and Engine._finish, wrapped
    on the instance for the call): where the host's time goes in the pipelined loop."""

    def __init__(self, engine):
        self.engine, self.events = engine, []

    def __enter__(self):
        for name in ("_launch", "_finish"):
            fn = getattr(self.engine, name)

            def timed(*args, _fn=fn, _name=name):
                t0 = time.perf_counter()
                try:
                    return _fn(*args)
                finally:
                    self.events.append((_name, t0, time.perf_counter()))

            setattr(self.engine, name, timed)
        return self

    def __exit__(self, *exc):
        for name in ("_launch", "_finish"):
            delattr(self.engine, name)

    def summary(self, start: float) -> dict:
        if not self.events:
            return {}
        first = min(e[1] for e in self.events)
        return {
            "host_before_loop_s": first - start,
            "launch_s": sum(e[2] - e[1] for e in self.events if e[0] == "_launch"),
            "finish_s": sum(e[2] - e[1] for e in self.events if e[0] == "_finish"),
            "loop_s": max(e[2] for e in self.events) - first,
        }


class _timer:
    def __init__(self, ctx: Context):
        self.ctx, self.s = ctx, None

    def __enter__(self):
        self.ctx.sync()
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.ctx.sync()
        self.s = time.perf_counter() - self.t


def section_speed(rec: Recorder, ctx: Context, which: str) -> None:
    import gc

    import torch
    from bench_icqs_workload import QUESTIONS, build_job
    from bench_scoring import make_requests
    from common import hf_model
    from tiny_models import random_weights

    from engine import Engine
    from engine.config import ModelConfig
    from engine.encoding import encode_pairs

    rate = ctx.report.get("matmul_tflops")
    if not rate:  # section 1 did not run or did not finish: measured here, shorter
        n = 8192 if ctx.cuda else 256
        a = torch.randn(n, n, device=ctx.device, dtype=torch.bfloat16)
        rate = 2 * n**3 / seconds_per_call(ctx, lambda: torch.mm(a, a), 10 if ctx.cuda else 3) / 1e12
        del a
    bandwidth = ctx.report.get("bounds", {}).get("bandwidth_gbs")
    cfg = speed_config(which, ctx.smoke)
    shape = "tiny Llama 3 (smoke)" if ctx.smoke else {"8b": "Llama-3-8B", "1b": "Llama-3.2-1B"}[which]
    config = ModelConfig.from_hf(cfg)
    tok = speed_tokenizer()
    dtype = torch.bfloat16
    weights = random_weights(cfg, seed=0, std=0.02, device=ctx.device, dtype=dtype)
    hf = hf_model(config, weights, dtype, device=ctx.device)
    engine = Engine(
        config,
        weights,
        tok,
        dtype=dtype,
        device=ctx.device,
        kv_tokens=4096 if ctx.smoke else 65536,
        token_budget=1024 if ctx.smoke else 8192,
    )
    del weights
    gc.collect()

    def icqs_job(questions: int) -> list:
        return encode_pairs(
            tok, build_job(questions, 3 if ctx.smoke else 11, 2 if ctx.smoke else 16, 2 if ctx.smoke else 4)[2]
        )

    # the whole job (50 questions) where a probe of a few says it takes under a third of the time left
    most, probe = (2, 1) if ctx.smoke else (QUESTIONS, 2)
    job = icqs_job(probe)
    engine.score(job)  # also the warm-up: the kernels compiled
    with _timer(ctx) as t:
        engine.score(job)
    questions = max(probe, min(most, int(min(90.0, ctx.left() / 3) / (t.s / probe))))
    print(f"probe: {probe} question(s) in {t.s:.2f} s: the job takes {questions}", flush=True)
    ids = icqs_job(questions)
    rec.put(
        "speed",
        f"icqs_{which}",
        value={
            "questions": questions,
            "note": (
                f"{questions} of the job's {QUESTIONS} questions ({len(ids):,} requests), as much as the time cap allowed"
                if questions < QUESTIONS and not ctx.smoke
                else None
            ),
        },
    )
    batch = 4 if ctx.smoke else (16 if which == "8b" else 32)
    hf_seconds = 2.0 if ctx.smoke else 25.0
    fast = rec.attempt(
        f"icqs_{which}",
        speed_scoring,
        rec,
        ctx,
        f"icqs_{which}",
        shape,
        engine,
        hf,
        tok,
        ids,
        True,
        16 if ctx.smoke else 512,
        batch,
        hf_seconds,
        rate,
    )
    plain = encode_pairs(tok, make_requests(6 if ctx.smoke else 256))
    rec.attempt(
        f"plain_{which}",
        speed_scoring,
        rec,
        ctx,
        f"plain_{which}",
        shape,
        engine,
        hf,
        tok,
        plain,
        False,
        len(plain),
        batch,
        hf_seconds,
        rate,
    )
    n, new_tokens = (4, 8) if ctx.smoke else (64, 128)
    key = "decode_64" if which == "8b" else f"decode_64_{which}"
    eager = rec.attempt(key, speed_decode, rec, ctx, key, shape, engine, hf, tok, n, new_tokens, rate, bandwidth)
    del hf
    gc.collect()
    if ctx.cuda:
        torch.cuda.empty_cache()
    if which == "8b":  # the same ICQS job in the deterministic mode (the `icqs` default), on a second engine
        det = "icqs_8b_deterministic"
        rec.attempt(det, speed_deterministic, rec, ctx, det, "icqs_8b", cfg, tok, ids, fast, rate)
    if eager:  # last: the first run of CUDA graphs at this shape
        rec.attempt(f"{key}_graphs", decode_with_graphs, rec, ctx, key, engine, tok, n, new_tokens, eager)


def speed_deterministic(rec: Recorder, ctx: Context, key: str, fast_key: str, cfg, tok, ids, fast, rate) -> None:
    """The ICQS job scored again by an engine in the deterministic mode (batch-invariant forms: row-tile
    linears, fixed key chunks, the one-split target log-prob), engine only: its time and MFU against the fast
    mode's run of the same job (`fast_key`), and how far its scores lie from that run's (bf16 rounding)."""
    import torch
    from tiny_models import random_weights

    from engine import Engine
    from engine.config import ModelConfig

    config = ModelConfig.from_hf(cfg)
    weights = random_weights(cfg, seed=0, std=0.02, device=ctx.device, dtype=torch.bfloat16)
    engine = Engine(
        config,
        weights,
        tok,
        dtype=torch.bfloat16,
        device=ctx.device,
        deterministic=True,
        kv_tokens=4096 if ctx.smoke else 65536,
        token_budget=1024 if ctx.smoke else 8192,
    )
    del weights
    got, run = timed_scoring(ctx, engine, ids, True, rate)
    base = rec.get("speed", fast_key, default={})
    res = {
        "shape": base.get("shape"),
        **run,
        "fast_mode_s": base.get("engine_s"),
        "vs_fast_mode": base["engine_s"] / run["engine_s"] if base.get("engine_s") else None,
        "max_abs_vs_fast_mode": max(abs(a.logprob - b.logprob) for a, b in zip(got, fast)) if fast else None,
    }
    rec.put("speed", key, value=res)
    if ctx.left() > 3 * run["engine_s"] + 10:
        res["device_profile"] = rec.attempt(f"{key}_profile", device_profile, ctx, lambda: engine.score(ids))
    res["note"] = (
        f"the deterministic mode: {run['engine_s']:.2f} s, "
        + (f"{res['vs_fast_mode']:.2f}x the fast mode's time, " if res["vs_fast_mode"] else "")
        + f"MFU {res['mfu']:.3f}; scores within {res['max_abs_vs_fast_mode']} of the fast mode's"
    )
    rec.put("speed", key, value=res)
    print(f"{key}: {res}", flush=True)


SECTIONS = {
    "bounds": section_bounds,
    "kernels": section_kernels,
    "parity": section_parity,
    "speed_8b": lambda rec, ctx: section_speed(rec, ctx, "8b"),
    "speed_1b": lambda rec, ctx: section_speed(rec, ctx, "1b"),
}


def child(args) -> int:
    ctx = Context(args)
    rec = Recorder(ctx.out / "parts" / f"{args.section}.json")
    rec.put("sections", args.section, "device", value=str(ctx.device))
    print(f"{args.section} on {ctx.device}, {ctx.left():.0f} s left", flush=True)
    rec.attempt(args.section, SECTIONS[args.section], rec, ctx)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--out", required=True, help="folder for gpu_check.json, gpu_check.md, logs/ and parts/")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (Triton interpreter), < 1 minute")
    ap.add_argument("--sections", default=None, help=f"comma-separated, in this order (default: {','.join(CAPS)})")
    ap.add_argument("--cap", action="append", default=[], metavar="NAME=SECONDS", help="a section's time cap")
    ap.add_argument("--budget", type=float, default=BUDGET, help="seconds for the whole run")
    ap.add_argument("--section", choices=sorted(SECTIONS), help=argparse.SUPPRESS)  # a child: one section
    ap.add_argument("--until", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    return child(args) if args.section else orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
