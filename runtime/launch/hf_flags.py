"""`accelerate launch` command lines, as written: every flag of HF Accelerate's launcher (1.15) is
an accelify flag (the same name, or a spelling of one that means the same), a flag accepted only
with a value that asks for what accelify does anyway, or refused with one line that says why.

Snake_case and kebab-case are both accepted, as HF does. Torch-free: the CLI uses it to parse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from accelify.errors import UserError
from accelify.runtime.options import DECLARED, FLAGS, given
from accelify.runtime.options.base import HFFlag

#: HF's option groups, in the order `accelerate launch --help` shows them
GROUPS = (
    "Options",
    "Hardware Selection Arguments",
    "Resource Selection Arguments",
    "Training Paradigm Arguments",
    "Distributed GPUs",
    "TPU",
    "DeepSpeed Arguments",
    "FSDP Arguments",
    "Megatron-LM Arguments",
    "FP8 Arguments",
    "AWS Arguments",
    "MPI Arguments",
    "ParallelismConfig Arguments",
)

#: `accelify launch`'s own options (click names) -> the HF group they belong to ("Options" if
#: not listed); each backend's flags go to that backend's group
GROUP_OF = {
    "use_cpu": "Hardware Selection Arguments",
    "multi_gpu": "Hardware Selection Arguments",
    "mixed_precision": "Resource Selection Arguments",
    "num_processes": "Resource Selection Arguments",
    "nproc_per_node": "Resource Selection Arguments",
    "num_machines": "Resource Selection Arguments",
    "num_cpu_threads_per_process": "Resource Selection Arguments",
    "gradient_accumulation_steps": "Resource Selection Arguments",
    "hf_dynamo_backend": "Resource Selection Arguments",
    "backend": "Training Paradigm Arguments",
    "use_fsdp": "Training Paradigm Arguments",
    "use_deepspeed": "Training Paradigm Arguments",
    "gpu_ids": "Distributed GPUs",
    "hf_same_network": "Distributed GPUs",
    "machine_rank": "Distributed GPUs",
    "main_process_ip": "Distributed GPUs",
    "main_process_port": "Distributed GPUs",
    "tee": "Distributed GPUs",
    "log_dir": "Distributed GPUs",
    "role": "Distributed GPUs",
    "rdzv_backend": "Distributed GPUs",
    "rdzv_conf": "Distributed GPUs",
    "max_restarts": "Distributed GPUs",
    "monitor_interval": "Distributed GPUs",
    "hang_timeout": "Distributed GPUs",
    **{flag.destination: "FSDP Arguments" for flag in DECLARED["fsdp"].hf_flags},
    **{flag.destination: "DeepSpeed Arguments" for flag in DECLARED["deepspeed"].hf_flags},
    **{
        dest: {"fsdp": "FSDP Arguments", "deepspeed": "DeepSpeed Arguments"}[owner]
        for dest, (owner, _) in FLAGS.items()
    },
}

_FP8 = "FP8 training (Transformer Engine, torchao, MS-AMP) is not supported: use bf16"

#: HF flags of the launcher itself (not of a backend) that are accepted only as what accelify
#: does anyway, and their groups
LAUNCH_HF_FLAGS = (
    (
        "Options",
        HFFlag(
            "quiet",
            takes_value=False,
            short="-q",
            accepts=("",),
            help="Accepted: the launcher never prints its own stack trace; a failure report "
            "shows the failing rank's traceback only.",
        ),
    ),
    (
        "Distributed GPUs",
        HFFlag(
            "same_network",
            takes_value=False,
            accepts=("",),
            help="Accepted: every machine reaches machine 0 at --main-process-ip directly "
            "(accelify's only way).",
        ),
    ),
    (
        "Resource Selection Arguments",
        HFFlag(
            "dynamo_backend",
            "accelify does not compile the model: call torch.compile(model) in the script",
            accepts=("no",),
            help="no (accelify does not compile; call torch.compile in the script).",
        ),
    ),
)


@dataclass(frozen=True)
class RefusedFamily:
    """HF flags that are all refused, whatever their value, for one reason."""

    group: str
    reason: str
    names: tuple[str, ...] = ()  # snake_case, without dashes
    prefixes: tuple[str, ...] = ()  # "megatron_lm_": every flag that starts so

    def covers(self, name: str) -> bool:
        return name in self.names or (bool(self.prefixes) and name.startswith(self.prefixes))

    @property
    def spellings(self) -> str:
        return ", ".join([f"--{name}" for name in self.names] + [f"--{p}*" for p in self.prefixes])


REFUSED = (
    RefusedFamily(
        "Hardware Selection Arguments",
        "TPUs (torch_xla) are not supported: accelify runs on CUDA GPUs (nccl) and CPUs (gloo)",
        names=("tpu",),
    ),
    RefusedFamily(
        "Resource Selection Arguments",
        "binding each rank to the CPU cores nearest its GPU (through NVML) is not supported: "
        "bind with numactl or taskset",
        names=("enable_cpu_affinity",),
    ),
    RefusedFamily(
        "Resource Selection Arguments",
        "accelify does not compile the model (see --dynamo_backend): call torch.compile(model, "
        "...) in the script",
        names=(
            "dynamo_mode",
            "dynamo_use_fullgraph",
            "dynamo_use_dynamic",
            "dynamo_use_regional_compilation",
        ),
    ),
    RefusedFamily(
        "Training Paradigm Arguments",
        "N-D parallelism (tensor, context, sequence parallel) is not supported: accelify shards "
        "the data (DDP) or the parameters and optimizer state (--use_fsdp, --use_deepspeed)",
        names=("use_parallelism_config",),
    ),
    RefusedFamily(
        "Training Paradigm Arguments",
        "Megatron-LM is not supported: use --use_fsdp or --use_deepspeed",
        names=("use_megatron_lm",),
    ),
    RefusedFamily(
        "TPU",
        "TPUs (torch_xla) are not supported: accelify runs on CUDA GPUs (nccl) and CPUs (gloo)",
        names=(
            "tpu_cluster",
            "no_tpu_cluster",
            "tpu_use_sudo",
            "vm",
            "env",
            "main_training_function",
            "downcast_bf16",
        ),
    ),
    RefusedFamily(
        "Megatron-LM Arguments",
        "Megatron-LM is not supported: use --use_fsdp or --use_deepspeed",
        prefixes=("megatron_lm_",),
    ),
    RefusedFamily("FP8 Arguments", _FP8, prefixes=("fp8_",)),
    RefusedFamily(
        "AWS Arguments",
        "launching on Amazon SageMaker is not supported: run accelify launch on the machines",
        prefixes=("aws_",),
    ),
    RefusedFamily(
        "MPI Arguments",
        "starting ranks through mpirun is not supported: accelify starts them with torchrun; "
        "run accelify launch on every machine (--num_machines, --machine_rank) or under Slurm",
        prefixes=("mpirun_",),
    ),
    RefusedFamily(
        "ParallelismConfig Arguments",
        "N-D parallelism (tensor, context, sequence parallel) is not supported: accelify shards "
        "the data (DDP) or the parameters and optimizer state (--use_fsdp, --use_deepspeed)",
        prefixes=("parallelism_config_",),
    ),
)


def snake(option: str) -> str:
    """``--fp8-backend`` -> ``fp8_backend``."""
    return option.lstrip("-").replace("-", "_")


def refused_family(option: str) -> RefusedFamily | None:
    name = snake(option)
    return next((family for family in REFUSED if family.covers(name)), None)


#: every HF flag accelify declares as a click option: destination -> (backend or None, flag)
HF_OPTIONS: dict[str, tuple[str | None, HFFlag]] = {
    **{flag.destination: (None, flag) for _, flag in LAUNCH_HF_FLAGS},
    **{
        flag.destination: (backend, flag)
        for backend, declaration in DECLARED.items()
        for flag in declaration.hf_flags
    },
}
GROUP_OF.update({flag.destination: group for group, flag in LAUNCH_HF_FLAGS})

Command = TypeVar("Command", bound=Callable[..., Any])


def click_options(command: Command) -> Command:
    """HF's flags that select an engine, and every HFFlag, as click options."""
    for _, flag in reversed(HF_OPTIONS.values()):
        settings: dict[str, Any] = (
            {"is_flag": True, "default": None} if not flag.takes_value else {"metavar": "VALUE"}
        )
        meaning = flag.help or f"Refused: {flag.refusal}."
        command = click.option(*flag.declarations, flag.destination, help=meaning, **settings)(
            command
        )
    for name, meaning in reversed(
        (
            ("multi_gpu", "Several processes on this machine's GPUs (the default on GPUs)."),
            ("use_deepspeed", "As --backend deepspeed."),
            ("use_fsdp", "As --backend fsdp."),
        )
    ):
        spellings = (f"--{name}", f"--{name.replace('_', '-')}")
        command = click.option(*spellings, name, is_flag=True, default=None, help=meaning)(command)
    return command


