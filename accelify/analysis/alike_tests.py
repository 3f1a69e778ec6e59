"""Tests every rank answers alike because of what the file's calls hand the function around
them: ``def run(stage): if stage == "fit":`` run as ``run("fit")``, nanoT5's ``forward(model,
batch, calc_acc=True)``. ACC212 leaves a write and a read in two arms of such a test alone;
ACC403 advises a reduce of a dict whose keys such a test adds on every rank."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.dataflow import is_attribute_name
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import all_params, assigned_targets, target_names, walk


def alike_by_its_callers(script: ScriptModel, test: cst.BaseExpression) -> bool:
    """Every name ``test`` reads that the rank analysis cannot vouch for is a parameter of the
    function around it, not rebound there, that each of its calls in the file fills with a
    value every rank holds alike: a constant (``run("fit")``), a setting, or the variable of a
    loop over such values (``for mode in ["train", "eval"]: run(mode)``)."""
    facts = facts_of(script)
    ranks = facts.ranks
    function = facts.placement.enclosing_function(test)
    if function is None:
        return False
    graph = script.call_graph
    sites = facts.flow.calls_of(function)
    if not sites or graph.uncertain_callers(function) or graph.references(function):
        return False
    rebound = {
        name for a in script.index.own_assignments(function) for t in assigned_targets(a)
        for name in target_names(t)
    }  # fmt: skip
    parameters = {p.name.value: p for p in all_params(function.params)}
    names = [
        n.value
        for n in walk(test)
        if isinstance(n, cst.Name) and not is_attribute_name(script, n) and not ranks.uniform(n)
    ]
    if not names:
        return False
    for name in dict.fromkeys(names):
        if name not in parameters or name in rebound:
            return False
        passed = facts.flow.call_site_arguments(name, test)
        if len(passed) < len(sites):
            default = parameters[name].default
            if default is None or not ranks.uniform(default):
                return False
        if not all(alike_value(script, argument.value) for argument in passed):
            return False
    return True


def alike_value(script: ScriptModel, value: cst.BaseExpression) -> bool:
    """``value`` is the same on every rank: a constant or setting, or the variable of a loop
    over such values around it."""
    ranks = facts_of(script).ranks
    if ranks.uniform(value):
        return True
    if not isinstance(value, cst.Name):
        return False
    for loop in script.ancestors(value):
        if isinstance(loop, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if (
            isinstance(loop, cst.For)
            and isinstance(loop.target, cst.Name)
            and loop.target.value == value.value
            and isinstance(loop.iter, (cst.List, cst.Tuple))
            and all(ranks.uniform(element.value) for element in loop.iter.elements)
        ):
            return True
    return False
