"""Functions of a file that no accelerator reaches: a plain single-device step beside the
distributed one (a linear probe trained on the main process over features the prepared model
extracted, Accelerate's test script's baseline). Rules that would move such a function onto
the accelerator (``accelerator.backward``, ``prepare`` its optimizer) leave it alone: nothing
it trains is prepared, and it runs where its callers run it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis.dataflow import assigns, variables_in
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import all_params

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts


def single_device_twin(facts: Facts, node: cst.CSTNode) -> bool:
    """``node`` runs in a module-level function that no accelerator or prepared object can
    reach: nothing in this file calls it or hands it on, or its callers pass it nothing
    ``prepare`` returned (nor an accelerator) and it reads none from the module."""
    script: ScriptModel = facts.model
    function = facts.placement.enclosing_function(node)
    if function is None:
        return False
    if not script.complete:  # the call graph and the prepared names may still grow
        return _reached_by_nothing(facts, function)
    # ACC401 asks it of every call in a training loop or a method it runs: the answer is the
    # function's (its body walked for the names it reads), kept with the function, once per file
    answers = facts.single_device_functions
    kept = answers.get(id(function))
    if kept is not None and kept[0] is function:
        return kept[1]
    answer = _reached_by_nothing(facts, function)
    answers[id(function)] = (function, answer)
    return answer


def _reached_by_nothing(facts: Facts, function: cst.FunctionDef) -> bool:
    """`single_device_twin` of every node of ``function``."""
    script: ScriptModel = facts.model
    if facts.calls.owner(function) is not None:
        return False
    if facts.placement.enclosing_function(function) is not None:
        return False  # a nested def: its outer function's objects reach it
    if facts.calls.references(function):
        return False  # handed on: what it will be called with is not in sight
    if _prepares_or_makes_an_accelerator(facts, function):
        return False  # ``def main(): accelerator = Accelerator(); ... prepare(...)``
    reaching = script.prepared_names | script.names_of(Kind.ACCELERATOR)
    for caller in facts.calls.callers(function):
        if any(variables_in(script, arg.value) & reaching for arg in caller.args):
            return False
    local = {param.name.value for param in all_params(function.params)}
    free = {name for name in variables_in(script, function.body) if name not in local}
    return not any(name in reaching and not assigns(function, name) for name in free)


def _prepares_or_makes_an_accelerator(facts: Facts, function: cst.FunctionDef) -> bool:
    """``function`` calls ``prepare`` or binds an accelerator in its own body (a script's
    ``main()``): the objects it prepares are its locals, so no name it reads is free, yet its
    loop is the distributed one."""
    script: ScriptModel = facts.model
    placement = facts.placement
    return any(
        placement.enclosing_function(call.call) is function for call in script.prepare_calls
    ) or any(
        placement.enclosing_function(binding.assign) is function
        for binding in script.of_kind(Kind.ACCELERATOR)
    )
