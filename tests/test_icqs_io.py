"""icqs.io (JSONL reading with file:line errors, resumable result log, atomic writes) and commands.fetch (offline,
against a local wheel served through pip's own --find-links configuration)."""

import json
import os
import zipfile

import pytest

from commands.fetch import fetch_package_file
from engine.errors import UserError
from icqs.io import ResultWriter, atomic_write, read_jsonl


def test_read_jsonl_rows_and_blank_lines(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": 1, "y": "a"}\n\n{"id": 2, "y": "b"}\n')
    assert read_jsonl(p, required=("id", "y")) == [{"id": 1, "y": "a"}, {"id": 2, "y": "b"}]


@pytest.mark.parametrize(
    "text, line, what",
    [
        ('{"id": 1}\n{"id": 2\n', 2, "not valid JSON"),
        ('{"id": 1}\n\n[1, 2]\n', 3, "expected a JSON object"),
        ('{"id": 1}\n{"y": 2}\n', 2, "missing field 'id'"),
    ],
)
def test_read_jsonl_errors_name_file_and_line(tmp_path, text, line, what):
    p = tmp_path / "bad.jsonl"
    p.write_text(text)
    with pytest.raises(UserError) as e:
        read_jsonl(p, required=("id",))
    assert str(e.value).startswith(f"{p}:{line}: ") and what in str(e.value)
    assert "\n" not in str(e.value)


def test_read_jsonl_missing_file(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_result_writer_resumes_and_drops_torn_line(tmp_path):
    p = tmp_path / "out" / "results.jsonl"
    with ResultWriter(p, key=("id", "method")) as w:
        w.write({"id": "a", "method": "icqs", "score": 1.0})
        w.write({"id": "b", "method": "icqs", "score": 0.5})
    with open(p, "a") as f:  # a kill in the middle of the third write
        f.write('{"id": "c", "method": "ic')
    w = ResultWriter(p, key=("id", "method"))
    assert [r["id"] for r in w.rows] == ["a", "b"]
    assert w.done(("a", "icqs")) and not w.done(("c", "icqs")) and not w.done(("a", "icl"))
    w.write({"id": "c", "method": "icqs", "score": 0.0})
    w.close()
    lines = p.read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["a", "b", "c"]


def test_result_writer_corrupt_middle_line_is_an_error(tmp_path):
    p = tmp_path / "results.jsonl"
    p.write_text('{"id": 1}\nnot json\n{"id": 2}\n')
    with pytest.raises(UserError, match=":2: corrupt"):
        ResultWriter(p, key="id")


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path):
    p = tmp_path / "sub" / "report.html"
    atomic_write(p, "old")
    atomic_write(p, b"new")
    assert p.read_bytes() == b"new"
    assert os.listdir(p.parent) == ["report.html"]


def _local_wheel(folder, name="icqsdemo", version="0.1"):
    """A minimal valid wheel holding `icqsdemo/data/words.txt`."""
    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "")
        zf.writestr(f"{name}/data/words.txt", "good\nbad\n")
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return path


def test_fetch_package_file_extracts_and_caches(tmp_path, monkeypatch):
    index = tmp_path / "index"
    index.mkdir()
    wheel = _local_wheel(index)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    got = fetch_package_file("icqsdemo==0.1", "icqsdemo/data/words.txt")
    assert got.read_text() == "good\nbad\n"
    assert str(got).startswith(str(tmp_path / "cache" / "icqs" / "data"))
    wheel.unlink()  # the second call must not need pip
    assert fetch_package_file("icqsdemo==0.1", "icqsdemo/data/words.txt") == got
    assert len(list((tmp_path / "cache" / "icqs" / "data" / "archives").glob("*/*.whl"))) == 1  # one download
    with pytest.raises(UserError, match="has no file 'icqsdemo/other.txt'"):  # other members: no new download
        fetch_package_file("icqsdemo==0.1", "icqsdemo/other.txt")
    with pytest.raises(UserError, match="cannot download 'icqsdemo==0.2' with pip"):
        fetch_package_file("icqsdemo==0.2", "icqsdemo/data/words.txt")
    _local_wheel(index)
    with pytest.raises(UserError, match="has no file 'icqsdemo/missing.txt'"):
        fetch_package_file("icqsdemo==0.1", "icqsdemo/missing.txt")
