"""Values of this rank's share of ``split_between_processes``: inside ``with
state.split_between_processes(ids) as mine:`` each rank holds other items than the others, so a
file named from one of them (``open(out_dir + item["id"] + ".json", "w")`` in a loop over what
the block built from ``mine``) is this rank's own file, written once per run. Guarding such a
write with ``is_main_process`` would keep the main process's share only (ChartReformer's
``distributed_inference_task1.py``)."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import target_names, walk

#: How many passes over a block the names derived from the share are followed for.
_MAX_PASSES = 8


def named_from_share(model: ScriptModel, node: cst.CSTNode) -> bool:
    """``node`` (a write's path, an ``open``) reads a name that holds part of this rank's share
    of a ``split_between_processes`` block around it: the ``as`` target, or a name the block
    binds from it (a loop over it, an assignment or ``.append`` of a value that reads it)."""
    read = {n.value for n in walk(node) if isinstance(n, cst.Name)}
    for ancestor in model.ancestors(node):
        if isinstance(ancestor, cst.With) and read & _share_names(ancestor):
            return True
    return False


def _share_names(block: cst.With) -> set[str]:
    share: set[str] = set()
    for item in block.items:
        call = item.item
        if (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "split_between_processes"
            and item.asname is not None
        ):
            share |= target_names(item.asname.name)
    if not share:
        return share
    for _ in range(_MAX_PASSES):
        grown = share | _derived(block.body, share)
        if grown == share:
            break
        share = grown
    return share


def _derived(body: cst.CSTNode, share: set[str]) -> set[str]:
    """The names ``body`` binds from a value that reads one of ``share``."""
    found: set[str] = set()
    for node in walk(body):
        if isinstance(node, cst.For) and _reads(node.iter, share):
            found |= target_names(node.target)
        elif isinstance(node, cst.Assign) and _reads(node.value, share):
            for target in node.targets:
                found |= target_names(target.target)
        elif (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in ("append", "extend")
            and isinstance(node.func.value, cst.Name)
            and any(_reads(a.value, share) for a in node.args)
        ):
            found.add(node.func.value.value)
    return found


def _reads(node: cst.CSTNode, share: set[str]) -> bool:
    return any(isinstance(n, cst.Name) and n.value in share for n in walk(node))
