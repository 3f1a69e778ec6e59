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
    from accelify.analysis.script_model import ScriptModel

MARKERS = (b"torch", b"accelerate", b"accelify")


@dataclass
class FileResult:
    path: str
    findings: list[Finding] = field(default_factory=list)
    original: bytes = b""
    fixed: bytes | None = None


def lint_source(data: bytes, path: str, selection: Selection, fix: bool = False) -> FileResult:
    result = FileResult(path, original=data)
    if not any(marker in data for marker in MARKERS):
        return result  # cannot match any rule: skipped before parsing
    try:
        module = parse(data, path)
    except UserError as error:
        if selection.enabled("ACC000", path):
            result.findings.append(
                Finding("ACC000", error.message, error.line or 1, error.column or 1, None, path)
            )
        return result
    if b"Accelerator" not in data and not _plain_script_rules(selection):
        return result  # no Accelerator, and no rule asked for on plain scripts: no analysis
    from accelify.analysis.script_model import analyze

    script = analyze(module)
    result.findings = _check(script, data, path, selection)
    if fix and any(f.fix for f in result.findings):
        result.fixed = _fix(data, path, selection)
        if result.fixed != data:
            script = analyze(parse(result.fixed, path))
            result.findings = _check(script, result.fixed, path, selection)
    return result


def _plain_script_rules(selection: Selection) -> bool:
    from accelify.lint.registry import all_rules

    return any(
        not rule.accelerator_only or selection.explicitly_selected(rule.code)
        for rule in all_rules()
    )


def _check(script: ScriptModel, data: bytes, path: str, selection: Selection) -> list[Finding]:
    from accelify.lint.registry import all_rules

    lines = data.decode("utf-8", errors="replace").splitlines()
    found: list[Finding] = []
    for rule in all_rules():
        if not selection.enabled(rule.code, path):
            continue
        plain_script = rule.accelerator_only and not script.uses_accelerator
        if plain_script and not selection.explicitly_selected(rule.code):
            continue
        for finding in rule.check(script):
            finding.path = path
            if not suppressed(lines, finding.line, finding.code):
                found.append(finding)
    return sorted(found, key=lambda f: (f.line, f.column, f.code))


def _fix(data: bytes, path: str, selection: Selection, rounds: int = 5) -> bytes:
    """One fix per node per round; later rounds see the earlier rounds' code."""
    from accelify.analysis.script_model import analyze
    from accelify.edits.apply import ApplyPlan

    current = data
    for _ in range(rounds):
        module = parse(current, path)
        findings = _check(analyze(module), current, path, selection)
        plans = [f.fix for f in findings if f.fix is not None]
        if not plans:
            break
        merged = plans[0]
        for plan in plans[1:]:
            for node, replace in plan.replacements.items():
                merged.replacements.setdefault(node, replace)
            merged.removals |= plan.removals
        updated = module.visit(ApplyPlan(merged)).bytes
        if updated == current:
            break
        current = updated
    return current
