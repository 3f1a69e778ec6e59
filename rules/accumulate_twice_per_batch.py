import functools
from collections.abc import Iterator

import libcst as cst

from accelify.analysis.accumulation_steps import accumulation_steps
from accelify.analysis.flow import accumulate_context
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import children_of, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule

_GAN = (
    "import torch\n"
    + HEADER.replace("Accelerator()", "Accelerator(gradient_accumulation_steps={steps})")
    + "G, D, opt_G, opt_D, loader = accelerator.prepare(G, D, opt_G, opt_D, loader)\n"
    + "for real in loader:\n"
    + "    with accelerator.accumulate(D):\n"
    + "        fake = G(torch.randn(8, 16)).detach()\n"
    + "        accelerator.backward(D(fake).mean() - D(real).mean())\n"
    + "        opt_D.step()\n"
    + "        opt_D.zero_grad()\n"
    + "    with accelerator.accumulate(G):\n"
    + "        accelerator.backward(-D(G(torch.randn(8, 16))).mean())\n"
    + "        opt_G.step()\n"
    + "        opt_G.zero_grad()\n"
)

_IN_TRAIN = (
    "import torch\n"
    + "from accelify import Accelerator\n\n\n"
    + "def train(steps=2):\n"
    + "    accelerator = Accelerator(gradient_accumulation_steps=steps)\n"
    + "    G, D, opt_G, opt_D, loader = accelerator.prepare(G, D, opt_G, opt_D, loader)\n"
    + "    for real in loader:\n"
    + "        with accelerator.accumulate(D):\n"
    + "            accelerator.backward(D(G(torch.randn(8, 16)).detach()).mean())\n"
    + "            opt_D.step()\n"
    + "        with accelerator.accumulate(G):\n"
    + "            accelerator.backward(-D(G(torch.randn(8, 16))).mean())\n"
    + "            opt_G.step()\n\n\n"
    + "{call}\n"
)


#: A GAN trainer that is handed the accelerator (a texturizer's): main() makes it with the
#: configured steps, the trainer's step method updates D then G in two contexts.
_HANDED = (
    "import torch\n"
    "from accelerate import Accelerator\n\n\n"
    "class GANTrainer:\n"
    "    def __init__(self, gen, discr, opt_G, opt_D, loader, accelerator):\n"
    "        self.gen, self.discr, self.opt_G, self.opt_D = gen, discr, opt_G, opt_D\n"
    "        self.loader = loader\n"
    "        self.accelerator = accelerator\n\n"
    "    def train_step(self, real):\n"
    "        with self.accelerator.accumulate(self.discr):\n"
    "            fake = self.gen(torch.randn(8, 16)).detach()\n"
    "            self.accelerator.backward(self.discr(fake).mean() - self.discr(real).mean())\n"
    "            self.opt_D.step()\n"
    "        with self.accelerator.accumulate(self.gen):\n"
    "            self.accelerator.backward(-self.discr(self.gen(torch.randn(8, 16))).mean())\n"
    "            self.opt_G.step()\n\n"
    "    def train(self):\n"
    "        for real in self.loader:\n"
    "            self.train_step(real)\n\n\n"
    "def main(config):\n"
    "    accelerator = Accelerator(gradient_accumulation_steps={steps})\n"
    "    gen, discr, opt_G, opt_D, loader = accelerator.prepare(gen, discr, opt_G, opt_D, loader)\n"
    "    GANTrainer(gen, discr, opt_G, opt_D, loader, accelerator).train()\n"
)

#: Statements between a context and the loop (or function) around it that may not run on every
#: iteration (a branch, a loop of its own, a handler) or that start another scope.
_CONDITIONAL = (
    cst.If,
    cst.IfExp,
    cst.For,
    cst.While,
    cst.ExceptHandler,
    cst.Else,
    cst.BooleanOperation,
    cst.FunctionDef,
    cst.ClassDef,
    cst.Lambda,
    cst.ListComp,
    cst.SetComp,
    cst.DictComp,
    cst.GeneratorExp,
)
#: The same, tested by exact type (none of them has subclasses): ``isinstance`` against a tuple
#: of libcst's classes runs ABCMeta's check per class for every ancestor of every call asked.
_CONDITIONAL_TYPES = frozenset(_CONDITIONAL)
_BLOCKS = (cst.IndentedBlock, cst.Module)


