from collections.abc import Iterator

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
    under_rank_guard,
)


class SaveOutsideMainProcess(Rule):
    """``torch.save`` on every rank writes the same file N times at once: the writes race, and a
    reader can see a truncated checkpoint. ``accelerator.save`` writes on the main process only,
    to a temporary name that is then renamed."""

    code = "ACC201"
    name = "save-outside-main-process"
    message = (
        "Save on the main process only: accelerator.save(...) "
        "or guard with accelerator.is_main_process"
    )
    why = "N processes writing one path race; the file can be truncated or mixed."
    bad = (
        Example(
            HEADER + "import torch\ntorch.save(state, 'ckpt.pt')\n",
            4,
            1,
            HEADER + "import torch\naccelerator.save(state, 'ckpt.pt')\n",
        ),
    )
    good = (
        HEADER + "accelerator.save(state, 'ckpt.pt')\n",
        HEADER
        + "import torch\nif accelerator.is_main_process:\n    torch.save(state, 'ckpt.pt')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        acc = accelerator_name(script)
        for call in calls(script):
            if script.call_names(call) & names.TORCH_SAVE and not under_rank_guard(script, call):
                plan = Plan()
                plan.replacements[call] = lambda updated: updated.with_changes(
                    func=expression(f"{acc}.save")
                )
                yield self.finding(script, call, plan)
