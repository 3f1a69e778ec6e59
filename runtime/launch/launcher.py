"""`accelify launch`: start N processes per machine through torch's elastic agent (torchrun).

The agent does the process management (start, watch, stop all when one fails, restart the group
with ``--max-restarts``); this module only turns accelerate-style settings into torchrun's
arguments and the ``ACCELIFY_*`` variables the runtime reads, and checks what can be checked
before any process starts.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from accelify.errors import UserError
from accelify.runtime import options as backend_options
from accelify.runtime.environment import FAILURE_DIR, LaunchSettings
from accelify.runtime.launch import foreign_accelerator, slurm
from accelify.runtime.launch import outcome as launch_outcome
from accelify.runtime.launch.config import LaunchConfig

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class LaunchPlan:
    config: LaunchConfig
    script: str
    script_args: tuple[str, ...]
    module: bool = False


def merge(
    file_config: LaunchConfig,
    overrides: dict[str, object],
    environ: Mapping[str, str] | None = None,
) -> LaunchConfig:
    """Flags win over the file: only flags the user gave (not None) replace file values,
    option by option for the backends' options too. Inside a Slurm allocation (``environ``,
    the launcher's environment) the allocation's placement sits between the two."""
    given = {key: value for key, value in overrides.items() if value is not None}
    if environ is not None:
        use_cpu = bool(given.get("use_cpu", file_config.use_cpu))
        allocation = slurm.placement(environ, use_cpu)
        file_config = replace(
            file_config, **{key: v for key, v in allocation.items() if key not in given}
        )
    if isinstance(given.get("auto_wrap"), str):
        given["auto_wrap"] = backend_options.class_names(str(given["auto_wrap"]))
    for section in backend_options.DECLARED:
        flags = {
            flag.option: given.pop(dest)
            for dest, (owner, flag) in backend_options.FLAGS.items()
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
    backend_options.check(config.backend, config.backend_options(), on_cpu)
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
        backend_options=backend_options.to_env(
            config.backend, config.backend_options().get(config.backend)
        ),
    )


def launch(plan: LaunchPlan) -> int:
    """Run the plan; returns the exit code (the failed rank's, 128 + N for signal N, or 0)."""
    import torch
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    cuda_available = torch.cuda.is_available()
    check(plan, cuda_available)
    processes = plan.config.num_processes
    if processes is None:
        processes = 1 if plan.config.use_cpu else max(torch.cuda.device_count(), 1)
    _check_foreign_accelerator(plan, processes, cuda_available)
    os.environ.update(runtime_settings(plan.config).to_env())
    if plan.config.use_cpu or not cuda_available:
        # torchrun would set 1 thread per process and warn; a CPU run shares the cores out.
        threads = max((os.cpu_count() or 1) // max(processes, 1), 1)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    arguments = torchrun.parse_args(torchrun_arguments(plan, processes))
    _quiet_agent_warnings()
    with tempfile.TemporaryDirectory(prefix="accelify-launch-") as records:
        os.environ[FAILURE_DIR] = records
        try:
            torchrun.run(arguments)
        except ChildFailedError as error:
            text, code = launch_outcome.failed_run(
                error.failures, Path(records), attempt=plan.config.max_restarts
            )
        except SignalException as error:
            text, code = launch_outcome.stopped(int(error.sigval))
        except KeyboardInterrupt:  # before the agent took over SIGINT
            text, code = launch_outcome.stopped(signal.SIGINT)
        else:
            return 0
    print(text, file=sys.stderr)
    return code


def _quiet_agent_warnings() -> None:
    """The agent's warnings ("Sending process N closing signal SIGTERM", "Received 2 death
    signal") say less well what the launcher's own report says; its errors stay. Each of its
    loggers sets its level from ``LOGLEVEL`` when created, so a user who sets it keeps it."""
    if "LOGLEVEL" in os.environ:
        return
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.ERROR)


def _check_foreign_accelerator(plan: LaunchPlan, processes: int, cuda_available: bool) -> None:
    if plan.module or processes * plan.config.num_machines < 2:
        return
    found = foreign_accelerator.accelerate_import(Path(plan.script))
    if found is None:
        return
    if plan.config.use_cpu or not cuda_available:
        raise UserError(foreign_accelerator.refusal(plan.script, found, processes))
    print(foreign_accelerator.warning(plan.script, found), file=sys.stderr)
