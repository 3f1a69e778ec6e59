"""`accelify launch`: start N processes per machine through torch's elastic agent (torchrun).

The agent does the process management (start, watch, stop all when one fails, restart the group
with ``--max-restarts``); this module only turns accelerate-style settings into torchrun's
arguments and the ``ACCELIFY_*`` variables the runtime reads, and checks what can be checked
before any process starts.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

from accelify import startup
from accelify.errors import UserError
from accelify.runtime import options as backend_options
from accelify.runtime.environment import FAILURE_DIR, RANK_TRACEBACKS, LaunchSettings
from accelify.runtime.launch import foreign_accelerator, leftovers, lifeline, rank_start, slurm
from accelify.runtime.launch import outcome as launch_outcome
from accelify.runtime.launch.config import LaunchConfig
from accelify.runtime.launch.watch import Moment, Watcher

LOOPBACK = "127.0.0.1"
#: The module every rank starts with (`accelify.runtime.rank_entry`).
RANK_ENTRY = "accelify.runtime.rank_entry"


@dataclass(frozen=True)
class LaunchPlan:
    config: LaunchConfig
    script: str
    script_args: tuple[str, ...]
    module: bool = False
    no_python: bool = False  # SCRIPT is an executable, run without python (torchrun's own)


def merge(
    file_config: LaunchConfig,
    overrides: dict[str, object],
    environ: Mapping[str, str] | None = None,
) -> LaunchConfig:
    """Flags win over the file: only flags the user gave (not None) replace file values,
    option by option for the backends' options too. Inside a Slurm allocation (``environ``,
    the launcher's environment) the allocation's placement sits between the two. torchrun's
    ``--nproc-per-node`` counts one machine's processes: times the machines, it is -n."""
    given = {key: value for key, value in overrides.items() if value is not None}
    per_node = given.pop("nproc_per_node", None)
    if per_node is not None and "num_processes" in given:
        raise UserError(
            "--nproc-per-node (torchrun's: processes on each machine) and -n (processes in all) "
            "both give the count: give one"
        )
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
    config = replace(file_config, **given)
    if per_node is not None:  # torchrun's count is per machine, -n's over all of them
        config = replace(config, num_processes=int(per_node) * config.num_machines)
    gpus = selected_gpus(config)
    if gpus and config.num_processes is None:
        config = replace(config, num_processes=len(gpus) * config.num_machines)
    return config


def per_machine(config: LaunchConfig, default: int) -> int:
    """Processes on each machine: ``num_processes`` is the total over all machines (HF's
    meaning); ``default`` is this machine's count when it is not set."""
    if config.num_processes is None:
        return default
    return config.num_processes // config.num_machines


def selected_gpus(config: LaunchConfig) -> list[str]:
    """The GPU ids --gpu-ids names (none: every GPU)."""
    if config.gpu_ids is None or config.gpu_ids.strip().lower() == "all":
        return []
    return [part.strip() for part in config.gpu_ids.split(",") if part.strip()]


_TEE = re.compile(r"[0-3]|\d+:[0-3](,\d+:[0-3])*")


def check_what_runs(plan: LaunchPlan) -> None:
    """Refuse a script that cannot start before torch is imported (seconds on a loaded machine):
    ``launch nosuch.py`` took 5.6 s to say there was no such file."""
    if plan.module and plan.no_python:
        raise UserError("--module and --no-python contradict each other: give one")
    if plan.no_python:
        if shutil.which(plan.script) is None:
            raise UserError(f"no such executable: {plan.script}")
    elif not plan.module:
        _check_script(Path(plan.script))
    if not plan.no_python:
        _check_runtime_importable(Path.cwd())


def check(plan: LaunchPlan, cuda_available: bool) -> None:
    """Refuse, before any rank starts, what the runtime would refuse on every rank."""
    check_what_runs(plan)
    check_settings(plan, cuda_available)


