"""How a verification is shown: a table per check, the changed lines of the conversion nearest
to where the scripts diverged, and a one-line verdict; or the same as JSON for CI."""

from __future__ import annotations

import difflib
import json

from accelify.verify.checks import CheckResult

NEAREST_HUNKS = 2


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = ["  " + "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def nearest_changes(original: str, converted: str, near: list[int]) -> str:
    """The hunks of the conversion closest to the converted script's lines ``near``."""
    before, after = original.splitlines(), converted.splitlines()
    hunks = [
        opcode
        for opcode in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes()
        if opcode[0] != "equal"
    ]
    if not hunks or not near:
        return ""

    def distance(opcode: tuple[str, int, int, int, int]) -> int:
        first, last = opcode[3] + 1, max(opcode[4], opcode[3] + 1)
        return min(
            0 if first <= line <= last else min(abs(line - first), abs(line - last))
            for line in near
        )

    chosen = sorted(sorted(hunks, key=distance)[:NEAREST_HUNKS], key=lambda op: op[3])
    out = []
    for _, i1, i2, j1, j2 in chosen:
        out.append(f"  converted line {j1 + 1} (original line {i1 + 1}):")
        out += [f"  - {line}" for line in before[i1:i2]]
        out += [f"  + {line}" for line in after[j1:j2]]
    return "\n".join(out)


def render_text(checks: list[CheckResult], verdict: str, changes: str) -> str:
    parts = []
    for check in checks:
        parts.append(check.title)
        if check.rows:
            parts.append(table(check.header, check.rows))
        parts.append(f"  -> {check.verdict}")
        if check.diverged_at is not None and changes:
            parts.append("  the conversion's changes nearest to the code that ran:")
            parts.append(changes)
        if check.output:
            parts.append("  its output (last lines):")
            parts.append("\n".join("  | " + line for line in check.output.splitlines()[-30:]))
        parts.append("")
    parts.append(verdict)
    return "\n".join(parts)


def render_json(checks: list[CheckResult], verdict: str, passed: bool) -> str:
    return json.dumps(
        {
            "passed": passed,
            "verdict": verdict,
            "checks": [
                {
                    "title": check.title,
                    "passed": check.passed,
                    "verdict": check.verdict,
                    "rows": [dict(zip(check.header, row, strict=True)) for row in check.rows],
                    "output": check.output,
                }
                for check in checks
            ],
        },
        indent=2,
    )
