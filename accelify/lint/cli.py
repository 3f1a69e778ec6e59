"""`accelify lint` and `accelify rules`: run, render, return the exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from accelify.errors import UserError
from accelify.lint.engine import FileResult, lint_source
from accelify.lint.finding import Finding
from accelify.lint.output import render, statistics
from accelify.lint.selection import Selection, load_settings
from accelify.source import python_files, write_atomically
from accelify.terminal import colorize


def run_lint(
    paths: list[Path],
    *,
    fix: bool,
    diff: bool,
    select: list[str],
    ignore: list[str],
    output_format: str,
    exit_zero: bool,
    show_statistics: bool,
    jobs: int,
) -> int:
    try:
        settings = load_settings(Path.cwd())
    except UserError as error:
        click.echo(f"accelify: error: {error}", err=True)
        return 2
    selection = Selection(
        select=select or settings.select,
        ignore=[*settings.ignore, *ignore],
        per_file_ignores=settings.per_file_ignores,
        exclude=settings.exclude,
    )
    files = list(_collect(paths or [Path(".")], selection))
    results = _lint_all(files, selection, fix or diff, jobs)
    findings = [f for result in results for f in result.findings]
    for result in results:
        if result.fixed is None or result.fixed == result.original:
            continue
        if diff:
            from accelify.edits.diff import unified_diff

            text = unified_diff(result.path, result.original, result.fixed)
            click.echo(colorize(text) if sys.stdout.isatty() else text, nl=False)
        elif fix:
            write_atomically(Path(result.path), result.fixed)
    if (findings and not diff) or (output_format in ("json", "sarif") and not diff):
        click.echo(render(findings, output_format))
    if show_statistics and findings:
        click.echo(statistics(findings))
    if output_format == "text" and not diff:
        fixable = sum(1 for f in findings if f.fixable)
        summary = f"Found {len(findings)} error{'s' if len(findings) != 1 else ''}."
        if fixable and not fix:
            summary += f" [*] {fixable} fixable with `accelify lint --fix`."
        click.echo(summary if findings else "All checks passed!", err=True)
    if exit_zero:
        return 0
    return 1 if findings else 0


def _lint_one(path: Path, selection: Selection, fix: bool) -> FileResult:
    try:
        data = path.read_bytes()
    except OSError as error:
        return FileResult(
            str(path), [Finding("ACC000", f"cannot read: {error.strerror}", 1, 1, None, str(path))]
        )
    return lint_source(data, str(path), selection, fix)


def _lint_all(files: list[Path], selection: Selection, fix: bool, jobs: int) -> list[FileResult]:
    if jobs <= 1 or len(files) < 2:
        return [_lint_one(path, selection, fix) for path in files]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_lint_in_worker, files, [selection] * len(files), [fix] * len(files)))


def _lint_in_worker(path: Path, selection: Selection, fix: bool) -> FileResult:
    """A worker's result, made picklable: fixes were applied there (``fixed``); the plans stay."""
    result = _lint_one(path, selection, fix)
    result.findings = [finding.portable() for finding in result.findings]
    return result


def _collect(paths: list[Path], selection: Selection):
    for path in paths:
        if path.is_file():
            yield path
            continue
        listed = _git_files(path)
        candidates = listed if listed is not None else python_files(path)
        for candidate in candidates:
            if candidate.suffix == ".py" and not selection.excluded(candidate):
                yield candidate


def _git_files(folder: Path) -> list[Path] | None:
    """Files git tracks or would track (``.gitignore`` respected); None outside a repository."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "."],
            cwd=folder,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    names = [name for name in listed.decode().split("\0") if name]
    return sorted(folder / name for name in names if (folder / name).is_file())


def show_rules(code: str | None) -> int:
    from accelify.lint.registry import all_rules, rule_by_code

    if code is None:
        for rule in all_rules():
            mark = "fixable" if rule.fixable else ""
            click.echo(f"{rule.code}  {rule.name:30} {mark:8} {rule.message}")
        return 0
    rule = rule_by_code(code)
    if rule is None:
        click.echo(f"accelify: error: no rule {code}; `accelify rules` lists them", err=True)
        return 2
    click.echo(rule_page(rule))
    return 0


def rule_page(rule) -> str:
    doc = " ".join((rule.__doc__ or "").split())
    bad = rule.bad[0] if rule.bad else None
    lines = [
        f"# {rule.code} {rule.name}",
        "",
        "## What it does",
        doc,
        "",
        "## Why it breaks on N processes",
        rule.why or doc,
        "",
    ]
    if bad is not None:
        lines += ["## Example", "```python", bad.code.rstrip(), "```", ""]
    if rule.good:
        lines += ["## Use instead", "```python", rule.good[0].rstrip(), "```", ""]
    lines += [
        "## Fix",
        "Safe fix available (`accelify lint --fix`)."
        if rule.fixable
        else "No automatic fix: the right change depends on the script.",
        "",
        f"Message: {rule.message}",
    ]
    return "\n".join(lines)
