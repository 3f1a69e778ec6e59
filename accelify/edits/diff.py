"""A change shown the way `git diff` and `ruff --diff` show it."""

from __future__ import annotations

import difflib


def unified_diff(path: str, original: bytes, changed: bytes, change: str = "converted") -> str:
    before = original.decode("utf-8", errors="replace").splitlines(keepends=True)
    after = changed.decode("utf-8", errors="replace").splitlines(keepends=True)
    lines = difflib.unified_diff(before, after, f"{path}\t(original)", f"{path}\t({change})")
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)
