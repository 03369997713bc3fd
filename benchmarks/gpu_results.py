"""Files a GPU check's run into the project's GPU facts: `benchmarks/results/gpu_check.json` (the latest result of
each section, whichever run it came from) and `benchmarks/results/gpu_check_runs/runN.{json,md}` (each run as it
came back), then prints the headline figures the issue's bars ask for.

    python benchmarks/gpu_results.py RUN_DIR --code "COMMIT: what the run measured"   # RUN_DIR: the device tool's
                                                                                          # files_at (gpu_check.json)
    python benchmarks/gpu_results.py --show                                              # the filed figures only

Each section of the run that finished or was cut off with results (`sections[NAME].status` "ok" or "cut off") replaces
that section's results in the combined file: bounds (device, gpu, versions, matmul_tflops, bounds), kernels and
parity whole; speed_8b and speed_1b row by row (each speed row names its run; a row the new run lacks keeps its
older run's). A section that failed, did not start or was cut off before any result leaves the earlier run's. `runs` lists every run with its command, code and sections, and each
section in `sections` names the run it came from. A smoke run (`--smoke`, on a CPU) is refused unless
`--allow-smoke` (the tests file one into a copy). Bad input (no such folder, not a GPU check's JSON) is one line
`error: ...`, exit 2, and nothing is written."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MAX_JSON_BYTES = 64 << 20  # a run's JSON is ~100 KB; a larger file is not one

# each section's part of the report: top-level keys, or ("speed", predicate on the row's name)
SECTION_KEYS = {
    "bounds": ("device", "gpu", "versions", "matmul_tflops", "bounds"),
    "kernels": ("kernels",),
    "parity": ("parity",),
}
SPEED_SECTIONS = {"speed_8b": lambda row: not row.endswith("_1b"), "speed_1b": lambda row: row.endswith("_1b")}
FILED = ("ok", "cut off")


class InputError(Exception):
    pass


def read_run(folder: Path) -> tuple[dict, str | None]:
    """The run's report (gpu_check.json) and its markdown (None where absent), checked."""
    if not folder.is_dir():
        raise InputError(f"{folder}: no such folder")
    path = folder / "gpu_check.json"
    if not path.is_file():
        raise InputError(f"{path}: no such file (the folder a GPU check wrote with --out)")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise InputError(f"{path}: {path.stat().st_size:,} bytes, larger than a GPU check's report can be")
    try:
        report = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not JSON ({e})") from None
    if not isinstance(report, dict) or not isinstance(report.get("sections"), dict):
        raise InputError(f"{path}: not a GPU check's report (no sections)")
    md = folder / "gpu_check.md"
    return report, md.read_text() if md.is_file() else None


def merge(combined: dict, run: dict, number: int, code: str) -> list[str]:
    """Run `number`'s sections into `combined` (in place); returns the sections taken."""
    taken = []
    for name, status in run["sections"].items():
        if not isinstance(status, dict) or status.get("status") not in FILED:
            continue
        if name in SECTION_KEYS:
            keys = [k for k in SECTION_KEYS[name] if k in run]
            if not keys:  # cut off before any result
                continue
            for key in keys:
                combined[key] = run[key]
        elif name in SPEED_SECTIONS:
            rows = {k: {**v, "run": number} for k, v in run.get("speed", {}).items() if SPEED_SECTIONS[name](k)}
            if not rows:
                continue
            combined["speed"] = {**combined.get("speed", {}), **rows}  # a row the run lacks keeps its older run's
        else:
            continue
        combined.setdefault("sections", {})[name] = {**status, "run": number}
        taken.append(name)
    errors = {f"run {number}: {part}": text for part, text in (run.get("errors") or {}).items()}
    if errors:
        combined["errors"] = {**(combined.get("errors") or {}), **errors}
    combined.setdefault("runs", []).append(
        {
            "run": number,
            "started": run.get("started"),
            "command": run.get("command"),
            "code": code,
            "sections": taken,
            "file": f"gpu_check_runs/run{number}.json",
        }
    )
    held = {}
    for name, s in combined["sections"].items():
        held.setdefault(s.get("run"), []).append(name)
    combined["command"] = "python benchmarks/gpu_check.py --out $OUT; the latest result of each section: " + "; ".join(
        f"run {r}: {', '.join(names)}" for r, names in sorted(held.items(), key=lambda x: str(x[0]))
    )
    return taken


