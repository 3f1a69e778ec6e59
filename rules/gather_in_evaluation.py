from collections.abc import Iterator

import libcst as cst

from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, loop_of

_EVAL = (
    HEADER
    + "import torch\nmodel, loader = accelerator.prepare(model, loader)\n"
    + "with torch.no_grad():\n    for x, y in loader:\n"
)


class GatherInEvaluation(Rule):
    """``accelerator.gather`` in an evaluation loop keeps the samples repeated to give every rank
    a full last batch, so they are counted twice and the metric is off. ``gather_for_metrics``
    drops exactly those repeats."""

    code = "ACC404"
    name = "gather-in-evaluation"
    message = (
        "Use accelerator.gather_for_metrics in evaluation: gather counts the padding samples twice"
    )
    why = "The last round is evened out with repeated samples; only gather_for_metrics drops them."
    bad = (
        Example(
            _EVAL + "        preds = accelerator.gather(model(x))\n",
            7,
            17,
            _EVAL + "        preds = accelerator.gather_for_metrics(model(x))\n",
        ),
    )
    good = (_EVAL + "        preds = accelerator.gather_for_metrics(model(x))\n",)

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        accelerators = script.names_of(Kind.ACCELERATOR)
        evaluating = {id(loop.node) for loop in script.loops if loop.evaluates}
        for call in calls(script):
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "gather"):
                continue
            loop = loop_of(script, call)
            if dotted(func.value) in accelerators and loop is not None and id(loop) in evaluating:
                from accelify.edits.plan import Plan

                plan = Plan()
                plan.replacements[func.attr] = lambda _: cst.Name("gather_for_metrics")
                yield self.finding(script, call, plan)