def check_settings(plan: LaunchPlan, cuda_available: bool) -> None:
    """`check`'s part that needs torch (whether CUDA is there)."""
    config = plan.config
    on_cpu = config.use_cpu or not cuda_available
    gpus = selected_gpus(config)
    if gpus and on_cpu:
        raise UserError(
            f"--gpu-ids {config.gpu_ids} selects GPUs, and this run is on the CPU"
            + (" (--cpu)" if config.use_cpu else " (no CUDA device found)")
        )
    if config.num_processes is not None and config.num_processes % config.num_machines:
        raise UserError(
            f"--num-processes {config.num_processes} is the total over all machines (as in HF "
            f"Accelerate), and {config.num_machines} machines cannot share it evenly"
        )
    if gpus and per_machine(config, len(gpus)) > len(gpus):
        raise UserError(
            f"{per_machine(config, len(gpus))} processes per machine need as many GPUs, and "
            f"--gpu-ids {config.gpu_ids} names {len(gpus)}"
        )
    if config.tee is not None and not _TEE.fullmatch(config.tee):
        raise UserError(
            f"--tee {config.tee}: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or "
            "per local rank as 0:3,1:1"
        )
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
    """A port free now, and free to be taken by anyone until it is bound again: for a program
    of its own (a benchmark's torchrun); `accelify launch` holds its port (`rendezvous_port`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def rendezvous_port(config: LaunchConfig) -> Iterator[int | None]:
    """The rendezvous port of a run on one machine with no port given, bound for the whole run.

    A port picked free and released (`free_port`) could be taken by another process (another
    run's rendezvous, any outgoing connection) before the agent bound it: the run then failed
    at its start with EADDRINUSE. The launcher starts the rendezvous store's server itself, on
    a port the system chooses as it binds it, and keeps it until the run ends; the agent, in
    the same process, shares that server (torch's rendezvous stores are ``multi_tenant``: one
    server per port and process) instead of binding the port again. None: the port is the
    user's (`--main-process-port`), the store is on another machine, or the rendezvous is not
    torch's store (etcd)."""
    if (
        config.num_machines != 1
        or config.main_process_port
        or config.rdzv_backend not in ("static", "c10d")
    ):
        yield None
        return
    from torch.distributed import TCPStore

    server = TCPStore(LOOPBACK, 0, is_master=True, multi_tenant=True, wait_for_workers=False)
    try:
        yield server.port
    finally:
        del server


def torchrun_arguments(
    plan: LaunchPlan,
    processes: int,
    port: int | None = None,
    client: list[str] | None = None,
) -> list[str]:
    """torchrun's command line; ``processes``: ``num_processes`` (the total over all machines)
    or, when it is not set, this machine's default count; ``port``: the one `rendezvous_port`
    holds (without it, a run on one machine with no port given gets a free one); ``client``:
    the command that has the template fork each rank (`rank_start.template`; None: each rank
    starts fresh)."""
    config = plan.config
    processes_per_machine = per_machine(config, processes)
    if config.num_machines == 1:
        address, port = LOOPBACK, config.main_process_port or port or free_port()
    else:
        address, port = str(config.main_process_ip), int(config.main_process_port or 0)
    agent = {  # torchrun's own settings, as given
        "--rdzv-conf": config.rdzv_conf,
        "--monitor-interval": config.monitor_interval,
        "--tee": config.tee,
        "--log-dir": config.log_dir,
        "--role": config.role,
    }
    if config.rdzv_backend != "static":  # a dynamic rendezvous is found at an endpoint
        agent["--rdzv-endpoint"] = f"{address}:{port}"
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
        config.rdzv_backend,
    ]
    for flag, value in agent.items():
        if value is not None:
            arguments += [flag, str(value)]
    if config.num_machines == 1:
        arguments += ["--local-addr", LOOPBACK]
    if plan.no_python:  # the program dies with the launcher, as a Python rank does
        return [*arguments, "--no-python", *lifeline.command(), plan.script, *plan.script_args]
    # Each rank starts through the runtime's entry, which records its failure and collectives
    # whether or not the script uses accelify's runtime, then runs the script unchanged.
    script = ["-m", plan.script] if plan.module else [plan.script]
    if client is not None:  # the client stands for the rank, forked from the template
        return [*arguments, "--no-python", *client, *script, *plan.script_args]
    return [*arguments, "--module", RANK_ENTRY, *script, *plan.script_args]


def runtime_settings(config: LaunchConfig) -> LaunchSettings:
    return LaunchSettings(
        mixed_precision=config.mixed_precision,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        use_cpu=config.use_cpu,
        backend=config.backend,
        backend_options=backend_options.to_env(
            config.backend, config.backend_options().get(config.backend)
        ),
        debug=config.debug,
        cpu_threads=config.num_cpu_threads_per_process,
        visible_gpus=",".join(selected_gpus(config)) or None,
    )


