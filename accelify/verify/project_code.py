"""The converted script and the project modules it imports, analysed as ``accelify lint`` reads
a project: each imported module with what the importing module's calls hand its functions,
classes and methods (`outside_callers.handed_calls`: ``engine.evaluate(loaders["val"])`` hands
``loader`` a prepared loader). verify's checks read from the code use it, so that an evaluation
in ``src/engine.py`` is read the way one in the script is, not passed over unseen.

The runs import the modules beside the file verify was given (the conversion's folder, or the
original's when verify converts it itself): the same files are read here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from accelify.analysis.outside_callers import HandedCall
    from accelify.analysis.script_model import ScriptModel

#: How many project modules are read at most (a project, not a library's tree).
MODULES_AT_MOST = 32


@dataclass(frozen=True)
class AnalysedModule:
    #: how a place in it is named: "" for the script itself, else its path relative to the
    #: script's folder (``src/engine.py``)
    label: str
    script: ScriptModel


def analysed_project(code: str, path: Path) -> list[AnalysedModule]:
    """The script (``code``, which stands at ``path``) first, then each project module it
    imports, directly or through another, importers before what they import. A module that
    cannot be read or parsed is left out (the run reports what it does)."""
    from accelify.analysis.outside_callers import handed_calls
    from accelify.analysis.project_modules import imported_files, read, resolved
    from accelify.analysis.script_model import analyze
    from accelify.errors import UserError
    from accelify.lint.engine import load_analysis, project_view
    from accelify.source import parse

    load_analysis()
    data = code.encode("utf-8")
    script = analyze(parse(data, str(path)), code, project=project_view(str(path), data, ()))
    found = [AnalysedModule("", script)]
    seen = {resolved(path)}
    pending: list[tuple[Path, bytes, ScriptModel]] = [(path, data, script)]
    handed: list[HandedCall] = []
    while pending and len(found) < MODULES_AT_MOST:
        importer, text, model = pending.pop(0)
        modules = [m for m in imported_files(importer, text).values() if resolved(m) not in seen]
        modules = list({resolved(m): m for m in modules}.values())
        handed += handed_calls(model, importer, {str(resolved(m)) for m in modules})
        for module in modules[: MODULES_AT_MOST - len(found)]:
            seen.add(resolved(module))
            source = read(module)
            view = project_view(str(module), source, (), tuple(handed))
            try:
                analysed = analyze(
                    parse(source, str(module)),
                    source.decode("utf-8", errors="replace"),
                    project=view,
                )
            except (UserError, RecursionError):
                continue
            found.append(AnalysedModule(_relative(module, path), analysed))
            pending.append((module, source, analysed))
    return found


def _relative(module: Path, script: Path) -> str:
    try:
        return str(module.resolve().relative_to(script.resolve().parent))
    except ValueError:
        return str(module)
