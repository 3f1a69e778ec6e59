"""What `--backend fsdp` and `--backend deepspeed` can be told, checked before any rank starts.

Each backend declares its options in its own module (`fsdp`, `deepspeed`): the dataclass, the
`accelify launch` flags, its HF Accelerate config section, its checks and its `accelify config`
questions; `DECLARED` lists them. Torch-free: the CLI, the config file reader and the launcher
use it; the runtime reads the same options back from ``ACCELIFY_BACKEND_OPTIONS`` (JSON).
Every option is ``None`` when not given, so that an option meant for another backend is an
error rather than silently ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from accelify.errors import UserError
from accelify.runtime.options import deepspeed, fsdp
from accelify.runtime.options.base import BackendOptions, Flag, class_names, given, parse_options
from accelify.runtime.options.deepspeed import DeepSpeedOptions
from accelify.runtime.options.fsdp import FSDPOptions

#: backend -> its declaration; a backend without options (ddp) is not listed
DECLARED: dict[str, BackendOptions] = {
    declaration.backend: declaration for declaration in (fsdp.DECLARATION, deepspeed.DECLARATION)
}
#: Each option's `accelify launch` flag: its click destination -> (backend, flag).
FLAGS: dict[str, tuple[str, Flag]] = {
    flag.destination: (declaration.backend, flag)
    for declaration in DECLARED.values()
    for flag in declaration.flags
}

Command = TypeVar("Command", bound=Callable[..., Any])


def launch_flags(command: Command) -> Command:
    """Every backend's flags as click options of ``accelify launch``, in declaration order."""
    for _, flag in reversed(FLAGS.values()):
        command = click.option(*flag.declarations, flag.destination, help=flag.help, **flag.click)(
            command
        )
    return command


def to_env(backend: str, chosen: Any) -> str:
    values = given(chosen) if backend in DECLARED else {}
    return json.dumps({key: list(v) if isinstance(v, tuple) else v for key, v in values.items()})


def from_env(backend: str, text: str | None) -> Any:
    declaration = DECLARED.get(backend)
    if declaration is None:
        return None
    return parse_options(declaration.options, json.loads(text) if text else {})


def check(backend: str, options_by_backend: dict[str, Any], on_cpu: bool) -> None:
    """Refuse what the chosen backend cannot honour, with the flag to change."""
    flag_of = {(owner, flag.option): flag.name for owner, flag in FLAGS.values()}
    for name, options in options_by_backend.items():
        if name != backend and given(options):
            flags = ", ".join(flag_of[(name, key)] for key in given(options))
            raise UserError(f"{flags} applies to --backend {name}, and this run uses {backend}")
    if backend in DECLARED:
        DECLARED[backend].check(options_by_backend[backend], on_cpu)


__all__ = [
    "DECLARED",
    "FLAGS",
    "DeepSpeedOptions",
    "FSDPOptions",
    "check",
    "class_names",
    "from_env",
    "given",
    "launch_flags",
    "parse_options",
    "to_env",
]