def _check_runtime_importable(folder: Path) -> None:
    """Each rank starts as ``python -m accelify.runtime.rank_entry`` in ``folder``, which then
    comes first on its path: from a source checkout's root the checkout's ``accelify/`` folder,
    which holds no ``runtime/`` until installed, is imported instead of the installed package.
    Every rank printed a bare ModuleNotFoundError (``accelify.runtime``) and the launcher said
    "their tracebacks are above"; ``python script.py`` says why (`accelify._explain`)."""
    import accelify

    if sys.flags.safe_path or os.environ.get("PYTHONSAFEPATH"):
        return  # the ranks' Python leaves the working directory off its path
    shadow = folder / "accelify"
    installed = Path(accelify.__file__).resolve().parent
    if not (shadow / "__init__.py").is_file() or shadow.resolve() == installed:
        return
    if (shadow / "runtime").is_dir():
        return
    raise UserError(
        f"{shadow} is accelify's source folder: the ranks start in {folder}, where it would be "
        "imported instead of the installed package and has no runtime/ (each rank would fail "
        "with ModuleNotFoundError: No module named 'accelify.runtime'): install the checkout "
        "with `pip install -e .`, or launch from another directory"
    )


def _check_script(script: Path) -> None:
    """A script that cannot start is said once, here, with its line: each rank would print the
    same SyntaxError and the run would end with a report about rank 0 and its peers."""
    if not script.is_file():
        raise UserError(f"no such script: {script}")
    try:
        compile(script.read_bytes(), str(script), "exec", dont_inherit=True)
    except SyntaxError as error:
        where = f"{script}:{error.lineno}" if error.lineno else str(script)
        raise UserError(f"{where}: {type(error).__name__}: {error.msg}") from None
    except (OSError, ValueError) as error:
        raise UserError(f"cannot read {script}: {error}") from None
    _check_leading_imports(script)


def _check_leading_imports(script: Path) -> None:
    """A module the script imports first and this Python cannot find (the package is not
    installed here, a typo) is said once, here, with its line: each rank would print the same
    ModuleNotFoundError traceback before any runtime exists to record it. Only the imports
    before the script's first other statement are checked: one after ``sys.path.insert(...)``,
    inside ``try``, or under a condition may be found only when the script runs. Only the first
    part of a dotted name is looked up (looking up ``a.b`` imports ``a``)."""
    try:
        tree = ast.parse(script.read_bytes(), str(script))
    except (SyntaxError, ValueError):
        return
    for statement in _leading_imports(tree):
        for name in _imported_top_names(statement):
            if not _findable(name, script):
                raise UserError(
                    f"{script}:{statement.lineno}: ModuleNotFoundError: No module named "
                    f"{name!r} (for {sys.executable}, which runs the ranks)"
                )


def _leading_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    imports: list[ast.Import | ast.ImportFrom] = []
    for index, statement in enumerate(tree.body):
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            imports.append(statement)
        elif not (index == 0 and isinstance(statement, ast.Expr)):  # the docstring
            break
    return imports


