"""Attributes set on some ranks only and read by every rank to name a checkpoint's folder.

``if accelerator.is_main_process: args.output_dir = "saved/" + str(int(time.time()))``, then
``accelerator.save_state(os.path.join(args.output_dir, f"step_{step}"))`` on every rank
(tango's train.py): the attribute exists on every rank, so nothing fails (ACC209's NameError
is the other shape), but only the main process changed it. Each rank writes its own part of
the checkpoint (its RNG states; its shards under FSDP or ZeRO), so the other ranks write theirs
under the old value, another folder, and the checkpoint the run resumes from lacks them;
``load_state`` so reads another folder on those ranks.

Only where every write of the attribute (``owner.attr``) in the file is under a rank test, in
the function that reads it; the read is outside any rank test, after a write (below it, or in
a loop holding both), and in the path of a ``save_state`` or ``load_state`` of an Accelerator,
directly or through a local bound in that function above the call and handed to it. A value
broadcast to every rank (``args.output_dir = broadcast_object_list([...])[0]`` outside the
test) is a write outside it, and one the other ranks set in the test's ``else``: not
reported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.rank_only_entries import reads_after
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import assigned_targets, dotted, walk

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts
    from accelify.analysis.script_model import ScriptModel

#: The Accelerator's calls whose first argument names the folder each rank writes or reads.
CHECKPOINT_FOLDER_CALLS = frozenset({"save_state", "load_state"})
#: How many locals between the read and the call are followed (``output_dir = f"step_{n}"``,
#: ``output_dir = os.path.join(args.output_dir, output_dir)``, ``save_state(output_dir)``).
_DEPTH = 3


@dataclass(frozen=True)
class RankOnlySetting:
    """A read every rank makes of an attribute only some ranks set, naming a checkpoint folder."""

    read: cst.Attribute  # ``args.output_dir`` in ``os.path.join(args.output_dir, ...)``
    name: str  # ``args.output_dir``
    write: cst.CSTNode  # the guarded assignment
    guard: cst.CSTNode  # the rank test around it
    call: cst.Call  # ``accelerator.save_state(output_dir)``


def rank_only_settings(facts: Facts) -> list[RankOnlySetting]:
    script = facts.model
    accelerators = script.names_of(Kind.ACCELERATOR)
    found: list[RankOnlySetting] = []
    for call in script.index.of_type(cst.Call):
        assert isinstance(call, cst.Call)
        func = call.func
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value in CHECKPOINT_FOLDER_CALLS
            and dotted(func.value) in accelerators
            and call.args
            and not script.under_rank_guard(call)
        ):
            continue
        for read in _attributes_feeding(script, call.args[0].value, call, _DEPTH):
            setting = _set_on_some_ranks(script, read, call)
            if setting is not None and all(f.read is not read for f in found):
                found.append(setting)
    return found


def _attributes_feeding(
    script: ScriptModel, value: cst.BaseExpression, at: cst.CSTNode, depth: int
) -> list[cst.Attribute]:
    """The ``owner.attr`` reads (owner a plain name) in ``value``, and in the values of the
    locals it reads, bound in the same function above ``at``, ``depth`` locals deep."""
    found = [
        node
        for node in walk(value)
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)
    ]
    if depth <= 0:
        return found
    scope = script.scope_of(at)
    for name in {n.value for n in walk(value) if isinstance(n, cst.Name)}:
        for statement, bound in script.index.values_bound_to(name):
            if script.scope_of(statement) is scope and script.order(statement) < script.order(at):
                found += _attributes_feeding(script, bound, statement, depth - 1)
    return found


def _set_on_some_ranks(
    script: ScriptModel, read: cst.Attribute, call: cst.Call
) -> RankOnlySetting | None:
    """The setting ``read`` reads, where every write of it is under a rank test in the read's
    function, one above the read (or in a loop that holds both), and the read itself is not."""
    name = dotted(read)
    if name is None or script.under_rank_guard(read):
        return None
    writes = [
        statement
        for statement in script.index.of_type((cst.Assign, cst.AugAssign, cst.AnnAssign))
        if any(dotted(target) == name for target in _targets(statement))  # type: ignore[arg-type]
    ]
    if not writes:
        return None
    scope = script.scope_of(read)
    for write in writes:
        if script.scope_of(write) is not scope or not script.under_rank_guard(write):
            return None  # set on every rank somewhere, or in a function not followed here
        guard = script.rank_guard_of(write)
        if (
            isinstance(guard, cst.If)
            and guard.orelse is not None
            and script.inside(write, guard.orelse)
        ):
            return None  # the other ranks set it in the test's else: what to, not known here
    for write in writes:
        if reads_after(script, read, write):
            guard = script.rank_guard_of(write)
            assert guard is not None
            return RankOnlySetting(read, name, write, guard, call)
    return None


def _targets(statement: cst.Assign | cst.AugAssign | cst.AnnAssign) -> list[cst.BaseExpression]:
    """Every target ``statement`` stores into, unpacked ones too (``args.a, args.b = ...``)."""
    stored = (
        [statement.target] if isinstance(statement, cst.AugAssign) else assigned_targets(statement)
    )
    flat: list[cst.BaseExpression] = []
    while stored:
        target = stored.pop()
        if isinstance(target, cst.Tuple | cst.List):
            stored += [element.value for element in target.elements]
        else:
            flat.append(target)
    return flat
