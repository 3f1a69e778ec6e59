"""How `accelify config` fills a `LaunchConfig`: by asking, or by looking at the hardware."""

from __future__ import annotations

import click

from accelify.runtime.environment import BACKEND_CHOICES, MIXED_PRECISION_CHOICES
from accelify.runtime.launch.config import LaunchConfig
from accelify.runtime.options import DECLARED


def detect() -> LaunchConfig:
    """One process per GPU with bf16 where the GPUs support it; one CPU process otherwise."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        return LaunchConfig(num_processes=1, use_cpu=True, mixed_precision="no")
    precision = "bf16" if torch.cuda.is_bf16_supported() else "no"
    return LaunchConfig(num_processes=gpus, use_cpu=False, mixed_precision=precision)


def ask() -> LaunchConfig:
    machines = click.prompt("How many machines will take part?", default=1, type=click.IntRange(1))
    machine_rank, ip, port = 0, None, None
    if machines > 1:
        machine_rank = click.prompt(
            "What is this machine's rank (0 on the machine that hosts the rendezvous)?",
            default=0,
            type=click.IntRange(0, machines - 1),
        )
        ip = click.prompt("What is the IP address of machine 0?", type=str)
        port = click.prompt(
            "Which port on machine 0?", default=29500, type=click.IntRange(1, 65535)
        )
    use_cpu = click.confirm("Run on the CPU only?", default=False)
    processes = click.prompt("How many processes per machine?", default=1, type=click.IntRange(1))
    precision = click.prompt(
        "Mixed precision?", default="no", type=click.Choice(MIXED_PRECISION_CHOICES)
    )
    if precision == "fp16" and use_cpu:
        raise click.BadParameter("fp16 needs CUDA GPUs; on the CPU choose bf16 or no")
    accumulation = click.prompt("Gradient accumulation steps?", default=1, type=click.IntRange(1))
    backend = click.prompt(
        "Which engine wraps the model (ddp, fsdp: PyTorch FSDP2, deepspeed: DeepSpeed ZeRO)?",
        default="ddp",
        type=click.Choice(BACKEND_CHOICES),
    )
    chosen = {name: declaration.options() for name, declaration in DECLARED.items()}
    if backend in DECLARED:
        chosen[backend] = DECLARED[backend].ask()
    return LaunchConfig(
        backend=backend,
        **chosen,
        num_processes=processes * machines,  # the total, as HF's num_processes
        num_machines=machines,
        machine_rank=machine_rank,
        main_process_ip=ip,
        main_process_port=port,
        mixed_precision=precision,
        gradient_accumulation_steps=accumulation,
        use_cpu=use_cpu,
    )
