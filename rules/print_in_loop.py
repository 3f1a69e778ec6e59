from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.script_model import ScriptModel
from accelify.edits.plan import Plan, expression
from accelify.lint.rule import (
    HEADER,
    Example,
    Finding,
    Rule,
    accelerator_name,
    calls,
    loop_of,
    under_rank_guard,
)


class PrintInLoop(Rule):
    """``print`` inside a training or evaluation loop prints once per process: N copies of every
    log line, interleaved."""

    code = "ACC203"
    name = "print-in-loop"
    message = "Use accelerator.print in loops: it prints on the local main process only"
    why = "Every rank runs the loop, so every rank prints."
    bad = (
        Example(
            HEADER + "for batch in loader:\n    print(loss.item())\n",
            4,
            5,
            HEADER + "for batch in loader:\n    accelerator.print(loss.item())\n",
        ),
    )
    good = (
        HEADER + "for batch in loader:\n    accelerator.print(loss.item())\n",
        HEADER + "print('starting')\n",
        HEADER + "for batch in loader:\n    if accelerator.is_main_process:\n        print(1)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        acc = accelerator_name(script)
        for call in calls(script):
            if not script.call_names(call) & names.PRINT or loop_of(script, call) is None:
                continue
            if under_rank_guard(script, call):
                continue
            reachable = not acc.startswith("self.") or any(
                isinstance(a, cst.ClassDef) for a in script.ancestors(call)
            )
            plan = None
            if reachable:
                plan = Plan()
                plan.replacements[call] = lambda updated: updated.with_changes(
                    func=expression(f"{acc}.print")
                )
            yield self.finding(script, call, plan)
