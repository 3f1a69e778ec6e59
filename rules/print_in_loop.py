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

#: An epoch loop in ``main()`` whose batches are a runner's method: ``{show}`` in that loop.
_RUNNER = (
    "from accelify import Accelerator\n\n\n"
    + "class Runner:\n"
    + "    def __init__(self, accelerator, model, optimizer, loader):\n"
    + "        self.accelerator = accelerator\n"
    + "        self.model, self.optimizer, self.loader = accelerator.prepare(\n"
    + "            model, optimizer, loader\n"
    + "        )\n\n"
    + "    def train_epoch(self):\n"
    + "        for x, y in self.loader:\n"
    + "            self.accelerator.backward(self.model(x).sub(y).pow(2).mean())\n"
    + "            self.optimizer.step()\n\n\n"
    + "def main(model, optimizer, loader):\n"
    + "    accelerator = Accelerator()\n"
    + "    runner = Runner(accelerator, model, optimizer, loader)\n"
    + "    for epoch in range(3):\n"
    + "        runner.train_epoch()\n"
    + "        {show}(f'epoch {{epoch}} done')\n"
)


class PrintInLoop(Rule):
    """``print`` inside a training or evaluation loop (over a DataLoader, around one, or running
    a forward, backward or optimizer step) prints once per process: N copies of every log line,
    interleaved. A loop whose work is a function of the file it calls (``for epoch in
    range(n): runner.train_epoch()``, a trainer's method that loops over the DataLoader) is such
    a loop too. Setup loops (over tokens, config entries) are not reported."""

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
        # the epoch loop of main() runs the batches through a runner's method
        Example(
            _RUNNER.format(show="print"),
            22,
            9,
            _RUNNER.format(show="accelerator.print"),
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
        # a loop that calls a function of the file doing no training or evaluation
        HEADER
        + "def describe(name):\n    return name.upper()\n\n\n"
        + "for name in args.datasets:\n    print(describe(name))\n",
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
