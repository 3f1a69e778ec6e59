from collections.abc import Callable, Iterator

import libcst as cst

from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import dotted, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_name

_TOGGLE = (
    "import torch\n"
    + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "for x, y in loader:\n"
    + "    loss = (model(x) - y).pow(2).mean()\n"
    + "    if args.use_accelerate:\n"
    + "        accelerator.backward(loss)\n"
    + "    else:\n"
    + "        loss.backward()\n"
    + "{step}"
)


class OptimizerNeverStepped(Rule):
    """A prepared optimizer whose every ``step()`` sits where the loop's
    ``accelerator.backward`` never runs: the other arm of the ``if`` that picks the backward
    (``if args.use_accelerate: accelerator.backward(loss)`` / ``else: loss.backward();
    optimizer.step()``), or under the negated test (``if not use_accelerate:``). A script kept
    runnable both ways by a flag steps only on the plain path: on the Accelerate path the
    gradients pile up and the model never trains, with no error. Only where the two tests are
    the same expression (one arm of one ``if``, or ``x`` against ``not x``) and that test is
    the same on every pass of the loop (a setting: not ``step % accumulation != 0``, a
    hand-written accumulation whose backward-only arm skips the step on purpose; not a test
    of the rank, ACC307's). Any call handed the optimizer (``scaler.step(optimizer)``, a
    helper's ``train_step(model, optimizer)``) counts as a step; a file with no step of the
    optimizer at all is left alone."""

    code = "ACC312"
    name = "optimizer-never-stepped"
    message = (
        "Step the optimizer where accelerator.backward runs: its only step is in the other "
        "branch, so on this path the gradients pile up and the model never trains"
    )
    why = "An optimizer stepped only on the branch without accelerator.backward never trains."
    bad = (
        Example(
            HEADER
            + _TOGGLE.format(step="        optimizer.step()\n        optimizer.zero_grad()\n"),
            9,
            9,
        ),
        # the step under the negated flag below the backward's `if`
        Example(
            HEADER
            + "import torch\n"
            + "optimizer = torch.optim.AdamW(model.parameters())\n"
            + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            + "for x, y in loader:\n"
            + "    loss = (model(x) - y).pow(2).mean()\n"
            + "    if use_accelerate:\n"
            + "        accelerator.backward(loss)\n"
            + "    if not use_accelerate:\n"
            + "        loss.backward()\n"
            + "        optimizer.step()\n",
            9,
            9,
        ),
    )
    good = (
        # stepped after the if/else, on both paths
        HEADER + _TOGGLE.format(step="    optimizer.step()\n    optimizer.zero_grad()\n"),
        # stepped in both arms
        HEADER
        + _TOGGLE.format(step="        optimizer.step()\n").replace(
            "        accelerator.backward(loss)\n",
            "        accelerator.backward(loss)\n        optimizer.step()\n",
        ),
        # a hand-written accumulation: the backward-only arm skips the step on purpose
        HEADER
        + "import torch\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for step, (x, y) in enumerate(loader):\n"
        + "    if step % accumulation != 0:\n"
        + "        with accelerator.no_sync(model):\n"
        + "            accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "    else:\n"
        + "        accelerator.backward((model(x) - y).pow(2).mean())\n"
        + "        optimizer.step()\n",
        # the other arm steps through the scaler it hands the optimizer to
        HEADER
        + "import torch\n"
        + "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        + "for x, y in loader:\n"
        + "    loss = (model(x) - y).pow(2).mean()\n"
        + "    if args.fp32:\n"
        + "        accelerator.backward(loss)\n"
        + "        optimizer.step()\n"
        + "    else:\n"
        + "        accelerator.backward(scaler.scale(loss))\n"
        + "        scaler.step(optimizer)\n",
        # stepped through a helper the file does not show: not followed
        HEADER + _TOGGLE.format(step="") + "    trainer_step(optimizer)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        optimizers = {
            name
            for call in script.prepare_calls
            for name in call.outputs
            if name in script.names_of(Kind.OPTIMIZER)
        }
        if not optimizers:
            return
        # ``optimizer.step()``, and every call handed the optimizer (``scaler.step(optimizer)``,
        # a helper's ``train_step(model, optimizer)``), each a step the file may not show
        steps: dict[str, list[cst.Call]] = {}
        for call in script.calls:
            func = call.func
            if isinstance(func, cst.Attribute) and func.attr.value == "step" and not call.args:
                owner = dotted(func.value)
                if owner in optimizers:
                    steps.setdefault(owner, []).append(call)
            for argument in call.args:
                if dotted(argument.value) in optimizers and not _prepare(call):
                    steps.setdefault(dotted(argument.value), []).append(call)  # type: ignore[arg-type]
        accelerators = script.names_of(Kind.ACCELERATOR)
        for call in script.calls:
            func = call.func
            if not (
                isinstance(func, cst.Attribute)
                and func.attr.value == "backward"
                and dotted(func.value) in accelerators
            ):
                continue
            for optimizer in sorted(optimizers & steps.keys()):
                tests = [_parting_test(script, call, step) for step in steps[optimizer]]
                if tests[0] is None or not all(tests):
                    continue
                message = _message(script, call, optimizer, steps[optimizer], tests[0])
                yield self.finding(script, call, message=message)
                break


