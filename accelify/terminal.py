"""Colors for diffs on a terminal, shared by `convert --diff` and `lint --diff`."""

from __future__ import annotations

import os
import sys

import click

#: ``--color/--no-color`` of the commands that show diffs, as ruff and git spell it
color_option = click.option(
    "--color/--no-color",
    "color",
    default=None,
    help="Color the diff [default: on a terminal, unless NO_COLOR is set].",
)


def use_color(choice: bool | None) -> bool:
    """``--color`` or ``--no-color`` where given; else on a terminal, unless ``NO_COLOR`` is set
    to anything but the empty string (no-color.org)."""
    if choice is not None:
        return choice
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def echo_diff(diff: str, color: bool) -> None:
    """The diff, colored or not; ``color=`` so that ``--color`` colors a pipe too (click strips
    the codes off anything but a terminal unless told)."""
    click.echo(colorize(diff) if color else diff, nl=False, color=color)


def colorize(diff: str) -> str:
    colored = []
    for line in diff.splitlines(keepends=True):
        if line.startswith(("+++", "---")):
            colored.append(click.style(line, bold=True))
        elif line.startswith("+"):
            colored.append(click.style(line, fg="green"))
        elif line.startswith("-"):
            colored.append(click.style(line, fg="red"))
        elif line.startswith("@@"):
            colored.append(click.style(line, fg="cyan"))
        else:
            colored.append(line)
    return "".join(colored)
