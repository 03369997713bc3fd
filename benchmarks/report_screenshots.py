"""Render HTML reports in headless Chromium and write screenshots to look at (the reports' visual check).

    python benchmarks/report_screenshots.py OUT_DIR REPORT.html [REPORT.html ...]

Each report is rendered at 1280 px wide, as tall as the page, and cut into 1280 x 1300 px tiles
OUT_DIR/<name>_<k>.png (blank tiles at the end dropped). Needs the `chromium` system package (Debian:
apt-get install chromium)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image, ImageChops

TILE = 1300


def screenshot(html: Path, out_dir: Path, height: int = 16000) -> list[Path]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("error: no chromium on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        full = Path(tmp) / "full.png"
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--window-size=1280,{height}",
                f"--screenshot={full}",
                html.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=180,
        )
        image = Image.open(full).convert("RGB")
        blank = Image.new("RGB", image.size, "white")
        box = ImageChops.difference(image, blank).getbbox()
        bottom = box[3] + 20 if box else image.size[1]
        tiles = []
        for k, top in enumerate(range(0, bottom, TILE)):
            path = out_dir / f"{html.stem if html.stem != 'report' else html.parent.name}_{k}.png"
            image.crop((0, top, 1280, min(top + TILE, bottom))).save(path)
            tiles.append(path)
        return tiles


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in argv[1:]:
        for path in screenshot(Path(name), out_dir):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
