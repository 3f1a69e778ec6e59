from collections.abc import Iterator

from accelify.analysis.collectives import EVERY_BACKEND, backends_in_view, named
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_at

_HF = "from accelerate import Accelerator, DistributedType\naccelerator = Accelerator()\n"


class DeleteOnEveryRank(Rule):
    """Files or directories deleted on every rank (``shutil.rmtree``, ``os.remove``...), most
    often old checkpoints pruned in a block every rank enters (``if accelerator.is_main_process
    or accelerator.distributed_type == DistributedType.DEEPSPEED:``, right for ``save_state`` under
    DeepSpeed, wrong for the pruning beside it). The fastest rank deletes; the others list the
    same entries and fail with FileNotFoundError."""

    code = "ACC205"
    name = "delete-on-every-rank"
    message = (
        "Delete on the main process only: every rank deletes the same path, and all but one fail"
    )
    why = "A path deleted by one rank is gone for the others: FileNotFoundError."
    bad = (
        Example(HEADER + "import shutil\nshutil.rmtree('old-checkpoint')\n", 4, 1),
        Example(  # in a function every rank runs: at the delete, not at the call of train()
            HEADER + "import shutil\n\n\ndef train():\n    accelerator.backward(loss)\n"
            "    shutil.rmtree('old')\n\n\ntrain()\n",
            8,
            5,
        ),
        Example(
            _HF + "import os, shutil\n"
            "if accelerator.is_main_process or "
            "accelerator.distributed_type == DistributedType.DEEPSPEED:\n"
            "    for old in os.listdir('out')[:-2]:\n"
            "        shutil.rmtree(os.path.join('out', old))\n"
            "    accelerator.save_state('out/checkpoint-9')\n",
            6,
            9,
        ),
        Example(
            _HF + "import os, shutil\n"
            'is_fsdp = getattr(accelerator.state, "fsdp_plugin", None) is not None\n'
            "if accelerator.is_main_process or is_fsdp:\n"
            "    for old in os.listdir('out')[:-2]:\n"
            "        shutil.rmtree(os.path.join('out', old))\n"
            "    accelerator.save_state('out/checkpoint-9')\n",
            7,
            9,
        ),
    )
    good = (
        HEADER + "import shutil\nif accelerator.is_main_process:\n    shutil.rmtree('old')\n",
        HEADER + "import shutil\nis_main = accelerator.is_main_process\n"
        "if is_main and args.clear:\n    shutil.rmtree('old')\n",
        # a function that trains runs on every rank: no advice ever guards it
        HEADER + "import shutil\n\n\ndef train():\n    accelerator.backward(loss)\n"
        "    if accelerator.is_main_process:\n        shutil.rmtree('old')\n\n\ntrain()\n",
        _HF + "import os, shutil\n"
        "if accelerator.is_main_process:\n"
        "    for old in os.listdir('out')[:-2]:\n"
        "        shutil.rmtree(os.path.join('out', old))\n"
        "if accelerator.is_main_process or "
        "accelerator.distributed_type == DistributedType.DEEPSPEED:\n"
        "    accelerator.save_state('out/checkpoint-9')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        in_view = backends_in_view(script)
        for effect in facts_of(script).repeated_effects:
            if not effect.deletes or not effect.backends & in_view:
                continue
            accelerator = accelerator_at(script, effect.reported) or "accelerator"
            where = (
                f" under {named(effect.backends & in_view)}"
                if effect.backends != EVERY_BACKEND
                else ""
            )
            message = (
                f"Delete on the main process only: guard with `if {accelerator}.is_main_process:`"
                f"; every rank deletes the same path{where}, and all but one fail with "
                "FileNotFoundError"
            )
            if effect.through_helper:
                message = (
                    f"Call {dotted(effect.reported.func)}() under `if {accelerator}."
                    f"is_main_process:` here too: it deletes files (line "
                    f"{script.line(effect.effect)}), its other calls are guarded, and every rank "
                    f"runs this one{where}"
                )
            yield self.finding(script, effect.reported, message=message)
