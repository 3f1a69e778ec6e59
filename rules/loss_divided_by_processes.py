from collections.abc import Iterator

import libcst as cst

from accelify.analysis.collectives import combines_ranks
from accelify.analysis.facts import facts_of
from accelify.analysis.loss_sources import Backward, backwards, loss_sources
from accelify.analysis.process_count import mean_reduce, process_count
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls_accelerator

_DIFFERENTIABLE_PREFIX = "torch.distributed.nn."


class LossDividedByProcesses(Rule):
    """A loss divided by the number of processes (``loss / accelerator.num_processes``, ``/
    world_size``, ``/ dist.get_world_size()``) before its backward. DDP (and FSDP, DeepSpeed)
    already average the gradients over the ranks, so the division scales every gradient by
    1/N: on 2 ranks the gradients after one step are half those of 1 process on the same data
    (checked with accelify's runtime and HF Accelerate), and the effective learning rate
    changes with the number of processes, silently. ``accelerator.reduce(loss, "mean")`` before the
    backward does the same: the all-reduce carries no gradient, so the backward sees this
    rank's loss divided by N.

    Backpropagate the rank's own mean loss, undivided; divide only what you log
    (``accelerator.reduce(loss.detach(), "sum") / accelerator.num_processes``). Not reported:
    the same division of a value that is only logged, a loss first summed over the ranks with
    a differentiable all-reduce (``torch.distributed.nn.all_reduce``, a custom autograd
    function), a denominator divided by N (a token count averaged over ranks), a script that
    all-reduces the gradients itself with a sum (then the division makes the mean), and a
    division by the accumulation steps (ACC303's)."""

    code = "ACC309"
    name = "loss-divided-by-processes"
    message = (
        "Do not divide the loss by the number of processes before backward: DDP already "
        "averages gradients over ranks, so this scales every gradient by 1/N and the learning "
        "rate changes with the process count; divide only the value you log"
    )
    why = "Gradients are averaged over ranks already; dividing the loss by N shrinks them N-fold."
    bad = (
        Example(
            HEADER + "for x, y in loader:\n"
            "    loss = criterion(model(x), y)\n"
            "    loss = loss / accelerator.num_processes\n"
            "    accelerator.backward(loss)\n",
            5,
            12,
        ),
        Example(  # torch.distributed's world size, divided in place
            HEADER + "import torch.distributed as dist\n"
            "for x, y in loader:\n"
            "    loss = criterion(model(x), y)\n"
            "    loss /= dist.get_world_size()\n"
            "    accelerator.backward(loss)\n",
            6,
            5,
        ),
        Example(  # a trainer method: the state's count, through a name bound to it
            "from accelerate import Accelerator\n"
            "class Trainer:\n"
            "    def __init__(self):\n"
            "        self.accelerator = Accelerator()\n"
            "        self.world_size = self.accelerator.state.num_processes\n"
            "    def training_step(self, batch):\n"
            "        loss = self.model(**batch).loss\n"
            "        self.accelerator.backward(loss / self.world_size)\n",
            8,
            35,
        ),
        Example(  # a helper handed the accelerator; the division inside the backward's loss
            "from accelerate import Accelerator\n"
            "def train_epoch(accelerator, model, loader, optimizer):\n"
            "    world_size = accelerator.num_processes\n"
            "    for batch in loader:\n"
            "        loss = model(**batch).loss / world_size\n"
            "        accelerator.backward(loss)\n"
            "        optimizer.step()\n",
            5,
            16,
        ),
        Example(  # averaged over ranks with reduce: no gradient through it, the rank's loss / N
            HEADER + "for x, y in loader:\n"
            "    loss = criterion(model(x), y)\n"
            '    loss = accelerator.reduce(loss, reduction="mean")\n'
            "    accelerator.backward(loss)\n",
            5,
            12,
        ),
    )
    good = (
        # the global batch split over the ranks: the loader's batch size, not the loss, is
        # divided (the model reached through ``.to(model.device)`` is no value of the loss)
        "from accelerate import Accelerator\n"
        "from project.data import get_local_dataloader\n"
        "def train(accelerator, model, optimizer, scheduler, args):\n"
        "    per_rank = int(args.batch_size / accelerator.num_processes)\n"
        "    loader = get_local_dataloader(args.shards, per_rank)\n"
        "    steps = len(loader.dataset) // args.batch_size\n"
        "    scheduler = make_scheduler(optimizer, steps * accelerator.num_processes)\n"
        "    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)\n"
        "    for batch in loader:\n"
        "        out = model(input_ids=batch['ids'].to(model.device))\n"
        "        accelerator.backward(clip_loss(out['embedding'], step=steps))\n"
        "        optimizer.step()\n"
        "        scheduler.step()\n"
        "train(Accelerator(), model, optimizer, scheduler, args)\n",
        HEADER + "for x, y in loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    accelerator.backward(loss)\n"
        '    logged = accelerator.reduce(loss.detach(), "sum") / accelerator.num_processes\n'
        "    accelerator.log({'loss': logged.item()})\n",
        # summed over ranks with a differentiable all-reduce, then divided: the global mean
        HEADER + "import torch.distributed.nn.functional as dist_fn\n"
        "for x, y in loader:\n"
        "    loss = dist_fn.all_reduce(criterion(model(x), y)) / accelerator.num_processes\n"
        "    accelerator.backward(loss)\n",
        # a token count averaged over the ranks: the denominator, not the loss, is divided
        HEADER + "for batch in loader:\n"
        "    n = accelerator.gather(batch['n_tokens']).sum() / accelerator.num_processes\n"
        "    loss = model(**batch).loss_sum / n\n"
        "    accelerator.backward(loss)\n",
        # the accumulation steps (ACC303 reports a double division)
        HEADER + "for x, y in loader:\n"
        "    loss = criterion(model(x), y) / args.gradient_accumulation_steps\n"
        "    accelerator.backward(loss)\n",
        # gradients summed by hand over the ranks: the division makes them a mean
        HEADER + "import torch.distributed as dist\n"
        "for x, y in loader:\n"
        "    loss = criterion(model(x), y) / dist.get_world_size()\n"
        "    accelerator.backward(loss)\n"
        "    for p in model.parameters():\n"
        "        dist.all_reduce(p.grad)\n"
        "    optimizer.step()\n",
        # a trainer that averages the gradients itself (Accelerate's reduce is a sum)
        "from accelerate import Accelerator\n"
        "class Trainer:\n"
        "    def __init__(self):\n"
        "        self.accelerator = Accelerator()\n"
        "    def step(self, batch):\n"
        "        loss = self.model(**batch).loss / self.accelerator.num_processes\n"
        "        loss.backward()\n"
        "        for p in self.model.parameters():\n"
        "            p.grad = self.accelerator.reduce(p.grad)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if _sums_gradients_by_hand(script):
            return
        reported: set[int] = set()
        for backward in backwards(script):
            division = _division_by_processes(script, backward)
            if division is not None and id(division) not in reported:
                reported.add(id(division))
                yield self.finding(script, division)


def _division_by_processes(script: ScriptModel, backward: Backward) -> cst.CSTNode | None:
    """The first division of the loss by the process count on its way to ``backward`` (or a
    mean ``reduce`` of it), unless a differentiable all-reduce summed it over the ranks."""
    sources = list(loss_sources(script, backward.loss, backward.call))
    if any(_differentiable_collective(script, node) for node in sources):
        return None
    found = [node for node in sources if _divides_by_processes(script, node)]
    return min(found, key=script.order) if found else None


def _divides_by_processes(script: ScriptModel, node: cst.CSTNode) -> bool:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide):
        return process_count(script, node.right, node)
    if isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.DivideAssign):
        return process_count(script, node.value, node)
    return isinstance(node, cst.Call) and mean_reduce(script, node)


