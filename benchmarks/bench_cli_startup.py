"""How long `icqs` takes to answer before any work: `--help`, a mistyped command, a subcommand's argument error,
against a bare Python start and `import torch` in the same run (each a fresh process, the median of --repeats).

    python benchmarks/bench_cli_startup.py [--repeats 7] [--root OTHER_CHECKOUT]

--root runs another checkout's `icqs` (e.g. an older commit, from `git archive`) beside this one's.

The machine is shared: the load average is printed, and the ratios to the bare start are the comparable figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ICQS = "import sys; from icqs.cli import main; sys.exit(main(sys.argv[1:]))"
CASES = {
    "python -c pass (the floor)": ["-c", "pass"],
    "icqs --help": ["-c", ICQS, "--help"],
    "icqs scroe (unknown command)": ["-c", ICQS, "scroe"],
    "icqs score (missing arguments)": ["-c", ICQS, "score"],
    "icqs allure run --help": ["-c", ICQS, "allure", "run", "--help"],
    "python -c 'import torch'": ["-c", "import torch"],
}


def seconds(argv: list[str], env: dict, cwd) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *argv], env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
    )
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--root", default=None, help="another checkout whose `icqs --help` and `icqs score` to time")
    args = ap.parse_args()

    def env_of(root) -> dict:
        return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}

    cases = {name: (argv, ROOT) for name, argv in CASES.items()}
    if args.root:
        for name in ("icqs --help", "icqs score (missing arguments)"):
            cases[f"{name} [--root]"] = (CASES[name], Path(args.root).resolve())
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {os.cpu_count()} cores")
    times = {name: [] for name in cases}
    for _ in range(args.repeats):  # interleaved, so that a change of load hits every case alike
        for name, (argv, root) in cases.items():  # run in the checkout: `-c` puts the working folder first
            times[name].append(seconds(argv, env_of(root), root))
    floor = statistics.median(times["python -c pass (the floor)"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:41s} median {med:6.3f} s  (min {min(ts):.3f}, max {max(ts):.3f}; {med / floor:5.1f}x the floor)")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
