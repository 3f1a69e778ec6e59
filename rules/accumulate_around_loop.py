from collections.abc import Iterator

import libcst as cst

from accelify.analysis.accumulation_steps import accumulation_steps
from accelify.analysis.facts import facts_of
from accelify.analysis.flow import accumulate_context
from accelify.analysis.script_model import Kind, Loop, ScriptModel
from accelify.analysis.syntax import dotted, walk
from accelify.lint.rule import Example, Finding, Rule

_SCRIPT = (
    "import torch\n"
    + "from accelify import Accelerator\n\n"
    + "accelerator = Accelerator(gradient_accumulation_steps={steps})\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "for epoch in range(3):\n"
    + "{body}"
)
#: The whole pass over the loader inside one context.
_AROUND = (
    "    with accelerator.accumulate(model):\n"
    + "        for x, y in loader:\n"
    + "            accelerator.backward((model(x) - y).pow(2).mean())\n"
    + "            optimizer.step()\n"
    + "            optimizer.zero_grad()\n"
)
#: One batch's step inside the context, entered once per batch.
_PER_BATCH = (
    "    for x, y in loader:\n"
    + "        with accelerator.accumulate(model):\n"
    + "            accelerator.backward((model(x) - y).pow(2).mean())\n"
    + "            optimizer.step()\n"
    + "            optimizer.zero_grad()\n"
)
#: A trainer whose ``fit`` enters the context around the loop of its ``train_epoch``.
_TRAINER = (
    "from accelify import Accelerator\n\n\n"
    + "class Trainer:\n"
    + "    def __init__(self, args, model, optimizer, loader):\n"
    + "        self.accelerator = Accelerator(\n"
    + "            gradient_accumulation_steps=args.gradient_accumulation_steps\n"
    + "        )\n"
    + "        self.model, self.optimizer, self.loader = self.accelerator.prepare(\n"
    + "            model, optimizer, loader\n"
    + "        )\n\n"
    + "    def train_epoch(self):\n"
    + "        for x, y in self.loader:\n"
    + "            self.accelerator.backward((self.model(x) - y).pow(2).mean())\n"
    + "            self.optimizer.step()\n"
    + "            self.optimizer.zero_grad()\n\n"
    + "    def fit(self, epochs):\n"
    + "        for epoch in range(epochs):\n"
    + "            with self.accelerator.accumulate(self.model):\n"
    + "                self.train_epoch()\n"
)


