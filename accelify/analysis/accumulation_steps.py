"""The ``gradient_accumulation_steps`` a file gives an Accelerator: a number it fixes, or the
run's setting it comes from. ACC311 (two ``accumulate()`` per batch) and ACC313 (one
``accumulate()`` around a whole loop) read the same value: what a run of the file may pass."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.rank_dependence import SETTINGS_ROOTS
from accelify.analysis.scheduler_preparation import default_left_to_some_call
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import accelerator_argument, all_params, dotted


def accumulation_steps(script: ScriptModel, accelerator: str) -> int | str | None:
    """The ``gradient_accumulation_steps`` the file gives ``accelerator``: a literal, a name
    every binding of which is one, or a parameter of the function around it whose every call
    passes the same literal (its default counting where a call leaves it out, or where no
    call in the file runs it); for an accelerator only handed on in the file (a trainer's
    ``self.accelerator = accelerator``), the one the file makes; or the setting it comes
    from (`setting_read`: the command line's ``args.gradient_accumulation_steps``), which any
    run may set to any number; None where the file does not say (no such argument, an
    Accelerator made elsewhere, bindings that disagree)."""
    bindings = [b for b in script.of_kind(Kind.ACCELERATOR) if b.name == accelerator]
    if all(not isinstance(b.value, cst.Call) for b in bindings):
        # unknown here, or only handed on (``self.accelerator = accelerator``, a trainer's
        # parameter): the Accelerators the file makes, if they agree
        bindings = [b for b in script.of_kind(Kind.ACCELERATOR) if isinstance(b.value, cst.Call)]
    values: set[int | str | None] = set()
    for binding in bindings:
        argument = accelerator_argument(binding.value, "gradient_accumulation_steps")
        if argument is None:
            return None
        steps = integer_value(script, argument.value)
        values.add(steps if steps is not None else setting_read(script, argument.value))
    if len(values) != 1:
        return None
    return values.pop()


def setting_read(script: ScriptModel, value: cst.BaseExpression, depth: int = 0) -> str | None:
    """The run's setting ``value`` holds, as the file spells it (``args.grad_accum``: a
    command-line flag or a config entry, any number the user passes, even ones included):
    an attribute of a settings object (``args``, ``config``, ...), read in place, through
    ``int(...)``, or through a name or a parameter every value of which is that setting (or
    one every call passes it to)."""
    if isinstance(value, cst.Call) and dotted(value.func) == "int" and len(value.args) == 1:
        value = value.args[0].value
    if isinstance(value, cst.Attribute):
        name = dotted(value)
        if name is not None and name.split(".")[0] in SETTINGS_ROOTS:
            return name
        return None
    name = dotted(value)
    if name is None or depth > 4:
        return None
    values = [assign.value for assign in script.index.assignments_to(name)]
    function = script.index.enclosing_function(value)
    if function is not None and any(p.name.value == name for p in all_params(function.params)):
        values += [a.value for a in facts_of(script).flow.call_site_arguments(name, value)]
    found = {setting_read(script, v, depth + 1) for v in values}
    return found.pop() if len(found) == 1 else None


def integer_value(script: ScriptModel, value: cst.BaseExpression, depth: int = 0) -> int | None:
    """The integer ``value`` always holds in the file, where it says so. A parameter holds
    what its calls pass (``train(args, args.steps)``: unknown), its default only where a call
    leaves it out or nothing in the file calls the function (a CLI entry point)."""
    if isinstance(value, cst.Integer):
        return int(value.evaluated_value)
    name = dotted(value)
    if name is None or "." in name or depth > 4:
        return None
    values = [assign.value for assign in script.index.assignments_to(name)]
    function = script.index.enclosing_function(value)
    parameter = None
    if function is not None:
        parameter = next((p for p in all_params(function.params) if p.name.value == name), None)
    if parameter is not None:
        facts = facts_of(script)
        values += [argument.value for argument in facts.flow.call_site_arguments(name, value)]
        default = default_left_to_some_call(facts, name, value)
        if default is not None or not facts.flow.calls_of(function):
            values += [parameter.default] if parameter.default is not None else []
    if not values:
        return None
    found = {integer_value(script, v, depth + 1) for v in values}
    return found.pop() if len(found) == 1 else None
