"""`accelify launch`: start N processes per machine through torch's elastic agent (torchrun).

The agent does the process management (start, watch, stop all when one fails, restart the group
with ``--max-restarts``); this module only turns accelerate-style settings into torchrun's
arguments and the ``ACCELIFY_*`` variables the runtime reads, and checks what can be checked
before any process starts.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from accelify.errors import UserError
from accelify.runtime import backend_options
from accelify.runtime.config import LaunchConfig
from accelify.runtime.environment import LaunchSettings

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class LaunchPlan:
    config: LaunchConfig
    script: str
    script_args: tuple[str, ...]
    module: bool = False


def merge(file_config: LaunchConfig, overrides: dict[str, object]) -> LaunchConfig:
    """Flags win over the file: only flags the user gave (not None) replace file values,
    option by option for the backends' options too."""
    given = {key: value for key, value in overrides.items() if value is not None}
    if isinstance(given.get("auto_wrap"), str):
        given["auto_wrap"] = backend_options.class_names(str(given["auto_wrap"]))
    for section in ("fsdp", "deepspeed"):
        flags = {
            option: given.pop(dest)
            for dest, (owner, option, _) in backend_options.FLAGS.items()
            if owner == section and dest in given
        }
        if flags:
            given[section] = replace(getattr(file_config, section), **flags)
    return replace(file_config, **given)


def check(plan: LaunchPlan, cuda_available: bool) -> None:
    """Refuse, before any rank starts, what the runtime would refuse on every rank."""
    config = plan.config
    if not plan.module and not Path(plan.script).is_file():
        raise UserError(f"no such script: {plan.script}")
    on_cpu = config.use_cpu or not cuda_available
    backend_options.check(config.backend, config.fsdp, config.deepspeed, on_cpu)
    if config.mixed_precision == "fp16" and on_cpu:
        raise UserError(
            "--mixed-precision fp16 needs CUDA GPUs, and this run is on the CPU"
            + (" (--cpu)" if config.use_cpu else " (no CUDA device found)")
            + "; use --mixed-precision bf16 on CPU"
        )
    if config.machine_rank >= config.num_machines:
        raise UserError(
            f"--machine-rank {config.machine_rank} is out of range for "
            f"--num-machines {config.num_machines}"
        )
    if config.num_machines > 1 and not config.main_process_ip:
        raise UserError("--num-machines > 1 needs --main-process-ip (the address of machine 0)")
    if config.num_machines > 1 and not config.main_process_port:
        raise UserError("--num-machines > 1 needs --main-process-port (the same on every machine)")


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def torchrun_arguments(plan: LaunchPlan, processes_per_machine: int) -> list[str]:
    config = plan.config
    if config.num_machines == 1:
        address, port = LOOPBACK, config.main_process_port or free_port()
    else:
        address, port = str(config.main_process_ip), int(config.main_process_port or 0)
    arguments = [
        "--nproc-per-node",
        str(processes_per_machine),
        "--nnodes",
        str(config.num_machines),
        "--node-rank",
        str(config.machine_rank),
        "--master-addr",
        address,
        "--master-port",
        str(port),
        "--max-restarts",
        str(config.max_restarts),
        "--rdzv-backend",
        "static",
    ]
    if config.num_machines == 1:
        arguments += ["--local-addr", LOOPBACK]
    if plan.module:
        arguments.append("--module")
    return [*arguments, plan.script, *plan.script_args]


def runtime_settings(config: LaunchConfig) -> LaunchSettings:
    return LaunchSettings(
        mixed_precision=config.mixed_precision,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        use_cpu=config.use_cpu,
        backend=config.backend,
        backend_options=backend_options.to_env(config.backend, config.fsdp, config.deepspeed),
    )


def launch(plan: LaunchPlan) -> int:
    """Run the plan; returns the exit code (the first failed rank's, or 0)."""
    import torch
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    check(plan, torch.cuda.is_available())
    processes = plan.config.num_processes
    if processes is None:
        processes = 1 if plan.config.use_cpu else max(torch.cuda.device_count(), 1)
    os.environ.update(runtime_settings(plan.config).to_env())
    if plan.config.use_cpu or not torch.cuda.is_available():
        # torchrun would set 1 thread per process and warn; a CPU run shares the cores out.
        threads = max((os.cpu_count() or 1) // max(processes, 1), 1)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    arguments = torchrun.parse_args(torchrun_arguments(plan, processes))
    try:
        torchrun.run(arguments)
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        if failure.exitcode < 0:
            how = f"was killed by {signal.Signals(-failure.exitcode).name}"
        else:
            how = f"failed with exit code {failure.exitcode} (its traceback is above)"
        print(f"accelify launch: rank {rank} {how}; the other ranks were stopped", file=sys.stderr)
        return failure.exitcode if failure.exitcode > 0 else 1
    return 0
