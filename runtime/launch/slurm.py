"""Inside a Slurm allocation, `accelify launch` needs no placement flags: the machines, this
machine's rank, the rendezvous host and port, and the processes per machine come from Slurm's
variables. Flags the user gives win over them; the allocation wins over the config file's
placement keys (a file cannot know which node it runs on).

Run one launcher per node (``srun --ntasks-per-node=1 accelify launch train.py``); each
starts one process per GPU of its node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from accelify.errors import UserError

#: first port of the range the rendezvous port is drawn from (below Linux's ephemeral ports)
PORT_BASE = 10000
PORT_SPAN = 20000


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list, in order: ``"node[01-03,07],gpu7"`` ->
    ``["node01", "node02", "node03", "node07", "gpu7"]``; several brackets in one name
    (``rack[1-2]-n[1-2]``) expand to every combination, zero padding kept."""
    hosts: list[str] = []
    for name in _split_top_level(text.strip()):
        hosts.extend(_expand_name(name, text))
    return hosts


def _split_top_level(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def _expand_name(name: str, whole: str) -> list[str]:
    match = _BRACKET.search(name)
    if match is None:
        if "[" in name or "]" in name:
            raise ValueError(f"unbalanced brackets in host list {whole!r}")
        return [name]
    prefix, rest = name[: match.start()], name[match.end() :]
    tails = _expand_name(rest, whole)
    return [
        f"{prefix}{item}{tail}" for item in _expand_ranges(match.group(1), whole) for tail in tails
    ]


def _expand_ranges(ranges: str, whole: str) -> list[str]:
    items: list[str] = []
    for part in ranges.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"bad range {part!r} in host list {whole!r}")
        if not dash:
            items.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"descending range {part!r} in host list {whole!r}")
        width = len(low)
        items.extend(str(number).zfill(width) for number in range(int(low), int(high) + 1))
    return items


def in_allocation(environ: Mapping[str, str]) -> bool:
    return bool(environ.get("SLURM_JOB_ID")) and bool(_node_list(environ))


def _node_list(environ: Mapping[str, str]) -> str:
    # a job step (srun) may run on part of the allocation: its own list comes first
    return environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""


def _integer(environ: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            # SLURM_GPUS_ON_NODE and the like may read "4(x2)" on heterogeneous steps
            digits = re.match(r"\d+", value)
            if digits is None:
                raise UserError(f"{name}={value!r}: expected a number (set by Slurm)")
            return int(digits.group())
    return None


def port(environ: Mapping[str, str]) -> int:
    """The rendezvous port every node of the job computes alike: from the job and step ids."""
    job = _integer(environ, "SLURM_JOB_ID") or 0
    step = _integer(environ, "SLURM_STEP_ID") or 0
    return PORT_BASE + (job * 31 + step) % PORT_SPAN


def placement(environ: Mapping[str, str], use_cpu: bool) -> dict[str, Any]:
    """`LaunchConfig` fields read from Slurm's variables (empty outside an allocation)."""
    if not in_allocation(environ):
        return {}
    try:
        hosts = expand_hostlist(_node_list(environ))
    except ValueError as error:
        raise UserError(f"SLURM_JOB_NODELIST: {error}") from None
    nodes = _integer(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    nodes = nodes or len(hosts)
    tasks = _integer(environ, "SLURM_STEP_NUM_TASKS")
    if tasks is not None and tasks > nodes:
        raise UserError(
            f"srun started {tasks} launchers on {nodes} node{'s' if nodes != 1 else ''} "
            "(SLURM_STEP_NUM_TASKS); each launcher starts every process of its node: run one "
            "per node (srun --ntasks-per-node=1 accelify launch ...)"
        )
    settings: dict[str, Any] = {"num_machines": nodes}
    if nodes > 1:
        rank = _integer(environ, "SLURM_NODEID", "SLURM_PROCID")
        if rank is None:
            raise UserError(
                f"a Slurm job on {nodes} nodes without SLURM_NODEID or SLURM_PROCID: run "
                "accelify launch through srun, one per node"
            )
        settings.update(
            machine_rank=rank, main_process_ip=hosts[0], main_process_port=port(environ)
        )
    gpus = _integer(environ, "SLURM_GPUS_ON_NODE")
    if gpus and not use_cpu:
        settings["num_processes"] = gpus * nodes  # the total, as HF's num_processes
    return settings
