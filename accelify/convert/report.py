"""How a conversion is shown: a unified diff (colored on a terminal) and a summary per file."""

from __future__ import annotations

import difflib

from accelify.convert.conversion import Conversion


def unified_diff(conversion: Conversion) -> str:
    before = conversion.original.decode("utf-8", errors="replace").splitlines(keepends=True)
    after = conversion.converted.decode("utf-8", errors="replace").splitlines(keepends=True)
    lines = difflib.unified_diff(
        before, after, f"{conversion.path}\t(original)", f"{conversion.path}\t(converted)"
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def summary(conversion: Conversion) -> str:
    path = conversion.path
    if conversion.skipped:
        lines = [f"{path}: skipped ({conversion.skipped})"]
    elif not conversion.changed:
        lines = [f"{path}: unchanged"]
    else:
        prepared = ", ".join(conversion.prepared) or "nothing"
        lines = [f"{path}: prepared {prepared}"]
        for note in conversion.changes:
            where = f"{path}:{note.line}" if note.line else path
            lines.append(f"  {where}: {note.text}")
    for note in conversion.reviews:
        lines.append(f"  review {path}:{note.line}: {note.text}")
    return "\n".join(lines)