#: the boolean flags HF spells with a value: the spelling -> {value: the flag it means}
BOOLEAN_VALUES: dict[str, Mapping[str, str]] = {
    declaration.split("/")[0]: flag.hf_values
    for _, flag in FLAGS.values()
    if flag.hf_values
    for declaration in flag.declarations
}


def rewrite(arguments: list[str], takes_value: Mapping[str, bool]) -> list[str]:
    """The options before SCRIPT, with HF's ``--fsdp_activation_checkpointing true`` spelled
    as accelify's boolean flag; a flag of a refused family ends the parse with its reason.
    ``takes_value``: every known option spelling -> whether it is followed by a value."""
    result: list[str] = []
    index = 0
    while index < len(arguments):
        token = arguments[index]
        if token == "--" or not token.startswith("-") or token == "-":
            break  # SCRIPT, and the script's own arguments
        name, equals, value = token.partition("=")
        family = refused_family(name) if name.startswith("--") else None
        if family is not None:
            raise UserError(f"{name}: {family.reason}")
        index += 1
        if name in BOOLEAN_VALUES:
            following = value if equals else arguments[index] if index < len(arguments) else ""
            meant = BOOLEAN_VALUES[name].get(following.lower())
            if meant is None and equals:
                raise UserError(f"{token}: expected true or false")
            result.append(meant or token)
            index += 1 if meant is not None and not equals else 0
            continue
        result.append(token)
        if not equals and takes_value.get(name) and index < len(arguments):
            result.append(arguments[index])
            index += 1
    return result + arguments[index:]


