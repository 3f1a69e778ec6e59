"""The `accelify` command: parse arguments, call one function, render its result.

Nothing here imports torch at import time; `launch`, `config --default` and `env` import it when
they run. The run-side commands are defined in `accelify.run_cli`, imported only when one of them
is asked for (or `--help` lists them): `accelify lint` starts without it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from accelify import startup

# first, before click is imported: a Ctrl-C as `accelify launch` starts ends it in one line
startup.stop_at_once_while_the_launch_starts()

import click  # noqa: E402

from accelify import __version__  # noqa: E402
from accelify.terminal import color_option  # noqa: E402

F = TypeVar("F", bound=Callable[..., Any])

#: Commands defined in `accelify.run_cli`, by name.
RUN_COMMANDS = ("config", "env", "launch", "verify")


class _Commands(click.Group):
    """The group, with the run-side commands imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *RUN_COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in RUN_COMMANDS:
            from accelify import run_cli

            return getattr(run_cli, name)
        return super().get_command(ctx, name)


def _show_version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from accelify.requirements import version_line

        click.echo(version_line(__version__))
        ctx.exit()


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show accelify's version and the torch and DeepSpeed it would run with.",
)
def main() -> None:
    """Make a single-device PyTorch training script distributed, and keep it correct."""


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--write", "write_files", is_flag=True, help="Rewrite the files in place (atomic).")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the converted script here instead (one input file).",
)
@click.option(
    "--diff/--no-diff",
    "show_diff",
    default=None,
    help="Show the unified diff (default: on, unless --write).",
)
@click.option("--check", is_flag=True, help="Exit 1 when a file would change (for CI).")
@click.option(
    "--target",
    type=click.Choice(["accelify", "accelerate"]),
    default="accelify",
    show_default=True,
    help="Emit imports for accelify's runtime or HF Accelerate.",
)
@click.option(
    "--mixed-precision",
    type=click.Choice(["no", "bf16", "fp16"]),
    help="Set Accelerator(mixed_precision=...) in the converted script.",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Convert files in parallel.",
)
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="Only errors and the final count (with --check: errors and the files that would change).",
)
@color_option
def convert(
    paths: tuple[Path, ...],
    write_files: bool,
    output: Path | None,
    show_diff: bool | None,
    check: bool,
    target: str,
    mixed_precision: str | None,
    jobs: int,
    quiet: bool,
    color: bool | None,
) -> None:
    """Convert single-device training scripts to run on N processes.

    Without --write this is a preview: the diff and a summary of what was prepared, each change
    and every place to review; nothing is written. A directory converts the training scripts
    under it (files without `.backward()` are skipped, unless they train through a
    module of their own folder: those get review lines).

    \b
    Examples:
      accelify convert train.py                 # preview
      accelify convert train.py --write         # apply
      accelify convert src/ --check             # CI: exit 1 if anything would change
    """
    from accelify.convert.cli import run_convert

    sys.exit(
        run_convert(
            list(paths),
            write_files=write_files,
            output=output,
            show_diff=show_diff,
            check=check,
            target=target,
            mixed_precision=mixed_precision,
            jobs=jobs,
            quiet=quiet,
            color=color,
        )
    )


@main.command()
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--fix", is_flag=True, help="Apply the safe fixes in place.")
@click.option("--diff", is_flag=True, help="Show the fixes as a diff; write nothing.")
@click.option(
    "--select", default="", help="Comma-separated codes or prefixes to check (default: bugs only)."
)
@click.option(
    "--extend-select", default="", help="Codes or prefixes to check on top of the selection."
)
@click.option("--ignore", default="", help="Comma-separated codes or prefixes to skip.")
@click.option(
    "--output-format",
    type=click.Choice(["text", "json", "github", "sarif"]),
    default="text",
    show_default=True,
)
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when something is reported.")
@click.option("--statistics", "show_statistics", is_flag=True, help="Count findings per code.")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--no-cache", is_flag=True, help="Lint every file again; read and write no cache.")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The cache folder [default: ACCELIFY_CACHE_DIR, else [tool.accelify] cache-dir, "
    "else .accelify_cache at the project root].",
)
@click.option("-q", "--quiet", is_flag=True, help="Only findings, errors and the final count.")
@color_option
def lint(
    paths: tuple[Path, ...],
    fix: bool,
    diff: bool,
    select: str,
    extend_select: str,
    ignore: str,
    output_format: str,
    exit_zero: bool,
    show_statistics: bool,
    jobs: int,
    no_cache: bool,
    cache_dir: Path | None,
    quiet: bool,
    color: bool | None,
) -> None:
    """Report distributed-training misuse in Accelerator scripts (ACC codes).

    Exit 0 when clean, 1 when something is reported, 2 on usage errors or a file the tool
    failed to check (named in one line, the others still checked). `# noqa: ACC201` on a
    line suppresses; `[tool.accelify]` in pyproject.toml sets select, extend-select, ignore,
    per-file-ignores, exclude and cache-dir. Without --select the default set runs (bugs only:
    `accelify rules` marks it); --select/--extend-select/--ignore take codes or prefixes (ACC2,
    ALL); ACC000 (a file that cannot be read or parsed) is always reported. Files without an
    Accelerator are checked for ACC000 only. Findings are cached per file content (as in ruff):
    an unchanged file is not linted twice.
    """
    from accelify.lint.cli import run_lint

    sys.exit(
        run_lint(
            list(paths),
            fix=fix,
            diff=diff,
            select=_codes(select),
            extend_select=tuple(_codes(extend_select)),
            ignore=_codes(ignore),
            output_format=output_format,
            exit_zero=exit_zero,
            show_statistics=show_statistics,
            jobs=jobs,
            cache=not no_cache,
            cache_dir=cache_dir,
            quiet=quiet,
            color=color,
        )
    )


def _codes(text: str) -> list[str]:
    return [code.strip().upper() for code in text.split(",") if code.strip()]


@main.command()
@click.argument("code", required=False)
def rules(code: str | None) -> None:
    """List the lint rules, or print one rule's page (what, why, example, fix)."""
    from accelify.lint.cli import show_rules

    sys.exit(show_rules(code))


if __name__ == "__main__":
    main()
