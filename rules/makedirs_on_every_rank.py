from collections.abc import Iterator
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis import names, side_effects
from accelify.analysis.facts import facts_of
from accelify.analysis.repeated_effects import run_by_every_rank
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_at

if TYPE_CHECKING:
    from accelify.edits.plan import Plan


class MakedirsOnEveryRank(Rule):
    """``os.mkdir(d)`` or ``os.makedirs(d)`` without ``exist_ok=True``, bare or under ``if not
    os.path.isdir(d):``, where every rank runs it: right after the ``Accelerator`` is made, in
    the function (or module) that makes it, or in a function handed the accelerator
    (``def train(accelerator, ...)``) that every rank calls. The ranks start together; the
    first creates the directory and the others fail with ``FileExistsError`` (the ``isdir``
    test does not help: they all test before any of them creates it). Under a rank test, or
    named per rank, it is left alone."""

    code = "ACC211"
    name = "makedirs-on-every-rank"
    message = (
        "Create the directory with os.makedirs(path, exist_ok=True) (or on the main process "
        "only): every rank runs this, and the ranks that come second fail with FileExistsError"
    )
    why = "Every rank creates the same directory; all but the first fail."
    bad = (
        Example(  # Music-Source-Separation-Training's train_accelerate.py
            HEADER + "import os\nif not os.path.isdir(args.results_path):\n"
            "    os.mkdir(args.results_path)\n",
            5,
            5,
        ),
        Example(  # the check and the creation race: fixed as one call
            HEADER + "import os\nif not os.path.exists('runs'):\n    os.makedirs('runs')\n",
            5,
            5,
            HEADER + "import os\nos.makedirs('runs', exist_ok=True)\n",
        ),
        Example(
            HEADER + "import os\nos.makedirs('out/checkpoints')\n",
            4,
            1,
            HEADER + "import os\nos.makedirs('out/checkpoints', exist_ok=True)\n",
        ),
        # a ClipCap fine-tuning's train(accelerator, ...): handed the accelerator, called by
        # every rank from main()
        Example(
            "import os\nfrom accelerate import Accelerator\n\n\n"
            "def train(accelerator, model, output_dir):\n"
            "    if not os.path.exists(output_dir):\n"
            "        os.makedirs(output_dir)\n"
            "    model = accelerator.prepare(model)\n\n\n"
            "def main():\n"
            "    accelerator = Accelerator()\n"
            "    train(accelerator, model, 'out')\n",
            7,
            9,
        ),
        # a forecasting experiment's train(): self.accelerator comes from the base class in
        # another module, and the method prepares, so every rank runs it
        Example(
            "import os\nfrom exp.exp_basic import Exp_Basic\n\n\n"
            "class Exp_Main(Exp_Basic):\n"
            "    def train(self, setting):\n"
            "        path = os.path.join(self.args.checkpoints, setting)\n"
            "        if not os.path.exists(path):\n"
            "            os.makedirs(path)\n"
            "        self.model, loader = self.accelerator.prepare(self.model, loader)\n",
            9,
            13,
        ),
    )
    good = (
        HEADER + "import os\nos.makedirs('out/checkpoints', exist_ok=True)\n",
        # a method of such a class that meets no other rank and that nothing in the file calls:
        # it may run on one process only
        "import os\nfrom exp.exp_basic import Exp_Basic\n\n\n"
        "class Exp_Main(Exp_Basic):\n"
        "    def predict(self, setting):\n"
        "        preds = [self.model(x) for x in self.pred_loader]\n"
        "        if not os.path.exists(setting):\n"
        "            os.makedirs(setting)\n"
        "        self.accelerator.print(len(preds))\n",
        HEADER + "import os\nif accelerator.is_main_process:\n    os.mkdir('out')\n",
        HEADER + "import os\nos.mkdir(f'shard_{accelerator.process_index}')\n",
        # before the Accelerator exists: a launcher's setup, not the ranks'
        "import os\nfrom accelify import Accelerator\nos.mkdir('out')\n"
        "accelerator = Accelerator()\n",
        # the same helper called on the main process only
        "import os\nfrom accelerate import Accelerator\n\n\n"
        "def setup(accelerator, output_dir):\n"
        "    if not os.path.exists(output_dir):\n"
        "        os.makedirs(output_dir)\n\n\n"
        "accelerator = Accelerator()\n"
        "if accelerator.is_main_process:\n"
        "    setup(accelerator, 'out')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        built = [call for call in script.calls if script.call_names(call) & names.ACCELERATORS]
        if not built and not script.accelerator_params and not script.names_of(Kind.ACCELERATOR):
            return
        for race in side_effects.makedirs_races(script, facts.placement):
            call = race.call
            if facts.ranks.under_rank_guard(call) or side_effects.per_rank_path(script, call):
                continue
            if not (
                _after_the_accelerator_is_made(script, call, built)
                or _handed_the_accelerator(script, call)
            ):
                continue
            yield self.finding(script, call, _fix(race))


def _after_the_accelerator_is_made(
    script: ScriptModel, call: cst.Call, built: list[cst.Call]
) -> bool:
    """An ``Accelerator(...)`` made earlier in the same function (or at module level): every
    rank is running this code."""
    scope = script.scope_of(call)
    return any(
        script.scope_of(made) is scope and script.order(made) < script.order(call) for made in built
    )


def _handed_the_accelerator(script: ScriptModel, call: cst.Call) -> bool:
    """``call`` runs in a function that receives the accelerator as a parameter, or in a method
    of a class that holds one (``self.accelerator``, set here or by a base class), so it runs
    once one exists, and that every rank calls: not only under a main-process guard (a method
    nothing in the file calls counts when it prepares, steps or meets the other ranks)."""
    facts = facts_of(script)
    function = facts.placement.enclosing_function(call)
    if function is None:
        return False
    held = accelerator_at(script, call)
    if Kind.ACCELERATOR not in facts.flow.params.get(function, {}).values() and not (
        held is not None and held.startswith("self.")
    ):
        return False
    return run_by_every_rank(
        script,
        facts.placement,
        facts.ranks.backend_guards,
        facts.synchronising_call,
        function,
    )


def _fix(race: side_effects.MakedirsRace) -> "Plan | None":
    """``os.makedirs(d, exist_ok=True)`` in place of the call (and of the ``if not
    os.path.isdir(d):`` around it): convert's edit."""
    from accelify.edits import rewrites  # a fix's edits: imported for a fix only
    from accelify.edits.plan import Plan

    edit = rewrites.makedirs_exist_ok(race.statement, race.call)
    return None if edit is None else Plan.of(edit)