def _differentiable_collective(script: ScriptModel, node: cst.CSTNode) -> bool:
    """``torch.distributed.nn.all_reduce(loss)`` or a custom autograd function's ``.apply``:
    a sum over ranks that the backward goes through."""
    if not isinstance(node, cst.Call):
        return False
    if any(name.startswith(_DIFFERENTIABLE_PREFIX) for name in script.call_names(node)):
        return True
    func = node.func
    return isinstance(func, cst.Attribute) and func.attr.value == "apply"


def _sums_gradients_by_hand(script: ScriptModel) -> bool:
    """The file all-reduces ``.grad`` itself (``dist.all_reduce(p.grad)``, ``p.grad =
    accelerator.reduce(p.grad)``, both sums by default): dividing the loss by N makes a mean."""
    return any(
        _combines_ranks(script, call)
        and any(
            isinstance(n, cst.Attribute) and n.attr.value == "grad"
            for arg in call.args
            for n in walk(arg.value)
        )
        for call in script.calls
    )


def _combines_ranks(script: ScriptModel, call: cst.Call) -> bool:
    accelerators = facts_of(script).flow.names_of(Kind.ACCELERATOR)
    return calls_accelerator(script, call, ("reduce", "gather"), accelerators) or combines_ranks(
        script, call
    )
