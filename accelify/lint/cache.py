"""Findings remembered per file, as ruff remembers them: a file linted before, with the same
content, path, rule selection and accelify, is not parsed again.

The cache is a folder (`.accelify_cache/` at the project root unless told otherwise, with its
own `.gitignore`); under it, one folder per accelify build, and in that one entry per file
content. An entry is written under a temporary name and renamed, so the processes of `--jobs` and
concurrent runs never read half of one. Nothing here fails a lint: an entry that cannot be read,
was written by another accelify or is corrupt is a miss, and a folder that cannot be written is
no cache.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from accelify import __version__
from accelify.lint.finding import Finding
from accelify.lint.selection import Selection

if TYPE_CHECKING:
    from hashlib import blake2b as _Blake2b

    from accelify.analysis.outside_callers import HandedCall

DEFAULT_FOLDER = ".accelify_cache"
ENVIRONMENT_VARIABLE = "ACCELIFY_CACHE_DIR"
GITIGNORE = "# Automatically created by accelify.\n*\n"
CACHEDIR_TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by accelify.\n"
)
#: The name of one build's folder: version, then the fingerprint of its code.
_BUILD_FOLDER = re.compile(r"[0-9][0-9A-Za-z.+!_]*-[0-9a-f]{16}")


@dataclass(frozen=True)
class CachedResult:
    """A file's stored lint: its findings, whether it uses no accelerator (a run from the
    cache says what a first run says), and what its calls hand other modules."""

    findings: list[Finding]
    no_accelerator: bool
    handed: tuple[HandedCall, ...] = ()


@dataclass(frozen=True)
class LintCache:
    folder: Path  # this build's entries
    settings: str  # digest of what selects the rules

    def get(self, path: str, data: bytes, read: bytes = b"") -> CachedResult | None:
        """What was stored for ``path`` with this content (`CachedResult`), or None. ``read``:
        what the findings depend on besides the file's text (`project_context`: the project
        modules it imports, and what its importers' calls hand it): a change in ``train.py``
        that changes what it hands ``Trainer`` lints ``trainer.py`` again. The entry also
        lists every other module the findings were read from (`FileResult.read_modules`: a
        factory module ``train.py`` imports) with its digest: a change in one is a miss."""
        try:
            entry = json.loads((self.folder / self._name(path, data, read)).read_bytes())
            if entry["accelify"] != __version__:
                return None
            if any(_digest(Path(p)) != digest for p, digest in entry.get("read", [])):
                return None
            findings = [_finding(item, path) for item in entry["findings"]]
            handed = entry.get("handed", [])
            if handed:
                from accelify.analysis.outside_callers import HandedCall

                handed = [HandedCall.from_list(item) for item in handed]
            return CachedResult(findings, bool(entry["no_accelerator"]), tuple(handed))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(
        self,
        path: str,
        data: bytes,
        findings: list[Finding],
        no_accelerator: bool = False,
        read: bytes = b"",
        read_modules: tuple[str, ...] = (),
        handed: tuple[HandedCall, ...] = (),
    ) -> None:
        """Remember ``findings`` for this content; only portable ones (fixes as text edits).
        ``read_modules``: the other modules the findings were read from, stored with their
        digests (checked by `get`). ``handed``: what the file's calls hand other modules (the
        facts they are linted with, so a cached importer still tells them)."""
        import tempfile

        if any(finding.fix is not None for finding in findings):
            return
        entry = {
            "accelify": __version__,
            "findings": [_as_dict(f) for f in findings],
            "no_accelerator": no_accelerator,
            "read": [[p, _digest(Path(p))] for p in read_modules],
            "handed": [call.as_list() for call in handed],
        }
        try:
            descriptor, temporary = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
        except OSError:
            return
        try:
            with os.fdopen(descriptor, "w") as handle:
                json.dump(entry, handle)
            os.replace(temporary, self.folder / self._name(path, data, read))
        except OSError:
            Path(temporary).unlink(missing_ok=True)

    def _name(self, path: str, data: bytes, read: bytes = b"") -> str:
        digest = blake2b(digest_size=20)
        for part in (self.settings.encode(), path.encode("utf-8", "surrogateescape"), data, read):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        return f"{digest.hexdigest()}.json"


def cache_root(explicit: Path | None, settings: Selection, cwd: Path) -> Path:
    """``--cache-dir``, else ``ACCELIFY_CACHE_DIR``, else ``[tool.accelify] cache-dir`` (relative
    to its pyproject.toml), else ``.accelify_cache`` beside that pyproject.toml (else in the
    working directory)."""
    if explicit is not None:
        return explicit
    if os.environ.get(ENVIRONMENT_VARIABLE):
        return Path(os.environ[ENVIRONMENT_VARIABLE])
    project = Path(settings.source).parent if settings.source else cwd
    return project / (settings.cache_dir or DEFAULT_FOLDER)


def open_cache(root: Path, selection: Selection) -> LintCache | None:
    """The cache of this accelify under ``root``, created when missing (with its `.gitignore`);
    other builds' folders are removed when this one is created. None when it cannot be.
    (What only a cache needs is imported here and below, not by `accelify lint --no-cache`.)"""
    folder = root / f"{__version__}-{_code_fingerprint()}"
    try:
        if not folder.is_dir():
            import shutil  # (a warm run does not import it)

            _create(root)
            for other in root.iterdir():
                if other.is_dir() and _BUILD_FOLDER.fullmatch(other.name):
                    shutil.rmtree(other, ignore_errors=True)
            folder.mkdir(exist_ok=True)
    except OSError:
        return None
    return LintCache(folder, _settings_digest(selection))


def _create(root: Path) -> None:
    import tempfile

    root.mkdir(parents=True, exist_ok=True)
    for name, text in ((".gitignore", GITIGNORE), ("CACHEDIR.TAG", CACHEDIR_TAG)):
        if not (root / name).exists():
            descriptor, temporary = tempfile.mkstemp(dir=root, suffix=".tmp")
            with os.fdopen(descriptor, "w") as handle:
                handle.write(text)
            os.replace(temporary, root / name)


def _settings_digest(selection: Selection) -> str:
    settings = [
        selection.select,
        selection.extend_select,
        selection.ignore,
        sorted(selection.per_file_ignores.items()),
    ]
    return blake2b(json.dumps(settings).encode(), digest_size=16).hexdigest()


def _code_fingerprint() -> str:
    """A release is named by its version, but an editable install changes between releases: the
    fingerprint also covers the size and time of every module the findings come from (engine,
    analysis, edits, rules), the Python and the libcst they run on."""
    import importlib.util

    package = Path(__file__).resolve().parent.parent
    files = [*package.glob("*.py")]
    for folder in ("analysis", "edits", "lint"):
        files += (package / folder).rglob("*.py")
    for name in ("accelify.rules", "libcst"):
        spec = importlib.util.find_spec(name)
        for location in (spec and spec.submodule_search_locations) or ():
            files += Path(location).glob("*.py")
    digest = blake2b(sys.version.encode(), digest_size=8)
    for file in sorted(files):
        try:
            stat = file.stat()
        except OSError:
            continue
        digest.update(f"{file}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def _digest(file: Path) -> str:
    """The digest of a module's text (of nothing, where it cannot be read)."""
    from accelify.analysis.project_modules import read

    return blake2b(read(file), digest_size=16).hexdigest()


