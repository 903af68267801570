"""Reads files out of the upstream patch series (patches/pytorch/*.patch).

The patches are the one copy of the series' code. Two consumers need parts of
them as files:

- the build (setup.py, CMakeLists.txt) compiles csrc/hooks/series_hooks.cpp,
  this library's implementation of the series' interface, against the header
  that patch 0001 creates (`new`);
- `make patch-check` (tools/patch_check.py) runs the Python bindings that
  patch 0001 adds to torch/csrc/autograd/init.cpp in a stock-wheel process,
  where THPAutograd_initExtension cannot be replaced (`added`).

Usage:
    series_files.py new PATCH PATH OUT        write the file PATCH creates at PATH to OUT
    series_files.py added PATCH PATH          print the lines PATCH adds to PATH (+ removed)
"""
from __future__ import annotations

import os
import re
import sys

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def file_diffs(patch_text: str) -> dict[str, list[str]]:
    """Each `diff --git` section of a patch, keyed by its b/ path (lines without newline)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in patch_text.split("\n"):
        if line.startswith("diff --git "):
            current = line.split(" b/", 1)[1]
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return sections


def _hunk_lines(section: list[str]):
    """(kind, text) of every hunk line of one file section: kind is ' ', '+' or '-'."""
    lines = iter(section)
    for line in lines:
        m = _HUNK.match(line)
        if not m:
            continue
        old_left = int(m.group(2) or 1)
        new_left = int(m.group(4) or 1)
        while old_left or new_left:
            body = next(lines)
            if body.startswith("\\"):  # "\ No newline at end of file"
                continue
            kind, text = (body[0], body[1:]) if body else (" ", "")
            if kind in " -":
                old_left -= 1
            if kind in " +":
                new_left -= 1
            yield kind, text


def new_file(patch_text: str, path: str) -> str:
    """The text of `path`, which the patch creates."""
    section = file_diffs(patch_text).get(path)
    if section is None or not any(line.startswith("new file mode") for line in section):
        raise KeyError(f"the patch creates no file {path}")
    return "".join(text + "\n" for kind, text in _hunk_lines(section) if kind == "+")


def added_lines(patch_text: str, path: str) -> list[str]:
    """The lines the patch adds to the existing file `path`, in order."""
    section = file_diffs(patch_text).get(path)
    if section is None:
        raise KeyError(f"the patch does not change {path}")
    return [text for kind, text in _hunk_lines(section) if kind == "+"]


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[1] == "new":
        text = new_file(open(argv[2], encoding="utf-8").read(), argv[3])
        os.makedirs(os.path.dirname(os.path.abspath(argv[4])), exist_ok=True)
        if not os.path.exists(argv[4]) or open(argv[4], encoding="utf-8").read() != text:
            with open(argv[4], "w", encoding="utf-8") as f:  # untouched when equal: no rebuild
                f.write(text)
        return 0
    if len(argv) == 4 and argv[1] == "added":
        sys.stdout.write("".join(line + "\n" for line in added_lines(open(argv[2], encoding="utf-8").read(), argv[3])))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
