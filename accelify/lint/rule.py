"""What a lint rule is: a code, a message that says what to do, examples that are its tests,
and a `check` over the shared `ScriptModel`. A fix is a set of edits in the converter's `Plan`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, strip_self_methods
from accelify.edits.plan import Plan
from accelify.lint.finding import Finding


@dataclass(frozen=True)
class Example:
    """A bad example: the code, where the finding is (1-based line and column), the fixed code."""

    code: str
    line: int
    column: int
    fixed: str | None = None


class Rule:
    """Subclasses set the attributes and implement `check`; the class docstring is its page."""

    code: str = ""
    name: str = ""
    message: str = ""
    why: str = ""
    bad: tuple[Example, ...] = ()
    good: tuple[str, ...] = ()
    # Most rules are about Accelerator scripts; on a plain single-device script they stay
    # silent unless selected by code.
    accelerator_only: bool = True

    @property
    def fixable(self) -> bool:
        return any(example.fixed is not None for example in self.bad)

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        raise NotImplementedError

    def finding(
        self,
        script: ScriptModel,
        node: cst.CSTNode,
        fix: Plan | None = None,
        message: str | None = None,
    ) -> Finding:
        start = script.position(node).start
        return Finding(self.code, message or self.message, start.line, start.column + 1, fix)


def accelerator_name(script: ScriptModel) -> str:
    names = [b.name for b in script.of_kind(Kind.ACCELERATOR)]
    return names[0] if names else "accelerator"


def prepared(script: ScriptModel, node: cst.CSTNode) -> set[str]:
    """Names that hold prepared objects at ``node``: outputs of a prepare call above it."""
    line = script.line(node)
    return {
        name for call in script.prepare_calls if call.line <= line for name in call.outputs if name
    }


def loop_of(script: ScriptModel, node: cst.CSTNode) -> cst.For | None:
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, cst.For):
            return ancestor
    return None


def calls_in(script: ScriptModel, node: cst.CSTNode) -> list[cst.Call]:
    """The calls somewhere under ``node`` (a loop, a block), in source order."""
    return [call for call in script.calls if any(a is node for a in script.ancestors(call))]


def under_rank_guard(script: ScriptModel, node: cst.CSTNode) -> bool:
    return script.under_rank_guard(node)


def calls(script: ScriptModel) -> list[cst.Call]:
    """Every call in the file, in source order (collected once, by the analysis)."""
    return script.calls


def steps_argument(accelerator: cst.BaseExpression) -> cst.Arg | None:
    """The ``gradient_accumulation_steps=`` argument of an ``Accelerator(...)`` call, if given."""
    if not isinstance(accelerator, cst.Call):
        return None
    return next(
        (
            argument
            for argument in accelerator.args
            if argument.keyword is not None
            and argument.keyword.value == "gradient_accumulation_steps"
        ),
        None,
    )


def optimizer_models(script: ScriptModel) -> dict[str, str]:
    """Optimizer name -> the model whose ``.parameters()`` it was built from."""
    owners: dict[str, str] = {}
    for binding in script.of_kind(Kind.OPTIMIZER):
        core = strip_self_methods(binding.value)
        if not isinstance(core, cst.Call) or not core.args:
            continue
        first = core.args[0].value
        if (
            isinstance(first, cst.Call)
            and isinstance(first.func, cst.Attribute)
            and first.func.attr.value in ("parameters", "named_parameters")
        ):
            model = dotted(first.func.value)
            if model:
                owners[binding.name] = model
    return owners


#: The two lines most examples start with: an Accelerator script.
HEADER = "from accelify import Accelerator\naccelerator = Accelerator()\n"
