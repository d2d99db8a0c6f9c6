"""benchmarks/manifest.py: component versions reconstructed from git at a result's revision
(None for a file absent there), written into the result with its formatting kept (CPU, git)."""

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from kvlab.components import digest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
TABLE = {"one": ("kvlab/x.py",), "two": ("kernels/y.cu", "kvlab/z.py")}


@pytest.fixture
def script(monkeypatch):
    """benchmarks/manifest.py as a module, reading the components of TABLE."""
    spec = importlib.util.spec_from_file_location("manifest_script",
                                                  ROOT / "benchmarks" / "manifest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "COMPONENTS", TABLE)
    return module


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A repository of two commits: x.py and y.cu, then z.py added. -> (path, first, second)."""
    git(tmp_path, "init", "-q")
    for path, text in (("kvlab/x.py", "x = 1\n"), ("kernels/y.cu", "// y\n")):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "first")
    first = git(tmp_path, "rev-parse", "HEAD")
    (tmp_path / "kvlab/z.py").write_text("z = 2\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "second")
    return tmp_path, first, git(tmp_path, "rev-parse", "HEAD")


def test_versions_at_a_revision_are_of_its_files_and_none_where_one_is_absent(script, repo):
    path, first, second = repo
    files = script.GitFiles(path)
    try:
        at_first = script.reconstructed(files, first)
        at_second = script.reconstructed(files, second)
        with pytest.raises(ValueError, match="git_revision='f{40}': not a commit"):
            script.reconstructed(files, "f" * 40)
    finally:
        files.close()
    assert at_first == {"one": digest([("kvlab/x.py", b"x = 1\n")]), "two": None}
    assert at_second == {"one": at_first["one"], "two": digest(
        [("kernels/y.cu", b"// y\n"), ("kvlab/z.py", b"z = 2\n")])}


@pytest.mark.parametrize("indent,ending", [(2, "\n"), (1, "\n"), (None, "")])
def test_backfill_adds_keys_after_the_git_keys_and_keeps_the_formatting(
        script, repo, tmp_path_factory, indent, ending):
    path, first, _ = repo
    result = {"benchmark": "attention", "date": "2026-12-03", "git_revision": first,
              "git_dirty": False, "git_source": "environment", "gpu": "G",
              "rows": [{"model": "m", "ms": 0.5}, {"model": "n", "ms": 1.5}]}
    file = tmp_path_factory.mktemp("results") / "a.json"
    before = json.dumps(result, indent=indent) + ending
    file.write_text(before)
    files = script.GitFiles(path)
    try:
        assert script.backfill(file, files, write=True)
        assert not script.backfill(file, files, write=True)  # once only
        assert script.backfill(file, files, write=False, redo=True)  # unless redone
    finally:
        files.close()
    after = json.loads(file.read_text())
    assert list(after) == [*list(result)[:5], "components", "components_source",
                           *list(result)[5:]]
    assert after["components"]["two"] is None and after["components_source"] == script.SOURCE
    assert file.read_text() == json.dumps(after, indent=indent) + ending
    if indent is not None:  # the diff adds lines only
        old, new = before.splitlines(), file.read_text().splitlines()
        assert [line for line in new if line in old] == old
        assert len(new) == len(old) + len(TABLE) + 3  # components' braces, and the source


def test_a_result_without_a_revision_gets_null_components(script, repo, tmp_path_factory):
    file = tmp_path_factory.mktemp("results") / "b.json"
    file.write_text(json.dumps({"benchmark": "cache", "date": "2026-11-29", "cpu": "C"}))
    files = script.GitFiles(repo[0])
    try:
        script.backfill(file, files, write=True)
    finally:
        files.close()
    assert file.read_text() == json.dumps(
        {"benchmark": "cache", "date": "2026-11-29", "components": None, "cpu": "C"})


def test_a_file_json_would_write_otherwise_is_refused(script):
    text = '{\n   "benchmark": "e2e"\n}\n'
    with pytest.raises(ValueError, match="json.dumps writes it back with no indent of"):
        script.formatting(text, json.loads(text))


def test_every_committed_result_has_its_components(script):
    assert script.main(["--check"]) == 0