class AccumulateTwicePerBatch(Rule):
    """Two ``accelerator.accumulate(...)`` contexts entered on every batch (a GAN's ``with
    accumulate(D): ... opt_D.step()`` then ``with accumulate(G): ... opt_G.step()``) with an
    even ``gradient_accumulation_steps``. Each entry of ``accumulate()`` counts one micro-batch
    on the Accelerator's one step counter (HF Accelerate's ``_do_sync``, accelify's
    ``GradientState.advance``), and the prepared optimizers step only when that count reaches a
    multiple of the steps: with 2 contexts per batch and steps = 2k, the first context always
    lands on an odd count, so its optimizer never steps (only on the loader's last batch, with
    the whole epoch's gradients piled up), while the second steps every k batches on k batches'
    gradients divided by 2k. Nothing fails; the first model does not train. (With odd steps
    each context still syncs every ``steps`` batches: not reported; nor a context entered under
    a branch or after an ``if`` that may ``continue`` first, or a plugin's steps.) Steps that
    come from a setting (``args.gradient_accumulation_steps``, in place or through a parameter
    every call passes it to) are reported: the flag is there to be set, and 2, 4 or 8 make the
    first model stop training without a word. The fix
    enters one context per batch for every model it trains: ``with accelerator.accumulate(D,
    G):`` around both updates."""

    code = "ACC311"
    name = "accumulate-twice-per-batch"
    message = (
        "Enter accelerator.accumulate once per batch, for every model (accumulate(D, G)): each "
        "accumulate() counts one micro-batch, so with even gradient_accumulation_steps the "
        "first context's optimizer never steps"
    )
    why = "Two accumulate() per batch share one step counter: the first model never steps."
    bad = (
        Example(_GAN.format(steps=2), 11, 10),
        # a `break` before the second context ends the loop: every batch it goes on with
        # still enters both
        Example(
            _GAN.format(steps=2).replace(
                "    with accelerator.accumulate(G)",
                "    if real.isnan().any():\n        break\n    with accelerator.accumulate(G)",
            ),
            13,
            10,
        ),
        # the two updates in methods the loop calls, the steps a constant of the file
        Example(
            "import torch\n"
            + HEADER.replace(
                "Accelerator()", "Accelerator(gradient_accumulation_steps=ACCUMULATION)"
            ).replace("accelerator = ", "ACCUMULATION = 4\naccelerator = ")
            + "\n\nclass Trainer:\n"
            + "    def critic_step(self, real):\n"
            + "        with accelerator.accumulate(self.critic):\n"
            + "            accelerator.backward(self.critic(real).mean())\n"
            + "            self.opt_critic.step()\n\n"
            + "    def actor_step(self, real):\n"
            + "        with accelerator.accumulate(self.actor):\n"
            + "            accelerator.backward(self.actor(real).mean())\n"
            + "            self.opt_actor.step()\n\n"
            + "    def fit(self, loader):\n"
            + "        for real in loader:\n"
            + "            self.critic_step(real)\n"
            + "            self.actor_step(real)\n",
            21,
            13,
        ),
        # the steps a parameter's default, which the one call leaves in place
        Example(_IN_TRAIN.format(call="train()"), 12, 14),
        # the steps from the command line: any run may pass an even number (2, 4, 8...)
        Example(_GAN.format(steps="args.gradient_accumulation_steps"), 11, 10),
        # ... also handed to the function that makes the Accelerator
        Example(_IN_TRAIN.format(call="train(args.gradient_accumulation_steps)"), 12, 14),
        # a trainer handed the accelerator main() makes with the configured steps
        Example(_HANDED.format(steps="config.gradient_accumulation_steps"), 22, 13),
    )
    good = (
        # one context per batch for both models
        "import torch\n"
        + HEADER.replace("Accelerator()", "Accelerator(gradient_accumulation_steps=2)")
        + "G, D, opt_G, opt_D, loader = accelerator.prepare(G, D, opt_G, opt_D, loader)\n"
        + "for real in loader:\n"
        + "    with accelerator.accumulate(D, G):\n"
        + "        accelerator.backward(D(G(torch.randn(8, 16)).detach()).mean())\n"
        + "        opt_D.step()\n"
        + "        accelerator.backward(-D(G(torch.randn(8, 16))).mean())\n"
        + "        opt_G.step()\n",
        # odd steps: each context still syncs every 3 batches
        _GAN.format(steps=3),
        # no accumulation: every entry syncs
        _GAN.format(steps=1),
        # the generator updated every fifth batch only (a WGAN's critic loop): left to review
        "import torch\n"
        + HEADER.replace("Accelerator()", "Accelerator(gradient_accumulation_steps=2)")
        + "G, D, opt_G, opt_D, loader = accelerator.prepare(G, D, opt_G, opt_D, loader)\n"
        + "for step, real in enumerate(loader):\n"
        + "    with accelerator.accumulate(D):\n"
        + "        accelerator.backward(D(G(torch.randn(8, 16)).detach()).mean())\n"
        + "        opt_D.step()\n"
        + "    if step % 5 == 0:\n"
        + "        with accelerator.accumulate(G):\n"
        + "            accelerator.backward(-D(G(torch.randn(8, 16))).mean())\n"
        + "            opt_G.step()\n",
        # ... or behind a `continue` on the other batches
        "import torch\n"
        + HEADER.replace("Accelerator()", "Accelerator(gradient_accumulation_steps=2)")
        + "G, D, opt_G, opt_D, loader = accelerator.prepare(G, D, opt_G, opt_D, loader)\n"
        + "for step, real in enumerate(loader):\n"
        + "    with accelerator.accumulate(D):\n"
        + "        accelerator.backward(D(G(torch.randn(8, 16)).detach()).mean())\n"
        + "        opt_D.step()\n"
        + "    if step % 5 != 0:\n"
        + "        continue\n"
        + "    with accelerator.accumulate(G):\n"
        + "        accelerator.backward(-D(G(torch.randn(8, 16))).mean())\n"
        + "        opt_G.step()\n",
        # the steps a parameter some call sets to an odd number, another to its own value
        _IN_TRAIN.format(call="train(3)\ntrain(steps=5)"),
        # the handed accelerator made with odd steps: each context syncs every 3 batches
        _HANDED.format(steps=3),
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for loop in script.loops:
            entered = _entered_every_iteration(script, loop.node)
            for accelerator in dict.fromkeys(acc for _, acc, _ in entered):
                contexts = [(w, site) for w, acc, site in entered if acc == accelerator]
                if len(contexts) < 2:
                    continue
                steps = _even_steps(script, accelerator)
                if steps is None:
                    continue
                (first, first_site), (second, site) = contexts[0], contexts[1]
                yield self.finding(
                    script,
                    site if site is not None else second.items[0].item,
                    message=_message(script, accelerator, first, first_site, second, site, steps),
                )


def _entered_every_iteration(
    script: ScriptModel, loop: cst.For | cst.While
) -> list[tuple[cst.With, str, cst.Call | None]]:
    """The ``accumulate()`` contexts each iteration of ``loop`` enters, in order, with their
    accelerator: in its body, or at the top of a function a call in its body runs (with that
    call), neither under a branch nor in a loop of their own."""
    found: list[tuple[int, cst.With, str, cst.Call | None]] = []
    skipped: dict[tuple[int, type], int] = {}
    for node in walk(loop.body):
        kind = type(node)
        if kind is cst.With and _always(script, node, loop, skipped):
            accelerator = accumulate_context(node)
            if accelerator is not None:
                found.append((script.order(node), node, accelerator, None))
        elif kind is cst.Call and _always(script, node, loop, skipped):
            for function, _ in script.call_graph.callees(node):
                for inner in walk(function.body):
                    if type(inner) is cst.With and _always(script, inner, function, skipped):
                        accelerator = accumulate_context(inner)
                        if accelerator is not None:
                            found.append((script.order(node), inner, accelerator, node))
    found.sort(key=lambda entry: entry[0])
    return [(w, accelerator, site) for _, w, accelerator, site in found]


def _always(
    script: ScriptModel,
    node: cst.CSTNode,
    container: cst.CSTNode,
    skipped: dict[tuple[int, type], int],
) -> bool:
    """``node`` runs whenever ``container``'s body does: nothing between them branches, and no
    statement before it may skip the rest of the iteration (a ``continue``: WGAN's ``if i %
    n_critic != 0: continue`` before the generator's ``accumulate(G)``) or of the call (a
    ``return`` in the function the loop calls). A ``break`` or ``raise`` ends the loop: every
    batch it goes on with still enters the context. ``skipped``: each block's first statement
    that may skip, by the block's id and the skip (asked for every call of a loop's body)."""
    skip = cst.Return if type(container) is cst.FunctionDef else cst.Continue
    for ancestor in (node, *script.ancestors(node)):
        if ancestor is container:
            return True
        if type(ancestor) in _CONDITIONAL_TYPES and ancestor is not node:
            return False
        block = script.parent(ancestor)
        if type(block) in _BLOCKS:
            key = (id(block), skip)
            first = skipped.get(key)
            if first is None:
                first = skipped[key] = next(
                    (i for i, s in enumerate(block.body) if _skips_rest(s, skip)), len(block.body)
                )
            if first < block.body.index(ancestor):  # type: ignore[arg-type]
                return False
    return False


def _skips_rest(statement: cst.CSTNode, skip: type[cst.Continue] | type[cst.Return]) -> bool:
    """``statement`` holds a ``skip`` (``continue`` or ``return``) of the loop or function it is
    in: not one of a function defined in it, nor a ``continue`` of a loop of its own. An
    expression or another simple statement holds no statement: not walked (most of a block's
    nodes)."""
    kind = type(statement)
    if kind is skip:
        return True
    if _holds_no_statement(kind) or kind is cst.FunctionDef or kind is cst.ClassDef:
        return False
    if skip is cst.Continue and (kind is cst.For or kind is cst.While):
        return False
    return any(_skips_rest(child, skip) for child in children_of(statement))


@functools.cache
def _holds_no_statement(kind: type) -> bool:
    """An expression (a ``lambda`` too) or a simple statement other than the skip: nothing
    below it is a statement, so no ``continue`` or ``return``."""
    return issubclass(kind, (cst.BaseExpression, cst.BaseSmallStatement))


def _even_steps(script: ScriptModel, accelerator: str) -> int | str | None:
    """The even ``gradient_accumulation_steps`` the file gives ``accelerator``
    (`accumulation_steps`), or the setting it comes from, which any run may set to an even
    number; else None."""
    steps = accumulation_steps(script, accelerator)
    if isinstance(steps, str):
        return steps
    return steps if steps is not None and steps > 1 and steps % 2 == 0 else None


def _message(
    script: ScriptModel,
    accelerator: str,
    first: cst.With,
    first_site: cst.Call | None,
    second: cst.With,
    second_site: cst.Call | None,
    steps: int | str,
) -> str:
    models = [
        script.module.code_for_node(argument.value)
        for context in (first, second)
        for item in context.items
        if isinstance(item.item, cst.Call)
        for argument in item.item.args
    ]
    together = ", ".join(dict.fromkeys(models)) or "model"
    if isinstance(steps, str):  # a setting: any run may pass an even number
        setting = (
            f"an even gradient_accumulation_steps (it is {steps}, which a run may set to 2, 4, "
            "8...)"
        )
        stepping = "every steps/2 batches on steps/2 batches' gradients divided by steps"
    else:
        setting = f"gradient_accumulation_steps={steps}"
        half = "one batch's" if steps == 2 else f"{steps // 2} batches'"
        every = "every batch" if steps == 2 else f"every {steps // 2} batches"
        stepping = f"{every} on {half} gradients divided by {steps}"
    entered = f"line {script.line(first)}"
    if first_site is not None:
        entered += f", through the call at line {script.line(first_site)}"
    context = script.module.code_for_node(second.items[0].item)
    this = f"this {context}"
    if second_site is not None:
        this = f"this call's {context} (line {script.line(second)})"
    return (
        f"Enter {accelerator}.accumulate once per batch, for every model: {this} comes after "
        f"this batch already "
        f"entered {script.module.code_for_node(first.items[0].item)} ({entered}), and each "
        f"accumulate() counts one micro-batch on the Accelerator's one step counter, so with "
        f"{setting} the first context never reaches a sync step: its "
        f"optimizer never steps (only on the loader's last batch, with the epoch's gradients "
        f"piled up) while the one under this context steps {stepping}; wrap both updates in one "
        f"`with {accelerator}.accumulate({together}):`"
    )
