from collections.abc import Iterator

import libcst as cst

from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.scheduler_preparation import prepared_schedulers
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, strip_self_methods, target_names, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls

_DATA = (
    "import torch\n"
    "train_set = torch.utils.data.TensorDataset(torch.zeros(64, 2))\n"
    "loader = torch.utils.data.DataLoader(train_set, batch_size=8)\n"
    "counting = torch.utils.data.DataLoader(train_set, batch_size=8)\n"
)


#: trlx's SFT trainer: the loaders a store builds, prepared onto the trainer's attributes; the
#: step count taken from {counted} after the prepare.
_RENAMED = (
    "from accelerate import Accelerator\n\n\n"
    "class SFTTrainer:\n"
    "    def __init__(self, model, opt, store, config):\n"
    "        self.accelerator = Accelerator()\n"
    "        self.model, self.opt, self.store, self.config = model, opt, store, config\n\n"
    "    def prepare_learning(self):\n"
    "        train_dataloader = self.store.create_loader(self.config.batch_size)\n"
    "        self.model, self.opt, self.train_dataloader = self.accelerator.prepare(\n"
    "            self.model, self.opt, train_dataloader\n"
    "        )\n"
    "        self.total_steps = self.config.epochs * len({counted})\n"
)


class UnpreparedLoaderLength(Rule):
    """``len()`` of a DataLoader that is never prepared, used for step counts (total steps,
    steps per epoch, the scheduler's ``num_training_steps``). Each rank iterates only its shard
    of the prepared loader, ``len(loader) / num_processes`` batches, so a count taken from the
    unsharded loader is N times too many: the LR schedule is stretched N times and a
    ``max_steps`` loop runs N times as many epochs."""

    code = "ACC405"
    name = "unprepared-loader-length"
    message = (
        "Count steps with len() of the prepared DataLoader: this one is never prepared, so it "
        "counts every rank's batches, N times what each rank steps through"
    )
    why = "A prepared loader yields 1/N of the batches on each of N ranks."
    bad = (
        Example(
            HEADER + _DATA + "loader = accelerator.prepare(loader)\n"
            "total_steps = len(counting) * 3\n",
            8,
            15,
        ),
        Example(
            HEADER + _DATA + "loader = accelerator.prepare(loader)\n"
            "scheduler = get_scheduler('linear', num_training_steps=len(counting))\n",
            8,
            56,
        ),
        # the local still names the loader as it was: every rank's batches
        Example(_RENAMED.format(counted="train_dataloader"), 14, 49),
    )
    good = (
        HEADER + _DATA + "loader = accelerator.prepare(loader)\ntotal_steps = len(loader) * 3\n",
        # ... counted from the prepared attribute: this rank's batches
        _RENAMED.format(counted="self.train_dataloader"),
        # the constructor keeps the loader it counts, and prepares the attribute
        HEADER
        + _DATA
        + "class Trainer:\n"
        + "    def __init__(self, model, train_loader):\n"
        + "        self.model = model\n"
        + "        self.train_loader = train_loader\n"
        + "        self.total_steps = 10 * len(train_loader)\n"
        + "        self.model, self.train_loader = accelerator.prepare(\n"
        + "            self.model, self.train_loader\n"
        + "        )\n"
        + "train_loader = torch.utils.data.DataLoader(train_set, batch_size=8)\n"
        + "trainer = Trainer(torch.nn.Linear(2, 1), train_loader)\n",
        HEADER + _DATA + "loader = accelerator.prepare(loader)\n"
        "print(f'{len(counting)} batches in all')\n",
        HEADER + _DATA + "steps_per_epoch = len(loader)\nloader = accelerator.prepare(loader)\n",
        # vits-accelerate: the dataset was prepared, the loop reads the unprepared loader itself
        # (ACC401 reports that loop): each rank steps through all len(counting) batches
        HEADER
        + _DATA
        + "model = torch.nn.Linear(2, 1)\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer, train_set = accelerator.prepare(model, optimizer, train_set)\n"
        + "total_steps = len(counting) * 3\n"
        + "for (x,) in counting:\n"
        + "    accelerator.backward(model(x).sum())\n"
        + "    optimizer.step()\n",
        # the local rebound to the prepared attribute before it is counted (review8a)
        _RENAMED.replace(
            "        self.total_steps",
            "        train_dataloader = self.train_dataloader\n        self.total_steps",
        ).format(counted="train_dataloader"),
        # the whole set's batches size a scheduler prepare wraps: it steps N times per call
        HEADER
        + _DATA
        + "from transformers import get_linear_schedule_with_warmup\n"
        + "model = torch.nn.Linear(2, 1)\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer, train_dl = accelerator.prepare(model, optimizer, loader)\n"
        + "total_steps = len(loader) * 3\n"
        + "scheduler = get_linear_schedule_with_warmup(optimizer, 0, total_steps)\n"
        + "scheduler = accelerator.prepare(scheduler)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        prepared_any = {
            name for call in script.prepare_calls for name in (*call.inputs, *call.outputs)
        }
        # a loader a method of the project builds (``self.store.create_loader(bs)``) is known by
        # what prepare takes and what its name says
        loaders = script.names_of(Kind.DATALOADER) | {
            name
            for call in script.prepare_calls
            for name in call.inputs
            if "loader" in name.rsplit(".", 1)[-1].lower()
        }
        if not script.prepare_calls:
            return  # nothing is sharded: every count is the script's own business
        for call in calls(script):
            if dotted(call.func) != "len" or len(call.args) != 1:
                continue
            name = dotted(call.args[0].value)
            if name not in loaders:
                continue
            renamed = _prepared_under_another_name(script, name, call)
            if (name in prepared_any or _prepared_later(script, name)) and renamed is None:
                continue
            if _kept_prepared(script, name, call, prepared_any):
                continue
            if _iterated_unprepared(script, name):
                continue  # each rank steps through all of it: the count is right (ACC401's bug)
            if _counts_steps(script, call) and renamed is not None:
                prepared, line = renamed
                yield self.finding(
                    script,
                    call,
                    message=(
                        f"Count steps with len({prepared}), the DataLoader prepare returned at "
                        f"line {line}: {name} still holds the loader as it was, so it counts "
                        "every rank's batches, N times what each rank steps through"
                    ),
                )
            elif _counts_steps(script, call):
                yield self.finding(script, call)


