"""Where lint reaches and where its findings sit: every file that uses an accelerator is checked
(one it creates, gets from a factory, holds on a class, receives as a parameter), and no finding
anywhere advises running on one rank a function that synchronises the ranks."""

from __future__ import annotations

import re
from pathlib import Path

import libcst as cst
import pytest

from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import Kind, ScriptModel, analyze
from accelify.analysis.syntax import dotted
from accelify.lint.engine import lint_source
from accelify.lint.finding import Finding
from accelify.lint.registry import all_rules
from accelify.lint.selection import Selection
from conftest import FIXTURES, case_group, lint_every_rule

REACH = FIXTURES / "lint" / "reach"
EXPECT = re.compile(r"#\s*expect:\s*(?P<codes>ACC\d+(?:\s*,\s*ACC\d+)*)")
EVERY_RULE = Selection(select=["ACC"])


def expected_findings(path: Path) -> set[tuple[int, str]]:
    """``# expect: ACC201, ACC503`` at the end of a line: those codes on that line."""
    found = set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = EXPECT.search(line)
        if match:
            found |= {(number, code.strip()) for code in match.group("codes").split(",")}
    return found


@pytest.mark.parametrize(
    "path", sorted(REACH.rglob("*.py")), ids=lambda p: p.relative_to(REACH).as_posix()
)
def test_files_that_get_their_accelerator_elsewhere_are_checked(path: Path):
    findings = lint_source(path.read_bytes(), str(path), EVERY_RULE).findings
    assert {(f.line, f.code) for f in findings} == expected_findings(path)


def test_an_accelerator_is_known_however_the_file_got_it():
    def accelerators(name: str) -> set[str]:
        script = analyze(cst.parse_module((REACH / name).read_text()))
        assert script.uses_accelerator, name
        return script.names_of(Kind.ACCELERATOR)

    assert "accelerator" in accelerators("factory_same_module.py")
    assert "accelerator" in accelerators("project/train_network.py")
    assert "self.accelerator" in accelerators("class_attribute.py")
    assert "self.accelerator" in accelerators("module_attribute.py")
    assert {"acc", "accelerator"} <= accelerators("parameter.py")
    assert "self.trainer.accelerator" in accelerators("held_by_a_trainer.py")


NOT_ACCELERATORS = {
    "settings-and-modules": (
        "import torch\n\n\ndef step(args, state, loss):\n"
        "    if args.is_main_process and state.is_main_process:\n"
        "        print(args.process_index)\n"
        "    with torch.autocast('cuda'):\n        loss.backward()\n"
        "    state.wait_for_everyone()\n"
    ),
    "deepspeed-accelerator": (
        "import torch\nfrom deepspeed.accelerator import get_accelerator\n\n\n"
        "class Engine:\n    def __init__(self):\n        self.accelerator = get_accelerator()\n"
        "        self.device = self.accelerator.device(0)\n\n"
        "    def step(self, x):\n        self.accelerator.synchronize()\n"
        "        torch.save(x, 'x.pt')\n"
    ),
    "hf-trainer": (
        "from transformers import Trainer\n\n"
        "trainer = Trainer(model=model, args=args)\ntrainer.train()\n"
        "trainer.save_model()\ntrainer.save_state()\n"
    ),
    # Lightning: a callback's ``trainer.accelerator`` is a device plugin, not HF's Accelerator
    "lightning-trainer-accelerator": (
        "import torch\nimport lightning as L\n\n\n"
        "class Stats(L.Callback):\n"
        "    def on_train_epoch_end(self, trainer, pl_module):\n"
        "        stats = trainer.accelerator.get_device_stats(pl_module.device)\n"
        "        torch.save(stats, 'stats.pt')\n"
    ),
    # autotrain's dataset module: a preprocessor's own prepare(), with nothing to prepare
    "preprocessor-prepare": (
        "import os\n\n\ndef build(train_dir):\n"
        "    preprocessor = ImagePreprocessor(train_data=train_dir)\n"
        "    os.remove(os.path.join(train_dir, 'notes.txt'))\n"
        "    return preprocessor.prepare()\n"
    ),
}


@pytest.mark.parametrize("code", NOT_ACCELERATORS.values(), ids=NOT_ACCELERATORS.keys())
def test_objects_that_only_look_like_an_accelerator_are_not_one(code: str):
    assert not analyze(cst.parse_module(code)).uses_accelerator


