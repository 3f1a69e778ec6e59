"""The library names a ``from sibling import *`` of a project module brings into a file.

``from dcgan import *`` in murumura/DCGAN-pytorch's train.py is how that file gets ``torch``,
``nn`` and ``optim``: dcgan.py imports them (and star imports utils.py in turn). Without them the
analysis cannot tell that ``optim.Adam(netD.parameters(), ...)`` makes an optimizer, sees no
model trained there, and the conversion left the trainer as it was, saying its model and
optimizer were handed in. Only what those modules bind by importing a library counts (their own
classes and functions are the project's, asked about elsewhere); names with a leading underscore
are not exported by a star import."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import libcst.helpers

from accelify.analysis.imports import ImportTable
from accelify.analysis.project_modules import module_file, read


def star_imported_names(script: Path, module: cst.Module) -> dict[str, str]:
    """Local name -> what it names (``optim`` -> ``torch.optim``) for every library import of
    the project modules ``module`` star imports, followed through their own star imports."""
    found: dict[str, str] = {}
    _collect(script, module, found, {script.resolve()})
    return found


def _collect(script: Path, module: cst.Module, found: dict[str, str], seen: set[Path]) -> None:
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if not (isinstance(small, cst.ImportFrom) and isinstance(small.names, cst.ImportStar)):
                continue
            if small.module is None:
                continue
            name = "." * len(small.relative) + (
                cst.helpers.get_full_name_for_node(small.module) or ""
            )
            file = module_file(script, name)
            if file is None or file.resolve() in seen:
                continue
            seen.add(file.resolve())
            try:
                other = cst.parse_module(read(file))
            except (cst.ParserSyntaxError, OSError, UnicodeDecodeError):
                continue
            table = ImportTable.of_module(other)
            for local, target in table.bound.items():
                root = target.lstrip(".").split(".", 1)[0]
                if local.startswith("_") or target.startswith(".") or module_file(file, root):
                    continue  # the project's own modules: not a library's name
                found.setdefault(local, target)
            _collect(file, other, found, seen)
