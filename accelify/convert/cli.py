"""`accelify convert`: run the conversions and render them; returns the exit code."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from accelify.convert.conversion import Conversion, Options
from accelify.convert.files import collect, convert_all, write
from accelify.convert.report import summary
from accelify.edits.diff import unified_diff
from accelify.errors import UserError
from accelify.terminal import echo_diff, use_color


def run_convert(
    paths: list[Path],
    *,
    write_files: bool,
    output: Path | None,
    show_diff: bool | None,
    check: bool,
    target: str,
    mixed_precision: str | None,
    jobs: int,
    quiet: bool,
    color: bool | None = None,
) -> int:
    files = list(collect(paths))
    if output is not None and (len(files) != 1 or write_files):
        click.echo(
            "accelify: error: -o/--output takes exactly one input file, without --write", err=True
        )
        return 2
    options = Options(target=target, mixed_precision=mixed_precision)
    if len(files) > 20 and not quiet and sys.stderr.isatty():
        with click.progressbar(length=len(files), label="converting", file=sys.stderr) as bar:
            results = convert_all(files, options, jobs, bar.update)
    else:
        results = convert_all(files, options, jobs)
    if show_diff is None:
        show_diff = not (write_files or output is not None or quiet or check)
    errors = 0
    changed = 0
    color = use_color(color)
    for result in results:
        if isinstance(result, UserError):
            click.echo(f"accelify: error: {result}", err=True)
            errors += 1
            continue
        changed += result.changed
        if check:  # as `ruff format --check`: one line per file that would change, even quiet
            if result.changed:
                _show(result, show_diff, quiet, color, summarize=False)
                click.echo(f"Would convert: {result.path}")
            continue
        _show(result, show_diff, quiet, color)
        if result.changed and (write_files or output is not None):
            write(result, output)
    if not (check and quiet):  # as `ruff format --check --quiet`: the files' lines only
        _final_line(results, changed, errors, write_files or output is not None, check)
    if errors:
        return 2
    return 1 if check and changed else 0


def _show(
    result: Conversion, show_diff: bool, quiet: bool, color: bool, summarize: bool = True
) -> None:
    if quiet:
        return
    if show_diff and result.changed:
        diff = unified_diff(result.path, result.original, result.converted)
        echo_diff(diff, color)
    if summarize:
        click.echo(summary(result))


def _final_line(results: list, changed: int, errors: int, wrote: bool, check: bool) -> None:
    files = len(results)
    verb = "converted" if wrote else "would be converted"
    parts = [f"{changed} of {files} file{'s' if files != 1 else ''} {verb}"]
    reviews = sum(len(r.reviews) for r in results if isinstance(r, Conversion))
    if reviews:
        parts.append(f"{reviews} place{'s' if reviews != 1 else ''} to review")
    if errors:
        parts.append(f"{errors} error{'s' if errors != 1 else ''}")
    hint = "" if wrote or check or not changed else " (run with --write to apply)"
    click.echo(", ".join(parts) + hint, err=True)