# --- every finding of every rule, on every example and fixture --------------------------------


def _corpus() -> list[tuple[str, str, str]]:
    """(id, code, the path it is linted as): a rule's example as ``case.py``, a fixture as the
    file it is; a golden's after.py in its case's xdist group, whose test_convert_fixtures test
    lints it too (`lint_every_rule`)."""
    cases = []
    for rule in all_rules():
        cases += [(f"{rule.code}-bad-{i}", e.code, "case.py") for i, e in enumerate(rule.bad)]
        cases += [(f"{rule.code}-good-{i}", code, "case.py") for i, code in enumerate(rule.good)]
    for path in sorted(FIXTURES.rglob("*.py")):
        if "syntax_error" not in path.parts:
            cases.append((path.relative_to(FIXTURES).as_posix(), path.read_text(), str(path)))
    return cases


def _corpus_params() -> list:
    params = []
    for case, code, path in _corpus():
        golden = Path(path)
        marks = ()
        if golden.name == "after.py" and golden.parent.parent == FIXTURES / "convert":
            marks = pytest.mark.xdist_group(case_group(golden.parent))
        params.append(pytest.param(case, code, path, id=case, marks=marks))
    return params


ONE_RANK_ADVICE = re.compile(r"main process only|is_main_process|on one rank|guard", re.I)


def _call_at(script: ScriptModel, finding: Finding) -> cst.Call | None:
    for call in script.calls:
        start = script.position(call).start
        if (start.line, start.column + 1) == (finding.line, finding.column):
            return call
    return None


def _called_function(script: ScriptModel, finding: Finding) -> cst.FunctionDef | None:
    """The file's own function (or the class's method) called where the finding sits."""
    facts = facts_of(script)
    call = _call_at(script, finding)
    if call is not None:
        func = call.func
        if isinstance(func, cst.Name) and func.value in script.functions:
            return script.functions[func.value]
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
            owner = facts.placement.class_of(call)
            if func.value.value == "self" and owner is not None:
                for statement in owner.body.body:
                    if (
                        isinstance(statement, cst.FunctionDef)
                        and statement.name.value == func.attr.value
                    ):
                        return statement
    return None


def _overrides(script: ScriptModel, function: cst.FunctionDef) -> list[cst.FunctionDef]:
    """``function`` and the methods of the same name of the file's other classes: a call of
    ``self.evaluate()`` in a base class runs a subclass's override too, whose line the finding
    may name (the collective is there)."""
    same_name = [
        node
        for node in script.index.of_type(cst.FunctionDef)
        if isinstance(node, cst.FunctionDef) and node.name.value == function.name.value
    ]
    return [function, *(node for node in same_name if node is not function)]


@pytest.mark.parametrize(("case", "code", "path"), _corpus_params())
def test_findings_sit_where_the_bug_is_and_never_send_training_to_one_rank(
    case: str, code: str, path: str
):
    findings = lint_every_rule(code.encode(), path).findings
    if not findings:
        return
    script = analyze(cst.parse_module(code))
    facts = facts_of(script)
    for finding in findings:
        call = _call_at(script, finding)
        inner = facts.synchronising_in(call) if call is not None else None
        if inner is not None and ONE_RANK_ADVICE.search(finding.message):
            # a guard around this statement would run ``inner`` on one rank: the advice must
            # keep it on every rank, and say so
            name = (dotted(inner.func) or "").rsplit(".", 1)[-1]
            assert f"{name}()" in finding.message and "every rank" in finding.message, (
                f"{finding.code} advises guarding a statement that calls {name}(), which every "
                f"rank must run: {finding.message}"
            )
        function = _called_function(script, finding)
        if function is None:
            continue  # at the offending statement itself
        named = {int(n) for n in re.findall(r"\bline (\d+)", finding.message)}
        assert any(
            script.line(method) <= n <= script.position(method).end.line
            for method in _overrides(script, function)
            for n in named
        ), (
            f"{finding.code} at the call of {function.name.value}() names no line of it: "
            f"{finding.message}"
        )
        if ONE_RANK_ADVICE.search(finding.message):
            assert facts.synchronising_call(function) is None, (
                f"{finding.code} advises running {function.name.value}() on one rank, but it "
                f"synchronises the ranks: {finding.message}"
            )