def _imported_top_names(statement: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(statement, ast.Import):
        return [alias.name.partition(".")[0] for alias in statement.names]
    if statement.level or not statement.module or statement.module == "__future__":
        return []
    return [statement.module.partition(".")[0]]


def _findable(name: str, script: Path) -> bool:
    """Whether a rank started on ``script`` can import ``name``: its path starts with the
    script's folder (not with ``PYTHONSAFEPATH`` set, which the ranks inherit), then this
    interpreter's path (installed packages, ``PYTHONPATH``)."""
    saved = list(sys.path)
    if not os.environ.get("PYTHONSAFEPATH"):  # the ranks' Python then leaves the folder out
        sys.path.insert(0, str(script.resolve().parent))
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return True  # cannot tell here: let the rank say
    finally:
        sys.path[:] = saved


def launch(plan: LaunchPlan) -> int:
    """Run the plan; returns the exit code (the failed rank's, 128 + N for signal N, or 0)."""
    check_what_runs(plan)
    with _stopped_at_once():
        import torch
        from torch.distributed import DistNetworkError
        from torch.distributed import run as torchrun
        from torch.distributed.elastic.multiprocessing import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    cuda_available = torch.cuda.is_available()
    check_settings(plan, cuda_available)
    processes = plan.config.num_processes
    if processes is None:
        processes = 1 if plan.config.use_cpu else max(torch.cuda.device_count(), 1)
    _check_foreign_accelerator(plan, processes, cuda_available)
    os.environ.update(runtime_settings(plan.config).to_env())
    if plan.config.tee not in (None, "0"):
        os.environ[RANK_TRACEBACKS] = "true"  # each rank's log file keeps its own traceback
    if plan.config.use_cpu or not cuda_available:
        # torchrun would set 1 thread per process and warn; a CPU run shares the cores out.
        local = per_machine(plan.config, processes)
        threads = max(_usable_cores() // max(local, 1), 1)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    _quiet_agent_warnings()
    leftovers.sweep()  # what launchers killed by SIGKILL left in the temporary folder
    with (
        contextlib.ExitStack() as stack,
        rendezvous_port(plan.config) as port,
        tempfile.TemporaryDirectory(prefix=leftovers.prefix("launch")) as records,
    ):
        os.environ[FAILURE_DIR] = records
        stack.enter_context(_the_launcher_of_what_starts_now())
        client = stack.enter_context(_rank_start(plan, processes))
        arguments = torchrun.parse_args(torchrun_arguments(plan, processes, port, client))
        if arguments.log_dir is None:
            # the agent's own folder (each rank's error file) inside this run's, which goes
            # with it however the run ends: left to the agent, an empty ``torchelastic_*``
            # tree stays in the temporary folder after every launch
            arguments.log_dir = os.path.join(records, "agent")
        watcher = Watcher(
            Path(records),
            hang_timeout=plan.config.hang_timeout,
            max_restarts=plan.config.max_restarts,
        )
        watcher.start()
        moments: list[Moment] = []  # the ranks as the first signal that stopped the run came

        def told() -> None:
            if not moments:
                moments.append(watcher.halt())

        try:
            with _told_of_stops(told):
                torchrun.run(arguments)
        except DistNetworkError as error:
            if "EADDRINUSE" not in str(error):
                raise
            raise UserError(_port_in_use(plan.config, arguments)) from None
        except ChildFailedError as error:
            attempt = plan.config.max_restarts
            text, code = launch_outcome.failed_run(
                error.failures, Path(records), attempt, watcher.verdict(attempt)
            )
        except SignalException as error:
            if not moments:  # the agent's handler was not ours to wrap (told: halted already)
                watcher.halt()
            text, code = launch_outcome.stopped(int(error.sigval), next(iter(moments), None))
        except KeyboardInterrupt:  # before the agent took over SIGINT
            watcher.halt()
            text, code = launch_outcome.stopped(signal.SIGINT)
        else:
            attempt = watcher.last_attempt() or 0
            ended = launch_outcome.finished(Path(records), attempt, watcher.verdict(attempt))
            if ended is None:
                return 0
            text, code = ended
        finally:
            watcher.stop()
    print(text, file=sys.stderr)
    return code


@contextlib.contextmanager
def _stopped_at_once() -> Iterator[None]:
    """Ctrl-C or SIGTERM while torch is imported ends the launcher there and then: nothing has
    started yet (no template, no rank, no port). A KeyboardInterrupt raised inside that import
    was caught by the import's own ``try``s (numpy's, torch's optional modules'): the launcher
    then went on and ran the whole script (2 of 4 Ctrl-Cs sent 1 s after the start), or failed
    with "cannot load module more than once". Held back until the import ends instead, the stop
    took as long as the import (5-9 s on a loaded machine)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {signum: signal.getsignal(signum) for signum in stops}
    for signum in stops:
        signal.signal(signum, _end_before_any_rank)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            # from here a Ctrl-C is a KeyboardInterrupt, which stops what the launch started
            signal.signal(signum, startup.python_handles_it_again(handler))


def _end_before_any_rank(signum: int, _frame: object) -> None:
    text, code = launch_outcome.stopped_before_any_rank(signum)
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
    os._exit(code)


@contextlib.contextmanager
def _told_of_stops(told: Callable[[], object]) -> Iterator[None]:
    """Have ``told`` called first thing when a signal stops the launcher while the agent runs
    (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT), before the agent passes it on to any rank: what the
    ranks were doing then is still in their records (`Watcher.halt`). The agent installs its
    handler, torch's ``_terminate_process_handler``, by that name from its module as it starts
    the ranks (and at each restart): for the run, the name holds a handler that tells, then
    hands on to torch's (which raises the agent's ``SignalException``). The name is torch's
    private one (torch 2.4 to 2.13 install it so, from ``PContext.start``): a torch without it,
    or whose agent installs its handler another way (`_agents_handler`), is not
    wrapped: nobody is told, and a stop says only which signal it was."""
    agents = _agents_handler()
    if agents is None:
        yield
        return
    from torch.distributed.elastic.multiprocessing import api

    def handler(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(Exception):  # the stop itself must happen
            told()
        agents(signum, frame)

    api._terminate_process_handler = handler
    try:
        yield
    finally:
        api._terminate_process_handler = agents


def _agents_handler() -> Callable[[int, FrameType | None], None] | None:
    """torch's ``_terminate_process_handler``, where a handler put under that name is the one
    the agent installs: its process context installs the handler as it starts the ranks,
    looking the name up in its module as it does (the name is among the globals that
    ``PContext.start`` reads). None for a torch that has no such name or installs its handler
    another way: the run is then not wrapped (`_told_of_stops`)."""
    try:
        from torch.distributed.elastic.multiprocessing import api
    except ImportError:
        return None
    handler = getattr(api, "_terminate_process_handler", None)
    start = getattr(getattr(api, "PContext", None), "start", None)
    names = getattr(getattr(start, "__code__", None), "co_names", ())
    return handler if callable(handler) and "_terminate_process_handler" in names else None


@contextlib.contextmanager
def _the_launcher_of_what_starts_now() -> Iterator[None]:
    """Every process the run starts dies with this one, even when it is killed by SIGKILL
    (`lifeline`): they find its pid in the environment they inherit. Only for the run: a
    program that launches in-process (a test) and later starts a rank's entry itself from a
    short-lived thread would have it killed as that thread ends."""
    previous = os.environ.get(lifeline.LAUNCHER)
    os.environ[lifeline.LAUNCHER] = str(os.getpid())
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(lifeline.LAUNCHER, None)
        else:
            os.environ[lifeline.LAUNCHER] = previous


def _usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a container's or ``taskset``'s
    mask), not the host's count, which ``os.cpu_count()`` gives: ranks given more intra-op
    threads than they have cores slow each other's large matmuls down."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def _rank_start(plan: LaunchPlan, processes: int) -> Iterator[list[str] | None]:
    """The ranks' template, when they can be forked from one (`rank_start`): yields the command
    each rank's client runs, None where the ranks start fresh. Started after the launcher has
    set every variable the ranks inherit, before the agent starts any rank."""
    if rank_start.fresh_reason(plan.script, plan.module, plan.no_python, os.environ) is not None:
        yield None
        return
    environment = rank_start.rank_environment(os.environ, per_machine(plan.config, processes))
    with rank_start.template(environment) as client:
        yield client


def _port_in_use(config: LaunchConfig, arguments: Any) -> str:
    """Why the rendezvous could not start: its port, the user's, is taken."""
    where = f"{arguments.master_addr}:{arguments.master_port}"
    if config.num_machines == 1:
        fix = "give another --main-process-port, or none: the launcher then binds a free one"
    else:
        fix = "give another --main-process-port, the same on every machine"
    return (
        f"the rendezvous port {where} is in use (another run, or another program, holds it): {fix}"
    )


def _quiet_agent_warnings() -> None:
    """The agent's warnings ("Sending process N closing signal SIGTERM", "Received 2 death
    signal") say less well what the launcher's own report says; its errors stay. Each of its
    loggers sets its level from ``LOGLEVEL`` when created, so a user who sets it keeps it."""
    if "LOGLEVEL" in os.environ:
        return
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.ERROR)
    # "failed (exitcode: 1) local_rank: 1 (pid: N) of binary: ...": the report says it better
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)


def _check_foreign_accelerator(plan: LaunchPlan, processes: int, cuda_available: bool) -> None:
    ranks = per_machine(plan.config, processes) * plan.config.num_machines
    if plan.module or plan.no_python or ranks < 2:
        return
    found = foreign_accelerator.accelerate_import(Path(plan.script))
    if found is None:
        return
    if plan.config.use_cpu or not cuda_available:
        raise UserError(foreign_accelerator.refusal(plan.script, found, processes))
    print(foreign_accelerator.warning(plan.script, found), file=sys.stderr)
