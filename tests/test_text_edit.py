"""A fix as a text edit (JSON output, the lint cache, ``--jobs``): `text_edits` generates the
file's code once and applies each plan to the part of the file it rewrites; the edit is the one
the plan applied to the whole module gives (`text_edit`), for lint's fixes and for every edit a
conversion plans, alone and together."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from accelify.analysis.script_model import ScriptModel, analyze
from accelify.convert import project
from accelify.convert.planner import Options, plan_conversion
from accelify.edits import text_edit as text_edit_module
from accelify.edits.plan import Plan
from accelify.edits.text_edit import text_edit, text_edits
from accelify.lint.engine import _check
from accelify.lint.registry import all_rules
from accelify.lint.selection import Selection
from accelify.source import parse

ROOT = Path(__file__).resolve().parent.parent
CONVERT_CASES = sorted(p for p in (ROOT / "fixtures" / "convert").iterdir() if p.is_dir())
#: a sample of the cases that parse (one in 25; a case with ``error.txt`` is a user error)
PARSED_SAMPLE = [case for case in CONVERT_CASES if not (case / "error.txt").exists()][::25]
EVERY_RULE = Selection(select=["ALL"])


def assert_same_edits(
    module: cst.Module, plans: list[Plan], script: ScriptModel, monkeypatch
) -> int:
    """Both ways agree on every plan; how many of them were applied to a part of the file (a
    plan `text_edits` hands to the whole-module `text_edit`, up front or as a fallback when a
    part's code differs, is not)."""
    code = module.code
    whole: list[Plan] = []

    def whole_module(module: cst.Module, plan: Plan, before: str):
        whole.append(plan)
        return text_edit(module, plan, before)

    with monkeypatch.context() as patched:
        patched.setattr(text_edit_module, "text_edit", whole_module)
        edits = text_edits(module, plans, script.parent, script.position)
    assert edits == [text_edit(module, p, code) for p in plans]
    return len(plans) - len(whole)


def test_every_rule_examples_fix_is_the_edit_of_the_whole_module(monkeypatch):
    plans_seen = parts = 0
    for rule in all_rules():
        for index, example in enumerate(rule.bad):
            data = example.code.encode()
            module = parse(data, f"{rule.code}-{index}.py")
            script = analyze(module, example.code)
            plans = [f.fix for f in _check(script, data, "x.py", EVERY_RULE) if f.fix is not None]
            if plans:
                parts += assert_same_edits(module, plans, script, monkeypatch)
                plans_seen += len(plans)
    assert plans_seen >= 50
    assert parts == plans_seen  # no lint fix needs the whole module


@pytest.mark.parametrize("case", PARSED_SAMPLE, ids=lambda case: case.name)
def test_a_conversions_edits_alone_and_together_are_those_of_the_whole_module(
    case: Path, monkeypatch
):
    """A conversion's plan holds every kind of edit (replacements, wraps, inserts, removals,
    guards, blocks, new parameters) at every depth; its imports are added after the plan."""
    path = case / "before.py"
    module = parse(path.read_bytes(), str(path))
    model = analyze(module)
    if model.uses_accelerator or not model.trains:
        pytest.skip("not converted")
    plan = plan_conversion(model, Options(), project.imported_writers(path, model))
    plan.imports = []
    alone = [Plan.of(edit) for edit, _ in plan._edits.every_edit()]
    assert_same_edits(module, [plan, *alone], model, monkeypatch)


@pytest.mark.parametrize(
    "source",
    [
        # the last statement removed; the file without a trailing newline
        "import torch\nx = 1\nmodel.to('cuda')\n",
        "import torch\nx = 1\nmodel.to('cuda')",
        # a removed statement's comment lines move onto the next one
        "x = 1\nmodel.to('cuda')\n# about y\ny = 2\nz = 3\n",
        "def f():\n\tx = 1\n\tmodel.to('cuda')\n\t# about y\n\ty = 2\n",
        # tab and mixed indentation, CRLF newlines
        "class A:\n\tdef f(self):\n\t\tif x:\n\t\t    model.to('cuda')\n\t\t    y = 2\n",
        "if a:\r\n    model.to('cuda')\r\n    b = 1\r\n",
        # a block of an elif (generated only inside its if) and a decorated function's body
        "if a:\n    pass\nelif b:\n    model.to('cuda')\n    y = 2\n",
        "class A:\n    # about f\n    @staticmethod\n    def f():\n        model.to('cuda')\n",
    ],
)
def test_removals_and_inserts_at_any_depth_and_layout(source: str, monkeypatch):
    module = cst.parse_module(source)
    script = analyze(module, source)
    calls = [
        n
        for n in script.index.of_type(cst.Call)
        if cst.Module([]).code_for_node(n).startswith("model.to")
    ]
    statement = next(
        a for a in script.ancestors(calls[0]) if isinstance(a, cst.SimpleStatementLine)
    )
    new = cst.parse_statement("accelerator.wait_for_everyone()\n")
    plans = [Plan(), Plan(), Plan()]
    plans[0].remove(statement)
    plans[1].insert_before(statement, new)
    plans[2].insert_after(statement, new)
    parts = assert_same_edits(module, plans, script, monkeypatch)
    # a last line with no newline is not the code its statement generates alone: that file
    # takes the whole-module way
    assert parts == (len(plans) if source.endswith("\n") else 0)
