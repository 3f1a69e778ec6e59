"""Which rules run on a file: ``--select``/``--ignore`` by code prefix (ruff's way), the
``[tool.accelify]`` table of the nearest ``pyproject.toml``, and ``# noqa`` comments."""

from __future__ import annotations

import fnmatch
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from accelify.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package (a dependency on 3.10 only)
    import tomli as tomllib

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*))?", re.I)


@dataclass
class Selection:
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exclude: list[str] = field(default_factory=list)

    def explicitly_selected(self, code: str) -> bool:
        """Named by a prefix longer than the bare ``ACC``: asked for even on plain scripts."""
        return any(code.startswith(prefix) and prefix != "ACC" for prefix in self.select)

    def enabled(self, code: str, path: str) -> bool:
        selected = not self.select or any(code.startswith(prefix) for prefix in self.select)
        ignored = any(code.startswith(prefix) for prefix in self.ignore)
        for pattern, codes in self.per_file_ignores.items():
            if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(Path(path).name, pattern):
                ignored = ignored or any(code.startswith(prefix) for prefix in codes)
        return selected and not ignored

    def excluded(self, path: Path) -> bool:
        text = path.as_posix()
        return any(
            fnmatch.fnmatch(text, pattern)
            or fnmatch.fnmatch(path.name, pattern)
            or any(fnmatch.fnmatch(part, pattern) for part in path.parts)
            for pattern in self.exclude
        )


def load_settings(start: Path) -> Selection:
    """``[tool.accelify]`` from the nearest pyproject.toml at or above ``start``."""
    for folder in [start, *start.parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                table = tomllib.loads(candidate.read_text()).get("tool", {}).get("accelify", {})
            except tomllib.TOMLDecodeError as error:
                raise UserError(f"invalid TOML: {error}", str(candidate)) from None
            return _from_table(table, candidate)
    return Selection()


def _from_table(table: dict, source: Path) -> Selection:
    known = {"select", "ignore", "per-file-ignores", "exclude", "target"}
    for key in table:
        if key not in known:
            raise UserError(
                f"[tool.accelify] unknown key {key!r}; expected one of {sorted(known)}", str(source)
            )
    return Selection(
        select=list(table.get("select", [])),
        ignore=list(table.get("ignore", [])),
        per_file_ignores={k: list(v) for k, v in table.get("per-file-ignores", {}).items()},
        exclude=list(table.get("exclude", [])),
    )


def suppressed(lines: list[str], line: int, code: str) -> bool:
    if not 0 < line <= len(lines):
        return False
    match = _NOQA.search(lines[line - 1])
    if match is None:
        return False
    codes = match.group("codes")
    return codes is None or code in {c.strip().upper() for c in codes.split(",")}