class AccumulateAroundLoop(Rule):
    """``with accelerator.accumulate(model):`` around a whole loop over a DataLoader whose
    batches run ``accelerator.backward``. ``accumulate()`` is one micro-batch: entering it
    advances the Accelerator's step counter once and decides, for everything inside, whether
    gradients are synchronised (HF Accelerate's ``_do_sync``, accelify's
    ``GradientState.advance``); the prepared optimizer's ``step()`` and ``zero_grad()`` do
    nothing where they are not. Entered once for the whole loop, with
    ``gradient_accumulation_steps`` = k > 1, only one entry in k syncs: in the other passes
    every step and zero_grad of the loop is skipped and the gradients of the whole pass pile up
    under ``no_sync``; in the pass that syncs, every batch steps with nothing accumulated (its
    loss still divided by k, the first step carrying the piled-up passes). The model trains on
    one epoch in k, with updates k times too small; a context entered once in the whole run
    never syncs, and the model never trains. Nothing fails. Reported at the ``with`` where the
    file fixes k > 1 or takes it from a setting that any run may set (with k = 1 every entry
    syncs, and the context does nothing). The loop is found in the context's body or in a
    function of the file called there (a trainer's ``train_epoch``). Not for a loop over
    something other than a DataLoader (micro-chunks of one batch: one micro-batch, several
    backwards), nor a context entered per batch of an outer DataLoader (its inner loader is
    that batch's micro-batches) or in a function every call of which runs per batch (``def
    train_step(batch)`` called from ``for batch in loader:``), nor where the loop enters an
    ``accumulate()`` of its own."""

    code = "ACC313"
    name = "accumulate-around-loop"
    message = (
        "Enter accelerator.accumulate(model) inside the loop, around one batch's forward, "
        "backward and step: entered once for the whole loop it counts one micro-batch, so "
        "the optimizer steps on one pass in gradient_accumulation_steps and the gradients "
        "pile up in the others"
    )
    why = "accumulate() is one micro-batch: around a whole loop it steps one pass in k."
    bad = (
        Example(_SCRIPT.format(steps=4, body=_AROUND), 7, 5),
        # the steps from the command line: any run may pass 2, 4, 8...
        Example(_SCRIPT.format(steps="args.gradient_accumulation_steps", body=_AROUND), 7, 5),
        # the loop in a method the context's body calls
        Example(_TRAINER, 21, 13),
    )
    good = (
        # entered in a step function that every call runs per batch of the loader: its own
        # loop is over the micro-batches of that batch
        "import torch\n"
        + "from accelify import Accelerator\n\n"
        + "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n\n\n"
        + "def train_step(batch):\n"
        + "    with accelerator.accumulate(model):\n"
        + "        micro = torch.utils.data.DataLoader(batch, batch_size=2)\n"
        + "        for x, y in micro:\n"
        + "            accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        optimizer.step()\n"
        + "        optimizer.zero_grad()\n\n\n"
        + "for epoch in range(3):\n"
        + "    for batch in loader:\n"
        + "        train_step(batch)\n",
        # one batch's step inside the context, entered once per batch
        _SCRIPT.format(steps=4, body=_PER_BATCH),
        # no accumulation: every entry syncs, the context does nothing
        _SCRIPT.format(steps=1, body=_AROUND),
        # micro-chunks of one batch inside the context entered per batch: one micro-batch
        _SCRIPT.format(
            steps=4,
            body="    for x, y in loader:\n"
            + "        with accelerator.accumulate(model):\n"
            + "            for xc, yc in zip(x.chunk(2), y.chunk(2)):\n"
            + "                accelerator.backward((model(xc) - yc).pow(2).mean())\n"
            + "            optimizer.step()\n"
            + "            optimizer.zero_grad()\n",
        ),
        # entered per batch of the outer loader around a DataLoader of that batch's
        # micro-batches: one micro-batch per entry
        _SCRIPT.format(
            steps=4,
            body="    for batch in loader:\n"
            + "        with accelerator.accumulate(model):\n"
            + "            micro = torch.utils.data.DataLoader(batch, batch_size=2)\n"
            + "            for x, y in micro:\n"
            + "                accelerator.backward((model(x) - y).pow(2).mean())\n"
            + "            optimizer.step()\n"
            + "            optimizer.zero_grad()\n",
        ),
        # the same method called from inside a context per batch
        _TRAINER.replace(
            "            with self.accelerator.accumulate(self.model):\n"
            "                self.train_epoch()\n",
            "            self.train_epoch()\n",
        ).replace(
            "            self.accelerator.backward(",
            "            with self.accelerator.accumulate(self.model):\n"
            "                self.accelerator.backward(",
        ),
        # an Accelerator made elsewhere: its steps are unknown here
        _SCRIPT.format(steps=4, body=_AROUND).replace(
            "accelerator = Accelerator(gradient_accumulation_steps=4)\n",
            "accelerator = make_accelerator()\n",
        ),
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        contexts = [
            (node, accelerator)
            for node in walk(script.module)
            if isinstance(node, cst.With) and (accelerator := accumulate_context(node))
        ]
        if not contexts:
            return
        loops = [loop for loop in script.loops if facts_of(script).flow.reads_loader(loop)]
        over_batches = {id(loop.node) for loop in loops}
        for context, accelerator in contexts:
            if _per_batch(script, context, over_batches):
                continue  # entered per batch of an outer loader: its inner loop is micro-batches
            found = _batch_loop_inside(script, context, accelerator, loops)
            if found is None:
                continue
            steps = accumulation_steps(script, accelerator)
            if steps is None or (isinstance(steps, int) and steps <= 1):
                continue
            loop, site = found
            yield self.finding(
                script, context, message=_message(script, context, accelerator, loop, site, steps)
            )


def _per_batch(
    script: ScriptModel, node: cst.CSTNode, over_batches: set[int], depth: int = 0
) -> bool:
    """``node`` runs once per batch of a loop over a DataLoader: inside that loop, or in a
    function of the file whose every call (each known: not handed elsewhere) is
    (``def train_step(batch): with accelerator.accumulate(model): ...`` called from ``for batch
    in loader: train_step(batch)``)."""
    if any(id(a) in over_batches for a in script.ancestors(node)):
        return True
    function = script.index.enclosing_function(node)
    graph = script.call_graph
    if function is None or depth >= 3:
        return False
    callers = graph.callers(function)
    if not callers or graph.references(function) or graph.uncertain_callers(function):
        return False
    return all(
        not script.inside(call, function) and _per_batch(script, call, over_batches, depth + 1)
        for call in callers
    )


def _batch_loop_inside(
    script: ScriptModel, context: cst.With, accelerator: str, loops: list[Loop]
) -> tuple[cst.For, cst.Call | None] | None:
    """A loop over a DataLoader that runs ``accelerator.backward`` for its batches and enters
    no ``accumulate()`` of its own, inside ``context``'s body or in a function of the file a
    call there runs (with that call). The backward may name the accelerator as the function
    it is in has it (a helper's ``acc`` parameter)."""
    accelerators = {accelerator} | script.names_of(Kind.ACCELERATOR)
    for loop in loops:
        if script.inside(loop.node, context.body) and _backward_per_batch(
            script, loop.node, accelerators
        ):
            return loop.node, None
    graph = script.call_graph
    for call in walk(context.body):
        if not isinstance(call, cst.Call):
            continue
        for function, _ in graph.callees(call):
            for loop in loops:
                if script.inside(loop.node, function) and _backward_per_batch(
                    script, loop.node, accelerators
                ):
                    return loop.node, call
    return None


def _backward_per_batch(script: ScriptModel, loop: cst.For, accelerators: set[str]) -> bool:
    """``loop``'s body runs an accelerator's ``backward`` and enters no ``accumulate()``
    itself."""
    backward = False
    for node in walk(loop.body):
        if isinstance(node, cst.With) and accumulate_context(node) is not None:
            return False
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "backward"
            and dotted(node.func.value) in accelerators
        ):
            backward = True
    return backward


def _message(
    script: ScriptModel,
    context: cst.With,
    accelerator: str,
    loop: cst.For,
    site: cst.Call | None,
    steps: int | str,
) -> str:
    code = script.module.code_for_node
    entered = code(context.items[0].item)
    where = f"the loop at line {script.line(loop)}"
    if site is not None:
        where += f" (run by the call at line {script.line(site)})"
    if isinstance(steps, str):
        setting = f"gradient_accumulation_steps = k > 1 (it is {steps}, which a run may set)"
    else:
        setting = f"gradient_accumulation_steps={steps}"
    k = "k" if isinstance(steps, str) else str(steps)
    return (
        f"Enter {entered} inside {where}, around one batch's forward, backward and step: "
        f"entered once for the whole loop it counts one micro-batch, so with {setting} only "
        f"one entry in {k} syncs; in the others every step() and zero_grad() of the prepared "
        f"optimizer in the loop is skipped and the whole pass's gradients pile up, and in the "
        f"one that syncs every batch steps with nothing accumulated (its loss still divided "
        f"by {k}): the model trains on one pass in {k}, and not at all where the context is "
        "entered once in the run"
    )
