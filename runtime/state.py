"""Where this process stands: its rank, the world, its device, and the process group.

Read from the variables torchrun's elastic agent sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``); without them this is one plain process.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import ClassVar

import torch
import torch.distributed as dist

from accelify.runtime import collective_record, failure_record, pending_work, rank_output
from accelify.runtime.environment import DEBUG_MODE, LaunchSettings, parse_bool
from accelify.runtime.kwargs_handlers import DistributedType, distributed_type_of

DEFAULT_TIMEOUT = timedelta(minutes=30)


@dataclass
class ProcessState:
    process_index: int
    local_process_index: int
    num_processes: int
    device: torch.device
    backend: str | None
    #: how the run is distributed; HF's test scripts set it to try other engines' code paths
    distributed_type: DistributedType = DistributedType.NO
    #: check that collectives get the same shapes on every rank first (HF's debug mode)
    debug: bool = False
    #: the mixed precision of the most recent Accelerator (HF's AcceleratorState reports it)
    mixed_precision: str = "no"

    @property
    def distributed(self) -> bool:
        return self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @classmethod
    def from_env(cls, cpu: bool, timeout: timedelta = DEFAULT_TIMEOUT) -> ProcessState:
        rank = int(os.environ.get("RANK", "0"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        device = _pick_device(cpu, local_rank)
        backend = None
        if world_size > 1:
            backend = "nccl" if device.type == "cuda" else "gloo"
            _init_process_group(backend, rank, world_size, device, timeout)
        settings = LaunchSettings.from_env()
        debug = any(
            parse_bool(os.environ.get(name, "false"))
            for name in (DEBUG_MODE, "ACCELERATE_DEBUG_MODE")
        )
        kind = distributed_type_of(settings.backend, world_size, device.type)
        return cls(rank, local_rank, world_size, device, backend, kind, debug)


def _pick_device(cpu: bool, local_rank: int) -> torch.device:
    if cpu or not torch.cuda.is_available():
        return torch.device("cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _init_process_group(
    backend: str, rank: int, world_size: int, device: torch.device, timeout: timedelta
) -> None:
    """Start the group on a store private to this restart attempt.

    After an elastic restart the agent's store still holds the peer addresses the dead attempt
    published; gloo would read them and connect to processes that no longer exist (a hang or a
    refused connection in about half the restarts). A prefix per attempt makes every attempt start
    on clean keys.
    """
    if dist.is_initialized():
        return
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        host_name=host,
        port=port,
        world_size=world_size,
        is_master=rank == 0 and not agent_hosts_store,
        timeout=timeout,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"accelify/attempt_{attempt}", store)
    # Its functions take ``group=group.WORLD`` as a default, evaluated when the module is first
    # imported (DDP imports it). Imported after the group exists, it would hold the group until
    # interpreter finalization; imported now, the default is None.
    import torch.distributed.nn  # noqa: F401

    dist.init_process_group(
        backend=backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    _ExitGuard.install(dist.PrefixStore(f"accelify/exit_{attempt}", store), rank, world_size)


class _ExitGuard:
    """Leave the process group cleanly at exit, whether or not the script called `end_training`.

    Four things must happen while the interpreter is still whole (see
    `accelify.runtime.pending_work` for what goes wrong otherwise): every rank has finished its
    collectives, the engines have let go of the groups (`Backend.at_exit`: every group up at exit,
    the script's own too), the communication threads have freed every work a backward or the
    runtime launched, and the groups themselves are freed. Waiting for
    the other ranks goes through the store, not a collective, so it is bounded: after an
    uncaught exception nobody waits (the other ranks are being stopped), and a rank that leaves
    early with ``sys.exit`` waits for ranks that will not come until the launcher has reported
    it (`collective_record.released`), at most `EXIT_WAIT`.

    The group is freed through its Python handle, held here from the start, and only here at
    the end. Freeing a gloo group joins its worker threads, and one of them may still be
    dropping the tensors of the last collective, which takes the GIL. Through the handle torch
    frees the group with the GIL released. Through a C++ owner (a DDP reducer, when the model
    goes out of scope after `end_training`, or its release at exit) the GIL stays held, and
    both threads wait forever: a rank that printed everything and never exited.
    """

    EXIT_WAIT = timedelta(seconds=10)
    crashed = False
    installed = False
    #: the Python handles of the groups this process started, let go of last
    groups: ClassVar[list[dist.ProcessGroup]] = []

    @classmethod
    def install(cls, store: dist.Store, rank: int, world_size: int) -> None:
        rank_output.write_whole_lines()
        failure_record.install(rank, on_exception=cls.mark_crashed)
        collective_record.install(rank)
        cls.groups.append(dist.group.WORLD)
        cls.installed = True
        atexit.register(cls.close, store, rank, world_size)

    @classmethod
    def mark_crashed(cls) -> None:
        cls.crashed = True
        collective_record.crashed()

    @classmethod
    def close(cls, store: dist.Store, rank: int, world_size: int) -> None:
        if cls.crashed:
            _let_go_of_the_uncaught_exception()
        collective_record.leaving()
        # the handlers that ran before this one were registered after the group started, and
        # could make a collective; the others run once the group is gone, and cannot
        collective_record.collectives_over()
        if dist.is_initialized():
            if not cls.crashed:
                try:
                    store.set(f"left/{rank}", "1")
                    _wait_for_keys(store, [f"left/{other}" for other in range(world_size)])
                except RuntimeError:  # DistStoreError included
                    pass  # a rank that left early, or a store already gone: nothing to wait for
            # A group something else still holds is freed only at finalization, where a
            # communication thread still dropping a work that holds Python objects can no
            # longer take the GIL. Those works are let go of first.
            pending_work.wait_until_freed(cls.EXIT_WAIT.total_seconds())
            destroy_process_groups()
        _run_exit_hooks()
        pending_work.wait_until_freed(cls.EXIT_WAIT.total_seconds())
        cls.groups.clear()


def _let_go_of_the_uncaught_exception() -> None:
    """Drop what Python keeps of the exception that ended the script (``sys.last_value`` and
    its kin, set once the traceback is printed, kept until finalization): its traceback holds
    the frames it passed through, and a collective it interrupted (Ctrl-C in a barrier, a
    gather) holds the work it launched in a local of those frames. Nothing else would free that
    work before finalization, and `pending_work` would wait out `EXIT_WAIT` twice for it (21 s
    from Ctrl-C to the end). Freed here, the work's last owner is the communication thread,
    which drops it as the peers leave, or this thread, now, while the interpreter is whole."""
    for name in ("last_exc", "last_type", "last_value", "last_traceback"):
        with contextlib.suppress(AttributeError):
            delattr(sys, name)
    if pending_work.in_flight():
        gc.collect()  # a frame of the traceback in a cycle (an exception kept in a local)


def _wait_for_keys(store: dist.Store, keys: list[str]) -> None:
    """Wait up to `_ExitGuard.EXIT_WAIT` for every key, asking the store in turn, or until the
    launcher releases this rank: once its watcher has reported that the peers cannot come (they
    wait in a collective this rank left), waiting on would only delay the end of the run. A
    healthy run is never released, so a rank that finishes first still waits for its peers.
    ``store.wait`` would wait in one call, but when it times out (a rank that left its loop
    early waits for peers that will not come) torch prints two C++ warnings about a socket
    timeout into the launcher's report, with ports and file descriptors: noise beside the report
    that names the rank that left."""
    deadline = time.monotonic() + _ExitGuard.EXIT_WAIT.total_seconds()
    pause = 0.001
    while not store.check(keys) and time.monotonic() < deadline:
        if collective_record.released():
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def destroy_process_groups() -> None:
    """`dist.destroy_process_group()`, every group at once (at exit, or `end_training`); the
    exit guard keeps their handles, to let go of last, and the engines let go of the other
    references at exit (`Backend.at_exit`): a script's own ``dist.new_group``, an engine's."""
    world = getattr(dist.distributed_c10d, "_world", None)
    held = _ExitGuard.groups
    if _ExitGuard.installed:  # else nothing would let go of them before finalization
        held.extend(
            group
            for group in list(getattr(world, "pg_map", None) or ())
            if all(group is not known for known in held)
        )
    dist.destroy_process_group()


def exit_groups() -> list[dist.ProcessGroup]:
    """The groups destroyed at exit, while the exit hooks run: the exit guard's own list, which
    holds them last (not to be changed: `Backend.at_exit` leaves its references alone)."""
    return _ExitGuard.groups


#: Engine cleanups (`Backend.at_exit`) run at exit, once the group is destroyed and while the
#: interpreter is still whole.
_EXIT_HOOKS: list[Callable[[], None]] = []


def on_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` at exit, after the group is destroyed, before interpreter finalization."""
    if hook not in _EXIT_HOOKS:
        _EXIT_HOOKS.append(hook)


def _run_exit_hooks() -> None:
    for hook in _EXIT_HOOKS:
        hook()


_SHARED: dict[bool, ProcessState] = {}


def shared_state(cpu: bool, timeout: timedelta = DEFAULT_TIMEOUT) -> ProcessState:
    """One `ProcessState` per process (per device choice): an `Accelerator` and any
    `PartialState` agree on the rank, the device and the process group."""
    known = _SHARED.get(cpu)
    if known is None or (known.distributed and not dist.is_initialized()):
        # first use, or the group was closed (end_training): start again
        _SHARED[cpu] = ProcessState.from_env(cpu=cpu, timeout=timeout)
    return _SHARED[cpu]


def debug_mode() -> bool:
    """HF's debug mode is on in this process (checks before collectives)."""
    return any(state.debug for state in _SHARED.values())
