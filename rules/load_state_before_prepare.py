from collections.abc import Iterator

import libcst as cst

from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls


class LoadStateBeforePrepare(Rule):
    """``accelerator.load_state`` restores into the objects that were prepared. Called before
    ``prepare`` there are none yet: nothing is restored, and training silently starts over."""

    code = "ACC501"
    name = "load-state-before-prepare"
    message = "Call accelerator.load_state after accelerator.prepare: before it nothing is restored"
    why = "load_state fills the prepared model, optimizer, scheduler and loaders."
    bad = (
        Example(
            HEADER + "accelerator.load_state('ckpt')\nmodel = accelerator.prepare(model)\n", 3, 1
        ),
    )
    good = (HEADER + "model = accelerator.prepare(model)\naccelerator.load_state('ckpt')\n",)

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        accelerators = script.names_of(Kind.ACCELERATOR)
        first_prepare = min((script.order(p.call) for p in script.prepare_calls), default=None)
        if first_prepare is None:
            return
        for call in calls(script):
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value == "load_state"
                and dotted(func.value) in accelerators
                and script.order(call) < first_prepare
                and script.scope_of(call) is script.scope_of(script.prepare_calls[0].call)
            ):
                yield self.finding(script, call)
