"""Which rules run on a file: the default set (bugs only), ``--select``, ``--extend-select`` and
``--ignore`` by code prefix (ruff's way), the ``[tool.accelify]`` table of the nearest
``pyproject.toml``, and ``# noqa`` comments."""

from __future__ import annotations

import fnmatch
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from accelify.errors import UserError

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*))?", re.I)


#: Reported whatever is selected or ignored: a file that cannot be read or parsed was not checked.
ALWAYS_REPORTED = "ACC000"


@dataclass
class Selection:
    select: list[str] = field(default_factory=list)  # empty: the default set
    extend_select: list[str] = field(default_factory=list)  # added to select or the default set
    ignore: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exclude: list[str] = field(default_factory=list)
    source: str | None = None  # the pyproject.toml it was read from
    cache_dir: str | None = None  # where findings are cached (see `accelify.lint.cache`)

    def enabled(self, code: str, path: str) -> bool:
        if code == ALWAYS_REPORTED:
            return True
        if self.select:
            selected = _matches(code, self.select)
        else:
            from accelify.lint.registry import default_codes

            selected = code in default_codes()
        selected = selected or _matches(code, self.extend_select)
        ignored = _matches(code, self.ignore)
        for pattern, codes in self.per_file_ignores.items():
            if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(Path(path).name, pattern):
                ignored = ignored or _matches(code, codes)
        return selected and not ignored

    def excluded(self, path: Path) -> bool:
        text = path.as_posix()
        return any(
            fnmatch.fnmatch(text, pattern)
            or fnmatch.fnmatch(path.name, pattern)
            or any(fnmatch.fnmatch(part, pattern) for part in path.parts)
            for pattern in self.exclude
        )

    def resolved(self, where: str) -> Selection:
        """This selection with every selector checked and spelled as the catalog spells it."""
        return Selection(
            select=resolve_selectors(self.select, where),
            extend_select=resolve_selectors(self.extend_select, where),
            ignore=resolve_selectors(self.ignore, where),
            per_file_ignores={
                pattern: resolve_selectors(codes, where)
                for pattern, codes in self.per_file_ignores.items()
            },
            exclude=self.exclude,
            source=self.source,
        )


def _matches(code: str, selectors: list[str]) -> bool:
    """``ALL`` matches every code also in a selection built without `resolved` (a test, an API
    caller): read as a prefix it would match none and silently check nothing."""
    return any(selector == "ALL" or code.startswith(selector) for selector in selectors)


def resolve_selectors(selectors: list[str], where: str) -> list[str]:
    """``ALL`` and ``ACC`` select every rule, a prefix (``ACC2``) its group, a moved code the rule
    it names now. A selector that matches no rule is a usage error, as in ruff: a typo would
    otherwise silently check nothing."""
    resolved = []
    for selector in selectors:
        wanted = selector.strip().upper()
        if wanted in ("ALL", "ACC"):
            resolved.append("ACC")  # every rule: no need to load the catalog to know it
            continue
        from accelify.lint.registry import REDIRECTS, all_codes

        codes = (ALWAYS_REPORTED, *all_codes())
        if wanted in REDIRECTS:
            _warn(f"{wanted} is now {REDIRECTS[wanted]}; update {where}")
            wanted = REDIRECTS[wanted]
        if not any(code.startswith(wanted) for code in codes):
            raise UserError(
                f"unknown rule selector {selector!r}: `accelify rules` lists the codes", where
            )
        resolved.append(wanted)
    return resolved


def _warn(text: str) -> None:
    print(f"accelify: warning: {text}", file=sys.stderr)


def load_settings(start: Path) -> Selection:
    """``[tool.accelify]`` from the nearest pyproject.toml at or above ``start``."""
    for folder in [start, *start.parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            # imported where a file is read: a tree without one (a one-file lint) starts sooner
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # Python 3.10: the same parser, as a package (a dependency on 3.10 only)
                import tomli as tomllib
            try:
                table = tomllib.loads(candidate.read_text()).get("tool", {}).get("accelify", {})
            except tomllib.TOMLDecodeError as error:
                raise UserError(f"invalid TOML: {error}", str(candidate)) from None
            return _from_table(table, candidate)
    return Selection()


def _from_table(table: dict, source: Path) -> Selection:
    known = {
        "select",
        "extend-select",
        "ignore",
        "per-file-ignores",
        "exclude",
        "target",
        "cache-dir",
    }
    for key in table:
        if key not in known:
            raise UserError(
                f"[tool.accelify] unknown key {key!r}; expected one of {sorted(known)}", str(source)
            )
    if not isinstance(table.get("cache-dir", ""), str):
        raise UserError("[tool.accelify] cache-dir must be a string (a folder)", str(source))
    return Selection(
        select=list(table.get("select", [])),
        extend_select=list(table.get("extend-select", [])),
        ignore=list(table.get("ignore", [])),
        per_file_ignores={k: list(v) for k, v in table.get("per-file-ignores", {}).items()},
        exclude=list(table.get("exclude", [])),
        source=str(source),
        cache_dir=table.get("cache-dir"),
    )


def suppressed(lines: list[str], line: int, code: str) -> bool:
    if not 0 < line <= len(lines):
        return False
    match = _NOQA.search(lines[line - 1])
    if match is None:
        return False
    codes = match.group("codes")
    if codes is None:
        return True
    from accelify.lint.registry import current_code

    return code in {current_code(c.strip()) for c in codes.split(",")}
