"""Lint one file: parse, analyse once, run the enabled rules, drop suppressed findings, and
apply the safe fixes (until nothing changes) when asked."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from accelify.errors import UserError
from accelify.lint.finding import Finding
from accelify.lint.selection import Selection, suppressed
from accelify.source import parse

if TYPE_CHECKING:
    import libcst as cst

    from accelify.analysis.script_model import ScriptModel

MARKERS = (b"torch", b"accelerate", b"accelify")
#: Text every file that uses an accelerator has: one it creates, gets from a factory, holds on a
#: class or receives as a parameter (named so, or used with members only an accelerator has).
ACCELERATOR_MARKERS = (
    b"ccelerator",
    b".prepare(",
    b".unwrap_model(",
    b".gather_for_metrics(",
    b".accumulate(",
)


@dataclass
class FileResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    original: bytes = b""
    fixed: bytes | None = None
    fixed_count: int = 0  # findings whose fix was applied to `fixed`


def lint_source(
    data: bytes, path: str, selection: Selection, fix: bool = False, portable: bool = False
) -> FileResult:
    """``portable``: findings carry their fix as a text edit on ``data`` (plain data), not as a
    plan over this process's tree."""
    result = FileResult(path, original=data)
    if not any(marker in data for marker in (*MARKERS, *ACCELERATOR_MARKERS)):
        return result  # cannot match any rule: skipped before parsing
    try:
        module = parse(data, path)
    except UserError as error:
        if selection.enabled("ACC000", path):
            result.findings.append(
                Finding("ACC000", error.message, error.line or 1, error.column or 1, None, path)
            )
        return result
    if not any(marker in data for marker in ACCELERATOR_MARKERS):
        return result  # every rule is about files that use an accelerator (`accelify rules`)
    from accelify.analysis.script_model import analyze

    script = analyze(module, data.decode("utf-8", errors="replace"))
    result.findings = _check(script, data, path, selection)
    if portable and not fix:
        result.findings = _portable(result.findings, module)
    if fix and any(f.fix for f in result.findings):
        result.fixed, result.fixed_count = _fix(data, path, selection)
        if result.fixed != data:
            module = parse(result.fixed, path)
            result.findings = _check(analyze(module), result.fixed, path, selection)
        if portable:
            result.findings = _portable(result.findings, module)
    return result


def _portable(findings: list[Finding], module: cst.Module) -> list[Finding]:
    """The findings with their fixes as text edits; the file's code is generated once."""
    if not any(finding.fix for finding in findings):
        return findings
    code = module.code
    return [finding.portable(module, code) for finding in findings]


def _check(script: ScriptModel, data: bytes, path: str, selection: Selection) -> list[Finding]:
    from accelify.lint.registry import all_rules

    lines = data.decode("utf-8", errors="replace").splitlines()
    found: list[Finding] = []
    for rule in all_rules():
        if not selection.enabled(rule.code, path) or not script.uses_accelerator:
            continue
        for finding in rule.check(script):
            finding.path = path
            if not suppressed(lines, finding.line, finding.code):
                found.append(finding)
    return sorted(found, key=lambda f: (f.line, f.column, f.code))


def _fix(data: bytes, path: str, selection: Selection, rounds: int = 5) -> tuple[bytes, int]:
    """One fix per node per round; later rounds see the earlier rounds' code. A result that
    Python cannot compile is never returned: the file stays as it was."""
    from accelify.analysis.script_model import analyze
    from accelify.edits.apply import ApplyPlan

    current, applied = data, 0
    for _ in range(rounds):
        module = parse(current, path)
        findings = _check(analyze(module), current, path, selection)
        plans = [f.fix for f in findings if f.fix is not None]
        if not plans:
            break
        merged = plans[0]
        for plan in plans[1:]:
            merged.merge(plan)
        updated = module.visit(ApplyPlan(merged)).bytes
        if updated == current:
            break
        current, applied = updated, applied + len(plans)
    if current != data and not _compiles(current, path):
        return data, 0
    return current, applied


def _compiles(data: bytes, path: str) -> bool:
    try:
        compile(data, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        import sys

        print(
            f"accelify: warning: {path}: the fixes gave code that does not compile; "
            "left unchanged (please report this)",
            file=sys.stderr,
        )
        return False
    return True
