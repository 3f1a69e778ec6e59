from collections.abc import Iterator

import libcst as cst

from accelify.analysis.evaluation import a_fixed_range
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, target_names, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, loop_of

_GATHERS = frozenset({"gather", "gather_for_metrics"})


class GatheredFirstAxisCut(Rule):
    """``output, trg = accelerator.gather_for_metrics((output, trg))`` followed by
    ``output[1:]`` (a seq2seq evaluation whose tensors are [length, batch]): the code cuts a
    fixed range off the first dimension, so that dimension is not the samples. The gather joins
    every rank's tensors along the first dimension and ``gather_for_metrics`` trims it to the
    set's size at the end: joined along the time steps, the cut drops the first rank's first
    step only (the other ranks' start tokens are scored), and the trim drops time steps, not
    repeated samples. A wrong metric with no error, on any run with more than one process.
    Gather tensors whose first dimension is the batch (``output.transpose(0, 1)``) and cut the
    range from the dimension it belongs to."""

    code = "ACC412"
    name = "gathered-first-axis-cut"
    message = (
        "Gather batch-first tensors: the first dimension of a gathered value is cut by a fixed "
        "range here, so it is not the samples, and the gather joins and trims that dimension "
        "(transpose(0, 1) before the gather, cut the dimension it belongs to)"
    )
    why = "gather_for_metrics joins and trims the first dimension; here it is not the samples."
    bad = (
        Example(
            HEADER + "for src, trg in loader:\n"
            "    output = model(src, trg)\n"
            "    output, trg = accelerator.gather_for_metrics((output, trg))\n"
            "    output = output[1:].view(-1, output.shape[-1])\n"
            "    total += criterion(output, trg[1:].view(-1)).item()\n",
            6,
            14,
        ),
        Example(  # one value gathered, cut in the metric itself
            HEADER + "for src, trg in loader:\n"
            "    logits = accelerator.gather_for_metrics(model(src))\n"
            "    correct += (logits[:-1].argmax(-1) == trg).sum().item()\n",
            5,
            17,
        ),
    )
    good = (
        HEADER + "for src, trg in loader:\n"
        "    output = model(src, trg)\n"
        "    output, trg = accelerator.gather_for_metrics((output, trg))\n"
        "    output = output[:, 1:].reshape(-1, output.shape[-1])\n"
        "    total += criterion(output, trg[:, 1:].reshape(-1)).item()\n",
        # the repeats dropped by hand, to a length the loop computes
        HEADER + "for step, (x, y) in enumerate(loader):\n"
        "    preds = accelerator.gather(model(x))\n"
        "    preds = preds[: len(loader.dataset) - seen]\n",
        # a tuple output unpacked by position, and a reversal
        HEADER + "for x, y in loader:\n"
        "    outputs = accelerator.gather_for_metrics(model(x))\n"
        "    logits = outputs[0][::-1]\n",
        # cut before the gather: the gathered value is batch-first
        HEADER + "for src, trg in loader:\n"
        "    output = model(src, trg)[1:].transpose(0, 1)\n"
        "    output = accelerator.gather_for_metrics(output)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        accelerators = script.names_of(Kind.ACCELERATOR)
        for call in calls(script):
            func = call.func
            if not (
                isinstance(func, cst.Attribute)
                and func.attr.value in _GATHERS
                and dotted(func.value) in accelerators
            ):
                continue
            loop = loop_of(script, call)
            if loop is None:
                continue
            gathered = _gathered_names(script, call)
            cut = _first_cut(script, loop, call, gathered)
            if cut is not None:
                yield self.finding(script, cut)


def _gathered_names(script: ScriptModel, call: cst.Call) -> set[str]:
    """The names a gather's result is bound to (``output, trg = ...``), or a placeholder for
    a result read in place (``accelerator.gather_for_metrics(x)[1:]``)."""
    parent = script.parent(call)
    if isinstance(parent, cst.Assign) and parent.value is call:
        return {name for t in parent.targets for name in target_names(t.target)}
    return set()


def _first_cut(
    script: ScriptModel, loop: cst.For, call: cst.Call, gathered: set[str]
) -> cst.Subscript | None:
    """The first ``name[1:]`` of a gathered name after the gather, in the same loop (a read
    before any rebinding of the name to something else is what the gather made)."""
    parent = script.parent(call)
    if (
        isinstance(parent, cst.Subscript)
        and parent.value is call
        and parent.slice
        and a_fixed_range(parent.slice[0].slice)
    ):
        return parent
    if not gathered:
        return None
    after = script.order(call)
    for node in walk(loop.body):
        if (
            isinstance(node, cst.Subscript)
            and isinstance(node.value, cst.Name)
            and node.value.value in gathered
            and node.slice
            and script.order(node) > after
            and a_fixed_range(node.slice[0].slice)
        ):
            return node
    return None