def headline(report: dict) -> list[str]:
    """The figures the issue's bars name, from a report (combined or one run)."""
    speed, parity, kernels = report.get("speed", {}), report.get("parity", {}), report.get("kernels", {})
    icqs, decode = speed.get("icqs_8b", {}), speed.get("decode_64", {})
    det, graphs = speed.get("icqs_8b_deterministic", {}), decode.get("graphs") or {}

    def f(v, spec=".3g"):
        if isinstance(v, bool):
            return "yes" if v else "no"
        return "-" if v is None else format(v, spec) if isinstance(v, (int, float)) else str(v)

    lines = [
        f"device: {report.get('device', '-')}; bf16 matmul {f(report.get('matmul_tflops'), '.0f')} TFLOP/s",
        f"kernels: {f(kernels.get('passed'))} passed, {f(kernels.get('failed'))} failed",
        f"parity: fp32 max abs {f(parity.get('fp32_max_abs'))} (bar 1e-4), greedy equal {f(parity.get('greedy_equal'))}"
        f", from CUDA graphs {f(parity.get('decode_graphs_equal'))}, deterministic bitwise "
        f"{f(parity.get('deterministic_bitwise'))}",
        f"icqs_8b: {f(icqs.get('engine_s'))} s, MFU {f(icqs.get('mfu'))} (bar 0.5), {f(icqs.get('vs_hf'))}x transformers"
        f" (bar 20x); device busy {f((icqs.get('device_profile') or {}).get('device_busy_fraction'))}, "
        f"{f((icqs.get('sync_points') or {}).get('count'))} waits for the device",
        f"icqs_8b_deterministic: {f(det.get('engine_s'))} s, MFU {f(det.get('mfu'))}, "
        f"{f(det.get('vs_fast_mode'))}x the fast mode's time",
        f"decode_64: {f(decode.get('vs_hf'))}x generate (bar 1.5x), {f(decode.get('engine_ms_per_step'))} ms a step; "
        f"from CUDA graphs {f(graphs.get('ms_per_step'))} ms a step, {f(graphs.get('vs_eager'))}x the eager steps, "
        f"tokens equal {f(graphs.get('sequences_equal_eager'))}, capture error "
        f"{(graphs['stats'].get('capture_failed') or 'none') if graphs.get('stats') else '-'}",
    ]
    return lines


def _timing(kernels: dict, op: str, case_has: str, model: str = "llama3-8b") -> dict | None:
    """The kernels section's bf16 timing row of `op` at `model` whose case names `case_has`."""
    return next(
        (
            t
            for t in kernels.get("timings", [])
            if t.get("op") == op and t.get("model") in (model, "smoke") and case_has in t.get("case", "")
        ),
        None,
    )