def _prepared_under_another_name(
    script: ScriptModel, name: str, length: cst.Call
) -> tuple[str, int] | None:
    """``self.train_loader = accelerator.prepare(train_loader)`` earlier in the same function,
    then ``len(train_loader)``: the local still holds the loader as it was (trlx's SFT trainer
    counts its total steps so, N times what each rank steps). Not ``len(loader)`` before the
    prepare (the whole set's batches, which a prepared scheduler's N steps per call match).
    The prepared name and the prepare's line, or None."""
    scope = script.scope_of(length)
    if _sizes_a_prepared_scheduler(script, length):
        return None
    for prepare in script.prepare_calls:
        if (
            name in prepare.inputs
            and len(prepare.inputs) == len(prepare.outputs)
            and name not in prepare.outputs
            and script.scope_of(prepare.call) is scope
            and script.order(prepare.call) < script.order(length)
            and not _rebound_between(script, name, prepare.call, length)
        ):
            return prepare.outputs[prepare.inputs.index(name)], prepare.line
    return None


def _rebound_between(script: ScriptModel, name: str, start: cst.CSTNode, end: cst.CSTNode) -> bool:
    """``name`` is bound again between ``start`` and ``end`` (``train_dataloader =
    self.train_dataloader`` after the prepare): the local holds what it was rebound to."""
    binding = last_binding(script, name, end)
    return binding is not None and script.order(binding) > script.order(start)


def _sizes_a_prepared_scheduler(script: ScriptModel, length: cst.Call) -> bool:
    """``length`` sizes a scheduler ``prepare`` wraps, in its constructor or through the name
    it is bound to (``total_steps = len(loader) * epochs``, then
    ``get_linear_schedule_with_warmup(optimizer, 0, total_steps)``): the wrapped scheduler
    steps N times per call, so the whole set's batches are what it should count."""
    statement = next((a for a in script.ancestors(length) if isinstance(a, cst.Assign)), None)
    sized = {
        n for t in statement.targets for n in target_names(t.target)
    } if statement is not None else set()  # fmt: skip
    for argument in prepared_schedulers(script).values():
        given = dotted(argument.value)
        binding = last_binding(script, given, argument) if given else None
        if not isinstance(binding, cst.Assign):
            continue
        for node in walk(binding.value):
            if node is length or (isinstance(node, cst.Name) and node.value in sized):
                return True
    return False


def _iterated_unprepared(script: ScriptModel, name: str) -> bool:
    """A training or evaluation loop iterates this very loader, unprepared (vits-accelerate
    prepared its dataset instead): every rank steps through all of its batches, so its len()
    is what each rank steps. The bug is the unsharded loop, reported by ACC401 at the loop."""
    flow = facts_of(script).flow
    for loop in script.loops:
        if loop.iterable != name or not (loop.trains or loop.evaluates):
            continue
        passed = flow.call_site_arguments(name, loop.node)
        if not passed or any(dotted(argument.value) == name for argument in passed):
            return True
    return False


def _kept_prepared(
    script: ScriptModel, name: str, call: cst.Call, prepared: set[str | None]
) -> bool:
    """``len(train_loader)`` in a constructor that keeps ``self.train_loader = train_loader``
    and prepares the attribute: one loader under two names, counted before prepare (as
    ``len(loader)`` just before ``loader = accelerator.prepare(loader)`` is)."""
    scope = script.scope_of(call)
    return any(
        binding.received
        and binding.scope is scope
        and binding.name in prepared
        and dotted(strip_self_methods(binding.value)) == name
        for binding in script.bindings
    )


def _prepared_later(script: ScriptModel, name: str) -> bool:
    """``accelerator.prepare_data_loader(name)`` or ``skip_first_batches(name, ...)``."""
    return any(
        isinstance(c.func, cst.Attribute)
        and c.func.attr.value.startswith(("prepare", "skip_first_batches"))
        and any(dotted(a.value) == name for a in c.args)
        for c in script.calls
    )


def _counts_steps(script: ScriptModel, node: cst.CSTNode) -> bool:
    """Inside an assignment to a ``*step*``/``total*`` name, or an argument named
    ``*steps*``, or the bound of a ``range``."""
    for ancestor in script.ancestors(node):
        if isinstance(ancestor, cst.Arg):
            keyword = ancestor.keyword.value if ancestor.keyword else ""
            if "steps" in keyword:
                return True
        if isinstance(ancestor, cst.Call) and dotted(ancestor.func) in ("print", "range"):
            return dotted(ancestor.func) == "range"
        if isinstance(ancestor, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = (
                [t.target for t in ancestor.targets]
                if isinstance(ancestor, cst.Assign)
                else [ancestor.target]
            )
            names = {n for t in targets for n in target_names(t)} | {
                dotted(t) or "" for t in targets
            }
            return any("step" in n or n.rsplit(".", 1)[-1].startswith("total") for n in names)
        if isinstance(ancestor, (cst.SimpleStatementLine, cst.FunctionDef)):
            return False
    return False
