from collections.abc import Iterator

import libcst as cst

from accelify.analysis import side_effects
from accelify.analysis.collectives import EVERY_BACKEND, backends_in_view, named
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, walk
from accelify.lint.rule import (
    HEADER,
    WRITE_ATOMIC_PER_PROCESS,
    Example,
    Finding,
    Rule,
    accelerator_name,
)

_HF = "from accelerate import Accelerator, DistributedType\naccelerator = Accelerator()\n"


class DeleteOnEveryRank(Rule):
    """Files or directories deleted on every rank (``shutil.rmtree``, ``os.remove``...), most
    often old checkpoints pruned in a block every rank enters (``if accelerator.is_main_process
    or accelerator.distributed_type == DistributedType.DEEPSPEED:``, right for ``save_state`` under
    DeepSpeed, wrong for the pruning beside it). The fastest rank deletes; the others list the
    same entries and fail with FileNotFoundError. A delete that tolerates a missing path
    (``ignore_errors=True``, ``missing_ok=True``, under ``except FileNotFoundError:``) is not
    reported: every rank ends with the path gone."""

    code = "ACC205"
    name = "delete-on-every-rank"
    message = (
        "Delete on the main process only: every rank deletes the same path, and all but one fail"
    )
    why = "A path deleted by one rank is gone for the others: FileNotFoundError."
    bad = (
        Example(  # the prompt in the condition runs on every rank too: guard the condition
            HEADER + "import shutil\n\n\ndef yes_or_no(question):\n"
            "    return input(question) == 'y'\n\n\n"
            "if len(old) > 0 and yes_or_no('clear?'):\n    shutil.rmtree('results')\n",
            11,
            5,
        ),
        Example(HEADER + "import shutil\nshutil.rmtree('old-checkpoint')\n", 4, 1),
        Example(HEADER + "import shutil\nshutil.rmtree('old', ignore_errors=False)\n", 4, 1),
        Example(  # caught, but not the error another rank's delete raises
            HEADER + "import os\ntry:\n    os.remove('out/last.pt')\nexcept KeyError:\n    pass\n",
            5,
            5,
        ),
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
        WRITE_ATOMIC_PER_PROCESS,
        HEADER + "import shutil\nif accelerator.is_main_process:\n    shutil.rmtree('old')\n",
        HEADER + "import shutil\n\n\ndef yes_or_no(question):\n"
        "    return input(question) == 'y'\n\n\n"
        "if accelerator.is_main_process and (args.clear or yes_or_no('clear?')):\n"
        "    shutil.rmtree('results')\n",
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
        # deletes that tolerate a path another rank removed first: every rank ends with it gone
        HEADER + "import shutil\nshutil.rmtree('stats_out', ignore_errors=True)\n",
        HEADER + "from pathlib import Path\nPath('out/last.pt').unlink(missing_ok=True)\n",
        HEADER + "import os\ntry:\n    os.remove('out/last.pt')\nexcept FileNotFoundError:\n"
        "    pass\n",
        HEADER + "import contextlib, os\nwith contextlib.suppress(OSError):\n"
        "    os.remove('out/last.pt')\n",
        # filelock's read-write lock: a file store's prepare(root, force=True), in a file that
        # imports no training library, is not an accelerator's; nor is its unlink a rank's
        "class Participant:\n"
        "    def __init__(self, files, root, log):\n"
        "        self._files, self._root, self._log = files, root, log\n\n"
        "    def _create_holder(self):\n"
        "        try:\n"
        "            self._files.create(self._holder_path(self.token))\n"
        "        except FileNotFoundError:\n"
        "            self._files.prepare(self._root, force=True)\n\n"
        "    def advance(self):\n"
        "        for _ in range(4):\n"
        "            if self._attempt():\n"
        "                return True\n\n"
        "    def _attempt(self):\n"
        "        if self._log.commit(self._log.latest()):\n"
        "            self._files.unlink(self._holder_path(self.token))\n"
        "        self._create_holder()\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        in_view = backends_in_view(script)
        for effect in facts_of(script).repeated_effects:
            if not effect.deletes or effect.helper is not None or not effect.backends & in_view:
                continue
            if side_effects.tolerates_missing(script, effect.effect):
                continue  # ``ignore_errors=True``, ``missing_ok=True``, under ``except OSError``
            accelerator = accelerator_name(script, effect.reported)
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
            prompt = _prompting_branch(script, effect.effect)
            if prompt is not None and facts_of(script).synchronising_in(prompt[0]) is None:
                branch, asked = prompt
                message = (
                    f"Delete on the main process only: start the condition at line "
                    f"{script.line(branch)} with `{accelerator}.is_main_process and (...)`, not "
                    f"only the delete: it asks for input ({dotted(asked.func)}, line "
                    f"{script.line(asked)}), and every rank would wait at the prompt; every rank "
                    f"deletes the same path{where}"
                )
            if effect.through_helper:
                message = (
                    f"Call {dotted(effect.reported.func)}() under `if {accelerator}."
                    f"is_main_process:` here too: it deletes files (line "
                    f"{script.line(effect.effect)}), its other calls are guarded, and every rank "
                    f"runs this one{where}"
                )
            yield self.finding(script, effect.reported, message=message)


def _prompting_branch(script: ScriptModel, delete: cst.Call) -> tuple[cst.If, cst.Call] | None:
    """The ``if`` whose body holds the delete and whose test asks the user
    (``if len(old) > 0 and yes_or_no('clear?'):``, with ``input()`` in the file's
    ``yes_or_no``): a guard around the delete alone still prompts on every rank."""
    child: cst.CSTNode = delete
    for ancestor in script.ancestors(delete):
        if isinstance(ancestor, cst.FunctionDef):
            return None
        if isinstance(ancestor, cst.If) and child is ancestor.body:
            for node in walk(ancestor.test):
                if isinstance(node, cst.Call) and _asks(script, node):
                    return ancestor, node
            return None
        child = ancestor
    return None


def _asks(script: ScriptModel, call: cst.Call) -> bool:
    name = dotted(call.func)
    if name == "input":
        return True
    helper = script.functions.get(name or "")
    return helper is not None and any(
        isinstance(node, cst.Call) and dotted(node.func) == "input" for node in walk(helper)
    )
