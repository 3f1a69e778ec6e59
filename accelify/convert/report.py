"""How a conversion is shown: the summary per file (the diff is `accelify.edits.diff`)."""

from __future__ import annotations

from accelify.convert.conversion import Conversion


def summary(conversion: Conversion) -> str:
    path = conversion.path
    if conversion.skipped:
        lines = [f"{path}: skipped ({conversion.skipped})"]
    elif not conversion.changed:
        lines = [f"{path}: unchanged"]
    else:
        if conversion.prepared or conversion.done is None:
            lines = [f"{path}: prepared {', '.join(conversion.prepared) or 'nothing'}"]
        else:
            lines = [f"{path}: {conversion.done}"]
        for note in conversion.changes:
            where = f"{path}:{note.line}" if note.line else path
            lines.append(f"  {where}: {note.text}")
    for note in conversion.reviews:
        lines.append(f"  review {path}:{note.line}: {note.text}")
    return "\n".join(lines)
