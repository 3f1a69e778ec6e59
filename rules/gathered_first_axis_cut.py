from collections.abc import Iterator

import libcst as cst

from accelify.analysis.dataflow import bound_by, statements
from accelify.analysis.evaluation import a_fixed_range, reaches_a_sink
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import target_names, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, calls_accelerator, loop_of

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
        Example(  # cut in the header of a loop over the gathered rows
            HEADER + "for src, trg in loader:\n"
            "    output, trg = accelerator.gather_for_metrics((model(src), trg))\n"
            "    for step_out, step_trg in zip(output[1:], trg[1:]):\n"
            "        total += criterion(step_out, step_trg).item()\n",
            5,
            35,
        ),
        Example(  # cut in the test that decides what is counted
            HEADER + "for src, trg in loader:\n"
            "    output, trg = accelerator.gather_for_metrics((model(src), trg))\n"
            "    if (output[1:].argmax(-1) == trg[1:]).all():\n"
            "        exact += 1\n",
            5,
            9,
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
        # a few samples printed: the cut feeds no metric, and [:8] keeps the first rows
        HEADER + "for step, (x, y) in enumerate(loader):\n"
        "    preds, y = accelerator.gather_for_metrics((model(x).argmax(-1), y))\n"
        "    if step == 0:\n"
        "        print('first predictions', preds[:8].tolist(), y[:8].tolist())\n"
        "    correct += (preds == y).sum().item()\n",
        # the first rows looked at in a header, printed, not scored
        HEADER + "for x, y in loader:\n"
        "    preds = accelerator.gather_for_metrics(model(x))\n"
        "    for p in preds[1:]:\n"
        "        print(p)\n"
        "    if preds[1:].any():\n"
        "        print('nonzero')\n"
        "    correct += (preds == y).sum().item()\n",
        # batch-first when gathered, made time-major again before the cut
        HEADER + "for src, trg in loader:\n"
        "    output, trg = accelerator.gather_for_metrics((model(src, trg), trg))\n"
        "    output, trg = output.transpose(0, 1), trg.transpose(0, 1)\n"
        "    total += criterion(output[1:].flatten(0, 1), trg[1:].flatten()).item()\n",
        # cut before the gather: the gathered value is batch-first
        HEADER + "for src, trg in loader:\n"
        "    output = model(src, trg)[1:].transpose(0, 1)\n"
        "    output = accelerator.gather_for_metrics(output)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for call in calls(script):
            if not calls_accelerator(script, call, _GATHERS):
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
    """The first ``name[1:]`` of a gathered name after the gather, in the same loop, whose
    result feeds the loop's metrics (``total += criterion(output[1:], ...)``, through any chain
    of its assignments); a read after a rebinding of the name to something else is not what the
    gather made, and ``preds[:8]`` (a look at the first few, printed) cuts nothing it scores."""
    parent = script.parent(call)
    if isinstance(parent, cst.Subscript) and parent.value is call and _a_cut(parent):
        return parent if _feeds_a_metric(script, loop, parent) else None
    if not gathered:
        return None
    after = script.order(call)
    rebound = _rebindings(script, loop, gathered, after)
    for node in walk(loop.body):
        if (
            isinstance(node, cst.Subscript)
            and isinstance(node.value, cst.Name)
            and node.value.value in gathered
            and script.order(node) > after
            and _a_cut(node)
            and not any(
                script.order(b) < script.order(node) and not _inside(script, node, b)
                for b in rebound.get(node.value.value, ())
            )
            and _feeds_a_metric(script, loop, node)
        ):
            return node
    return None


def _a_cut(node: cst.Subscript) -> bool:
    """A fixed range of the first dimension that drops a part of it: ``[1:]``, ``[:-1]``,
    ``[1:-1]``; not ``[:k]`` nor ``[0:k]`` (the first k rows kept, a look at a few samples)."""
    if not node.slice or not a_fixed_range(node.slice[0].slice):
        return False
    index = node.slice[0].slice
    if not isinstance(index, cst.Slice):
        return False
    from_start = index.lower is None or (
        isinstance(index.lower, cst.Integer) and index.lower.evaluated_value == 0
    )
    return not from_start or isinstance(index.upper, cst.UnaryOperation)


def _rebindings(
    script: ScriptModel, loop: cst.For, gathered: set[str], after: int
) -> dict[str, list[cst.CSTNode]]:
    """The statements of ``loop`` after the gather that bind a gathered name again."""
    found: dict[str, list[cst.CSTNode]] = {}
    for node in walk(loop.body):
        if script.order(node) <= after:
            continue
        for name in bound_by(node) & gathered:
            found.setdefault(name, []).append(node)
    return found


def _inside(script: ScriptModel, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    return any(a is container for a in script.ancestors(node))


def _feeds_a_metric(script: ScriptModel, loop: cst.For, cut: cst.Subscript) -> bool:
    """The cut is read by one of the loop's metrics (``correct += ...``, ``losses.append``,
    ``metric.add_batch``), in it or through the names the loop binds from it; also from the
    header of a ``for`` or an ``if`` inside the loop (``for p in preds[1:]:``, ``if
    preds[1:].any():``): then through the statements under it, which the cut's rows steer."""
    for node in (cut, *script.ancestors(cut)):
        if node is loop:
            return False
        parent = script.parent(node)
        if isinstance(parent, cst.SimpleStatementLine):
            return reaches_a_sink(node, loop)
        if isinstance(parent, cst.For) and node is parent.iter:
            targets = set(target_names(parent.target))
            return any(
                reaches_a_sink(small, loop)
                for small in statements(parent.body)
                if targets & {n.value for n in walk(small) if isinstance(n, cst.Name)}
            )
        if isinstance(parent, (cst.If, cst.While)) and node is parent.test:
            return any(reaches_a_sink(small, loop) for small in statements(parent))
    return False