def decisions(report: dict) -> list[str]:
    """What the run settles for the options and kernels built before a GPU measured them, each with the figures it
    rests on: the decode graphs (a default on CUDA?), the overlap (kept on?), the split decode attention
    (kept?), the batch-invariant Triton linear (the deterministic mode's GPU linears?), the host reads. A figure the
    run lacks says so."""
    speed, parity, kernels = report.get("speed", {}), report.get("parity", {}), report.get("kernels", {})
    decode = speed.get("decode_64", {})
    graphs, first = decode.get("graphs") or {}, decode.get("read_first") or {}
    out = []

    def equal(s) -> bool:  # "n/n"
        return isinstance(s, str) and "/" in s and s.split("/")[0] == s.split("/")[1]

    if graphs.get("ms_per_step"):
        ok = equal(graphs.get("sequences_equal_eager")) and (graphs.get("vs_eager") or 0) > 1.1
        out.append(
            f"decode_graphs: {graphs['ms_per_step']:.2f} ms a step, {graphs.get('vs_eager', 0):.2f}x the eager steps, "
            f"tokens equal {graphs.get('sequences_equal_eager')}, greedy equal on 4 architectures from graphs "
            f"{parity.get('decode_graphs_equal')} -> "
            + ("make it the default on CUDA" if ok and parity.get("decode_graphs_equal") else "keep it off")
        )
    else:
        out.append("decode_graphs: not measured in this report")
    if first.get("ms_per_step"):
        ok = equal(first.get("sequences_equal_overlapped")) and first.get("overlapped_vs_read_first", 0) >= 1.0
        out.append(
            f"overlap: read-first {first['ms_per_step']:.2f} ms a step, overlapped "
            f"{first.get('overlapped_vs_read_first', 0):.2f}x as fast, tokens equal "
            f"{first.get('sequences_equal_overlapped')} -> "
            + ("keep it on on CUDA" if ok else "look before keeping it")
        )
    else:
        out.append("overlap: not measured in this report")
    split = _timing(kernels, "paged_decode_attention", "8192 keys")
    whole = _timing(kernels, "paged_decode_attention_unsplit", "8192 keys")
    if split and whole:
        r = whole["triton_ms"] / split["triton_ms"]
        out.append(
            f"split decode attention, 1 sequence x 8,192 keys: {split['triton_ms']:.3f} ms split, "
            f"{whole['triton_ms']:.3f} ms whole rows ({r:.2f}x) -> "
            + ("keep the split" if r >= 1.0 else "raise SPLIT_MIN_KEYS or drop the split")
        )
    else:
        out.append("split decode attention: not timed in this report")
    tiles = [t for t in kernels.get("timings", []) if t.get("op") == "linear_row_tiles"]
    full = [t for t in kernels.get("timings", []) if t.get("op") == "linear"]
    bits = {
        d.get("dtype"): d.get("bitwise")
        for d in parity.get("deterministic_ops", [])
        if d.get("op") == "linear (Triton, batch-invariant)"
    }
    if tiles:
        faster = all(t["torch_ms"] / t["triton_ms"] > 1.05 for t in tiles)
        per = (
            "; ".join(f"{t['case']}: {t['torch_ms'] / t['triton_ms']:.2f}x the row tiles" for t in tiles)
            + "; "
            + "; ".join(f"{t['case']}: {t['torch_ms'] / t['triton_ms']:.2f}x cuBLAS" for t in full)
        )
        out.append(
            f"Triton linear: {per}; bitwise alone vs in batches {bits or 'not probed'} -> "
            + (
                "use it for the deterministic mode's GPU linears"
                if faster and bits and all(bits.values())
                else "keep the row tiles"
            )
        )
    else:
        out.append("Triton linear: not timed in this report")
    hc = (report.get("bounds") or {}).get("host_copy")
    if hc:
        out.append(
            f"host reads: HostCopy {hc['host_copy']['read_ms']:.2f} ms with {hc['host_copy']['later_work_ms']:.0f} ms "
            f"of later work queued (.tolist(): {hc['tolist']['read_ms']:.1f} ms) -> "
            + ("the pipelined loop can read step N while N+1 runs" if hc.get("reads_before_later_work") else "look")
        )
    return out


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", type=Path, help="the folder a GPU check wrote (gpu_check.json)")
    ap.add_argument("--code", default=None, help="the commit the run measured, and what it changed")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default: benchmarks/results)")
    ap.add_argument("--show", action="store_true", help="print the filed figures; file nothing")
    ap.add_argument("--allow-smoke", action="store_true", help="file a --smoke run (the tests' use)")
    args = ap.parse_args(argv)
    combined_path = args.results / "gpu_check.json"
    try:
        combined = json.loads(combined_path.read_text()) if combined_path.is_file() else {}
        if args.show or args.run is None:
            if args.run is not None:
                raise InputError("--show prints the filed figures: it takes no run folder")
            print("\n".join(headline(combined) + ["what this settles:"] + decisions(combined)))
            return 0
        run, md = read_run(args.run)
        if run.get("smoke") and not args.allow_smoke:
            raise InputError(f"{args.run}: a --smoke run (CPU, tiny sizes): not a GPU fact (--allow-smoke files it)")
        if not args.code:
            raise InputError("--code: say which commit the run measured (e.g. 'abc1234: decode graphs')")
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    number = len(combined.get("runs", [])) + 1
    taken = merge(combined, run, number, args.code)
    runs = args.results / "gpu_check_runs"
    write_atomic(runs / f"run{number}.json", json.dumps(run, indent=1))
    if md is not None:
        write_atomic(runs / f"run{number}.md", md)
    write_atomic(combined_path, json.dumps(combined, indent=1, default=str))
    print(f"run {number}: sections {', '.join(taken) or 'none'} filed into {combined_path}")
    print("\n".join(headline(combined) + ["what this settles:"] + decisions(combined)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