def _prepare(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "prepare"


def _fixed_for_the_run(script: ScriptModel, test: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``test`` holds the same value on every pass of the loops around ``at``: no name it reads
    is bound in them (``step % accumulation != 0`` of ``for step, batch in ...`` changes per
    batch: a hand-written accumulation, whose backward-only arm is meant to skip the step),
    and it reads no call's result, nor the rank (which parts ranks, not runs: ACC307's)."""
    if script.reads_rank(test) or any(isinstance(n, cst.Call) for n in walk(test)):
        return False
    read = {n.value for n in walk(test) if isinstance(n, cst.Name)}
    for loop in script.ancestors(at):
        if not isinstance(loop, (cst.For, cst.While)):
            continue
        for node in walk(loop):
            targets: list[cst.BaseExpression] = []
            if isinstance(node, cst.Assign):
                targets = [t.target for t in node.targets]
            elif isinstance(
                node, (cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.NamedExpr)
            ):
                targets = [node.target]
            elif isinstance(node, cst.AsName):
                targets = [node.name]  # type: ignore[list-item]
            if any(isinstance(n, cst.Name) and n.value in read for t in targets for n in walk(t)):
                return False
    return True


def _parting_test(script: ScriptModel, backward: cst.Call, step: cst.Call) -> cst.If | None:
    """The ``if`` that keeps ``step`` from every run of ``backward``: one whose two arms hold
    one each, or, for two ``if``s in the same block of code, the one around ``step`` whose
    test negates the test around ``backward`` (or is the one ``backward``'s negates)."""
    code = script.module.code_for_node
    around_step = [a for a in script.ancestors(step) if isinstance(a, cst.If)]
    around_backward = [a for a in script.ancestors(backward) if isinstance(a, cst.If)]
    for branch in around_step:
        if (
            branch.orelse is not None
            and any(branch is b for b in around_backward)
            and script.inside(step, branch.body) != script.inside(backward, branch.body)
        ):
            return branch if _fixed_for_the_run(script, branch.test, backward) else None
    for branch in around_step:
        for other in around_backward:
            if other is branch:
                continue
            if _negates(code, branch.test, other.test) or _negates(code, other.test, branch.test):
                return branch if _fixed_for_the_run(script, branch.test, backward) else None
    return None


def _negates(
    code: Callable[[cst.CSTNode], str], test: cst.BaseExpression, other: cst.BaseExpression
) -> bool:
    """``test`` is ``not <other>``."""
    return (
        isinstance(test, cst.UnaryOperation)
        and isinstance(test.operator, cst.Not)
        and code(test.expression.with_changes(lpar=[], rpar=[])) == code(other)
    )


def _message(
    script: ScriptModel, backward: cst.Call, optimizer: str, steps: list[cst.Call], test: cst.If
) -> str:
    accelerator = accelerator_name(script, backward)
    lines = ", ".join(str(script.line(step)) for step in steps)
    where = (
        f"its only step (line {lines}) is" if len(steps) == 1 else f"its steps (lines {lines}) are"
    )
    return (
        f"Step {optimizer} where {accelerator}.backward runs: {where} on the other side of the "
        f"test at line {script.line(test)} "
        f"(`{script.module.code_for_node(test.test)}`), so on this path the gradients pile up "
        f"and the model never trains; call {optimizer}.step() and {optimizer}.zero_grad() "
        "after the if/else, on both paths"
    )
