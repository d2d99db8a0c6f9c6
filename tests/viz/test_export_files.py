"""Where an export writes: a new folder of its own, new regular files only, never through a link
(CPU)."""

import os
import pathlib
import re

import pytest

from kvlab.viz.export import new_export_folder, write_new_files

FILES = {"tab-chart.csv": "x,y\n1,2\n", "tab.html": "<p>caf\u00e9</p>"}


def test_writes_each_file_new_in_utf8_and_returns_the_paths(tmp_path):
    paths = write_new_files(tmp_path / "out" / "deeper", FILES)
    assert paths == [tmp_path / "out" / "deeper" / n for n in FILES]
    assert [p.read_text(encoding="utf-8") for p in paths] == list(FILES.values())
    assert all(p.is_file() and not p.is_symlink() for p in paths)


@pytest.mark.parametrize("folder", [str, pathlib.PurePath, lambda p: type("P", (), {
    "__fspath__": lambda self: str(p)})()])
def test_folder_may_be_a_str_or_any_path_like(tmp_path, folder):
    paths = write_new_files(folder(tmp_path / "out"), FILES)
    assert [p.name for p in paths] == list(FILES) and paths[0].read_text() == FILES["tab-chart.csv"]


@pytest.mark.parametrize("folder", [None, 5, 1.5, b"out", bytearray(b"out"), ["out"], "",
                                    "out\0x", type("B", (), {"__fspath__": lambda self: b"out"})()])
def test_folder_of_another_type_is_refused_naming_it(tmp_path, monkeypatch, folder):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"folder={folder!r}: must be a str or "
                                                   "os.PathLike naming a folder")):
        write_new_files(folder, FILES)
    with pytest.raises(ValueError, match=re.escape(f"parent={folder!r}: must be a str")):
        new_export_folder(folder, "stamp")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["../escape.csv", "sub/a.csv", "", ".", "..", "a\0b", 5])
def test_names_must_be_plain_file_names(tmp_path, name):
    with pytest.raises(ValueError, match="must be plain file names"):
        write_new_files(tmp_path / "out", {**FILES, name: "x"})
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape.csv").exists()


@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_planted_in_the_folder_is_refused_and_nothing_is_written(tmp_path, dangling):
    victim = tmp_path / "victim.txt"
    if not dangling:
        victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "tab.html").symlink_to(victim)
    with pytest.raises(ValueError, match=re.escape(f"folder={str(out)!r}: holds ['tab.html'] "
                                                   "already: an export writes new files only")):
        write_new_files(out, FILES)
    assert sorted(p.name for p in out.iterdir()) == ["tab.html"]  # the CSV not written either
    assert victim.read_text() == "precious" if not dangling else not victim.exists()


def test_a_file_there_already_is_left_as_it_is(tmp_path):
    (tmp_path / "tab-chart.csv").write_text("mine")
    with pytest.raises(ValueError, match=re.escape("holds ['tab-chart.csv'] already")):
        write_new_files(tmp_path, FILES)
    assert (tmp_path / "tab-chart.csv").read_text() == "mine"
    assert not (tmp_path / "tab.html").exists()


def test_a_folder_that_is_a_link_or_a_file_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").symlink_to(elsewhere)
    with pytest.raises(ValueError, match="out'.*is a symbolic link: must be a folder"):
        write_new_files(tmp_path / "out", FILES)
    assert list(elsewhere.iterdir()) == []
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ValueError, match="file'.*is not a folder"):
        write_new_files(tmp_path / "file", FILES)


def test_a_link_swapped_in_for_the_folder_after_the_checks_is_not_followed(tmp_path,
                                                                           monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    real_mkdir = pathlib.Path.mkdir

    def mkdir_then_swap(self, *args, **kwargs):  # the race: a link where the folder was
        real_mkdir(self, *args, **kwargs)
        if self == out:
            os.rmdir(out)
            out.symlink_to(elsewhere)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir_then_swap)
    with pytest.raises(OSError):
        write_new_files(out, FILES)
    assert list(elsewhere.iterdir()) == []


def test_new_export_folders_of_one_second_are_each_new(tmp_path):
    parent = tmp_path / "kvlab-export"
    (parent / "stamp-3").mkdir(parents=True)  # taken by an earlier export
    folders = [new_export_folder(parent, "stamp") for _ in range(3)]
    assert [f.name for f in folders] == ["stamp", "stamp-2", "stamp-4"]
    assert all(f.is_dir() and not any(f.iterdir()) for f in folders)


def test_a_link_at_the_new_folders_name_is_passed_over(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "stamp").symlink_to(elsewhere)
    (tmp_path / "stamp-2").symlink_to(tmp_path / "nowhere")  # dangling
    folder = new_export_folder(str(tmp_path), "stamp")
    assert folder == tmp_path / "stamp-3" and not folder.is_symlink()
    write_new_files(folder, FILES)
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "nowhere").exists()
