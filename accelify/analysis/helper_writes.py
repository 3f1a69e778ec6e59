"""Calls of another project module's function that writes files on every rank that runs it.

``engine.py`` calls ``save_checkpoint(state, is_best, path)`` of ``utils.py``, whose body is
``torch.save(state, path)`` and ``shutil.copyfile(path, best)``: read alone, ``utils.py`` names
no accelerator and is not checked, and ``engine.py`` sees a call, not a write. Every rank that
makes the call writes the same files at once. The fix is at the call (``utils.py`` has no
accelerator to test): run it under ``is_main_process``. That advice is safe only where the
helper needs every rank for nothing: it reaches no ``prepare``, ``backward`` or collective
(analysed in its own module), returns no value, reads back nothing it wrote, and tests no rank
itself; `helper_writes` keeps only those. Whether every rank makes the call is the caller's
question (`repeated_effects`), and so is what its arguments compute
(``accelerator.get_state_dict(model)`` under FSDP gathers: the rule stays silent there).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis import names, side_effects
from accelify.analysis.outside_callers import Load, handed_calls
from accelify.analysis.project_modules import read
from accelify.analysis.split_shares import named_from_share
from accelify.analysis.syntax import dotted, top_level_functions

if TYPE_CHECKING:
    from accelify.analysis.script_model import ScriptModel


#: A name a file-writing call ends with (`names.FILE_WRITERS`, `names.TORCH_SAVE`,
#: `names.FILE_WRITING_METHODS`) or ``open(``: a module whose text has none writes nothing.
_WRITING_WORDS = re.compile(
    rb"\bopen\(|\b(?:"
    + b"|".join(
        re.escape(word.encode())
        for word in sorted(
            {
                name.rpartition(".")[2]
                for name in names.FILE_WRITERS | names.TORCH_SAVE | names.FILE_WRITING_METHODS
            }
        )
    )
    + rb")\b"
)


@dataclass(frozen=True)
class HelperWrite:
    """``call`` (of this file) runs ``function`` of ``module``, which writes ``writes``: each
    the writing call's name and its line in ``module`` (``("torch.save", 28)``)."""

    call: cst.Call
    function: str
    module: str  # as the caller's folder reaches it: ``src/utils.py``
    writes: tuple[tuple[str, int], ...]

    def said(self) -> str:
        """``torch.save at src/utils.py:28, shutil.copyfile at line 30``: for a message."""
        (first, line), *rest = self.writes
        return ", ".join(
            [f"{first} at {self.module}:{line}"] + [f"{name} at line {at}" for name, at in rest]
        )


def helper_writes(
    model: ScriptModel, calls_into_project: Iterable[tuple[cst.Call, Path, str]]
) -> list[HelperWrite]:
    """The calls of ``model`` that are statements of their own and run a top-level function of
    another project module that writes files whoever runs it and needs no other rank (see the
    module docstring), among ``calls_into_project`` (`Facts.project_calls`). Each such module is
    analysed alone, once (`ProjectView.load_alone`)."""
    project = model.project
    if project is None:
        return []
    load = project.load_alone or project.load
    if load is None:
        return []
    here = project.path.resolve()
    found: list[HelperWrite] = []
    known: dict[tuple[Path, str], tuple[tuple[str, int], ...]] = {}
    for call, module, member in calls_into_project:
        if "." in member or module.resolve() == here:
            continue  # a method: the instance's class is not followed here
        if not isinstance(model.parent(call), cst.Expr):
            continue  # its value is used: every rank needs it
        if side_effects.per_rank_path(model, call):
            continue  # handed the rank (f"{out}/rank{accelerator.process_index}"): its own files
        if any(named_from_share(model, argument.value) for argument in call.args):
            continue  # handed an item of this rank's split_between_processes share: its files
        key = (module.resolve(), member)
        if key not in known:
            known[key] = _writes_of(load, module, member)
            project.read.add(module)  # a later edit of the helper changes the answer
        writes = known[key]
        if writes:
            found.append(HelperWrite(call, member, _relative(module, project.path), writes))
    if not found:
        return found
    # a call that hands the helper the accelerator or a prepared object makes its module an
    # accelerator file, checked on its own (`ScriptModel.uses_accelerator`): reported there
    handing = {
        (call.member, call.line) for call in handed_calls(model, project.path) if call.arguments
    }
    return [h for h in found if (h.function, model.line(h.call)) not in handing]


def _writes_of(load: Load, module: Path, member: str) -> tuple[tuple[str, int], ...]:
    """What ``member`` of ``module`` writes on every rank that calls it, when it needs no other
    rank (empty otherwise, and for a module that does not parse or holds an accelerator: its
    own analysis judges it)."""
    text = read(module)
    if f"def {member}".encode() not in text or _WRITING_WORDS.search(text) is None:
        return ()  # (most helpers called as statements write nothing: not analysed)
    helper = load(module)
    if helper is None or helper.uses_accelerator:
        return ()
    defined = top_level_functions(helper.module, member)
    if len(defined) != 1:
        return ()
    function = defined[0]
    if any(r.value is not None for r in helper.index.own_returns(function)):
        return ()  # every rank needs the value
    from accelify.analysis.facts import facts_of

    facts = facts_of(helper)
    if facts.synchronising_call(function) is not None:
        return ()  # a guard at its calls would run a collective on one rank
    guards = facts.ranks.backend_guards
    own = [
        write.call
        for write in side_effects.writes(helper, facts.placement, with_torch_save=True)
        if facts.placement.enclosing_function(write.call) is function
    ]
    writes = []
    for call in own:
        if side_effects.deletes(helper, call) or side_effects.uploads(helper, call):
            continue  # ACC205's and ACC207's
        if helper.reads_rank(function) or not guards.entered_by_all(call, within=function):
            return ()  # it tests the rank itself
        if side_effects.per_rank_path(helper, call) or facts.shared_files.unique_per_process(call):
            continue
        read_back = facts.shared_files.read_back_below(call)
        if read_back is not None and not any(read_back is call for call in own):
            return ()  # it reads back what it wrote (a copy to ``best.pth`` is a write too)
        writes.append((dotted(call.func) or "a write", helper.line(call)))
    return tuple(writes)


def _relative(module: Path, caller: Path) -> str:
    try:
        return str(module.resolve().relative_to(caller.resolve().parent))
    except ValueError:
        return str(module)
