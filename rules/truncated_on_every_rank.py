from collections.abc import Iterator, Sequence

import libcst as cst

from accelify.analysis import names, side_effects
from accelify.analysis.facts import facts_of
from accelify.analysis.objects import bound_arguments, callee
from accelify.analysis.rank_dependence import RankDependence
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
    the main process alone; also a bare ``f = open(path, "w")`` whose writes after it (up to
    ``f.close()``) are the main process's, and a handle handed to a helper of the file that
    writes under the test (``write_rows(f, rows)``). Opening with ``"w"`` empties the file, so
    every other rank's open truncates it too; a rank that opens it after the main process has
    written (or while it writes) leaves an empty or torn checkpoint, and which one wins changes
    from run to run. The open has to run where the write does: the ``with`` under the
    main-process test, or the path handed to ``accelerator.save`` (it opens the file on the main
    process only); for a bare open, ``os.devnull`` on the other ranks (``open(path if
    accelerator.is_main_process else os.devnull, "w")``), which leaves its writes, its close and
    the code between them as they are.

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
        # a bare open by every rank, written on the main process only
        Example(
            _CHECKPOINT
            + "out = open('predictions.txt', 'w')\n"
            + "for line in predictions:\n"
            + "    if accelerator.is_main_process:\n"
            + "        out.write(line)\n"
            + "out.close()\n",
            9,
            7,
        ),
        # the handle handed to a helper that writes under the main-process test
        Example(
            _CHECKPOINT
            + "def write_rows(handle, rows):\n"
            + "    if accelerator.is_main_process:\n"
            + "        for row in rows:\n"
            + "            handle.write(row)\n"
            + "with open('rows.csv', 'w') as f:\n"
            + "    write_rows(f, rows)\n",
            13,
            6,
        ),
    )
    good = (
        # every rank writes its own lines into the bare open: N writers, ACC201's
        _CHECKPOINT + "out = open('log.txt', 'w')\nout.write('done')\nout.close()\n",
        # a path per rank
        _CHECKPOINT
        + "out = open(f'log_{accelerator.process_index}.txt', 'w')\n"
        + "if accelerator.is_main_process:\n"
        + "    out.write('done')\n",
        # a helper handed the handle that every rank writes through
        _CHECKPOINT
        + "def write_rows(handle, rows):\n"
        + "    for row in rows:\n"
        + "        handle.write(row)\n"
        + "with open('rows.csv', 'w') as f:\n"
        + "    write_rows(f, rows)\n",
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
        for opened, handle, region, anchor in _opened_files(script):
            if not side_effects.opens_truncating(opened):
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
            once, everyone = _writes(script, region, handle)
            if not once or everyone:
                continue  # nothing written into it, or every rank writes (ACC201)
            yield self.finding(
                script, opened, message=_message(script, anchor, region, opened, once[0])
            )


def _opened_files(
    script: ScriptModel,
) -> Iterator[tuple[cst.BaseExpression, str, list[cst.CSTNode], cst.CSTNode]]:
    """Each file the script opens under a name, with the statements that may write through it
    and the statement to guard: a ``with open(...) as f:`` and its body, or ``f = open(...)``
    and the statements after it in its block (up to its ``f.close()``, which ends the
    writes)."""
    for block in script.index.of_type(cst.With):
        assert isinstance(block, cst.With)
        for item in block.items:
            handle = dotted(item.asname.name) if item.asname is not None else None
            if handle is not None:
                yield item.item, handle, [block.body], block
    for assign in script.index.of_type(cst.Assign):
        assert isinstance(assign, cst.Assign)
        if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
            continue
        if not (isinstance(assign.value, cst.Call) and dotted(assign.value.func) == "open"):
            continue
        statement = script.parent(assign)
        container = script.parent(statement) if statement is not None else None
        body = getattr(container, "body", None)
        if not isinstance(body, (list, tuple)) or statement not in body:
            continue
        yield assign.value, assign.targets[0].target.value, _after(body, statement), statement


def _after(body: Sequence[cst.CSTNode], statement: cst.CSTNode) -> list[cst.CSTNode]:
    return list(body[body.index(statement) + 1 :])


def _writes(
    script: ScriptModel, region: Sequence[cst.CSTNode], handle: str, depth: int = 0
) -> tuple[list[cst.Call], list[cst.Call]]:
    """The calls in ``region`` that write through ``handle``, split into those the main process
    alone makes (under a rank test inside the region, or ``accelerator.save``) and the others;
    followed into a helper of the file the handle is handed to (``write_rows(f, rows)``), whose
    writes count as the main process's alone where they are under a rank test in the helper
    or the call is under one in the region."""
    ranks = facts_of(script).ranks
    accelerators = script.names_of(Kind.ACCELERATOR)
    once: list[cst.Call] = []
    everyone: list[cst.Call] = []
    for top in region:
        for node in walk(top):
            if not isinstance(node, cst.Call):
                continue
            guarded = _guarded_within(script, node, top, ranks)
            if _closes(node, handle):
                return once, everyone
            if not _writes_through(script, node, handle):
                helper = _handed_to(script, node, handle) if depth < 2 else None
                if helper is not None:
                    inner_once, inner_all = _writes(script, [helper[0].body], helper[1], depth + 1)
                    once += inner_once + (inner_all if guarded else [])
                    everyone += [] if guarded else inner_all
                continue
            func = node.func
            saves_once = (
                isinstance(func, cst.Attribute)
                and func.attr.value == "save"
                and dotted(func.value) in accelerators
            )
            (once if saves_once or guarded else everyone).append(node)
    return once, everyone


def _guarded_within(
    script: ScriptModel, node: cst.CSTNode, top: cst.CSTNode, ranks: RankDependence
) -> bool:
    """``node`` runs under a rank test at or below ``top``."""
    child: cst.CSTNode = node
    for ancestor in script.ancestors(node):
        if (
            isinstance(ancestor, cst.If)
            and child is not ancestor.test
            and ranks.is_rank_test(ancestor.test)
        ):
            return True
        if ancestor is top:
            return False
        child = ancestor
    return False


def _closes(call: cst.Call, handle: str) -> bool:
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value == "close"
        and dotted(func.value) == handle
    )


