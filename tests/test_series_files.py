"""tools/series_files.py reads the upstream series' patches: the build takes
the series' interface header from patch 0001 and `make patch-check` runs the
lines it adds to init.cpp. Checked against git's own reading of the patches."""
from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import series_files  # noqa: E402

PATCHES = sorted(glob.glob(os.path.join(ROOT, "patches", "pytorch", "[0-9][0-9][0-9][0-9]-*.patch")))


def git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout


def make_patch(tmp_path, before: dict, after: dict) -> str:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for path, text in before.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "before")
    for path, text in after.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "add", "-A")
    return git(repo, "diff", "--cached", "--full-index")


def test_new_file_and_added_lines_of_a_made_patch(tmp_path):
    old = "".join(f"line {i}\n" for i in range(30))
    new = old.replace("line 3\n", "line 3\n+ added, starts with plus\n").replace("line 20\n", "-- \nline 20b\n")
    created = "first\n\n-- not a signature\n\\ not a marker\nlast"  # no newline at the end
    patch = make_patch(tmp_path, {"a/f.txt": old}, {"a/f.txt": new, "b/new.h": created})
    assert series_files.new_file(patch, "b/new.h") == created + "\n"
    assert series_files.added_lines(patch, "a/f.txt") == ["+ added, starts with plus", "-- ", "line 20b"]
    with pytest.raises(KeyError):
        series_files.new_file(patch, "a/f.txt")  # changed, not created
    with pytest.raises(KeyError):
        series_files.added_lines(patch, "c/none.txt")


@pytest.mark.skipif(not PATCHES, reason="no patch series")
def test_every_file_the_series_creates_reads_as_git_applies_it(tmp_path):
    for patch in PATCHES:
        text = open(patch, encoding="utf-8").read()
        created = [p for p, lines in series_files.file_diffs(text).items()
                   if any(line.startswith("new file mode") for line in lines)]
        out = tmp_path / os.path.basename(patch)
        out.mkdir()
        git(out, "init", "-q")
        includes = [f"--include={p}" for p in created]
        if not created:
            continue
        git(out, "apply", *includes, patch)
        for path in created:
            assert series_files.new_file(text, path) == (out / path).read_text(encoding="utf-8"), path


@pytest.mark.skipif(not PATCHES, reason="no patch series")
def test_init_cpp_lines_are_the_bindings_and_the_header_matches_the_build():
    text = open(PATCHES[0], encoding="utf-8").read()
    added = series_files.added_lines(text, "torch/csrc/autograd/init.cpp")
    assert added[0] == "#include <torch/csrc/autograd/semiring.h>"
    body = "\n".join(added[1:])
    for name in ("_set_semiring", "_get_semiring_state", "_set_semiring_state", "_registered_semirings"):
        assert f'"{name}"' in body
    built = os.path.join(ROOT, "build", "series", "include", "torch", "csrc", "autograd", "semiring.h")
    if os.path.exists(built):  # setup.py extracted it for csrc/hooks/series_hooks.cpp
        assert open(built, encoding="utf-8").read() == series_files.new_file(text, "torch/csrc/autograd/semiring.h")
