"""A function or method the conversion gives the accelerator is passed it at every call in the
file, and adding the parameter works on every signature Python allows."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from call_binding import unbound_calls
from test_convert_fixtures import CONVERTIBLE

from accelify.convert import convert_source
from conftest import FIXTURES

SCRIPTS = sorted((FIXTURES / "scripts").glob("*.py"))


@pytest.mark.parametrize("case", CONVERTIBLE, ids=lambda case: case.name)
def test_every_call_of_a_changed_signature_binds_in_the_golden_output(case: Path):
    before = (case / "before.py").read_text()
    after = (case / "after.py").read_text()
    assert unbound_calls(before, after) == []


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_call_of_a_changed_signature_binds_in_the_runnable_scripts(script: Path):
    before = script.read_text()
    after = convert_source(script.read_bytes(), script).converted.decode()
    assert unbound_calls(before, after) == []


def test_the_binding_check_sees_a_call_left_without_the_new_argument():
    before = "class T:\n    def fit(self, n):\n        pass\n\nT().fit(1)\nt = T()\nt.fit(2)\n"
    after = before.replace("def fit(self, n)", "def fit(self, n, accelerator)")
    assert [p.split(":")[0] for p in unbound_calls(before, after)] == ["5", "7"]


SCRIPT = """\
import torch
from torch import nn


def report({signature}):
    print("reported")


def main():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(4, 2)).sum()
    loss.backward()
    optimizer.step()
    report({arguments})


if __name__ == "__main__":
    main()
"""

#: (id, parameters, a call that binds them)
SIGNATURES = [
    ("default-last", 'state, is_best, filename="checkpoint.pth.tar"', "{}, True"),
    ("only-defaults", "every=1, path=None", ""),
    ("star-args", "*args", "1, 2"),
    ("star-args-and-kwargs", "*args, **kwargs", "1, key=2"),
    ("kwargs-only", "**kwargs", "key=1"),
    ("positional-then-kwargs", "step, **kwargs", "1"),
    ("default-then-kwargs", "step=0, **kwargs", "step=1"),
    ("keyword-only", "step, *, every", "1, every=2"),
    ("keyword-only-default-and-kwargs", "step, *, every=1, **kwargs", "1"),
    ("positional-only", "step, /", "1"),
    ("positional-only-default", "step=0, /", ""),
    ("positional-only-then-default", "step, /, every=1", "1, 2"),
    ("no-parameters", "", ""),
    ("trailing-comma", "step, every,", "1, 2"),
    ("one-per-line", "\n    step,\n    every=1,\n", "1"),
    ("annotated", "step: int, every: int = 1, *rest: str, **options: object", "1"),
]


@pytest.mark.parametrize(
    ("parameters", "arguments"),
    [pytest.param(p, a, id=name) for name, p, a in SIGNATURES],
)
def test_a_helper_of_any_signature_gains_the_accelerator_and_its_call_passes_it(
    parameters: str, arguments: str
):
    before = SCRIPT.format(signature=parameters, arguments=arguments)
    conversion = convert_source(before.encode(), "signatures.py")
    after = conversion.converted.decode()
    report = next(
        node
        for node in ast.parse(after).body
        if isinstance(node, ast.FunctionDef) and node.name == "report"
    )
    added = [a.arg for a in (*report.args.args, *report.args.kwonlyargs)]
    assert "accelerator" in added
    assert "accelerator.print(" in after
    assert "accelerator=accelerator)" in after
    assert unbound_calls(before, after) == []


def test_a_bug_of_ours_is_one_error_line_for_that_file_not_a_traceback(tmp_path, monkeypatch):
    from accelify.convert import files
    from accelify.convert.conversion import Options
    from accelify.errors import UserError

    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(signature="", arguments=""))

    def broken(*_args, **_kwargs):
        raise ValueError("an edit went wrong")

    monkeypatch.setattr(files, "convert_source", broken)
    result = files.convert_file(script, Options(), named=True)
    assert isinstance(result, UserError)
    assert str(result) == (
        f"{script}: internal error, the file is left as it is "
        "(ValueError: an edit went wrong); please report this file"
    )


HANDED_ON = """\
import threading

import torch
from torch import nn


def report(step):
    print("step", step)


class Runner:
    def run(self, model, optimizer):
        loss = model(torch.randn(2, 2)).sum()
        loss.backward()
        optimizer.step()
        threading.Thread(target=report, args=(1,)).start()


RUNNERS = {"default": Runner}


def build():
    return RUNNERS["default"]()


def main():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    runner = build()
    runner.run(model, optimizer)
    report(0)


main()
"""


def test_a_function_handed_on_makes_the_accelerator_a_global_no_function_takes():
    """``threading.Thread(target=report)``: whoever runs ``report`` cannot be given an argument,
    and ``runner.run`` is called on an object the conversion cannot place. A parameter would be
    a TypeError (or a review line asking the reader to pass it); created at the module's level,
    before ``main()``, the accelerator is a global that every function reads."""
    conversion = convert_source(HANDED_ON.encode(), "handed_on.py")
    reviews = [note.text for note in conversion.reviews]
    assert not any("handed on here" in text for text in reviews)
    assert not any("cannot tell what the object is" in text for text in reviews)
    after = conversion.converted.decode()
    assert "\naccelerator = Accelerator()\nmain()\n" in after
    assert "    report(0)\n" in after and "def report(step):\n" in after
    assert "    runner.run(model, optimizer)\n" in after
    assert unbound_calls(HANDED_ON, after) == []


def test_a_method_called_on_what_a_factory_of_the_file_built_is_passed_the_accelerator():
    """``runner = build()`` where ``build`` returns ``Runner()``: the one call resolver places
    ``runner`` for the conversion as it does for the object analysis."""
    source = HANDED_ON.replace('return RUNNERS["default"]()', "return Runner()").replace(
        "        threading.Thread(target=report, args=(1,)).start()\n", ""
    )
    conversion = convert_source(source.encode(), "built.py")
    after = conversion.converted.decode()
    assert "    runner.run(model, optimizer, accelerator=accelerator)\n" in after
    assert not any("cannot tell what the object is" in note.text for note in conversion.reviews)
    assert unbound_calls(source, after) == []
