"""`name_scopes`: which binding a name means where it is read, by Python's scoping."""

from __future__ import annotations

import libcst as cst
import pytest

from accelify.analysis.name_scopes import local_owner, means_module_binding
from accelify.analysis.placement import Placement
from accelify.analysis.script_model import analyze
from accelify.analysis.syntax import walk

CODE = """\
model = 1
def plain():
    return model.config
def param(model=None):
    return model.config
def closure(model):
    def inner():
        return model.config
    return inner
def lam():
    return lambda model: model.config
def comp(models):
    return [model.config for model in models]
def walrus():
    if (model := get()) is not None:
        return model.config
def excepted():
    try:
        pass
    except Exception as model:
        return model.config
def matched(x):
    match x:
        case {"m": model}:
            return model.config
def imported():
    from transformers import AutoModel as model
    return model.config
def declared():
    global model
    return model.config
"""


def _reads() -> tuple[object, dict[str, cst.Attribute]]:
    script = analyze(cst.parse_module(CODE))
    reads = {}
    for node in walk(script.module):
        if isinstance(node, cst.Attribute) and node.attr.value == "config":
            function = script.index.enclosing_function(node)
            while script.index.enclosing_function(function) is not None:
                function = script.index.enclosing_function(function)
            reads[function.name.value] = node
    return script, reads


@pytest.mark.parametrize("function", ["plain", "declared"])
def test_the_module_binding(function):
    script, reads = _reads()
    assert means_module_binding(script, "model", reads[function])
    assert local_owner(script, "model", reads[function]) is None


@pytest.mark.parametrize(
    ("function", "owner"),
    [
        ("param", cst.FunctionDef),
        ("closure", cst.FunctionDef),
        ("lam", cst.Lambda),
        ("comp", cst.ListComp),
        ("walrus", cst.FunctionDef),
        ("excepted", cst.FunctionDef),
        ("matched", cst.FunctionDef),
        ("imported", cst.FunctionDef),
    ],
)
def test_a_binding_of_its_own(function, owner):
    script, reads = _reads()
    assert not means_module_binding(script, "model", reads[function])
    found = local_owner(script, "model", reads[function])
    assert isinstance(found, owner)
    if function == "closure":  # the enclosing function's parameter, not the inner def's
        assert found.name.value == "closure"


def test_a_default_value_runs_where_its_def_runs():
    script = analyze(
        cst.parse_module("class T:\n    def __init__(self, noise=draw()):\n        x = draw()\n")
    )
    placement = Placement(script)
    default, inside = [n for n in walk(script.module) if isinstance(n, cst.Call)]
    init = script.index.enclosing_function(inside)
    assert placement.running_function(default) is None
    assert placement.running_function(inside) is init
    assert placement.runs_inside(inside, init) and not placement.runs_inside(default, init)


def test_the_plain_answer_agrees_with_the_scopes():
    """Where the cheap path answers, libcst's scopes over the statement answer the same, for
    every name read in every function of the conversion fixtures' scripts."""
    from pathlib import Path

    from accelify.analysis import name_scopes

    checked = 0
    for before in sorted(Path(__file__).parent.parent.glob("fixtures/convert/*/before.py"))[:80]:
        try:
            script = analyze(cst.parse_module(before.read_text()))
        except cst.ParserSyntaxError:
            continue
        for node in walk(script.module):
            if not isinstance(node, cst.Name) or isinstance(
                script.parent(node), (*name_scopes._BINDING_PARENTS, cst.Attribute)
            ):
                continue
            if node.value in ("None", "True", "False"):
                continue
            top = name_scopes._top_statement(script, node)
            if top is None:
                continue
            plain = name_scopes._plain_answer(script, node.value, node, top)
            if plain is None:
                continue
            scope = name_scopes._scopes(script, top).get(node)
            if scope is None:
                continue
            found = (name_scopes._owner_of(script, a.scope) for a in scope[node.value])
            owners = [o for o in found if o is not None] or [script.module]  # builtins
            assert all(o is plain for o in owners), (before, script.line(node), node.value)
            checked += 1
    assert checked > 1000
