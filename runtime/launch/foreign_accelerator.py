"""A script that creates Hugging Face Accelerate's `Accelerator` under `accelify launch`.

HF's Accelerator reads torchrun's variables but not ``ACCELIFY_*``: on GPUs its ranks form a
group, but on the CPU (without HF's own ``ACCELERATE_USE_CPU``) each rank decides it is alone,
and N copies train on all the data, print everything N times and write the same files — a run
that looks fine and is not. The launcher checks the script's imports before any rank starts.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

#: Names whose construction makes HF Accelerate decide the process layout.
STATEFUL_NAMES = {"Accelerator", "PartialState", "AcceleratorState"}


@dataclass(frozen=True)
class ForeignImport:
    line: int
    statement: str


def accelerate_import(script: Path) -> ForeignImport | None:
    """Where a script that does not import accelify takes HF Accelerate's Accelerator (or its
    state): ``from accelerate import Accelerator``, or ``import accelerate`` used as
    ``accelerate.Accelerator``. None when there is none, or when the file cannot be read as
    Python (then Python itself reports it on every rank)."""
    try:
        source = script.read_text(encoding="utf-8-sig")
        tree = ast.parse(source, filename=str(script))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    nodes = list(ast.walk(tree))
    imports = sorted(
        (node for node in nodes if isinstance(node, (ast.Import, ast.ImportFrom))),
        key=lambda node: node.lineno,
    )
    if any(_root(module) == "accelify" for node in imports for module in _modules(node)):
        return None
    module_aliases: dict[str, ast.AST] = {}
    for node in imports:
        if isinstance(node, ast.ImportFrom) and _root(node.module or "") == "accelerate":
            if node.level == 0 and any(alias.name in STATEFUL_NAMES for alias in node.names):
                return _found(source, node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "accelerate":
                    module_aliases[alias.asname or alias.name] = node
    for node in nodes:
        if (
            isinstance(node, ast.Attribute)
            and node.attr in STATEFUL_NAMES
            and isinstance(node.value, ast.Name)
            and node.value.id in module_aliases
        ):
            return _found(source, module_aliases[node.value.id])
    return None


def _modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module] if node.level == 0 and node.module else []


def _root(module: str) -> str:
    return module.split(".", 1)[0]


def _found(source: str, node: ast.AST) -> ForeignImport:
    return ForeignImport(node.lineno, ast.get_source_segment(source, node) or "")


def refusal(script: str, found: ForeignImport, processes: int) -> str:
    return (
        f"{script}:{found.line}: `{found.statement}`: this script creates Hugging Face "
        "Accelerate's Accelerator, which does not read accelify launch's settings; on the CPU "
        f"its {processes} processes would not form a group (each would train alone on all the "
        "data and print everything). Import it from accelify instead (`from accelify import "
        "Accelerator`: the same API), or run the script with "
        f"`ACCELERATE_USE_CPU=1 torchrun --nproc_per_node {processes} {script}` (HF's own "
        f"`accelerate launch --cpu --num_processes {processes}` starts one process without MPI)"
    )


def warning(script: str, found: ForeignImport) -> str:
    return (
        f"accelify launch: warning: {script}:{found.line} creates Hugging Face Accelerate's "
        "Accelerator: its ranks form a group through torchrun's variables, but accelify's "
        "--mixed-precision, --gradient-accumulation-steps and --backend do not reach it"
    )
