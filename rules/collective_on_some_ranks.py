from collections.abc import Iterator

import libcst as cst

from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, under_rank_guard

COLLECTIVES = {
    "wait_for_everyone",
    "gather",
    "gather_for_metrics",
    "reduce",
    "save_state",
    "prepare",
    "backward",
    "pad_across_processes",
    "check_trigger",
}


class CollectiveOnSomeRanks(Rule):
    """A collective (``wait_for_everyone``, ``gather``, ``reduce``, ``save_state``, ``prepare``,
    ``backward``...) inside a block only some ranks enter. Those ranks wait for the others, who
    never arrive: the job hangs until the timeout, 30 minutes later."""

    code = "ACC202"
    name = "collective-on-some-ranks"
    message = (
        "Call this on every rank: it is a collective, and the other ranks never reach it (hang)"
    )
    why = "Collectives complete only when every rank calls them."
    bad = (
        Example(
            HEADER + "if accelerator.is_main_process:\n    accelerator.wait_for_everyone()\n", 4, 5
        ),
        Example(HEADER + "if rank == 0:\n    accelerator.save_state('ckpt')\n", 4, 5),
    )
    good = (
        HEADER + "accelerator.wait_for_everyone()\nif accelerator.is_main_process:\n    print(1)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        accelerators = script.names_of(Kind.ACCELERATOR)
        for call in calls(script):
            func = call.func
            if not isinstance(func, cst.Attribute) or func.attr.value not in COLLECTIVES:
                continue
            if dotted(func.value) in accelerators and under_rank_guard(script, call):
                yield self.finding(script, call)
