from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names, side_effects
from accelify.analysis.facts import facts_of
from accelify.analysis.repeated_effects import run_by_every_rank
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name

_CHECKPOINT = (
    HEADER
    + "import torch\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "for x, y in loader:\n"
    + "    accelerator.backward(loss_fn(model(x), y))\n"
    + "    optimizer.step()\n"
    + "accelerator.wait_for_everyone()\n"
)


class TruncatedOnEveryRank(Rule):
    """A file every rank opens for writing (``with open(path, "wb") as f:``), into which only
    the main process writes: ``if accelerator.is_main_process: torch.save(state, f)`` (or
    ``json.dump``, ``f.write``) in the block, or ``accelerator.save(state, f)``, which writes on
    the main process alone. Opening with ``"w"`` empties the file, so every other rank's open
    truncates it too; a rank that opens it after the main process has written (or while it
    writes) leaves an empty or torn checkpoint, and which one wins changes from run to run. The
    open has to run where the write does: the ``with`` under the main-process test, or the path
    handed to ``accelerator.save`` (it opens the file on the main process only).

    A path made per process (a rank in its name, a temporary directory), a file opened on some
    ranks only, ``open(os.devnull, "w")``, a block whose writes every rank makes (that is
    ACC201's: N writers) and a file opened to append or read are left alone."""

    code = "ACC430"
    name = "truncated-on-every-rank"
    message = (
        "Open the file on the main process only: every rank's open(..., 'w') empties it, and "
        "only the main process writes into it"
    )
    why = (
        "Every rank's open for writing truncates the file the main process alone writes: an "
        "empty or torn checkpoint."
    )
    bad = (
        # a checkpoint written by the main process into a file every rank opened
        Example(
            _CHECKPOINT
            + "with open('model.pt', 'wb') as f:\n"
            + "    if accelerator.is_main_process:\n"
            + "        torch.save(accelerator.unwrap_model(model).state_dict(), f)\n",
            9,
            6,
        ),
        # accelerator.save writes on the main process alone, into the handle every rank opened
        Example(
            _CHECKPOINT
            + "with open('state.pt', 'wb') as handle:\n"
            + "    accelerator.save(accelerator.get_state_dict(model), handle)\n",
            9,
            6,
        ),
        # a trainer's metrics file: every rank runs save_metrics, the main process dumps
        Example(
            HEADER
            + "import json\n\n\n"
            + "class Trainer:\n"
            + "    def save_metrics(self, metrics, path):\n"
            + "        with open(path, 'w') as f:\n"
            + "            if accelerator.is_main_process:\n"
            + "                json.dump(metrics, f)\n\n"
            + "    def fit(self):\n"
            + "        accelerator.backward(self.model(1))\n"
            + "        self.save_metrics({'loss': 1.0}, 'metrics.json')\n\n\n"
            + "Trainer().fit()\n",
            8,
            14,
        ),
    )
    good = (
        # the open under the main-process test with the write
        _CHECKPOINT
        + "if accelerator.is_main_process:\n"
        + "    with open('model.pt', 'wb') as f:\n"
        + "        torch.save(accelerator.unwrap_model(model).state_dict(), f)\n",
        # the path handed to accelerator.save: it opens the file on the main process only
        _CHECKPOINT + "accelerator.save(accelerator.get_state_dict(model), 'state.pt')\n",
        # one file per rank
        _CHECKPOINT
        + "with open(f'model_{accelerator.process_index}.pt', 'wb') as f:\n"
        + "    if accelerator.is_main_process:\n"
        + "        torch.save(model.state_dict(), f)\n",
        # opened to append: nothing is emptied
        _CHECKPOINT
        + "with open('log.txt', 'a') as f:\n"
        + "    if accelerator.is_main_process:\n"
        + "        f.write('done\\n')\n",
        # a sink on the other ranks: they write nowhere
        _CHECKPOINT
        + "import os\n"
        + "with open(path if accelerator.is_main_process else os.devnull, 'w') as f:\n"
        + "    if accelerator.is_main_process:\n"
        + "        f.write('done\\n')\n",
        # a helper only the main process calls
        HEADER
        + "import json\n\n\n"
        + "def dump(metrics, path):\n"
        + "    with open(path, 'w') as f:\n"
        + "        if accelerator.is_main_process:\n"
        + "            json.dump(metrics, f)\n\n\n"
        + "if accelerator.is_main_process:\n"
        + "    dump({}, 'm.json')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        guards = facts.ranks.backend_guards
        for block in script.index.of_type(cst.With):
            assert isinstance(block, cst.With)
            for item in block.items:
                opened = item.item
                handle = dotted(item.asname.name) if item.asname is not None else None
                if handle is None or not side_effects.opens_truncating(opened):
                    continue
                assert isinstance(opened, cst.Call)
                if side_effects.per_rank_path(script, opened):
                    continue
                if facts.shared_files.unique_per_process_path(opened):
                    continue
                function = facts.placement.enclosing_function(opened)
                if script.under_rank_guard(opened):
                    continue
                if not guards.entered_by_all(opened, within=function):
                    continue  # opened on some ranks only
                if function is not None and not run_by_every_rank(
                    script, facts.placement, guards, facts.synchronising_call, function
                ):
                    continue
                once, everyone = _writes(script, block, handle)
                if not once or everyone:
                    continue  # nothing written into it, or every rank writes (ACC201)
                yield self.finding(script, opened, message=_message(script, block, opened, once[0]))


def _writes(
    script: ScriptModel, block: cst.With, handle: str
) -> tuple[list[cst.Call], list[cst.Call]]:
    """The calls in ``block`` that write through ``handle``, split into those the main process
    alone makes (under a rank test inside the block, or ``accelerator.save``) and the others."""
    ranks = facts_of(script).ranks
    accelerators = script.names_of(Kind.ACCELERATOR)
    once: list[cst.Call] = []
    everyone: list[cst.Call] = []
    for node in walk(block.body):
        if not isinstance(node, cst.Call) or not _writes_through(script, node, handle):
            continue
        func = node.func
        saves_once = (
            isinstance(func, cst.Attribute)
            and func.attr.value == "save"
            and dotted(func.value) in accelerators
        )
        guarded = False
        child: cst.CSTNode = node
        for ancestor in script.ancestors(node):
            if ancestor is block:
                break
            if (
                isinstance(ancestor, cst.If)
                and child is not ancestor.test
                and ranks.is_rank_test(ancestor.test)
            ):
                guarded = True
            child = ancestor
        (once if saves_once or guarded else everyone).append(node)
    return once, everyone


def _writes_through(script: ScriptModel, call: cst.Call, handle: str) -> bool:
    """``handle.write(...)``, ``handle.writelines(...)``, ``print(..., file=handle)``, or a
    writer handed the handle (``torch.save(state, handle)``, ``json.dump(rows, handle)``)."""
    func = call.func
    if isinstance(func, cst.Attribute) and dotted(func.value) == handle:
        return func.attr.value in ("write", "writelines")
    if not any(dotted(argument.value) == handle for argument in call.args):
        return False
    if dotted(func) == "print":
        return any(
            a.keyword is not None and a.keyword.value == "file" and dotted(a.value) == handle
            for a in call.args
        )
    return bool(script.call_names(call) & (names.FILE_WRITERS | names.TORCH_SAVE)) or (
        isinstance(func, cst.Attribute) and func.attr.value in ("save", "dump")
    )


def _message(script: ScriptModel, block: cst.With, opened: cst.Call, write: cst.Call) -> str:
    accelerator = accelerator_name(script, opened)
    path = script.module.code_for_node(opened.args[0].value) if opened.args else "the file"
    func = write.func
    inside = facts_of(script).synchronising_in(block.body)
    if (
        isinstance(func, cst.Attribute)
        and func.attr.value == "save"
        and dotted(func.value) in (script.names_of(Kind.ACCELERATOR))
    ):
        fix = (
            f"hand {accelerator}.save the path ({path}) instead of a handle: it opens the file "
            "on the main process only"
        )
    elif inside is not None:
        fix = (
            f"compute {dotted(inside.func) or 'the collective'}() (line {script.line(inside)}) "
            f"on every rank before the `with`, then put the `with` under `if "
            f"{accelerator}.is_main_process:`"
        )
    else:
        fix = (
            f"put the `with` at line {script.line(block)} under `if {accelerator}.is_main_process:`"
        )
    return (
        f"Open the file on the main process only: every rank opens {path} for writing here, "
        f"which empties it, but only the main process writes into it (line "
        f"{script.line(write)}), so another rank's open can truncate the file after (or while) "
        f"the main process writes it: an empty or torn file; {fix}"
    )
