from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names, side_effects
from accelify.analysis.collectives import EVERY_BACKEND, backends_in_view, named
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.edits.plan import Plan, expression, statement
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_at

_HF = "from accelerate import Accelerator, DistributedType\naccelerator = Accelerator()\n"


class SaveOutsideMainProcess(Rule):
    """A file written on every rank (``torch.save``, ``save_pretrained``, safetensors'
    ``save_file``, ``np.save``, ``json.dump``, ``save_image``, ``savefig``...): N processes write
    the same path at once, the writes race, and a reader can see a truncated file. A helper that
    writes counts where it is called on every rank; a path made per process (a temporary
    directory, a pid) is a file of each rank's own. ``accelerator.save`` writes on the main
    process only, to a temporary name that is then renamed."""

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
            HEADER
            + "import torch\naccelerator.wait_for_everyone()\naccelerator.save(state, 'ckpt.pt')\n",
        ),
        Example(
            HEADER + "import json\nwith open('m.json', 'w') as f:\n    json.dump(m, f)\n", 5, 5
        ),
        Example(HEADER + "model.save_pretrained('out')\n", 3, 1),
        Example(
            HEADER + "import torch\n\n\ndef save(path):\n    torch.save(state, path)\n\n\n"
            "save('a.pt')\n",
            10,
            1,
        ),
        Example(
            _HF + "import numpy as np\n"
            "if accelerator.is_main_process or "
            "accelerator.distributed_type == DistributedType.DEEPSPEED:\n"
            "    np.save('preds.npy', preds)\n",
            5,
            5,
        ),
    )
    good = (
        HEADER + "accelerator.save(state, 'ckpt.pt')\n",
        HEADER
        + "import torch\nif accelerator.is_main_process:\n    torch.save(state, 'ckpt.pt')\n",
        HEADER
        + "import torch\n\n\ndef save(path):\n    torch.save(state, path)\n\n\n"
        + "if accelerator.is_main_process:\n    save('a.pt')\n",
        HEADER + "import torch\n\n\ndef save_hook(models, weights, path):\n"
        "    torch.save(weights, path)\n",
        HEADER
        + "model.save_pretrained('out', is_main_process=accelerator.is_main_process, "
        + "save_function=accelerator.save)\n",
        HEADER + "import numpy as np\nnp.save(f'preds_{accelerator.process_index}.npy', p)\n",
        # a path made per process: each rank writes (and reads back) a file of its own
        HEADER
        + "import os, tempfile, torch\nwith tempfile.TemporaryDirectory() as tmp:\n"
        + "    path = os.path.join(tmp, 'best.pt')\n    torch.save(state, path)\n"
        + "    state = torch.load(path)\n",
        HEADER
        + "import torch\n\n\ndef save(path):\n    if not accelerator.is_main_process:\n"
        + "        return\n    torch.save(state, path)\n\n\nsave('a.pt')\n",
        HEADER
        + "import torch\n\n\nclass Trainer:\n    def save(self, path):\n"
        + "        torch.save(state, path)\n\n    def fit(self):\n"
        + "        if accelerator.is_main_process:\n            self.save('x.pt')\n\n\n"
        + "accelerator.save(state, 'y.pt')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        in_view = backends_in_view(script)
        for effect in facts_of(script).repeated_effects:
            if effect.deletes or not effect.backends & in_view:
                continue
            if side_effects.uploads(script, effect.effect):
                continue  # ACC207
            yield self.finding(
                script,
                effect.reported,
                _fix(script, effect.reported),
                _message(script, effect, in_view),
            )


def _message(script: ScriptModel, effect, in_view: frozenset[str]) -> str | None:
    where = "" if effect.backends == EVERY_BACKEND else f" under {named(effect.backends & in_view)}"
    if effect.through_helper:
        return (
            f"Call {dotted(effect.reported.func)}() on the main process only: it writes files "
            f"({dotted(effect.effect.func)}, line {script.line(effect.effect)}) and every rank "
            f"calls it here{where}, racing on the same path"
        )
    if where:
        return f"Write on the main process only: every rank runs this{where} and races on the path"
    return None


def _fix(script: ScriptModel, call: cst.Call) -> Plan | None:
    """``torch.save`` -> ``accelerator.save`` after the barrier `convert` puts before a save."""
    if not script.call_names(call) & names.TORCH_SAVE:
        return None
    facts = facts_of(script)
    accelerator = accelerator_at(script, call)
    if accelerator is None or facts.ranks.under_rank_guard(call):
        return None
    plan = Plan()
    plan.replacements[call] = lambda updated: updated.with_changes(
        func=expression(f"{accelerator}.save")
    )
    line = script.parent(script.parent(call))
    for anchor in facts.ranks.barrier_places(line):
        plan.insert_before(anchor, statement(f"{accelerator}.wait_for_everyone()"))
    return plan