def _handed_to(
    script: ScriptModel, call: cst.Call, handle: str
) -> tuple[cst.FunctionDef, str] | None:
    """The helper of the file ``call`` runs and its parameter that receives ``handle``."""
    if not any(dotted(argument.value) == handle for argument in call.args):
        return None
    target = callee(script, call)
    if target is None:
        return None
    function, implicit = target
    for parameter, argument in bound_arguments(function, call, implicit):
        if dotted(argument.value) == handle:
            return function, parameter
    return None


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


def _message(
    script: ScriptModel,
    anchor: cst.CSTNode,
    region: Sequence[cst.CSTNode],
    opened: cst.Call,
    write: cst.Call,
) -> str:
    accelerator = accelerator_name(script, opened)
    path = script.module.code_for_node(opened.args[0].value) if opened.args else "the file"
    func = write.func
    where = "`with`"
    inside = next(
        (c for top in region if (c := facts_of(script).synchronising_in(top)) is not None), None
    )
    if (
        isinstance(func, cst.Attribute)
        and func.attr.value == "save"
        and dotted(func.value) in (script.names_of(Kind.ACCELERATOR))
    ):
        fix = (
            f"hand {accelerator}.save the path ({path}) instead of a handle: it opens the file "
            "on the main process only"
        )
    elif not isinstance(anchor, cst.With):
        fix = (
            f"open os.devnull on the other ranks: open({path} if {accelerator}.is_main_process "
            "else os.devnull, ...) (its writes, close and everything after it stay as they are)"
        )
    elif inside is not None:
        fix = (
            f"compute {dotted(inside.func) or 'the collective'}() (line {script.line(inside)}) "
            f"on every rank before the {where}, then put the {where} under `if "
            f"{accelerator}.is_main_process:`"
        )
    else:
        fix = (
            f"put the {where} at line {script.line(anchor)} under `if "
            f"{accelerator}.is_main_process:`"
        )
    return (
        f"Open the file on the main process only: every rank opens {path} for writing here, "
        f"which empties it, but only the main process writes into it (line "
        f"{script.line(write)}), so another rank's open can truncate the file after (or while) "
        f"the main process writes it: an empty or torn file; {fix}"
    )