def blake2b(data: bytes = b"", *, digest_size: int) -> _Blake2b:
    """``hashlib.blake2b``, without importing hashlib where the interpreter has it built in:
    hashlib's import loads OpenSSL (~3 of a warm run's ~65 ms in process) for digests it takes
    from ``_blake2`` itself (CPython's ``hashlib.blake2b`` is ``_blake2.blake2b``). Shared with
    `accelify.libcst_import`'s store check."""
    try:
        from _blake2 import blake2b as made
    except ImportError:  # another interpreter: hashlib's
        from hashlib import blake2b as made
    return made(data, digest_size=digest_size)


def _as_dict(finding: Finding) -> dict[str, object]:
    return {
        "code": finding.code,
        "message": finding.message,
        "line": finding.line,
        "column": finding.column,
        "fixable": finding.fixable,
        "edit": finding.edit.as_dict() if finding.edit is not None else None,
    }


def _finding(item: dict, path: str) -> Finding:
    edit = None
    if item["edit"] is not None:
        from accelify.edits.text_edit import TextEdit

        edit = TextEdit(**item["edit"])
    return Finding(
        item["code"],
        item["message"],
        item["line"],
        item["column"],
        None,
        path,
        fixable=item["fixable"],
        edit=edit,
    )


def project_context(
    path: Path, data: bytes, importers: tuple[Path, ...], handed: tuple[HandedCall, ...] = ()
) -> bytes:
    """What the findings of ``path`` read besides its own text: the path and content of each
    project module it imports and of each importer analysed with it (`lint_source`'s
    ``importers``: an import cycle), and what the linted importers' calls hand it (their facts,
    not their text: a change in ``train.py`` that hands ``trainer.py`` the same keeps its
    findings); empty for a file of none."""
    from accelify.analysis.project_modules import project_files, read

    parts = []
    for file in project_files(path, data, importers):
        parts += [str(file).encode("utf-8", "surrogateescape"), read(file)]
    if handed:
        parts.append(json.dumps([call.as_list() for call in handed]).encode())
    return b"".join(len(part).to_bytes(8, "little") + part for part in parts)
