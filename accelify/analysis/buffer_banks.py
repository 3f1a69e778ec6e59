"""Memory banks kept in a module's buffers and filled from each training step's batch.

A MoCo-style queue (``self.register_buffer("queue", ...)``, then ``self.queue[idx] = keys`` in
an ``enqueue(keys)`` method called with the step's keys) holds what one process saw. Sharded
over N ranks, each rank enqueues only the keys of its own shard: the ranks' queues hold
different negatives, the contrastive loss differs per rank, and the bank no longer spans the
batch the original saw. MoCo gathers the keys from every rank before it enqueues them
(``concat_all_gather(keys)``); nothing in DDP does it (its buffers are broadcast from rank 0
only for a module it wraps, and an EMA teacher is not wrapped).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelify.analysis.idle_members import class_methods
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, self_parameter, walk


@dataclass(frozen=True)
class BankFill:
    """A call in a training loop of a method that writes what it is handed into a buffer."""

    call: cst.Call
    method: str  # ``teacher.enqueue``
    buffer: str  # ``queue``
    write: cst.CSTNode  # ``self.queue[idx] = keys``


def banks_filled_per_step(model: ScriptModel) -> list[BankFill]:
    """Each call of a method of one of the file's module classes that stores one of its
    arguments into a buffer the class registers, from inside a loop that trains over a
    DataLoader: on N ranks each rank fills its own bank with its own shard's values."""
    writers = _buffer_writers(model)
    if not writers:
        return []
    found = []
    for loop in model.loops:
        if not loop.trains or loop.iterable is None:
            continue
        for node in walk(loop.node.body):
            if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
                continue
            written = writers.get(node.func.attr.value)
            if written is None or not node.args:
                continue
            method = dotted(node.func)
            if method is None or method == f"self.{node.func.attr.value}":
                continue  # ``self.enqueue(...)`` inside the class itself: not a step's call
            found.append(BankFill(node, method, *written))
    return found


def _buffer_writers(model: ScriptModel) -> dict[str, tuple[str, cst.CSTNode]]:
    """Methods of the file's module classes that assign one of their parameters (or what is
    made from it) into a registered buffer, by method name: the buffer and the write. A name
    two classes define differently is left out."""
    found: dict[str, tuple[str, cst.CSTNode]] = {}
    twice: set[str] = set()
    for class_name in model.module_classes:
        methods = class_methods(model, class_name)
        init = methods.get("__init__")
        buffers = _registered(init) if init is not None else set()
        if not buffers:
            continue
        for name, method in methods.items():
            if name == "__init__":
                continue
            write = _writes_a_parameter(method, buffers)
            if write is None:
                continue
            if name in found and found[name][1] is not write[1]:
                twice.add(name)
            found[name] = write
    return {name: write for name, write in found.items() if name not in twice}


def _registered(init: cst.FunctionDef) -> set[str]:
    """``self.register_buffer("queue", ...)``: the buffers' names."""
    me = self_parameter(init)
    names = set()
    for node in walk(init.body):
        if (
            isinstance(node, cst.Call)
            and dotted(node.func) == f"{me}.register_buffer"
            and node.args
            and isinstance(node.args[0].value, cst.SimpleString)
        ):
            value = node.args[0].value.evaluated_value
            if isinstance(value, str):
                names.add(value)
    return names


def _writes_a_parameter(
    method: cst.FunctionDef, buffers: set[str]
) -> tuple[str, cst.CSTNode] | None:
    """``self.queue[idx] = keys`` (or ``self.queue[ptr:ptr + n] = keys.T``) with ``keys`` a
    parameter of ``method``: the buffer and the statement."""
    me = self_parameter(method)
    parameters = {p.name.value for p in method.params.params} - {me}
    for node in walk(method.body):
        if not isinstance(node, cst.Assign):
            continue
        for target in node.targets:
            written = target.target
            if not isinstance(written, cst.Subscript):
                continue
            owner = dotted(written.value)
            if owner is None or not owner.startswith(f"{me}."):
                continue
            buffer = owner.split(".", 1)[1]
            read = {n.value for n in walk(node.value) if isinstance(n, cst.Name)}
            if buffer in buffers and read & parameters:
                return buffer, node
    return None