def resolve(flags: dict[str, Any]) -> dict[str, Any]:
    """The parsed flags as accelify's own: HF's flags translated into the settings they mean,
    or refused (UserError) with the reason."""
    flags = dict(flags)
    translated: dict[str, dict[str, Any]] = {}
    for destination, (backend, flag) in HF_OPTIONS.items():
        value = flags.pop(destination, None)
        if value is None:
            continue
        reason = flag.refused(value)
        if reason is not None:
            spelled = f"--{flag.name}" if value is True else f"--{flag.name} {value}"
            raise UserError(f"{spelled}: {reason}")
        if flag.translated and backend is not None:
            translated.setdefault(backend, {})[flag.name] = value
    for backend, values in translated.items():
        _apply_translated(flags, backend, values)
    engines = [name for name in ("fsdp", "deepspeed") if flags.pop(f"use_{name}", None)]
    multi_gpu = flags.pop("multi_gpu", None)
    if len(engines) > 1:
        raise UserError("--use_fsdp and --use_deepspeed ask for two engines: give one")
    if engines:
        if flags.get("backend") not in (None, engines[0]):
            raise UserError(
                f"--use_{engines[0]} and --backend {flags['backend']} ask for two engines: give one"
            )
        flags["backend"] = engines[0]
    if multi_gpu and flags.get("use_cpu"):
        raise UserError("--multi_gpu asks for GPUs and --cpu for the CPU: give one")
    if flags.get("mixed_precision") == "fp8":
        raise UserError(f"--mixed_precision fp8: {_FP8}")
    return flags


def _apply_translated(flags: dict[str, Any], backend: str, values: dict[str, Any]) -> None:
    """HF's flags of one backend, read as the keys of its HF config section of the same names;
    an accelify flag given for the same option wins."""
    try:
        options, _ = DECLARED[backend].from_hf(values)
    except ValueError as error:
        names = ", ".join(f"--{name}" for name in values)
        raise UserError(f"{names}: {error}") from None
    destination_of = {(owner, flag.option): dest for dest, (owner, flag) in FLAGS.items()}
    for option, value in given(options).items():
        destination = destination_of[(backend, option)]
        if flags.get(destination) is None:
            flags[destination] = value


def help_sections(records: Mapping[str, list[tuple[str, str]]]) -> list[tuple[str, list]]:
    """`accelify launch --help`'s sections, in HF's order: each group's options (``records``,
    by group) and then its refused flags, one row per reason."""
    sections = []
    for group in GROUPS:
        rows = list(records.get(group, []))
        rows += [
            (family.spellings, f"Refused: {family.reason}.")
            for family in REFUSED
            if family.group == group
        ]
        if rows:
            sections.append((group, rows))
    return sections
