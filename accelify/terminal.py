"""Colors for diffs on a terminal, shared by `convert --diff` and `lint --diff`."""

from __future__ import annotations

import click


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
