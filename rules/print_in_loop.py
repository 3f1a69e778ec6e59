from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.lint.rule import (
    HEADER,
    Example,
    Finding,
    Rule,
    accelerator_at,
    calls,
    under_rank_guard,
)

_PREPARED = HEADER + "loader = accelerator.prepare(loader)\n"


class PrintInLoop(Rule):
    """``print`` inside a training or evaluation loop (over a DataLoader, around one, or running
    a forward, backward or optimizer step) prints once per process: N copies of every log line,
    interleaved. Setup loops (over tokens, config entries) are not reported."""

    code = "ACC203"
    name = "print-in-loop"
    message = "Use accelerator.print in loops: it prints on the local main process only"
    why = "Every rank runs the loop, so every rank prints."
    opt_in = (
        "N copies of a log line are noise, not a wrong result: nothing hangs, crashes, loses a "
        "file or computes a wrong number"
    )
    bad = (
        Example(
            _PREPARED + "for batch in loader:\n    print(loss.item())\n",
            5,
            5,
            _PREPARED + "for batch in loader:\n    accelerator.print(loss.item())\n",
        ),
        Example(
            _PREPARED + "for epoch in range(3):\n    for batch in loader:\n        pass\n"
            "    print(epoch)\n",
            7,
            5,
            _PREPARED + "for epoch in range(3):\n    for batch in loader:\n        pass\n"
            "    accelerator.print(epoch)\n",
        ),
    )
    good = (
        HEADER + "for batch in loader:\n    accelerator.print(loss.item())\n",
        HEADER + "print('starting')\n",
        HEADER + "for batch in loader:\n    if accelerator.is_main_process:\n        print(1)\n",
        # the other ranks leave the function first (BigVGAN's validate(accelerator, ...))
        _PREPARED
        + "def validate(acc, loader):\n    if not acc.is_main_process:\n        return\n"
        + "    for j, batch in enumerate(loader):\n        print(j)\n\n\n"
        + "validate(accelerator, loader)\n",
        HEADER + "for token in tokenizer.additional_special_tokens:\n    print(token)\n",
        HEADER + "for name, value in vars(args).items():\n    print(name, value)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for call in calls(script):
            if not script.call_names(call) & names.PRINT or not _in_work_loop(script, call):
                continue
            if under_rank_guard(script, call):
                continue
            acc = accelerator_at(script, call)
            from accelify.edits import rewrites  # a fix's edits: imported for a fix only
            from accelify.edits.plan import Plan

            fix = Plan.of(rewrites.print_once(call, acc)) if acc is not None else None
            yield self.finding(script, call, fix)


def _in_work_loop(script: ScriptModel, call: cst.Call) -> bool:
    work = facts_of(script).work_loops
    return any(
        isinstance(a, (cst.For, cst.While)) and id(a) in work for a in script.ancestors(call)
    )
