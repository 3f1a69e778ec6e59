from collections.abc import Iterator

from accelify.analysis.collective_order import OrderMismatch, Step, order_mismatches
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.lint.rule import Example, Finding, Rule

_EVAL = (
    "import torch\n"
    + "from accelify import Accelerator\n\n"
    + "accelerator = Accelerator()\n"
    + "model, loader = accelerator.prepare(model, loader)\n"
    + "for x, y in loader:\n"
    + "    out = model(x)\n"
    + "{split}"
    + "    accelerator.print(preds.shape, labels.shape)\n"
)
_SWAPPED = (
    "    if accelerator.is_main_process:\n"
    + "        preds = accelerator.gather_for_metrics(out)\n"
    + "        labels = accelerator.gather_for_metrics(y)\n"
    + "    else:\n"
    + "        labels = accelerator.gather_for_metrics(y)\n"
    + "        preds = accelerator.gather_for_metrics(out)\n"
)
_IN_ORDER = _SWAPPED.replace(
    "        labels = accelerator.gather_for_metrics(y)\n"
    "        preds = accelerator.gather_for_metrics(out)\n",
    "        preds = accelerator.gather_for_metrics(out)\n"
    "        labels = accelerator.gather_for_metrics(y)\n",
)


class CollectivesOutOfOrder(Rule):
    """The two sides of a rank test making different sequences of collectives: ``if
    accelerator.is_main_process: a = gather(x); b = gather(y)`` with ``else: b = gather(y); a
    = gather(x)``, or the same split written as two ``if``s of one block (``if rank == 0:
    gather(a)``, ``gather(b)``, ``if rank != 0: gather(a)``). Collectives meet by their order,
    not by their names: the n-th collective of one rank meets the n-th of every other. Handed
    the same values in another order, the main process's ``x`` is joined with the other ranks'
    ``y`` (a silently swapped metric where the shapes agree, a size error or a hang where they
    do not); a gather meeting a reduce or a barrier, or one side making one more gather,
    waits forever (a hang). ACC202 does not report these: each kind of collective is called on
    every rank, somewhere (a kind one side never makes is ACC202's finding). Only straight
    code is compared (no collective under a branch, loop or ``try`` of its own on either
    side, no early ``return``/``break``), on DDP; sides that
    differ only in what they hand (``gather(torch.zeros_like(x))``: the other ranks'
    stand-in) agree. The fix makes the same collectives in the same order on every rank,
    usually by moving them out of the test."""

    code = "ACC214"
    name = "collectives-out-of-order"
    message = (
        "Make the same collectives in the same order on every rank: the two sides of this "
        "rank test call them in different orders, so each rank's collective meets another one "
        "(values swapped between ranks, or a hang)"
    )
    why = "Collectives meet by order: two sides of a rank test calling them in other orders."
    bad = (
        Example(_EVAL.format(split=_SWAPPED), 9, 17),
        # two ``if``s on the negated test with an unconditional gather between
        Example(
            _EVAL.format(
                split="    if accelerator.is_main_process:\n"
                + "        preds = accelerator.gather_for_metrics(out)\n"
                + "    labels = accelerator.gather_for_metrics(y)\n"
                + "    if not accelerator.is_main_process:\n"
                + "        preds = accelerator.gather_for_metrics(out)\n"
            ),
            9,
            17,
        ),
        # the test kept by a walrus and negated through its name below: the same split
        Example(
            _EVAL.format(
                split="    if (is_main := accelerator.is_main_process):\n"
                + "        preds = accelerator.gather_for_metrics(out)\n"
                + "    labels = accelerator.gather_for_metrics(y)\n"
                + "    if not is_main:\n"
                + "        preds = accelerator.gather_for_metrics(out)\n"
            ),
            9,
            17,
        ),
        # a gather on one side meets a barrier on the other (hang): the same two kinds
        # in another order
        Example(
            _EVAL.format(
                split="    if accelerator.process_index == 0:\n"
                + "        preds = accelerator.gather(out)\n"
                + "        accelerator.wait_for_everyone()\n"
                + "    else:\n"
                + "        accelerator.wait_for_everyone()\n"
                + "        preds = accelerator.gather(out)\n"
                + "    labels = y\n"
            ),
            9,
            17,
        ),
    )
    good = (
        # the same order on both sides
        _EVAL.format(split=_IN_ORDER),
        # the others hand a stand-in in the same place
        _EVAL.format(
            split=_IN_ORDER.replace(
                "        preds = accelerator.gather_for_metrics(out)\n"
                "        labels = accelerator.gather_for_metrics(y)\n    else:",
                "        preds = accelerator.gather_for_metrics(out)\n"
                "        labels = accelerator.gather_for_metrics(y)\n    else:",
            ).replace(
                "    else:\n        preds = accelerator.gather_for_metrics(out)\n",
                "    else:\n"
                "        preds = accelerator.gather_for_metrics(torch.zeros_like(out))\n",
            )
        ),
        # the main-first idiom written out by hand: each rank reaches the barrier once
        _EVAL.format(
            split="    if not accelerator.is_main_process:\n"
            + "        accelerator.wait_for_everyone()\n"
            + "    preds, labels = out, y\n"
            + "    if accelerator.is_main_process:\n"
            + "        accelerator.wait_for_everyone()\n"
        ),
        # ... also with the test kept by a walrus and negated through its name
        _EVAL.format(
            split="    if not (is_main := accelerator.is_main_process):\n"
            + "        accelerator.wait_for_everyone()\n"
            + "    preds, labels = out, y\n"
            + "    if is_main:\n"
            + "        accelerator.wait_for_everyone()\n"
        ),
        # a kind only one side makes: ACC202's collective on some ranks, not this rule's
        _EVAL.format(
            split="    if accelerator.is_main_process:\n"
            + "        preds = accelerator.gather(out)\n"
            + "    else:\n"
            + "        accelerator.wait_for_everyone()\n"
            + "        preds = out\n"
            + "    labels = y\n"
        ),
        # a side that may skip its gathers: not one sequence, not compared
        _EVAL.format(
            split=_SWAPPED.replace(
                "    else:\n        labels",
                "    else:\n        if y.numel() == 0:\n            continue\n        labels",
            )
        ),
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        facts = facts_of(script)
        uses = facts.collective_uses
        if len(uses) < 2:
            return
        for mismatch in order_mismatches(script, uses):
            yield self.finding(script, _reported_at(mismatch), message=_message(script, mismatch))


def _reported_at(mismatch: OrderMismatch) -> object:
    """The first collective where the sides part, on the side the test lets in (else the
    other side's, where the tested side has no more)."""
    if mismatch.at < len(mismatch.tested):
        return mismatch.tested[mismatch.at].call
    return mismatch.others[mismatch.at].call


def _describe(script: ScriptModel, steps: list[Step]) -> str:
    code = script.module.code_for_node
    return (
        ", ".join(
            f"{code(step.call.func)}({step.operand}) (line {script.line(step.call)})"
            for step in steps
        )
        or "none"
    )


def _message(script: ScriptModel, mismatch: OrderMismatch) -> str:
    test = script.module.code_for_node(mismatch.test.test)
    sides = (
        f"where `{test}` holds: {_describe(script, mismatch.tested)}; on the other ranks: "
        f"{_describe(script, mismatch.others)}"
    )
    if mismatch.swapped:
        effect = (
            "each rank's collective meets the other ranks' one of another value: the values "
            "are swapped between ranks (a wrong result where the shapes agree, a size error or a "
            "hang where they do not)"
        )
    else:
        effect = (
            "each rank's collective meets another kind or finds none on the other ranks (a hang)"
        )
    return (
        f"Make the same collectives in the same order on every rank ({sides}): collectives meet "
        f"by order, not by name, so {effect}; call them once, in one order, outside the rank "
        "test"
    )
