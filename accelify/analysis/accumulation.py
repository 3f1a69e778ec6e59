"""Manual gradient accumulation, and whether it can become ``accelerator.accumulate``.

The shape recognised::

    loss = criterion(output, target) / accum      # or: loss = loss / accum, loss /= accum
    loss.backward()
    if (step + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()

It becomes ``Accelerator(gradient_accumulation_steps=accum)``, the loop body runs inside
``with accelerator.accumulate(model):`` (no gradient all-reduce on the steps that only
accumulate), the division goes (``accelerator.backward`` divides), and the ``if`` tests
``accelerator.sync_gradients``. That is only the same program when every later use of the divided
loss can be rewritten: ``loss.item() * accum`` becomes ``loss.item()``; any other use keeps the
manual pattern, which is correct as it stands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis import names
from accelify.analysis.dataflow import is_binding
from accelify.analysis.script_model import Kind, Loop, ScriptModel, own_method
from accelify.analysis.syntax import (
    Visitor,
    accelerator_argument,
    assigned_targets,
    dotted,
    updated_with,
    visit_code,
    walk,
)

if TYPE_CHECKING:
    from accelify.analysis.facts import Facts


@dataclass
class ManualAccumulation:
    line: int
    steps_code: str
    loss: str
    loop: cst.For
    division: cst.CSTNode
    division_statement: cst.SimpleStatementLine
    condition: cst.If
    multiplied: list[cst.BinaryOperation] = field(default_factory=list)
    unaccounted: str | None = None
    #: the step count as the division writes it (``accum_steps`` of ``loss / accum_steps``)
    steps: cst.BaseExpression | None = None


def find_manual_accumulation(loop: Loop, facts: Facts) -> ManualAccumulation | None:
    found = _accumulation_shape(loop, facts)
    if found is None:
        return None
    _account_for_later_uses(found, loop, facts)
    if not accumulated_models(loop, facts):
        found.unaccounted = "no model found to pass to accelerator.accumulate()"
    if found.unaccounted is None:
        found.unaccounted = _stepped_outside(found, loop, facts)
    if found.unaccounted is None:
        found.unaccounted = _undivided_backward(found, facts)
    if found.unaccounted is None and _draws_from_a_loader(loop, facts):
        found.unaccounted = (
            "the loop draws its batches from a DataLoader it does not iterate (next()): "
            "accumulate() also syncs when the loader runs out, and entered before the next() "
            "that runs it out it syncs one batch late, shifting every later step"
        )
    counter = _loop_counter(loop.node, facts.model, found.condition.test)
    if (
        found.unaccounted is None
        and counter is not None
        and _in_step_with_accumulate(found.condition.test, counter, facts.model) is False
    ):
        found.unaccounted = (
            f"its step test `{facts.model.module.code_for_node(found.condition.test)}` does not "
            f"count the batches from 1 as accumulate() does (it steps at the last of every "
            f"{found.steps_code} batches): the optimizer would step at other batches, and a "
            f"pass's number of steps can change. As written it is correct; to use accumulate(), "
            f"test `{_first_batch_count(counter)} % {found.steps_code} == 0`"
        )
    if (
        found.unaccounted is None
        and facts.flow.reads_loader(loop)
        and not _steps_at_the_last_batch(found.condition.test, loop, facts)
    ):
        models = accumulated_models(loop, facts)
        found.unaccounted = (
            f"its step test fires every {found.steps_code} batches only, and accumulate() also "
            "steps at each pass's last batch: where a pass's batch count does not divide by "
            f"{found.steps_code}, accumulate() would make more optimizer steps than the "
            "original (a schedule sized to its count would run past its end). As written it is "
            "correct, but every backward all-reduces: to skip those syncs and keep its steps, "
            "run the backward of the batches that do not step under `with "
            f"accelerator.no_sync({models[0] if models else 'model'}):`; or step at the last "
            f"batch too (`or {_last_batch_test(loop, facts)}`) and the conversion uses accumulate()"
        )
    return found


def _steps_at_the_last_batch(test: cst.BaseExpression, loop: Loop, facts: Facts) -> bool:
    """``(i + 1) % k == 0 or i + 1 == len(loader)``: the test also fires at the last batch of
    the loader the loop iterates, as ``accumulate()`` syncs there (HF's
    ``sync_with_dataloader``): the rewrite keeps the original's optimizer steps. Without that
    side, a pass whose batch count does not divide by ``k`` leaves its last batches'
    gradients to the next pass's first step, where ``accumulate()`` would step on them. Only
    an equality of the loop's own counter and its own loader's length counts (``or
    len(loader) < k``, ``or i + 1 == len(other)`` fire at other batches)."""
    if not isinstance(test, cst.BooleanOperation) or not isinstance(test.operator, cst.Or):
        return False
    counter = _loop_counter(loop.node, facts.model, test)
    if counter is None or not _in_step_with_accumulate(test, counter, facts.model):
        return False  # another phase, or a test not read (``not step % k``)
    loaders = {loop.iterable, _enumerated(loop.node, facts.model)} - {None}
    if loop.through is not None:
        loaders |= {dotted(node) for node in walk(loop.through)} - {None}
    return any(
        _steps_at_the_last_batch(side, loop, facts)
        or _is_the_last_batch(side, counter, loaders, facts.model)
        for side in (test.left, test.right)
    )


def _in_step_with_accumulate(
    test: cst.BaseExpression, counter: tuple[str, int], model: ScriptModel
) -> bool | None:
    """Every ``x % k == 0`` of ``test`` counts the loop's own batches from 1, as
    ``accumulate()`` does: ``(i + 1) % k`` of ``enumerate(loader)``, ``step % k`` of a
    counter incremented before the test. ``i % k == 0`` fires at batches 1, k + 1, ...:
    another count of optimizer steps than accumulate()'s (9 batches, k = 3: 4 against 3).
    None where ``test`` has no such comparison (``not step % k``): not read."""
    name, start = counter
    found = False
    for node in walk(test):
        if not (
            isinstance(node, cst.Comparison)
            and isinstance(node.left, cst.BinaryOperation)
            and isinstance(node.left.operator, cst.Modulo)
        ):
            continue
        found = True
        offset = _counter_offset(_unparenthesized(node.left.left), name)
        zero = len(node.comparisons) == 1 and _code(node.comparisons[0].comparator) == "0"
        if offset is None or offset + start != 1 or not zero:
            return False
    return True if found else None


def _first_batch_count(counter: tuple[str, int]) -> str:
    """The counter as 1 at the first batch: ``i + 1`` of ``enumerate(loader)``."""
    name, start = counter
    if start == 1:
        return name
    return f"({name} + {1 - start})" if start < 1 else f"({name} - {start - 1})"


def _unparenthesized(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=(), rpar=()) if node.lpar else node


def _last_batch_test(loop: Loop, facts: Facts) -> str:
    """The test to add, in the loop's own names: ``step + 1 == len(train_loader)``."""
    counter = _loop_counter(loop.node, facts.model, None)
    iterated = _enumerated(loop.node, facts.model) or loop.iterable
    loader = f"len({iterated})" if iterated else "the number of batches"
    if counter is None:
        return f"<the batch index> + 1 == {loader}"
    name, start = counter
    offset = 1 - start
    if offset > 0:
        return f"{name} + {offset} == {loader}"
    return f"{name} - {-offset} == {loader}" if offset < 0 else f"{name} == {loader}"


def _enumerated(loop: cst.For, model: ScriptModel) -> str | None:
    """``loaders["train"]`` of ``for step, batch in enumerate(loaders["train"])``, as written,
    also inside a progress bar (``enumerate(tqdm(loader, desc=...))``: ``loader``, whose
    ``len()`` is the bar's; a ``len()`` of the bar written in advice would draw a second bar)."""
    call = loop.iter
    if not (isinstance(call, cst.Call) and dotted(call.func) == "enumerate" and call.args):
        return None
    loader = call.args[0].value
    while (
        isinstance(loader, cst.Call) and loader.args and model.qualified(loader.func) & names.TQDM
    ):
        loader = loader.args[0].value
    return model.module.code_for_node(loader)


def _loop_counter(
    loop: cst.For, model: ScriptModel, test: cst.BaseExpression | None
) -> tuple[str, int] | None:
    """``i`` and its value at the first batch for ``for i, batch in enumerate(loader)``
    (``enumerate(loader, 1)``: 1), or for a counter the loop keeps itself (`_kept_counter`);
    None for another loop, or a start not written as a number."""
    return _enumerate_counter(loop) or _kept_counter(loop, model, test)


def _kept_counter(
    loop: cst.For, model: ScriptModel, test: cst.BaseExpression | None
) -> tuple[str, int] | None:
    """``step`` of ``step = 0`` just before the loop (in the same block, so every pass starts
    it again) and ``step += 1`` a statement of the loop's own body, its only binding there,
    with no ``continue`` of the loop to skip it: it counts the batches like ``enumerate``.
    Its value at ``test`` (the step test, a statement of the body) at the first batch is the
    start, plus 1 where the increment runs before the test. ``test`` None: where the test
    sits is not known, the increment must come first."""
    body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else ()
    increments = [
        (index, name)
        for index, statement in enumerate(body)
        if (name := _incremented(statement)) is not None
    ]
    if len(increments) != 1:
        return None
    index, name = increments[0]
    bindings = [
        node
        for node in walk(loop.body)
        if isinstance(node, cst.Name) and node.value == name and is_binding(model, node)
    ]
    if len(bindings) != 1 or _continues(loop):
        return None
    start = _reset_before(loop, name, model)
    if start is None:
        return None
    position = next(
        (i for i, statement in enumerate(body) if test is not None and _holds(statement, test)),
        None,
    )
    if position is None and test is not None:
        return None
    return name, start + (1 if position is None or index < position else 0)


def _incremented(statement: cst.BaseStatement) -> str | None:
    """``step`` of the statement ``step += 1``."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if (
        isinstance(small, cst.AugAssign)
        and isinstance(small.operator, cst.AddAssign)
        and isinstance(small.target, cst.Name)
        and _code(small.value) == "1"
    ):
        return small.target.value
    return None


def _continues(loop: cst.For) -> bool:
    """A ``continue`` of ``loop`` itself (not of a loop nested in it, nor in a function)."""
    found = False

    class _Finder(cst.CSTVisitor):
        def visit_Continue(self, node: cst.Continue) -> None:
            nonlocal found
            found = True

        def visit_For(self, node: cst.For) -> bool:
            return False

        def visit_While(self, node: cst.While) -> bool:
            return False

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    loop.body.visit(_Finder())
    return found


def _reset_before(loop: cst.For, name: str, model: ScriptModel) -> int | None:
    """The number ``name`` is set to by the statement right before ``loop`` in its block
    (``step = 0``), none of the statements between binding it."""
    block = model.parent(loop)
    statements = list(getattr(block, "body", ()))
    if loop not in statements:
        return None
    for statement in reversed(statements[: statements.index(loop)]):
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            small = statement.body[0]
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and dotted(small.targets[0].target) == name
            ):
                return small.value.evaluated_value if isinstance(small.value, cst.Integer) else None
        if any(
            isinstance(node, cst.Name) and node.value == name and is_binding(model, node)
            for node in walk(statement)
        ):
            return None
    return None


def _holds(statement: cst.CSTNode, node: cst.CSTNode) -> bool:
    return any(n is node for n in walk(statement))


def _enumerate_counter(loop: cst.For) -> tuple[str, int] | None:
    """``i`` and its first value for ``for i, batch in enumerate(loader)``."""
    call, target = loop.iter, loop.target
    if not (
        isinstance(call, cst.Call)
        and dotted(call.func) == "enumerate"
        and isinstance(target, cst.Tuple)
        and len(target.elements) == 2
        and isinstance(target.elements[0].value, cst.Name)
    ):
        return None
    start = 0
    if len(call.args) > 1:
        value = call.args[1].value
        if not isinstance(value, cst.Integer):
            return None
        start = value.evaluated_value
    return target.elements[0].value.value, start  # type: ignore[attr-defined]


def _is_the_last_batch(
    side: cst.BaseExpression, counter: tuple[str, int], loaders: set[str], model: ScriptModel
) -> bool:
    """``i + 1 == len(loader)`` or ``i == len(loader) - 1`` (either way round; ``n`` bound
    once to ``len(loader)`` as well): true at the last batch of the loop's own loader only."""
    if (
        not isinstance(side, cst.Comparison)
        or len(side.comparisons) != 1
        or not isinstance(side.comparisons[0].operator, cst.Equal)
    ):
        return False
    pair = (side.left, side.comparisons[0].comparator)
    name, start = counter
    return any(
        (offset := _counter_offset(a, name)) is not None
        and (length := _length_offset(b, loaders, model)) is not None
        and offset + start - 1 == length
        for a, b in (pair, pair[::-1])
    )


def _counter_offset(node: cst.BaseExpression, counter: str) -> int | None:
    """0 for ``i``, 1 for ``i + 1`` (``1 + i``)."""
    if isinstance(node, cst.Name):
        return 0 if node.value == counter else None
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        sides = {_code(node.left), _code(node.right)}
        return 1 if sides == {counter, "1"} else None
    return None


def _length_offset(node: cst.BaseExpression, loaders: set[str], model: ScriptModel) -> int | None:
    """0 for ``len(loader)`` (or a name bound once to it), -1 for ``len(loader) - 1``."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Subtract):
        if _code(node.right) != "1":
            return None
        inner = _length_offset(node.left, loaders, model)
        return None if inner is None else inner - 1
    if isinstance(node, cst.Name):
        bound = model.index.values_bound_to(node.value)
        if len(bound) != 1 or isinstance(bound[0][1], cst.Name):
            return None
        node = bound[0][1]
    if (
        isinstance(node, cst.Call)
        and dotted(node.func) == "len"
        and len(node.args) == 1
        and (
            dotted(node.args[0].value) in loaders
            or model.module.code_for_node(node.args[0].value) in loaders
        )
    ):
        return 0
    return None


def _code(node: cst.BaseExpression) -> str | None:
    """A name's or a whole number's text; None for anything else."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Integer):
        return node.value
    return None


def accumulated_models(loop: Loop, facts: Facts) -> list[str]:
    """The models to hand ``accelerator.accumulate()``: those of the loop's scope the loop reads
    (``model(xb)``, ``train_step(model, ...)``). A model the function makes after the loop (a
    fresh one the saved weights are reloaded into) does not exist yet when the loop enters
    the context: naming it there raises NameError. A loop that reads none of them by name (its
    step reaches the model through a helper) gets every model of the scope."""
    scoped = facts.flow.model_names_in_scope(loop.scope)
    read = {dotted(node) for node in walk(loop.node) if isinstance(node, (cst.Name, cst.Attribute))}
    return [name for name in scoped if name in read] or scoped


def _stepped_outside(found: ManualAccumulation, loop: Loop, facts: Facts) -> str | None:
    """Why the rewrite would step twice: the function also steps an optimizer outside the
    accumulating loop, the remainder step after it (``if len(loader) % accum != 0:
    optimizer.step()``) for the batches the last ``% accum`` test left over. ``accumulate()``
    already steps at the loader's last batch, so that step would run again on gradients just
    applied and zeroed, and whatever it updates beside the optimizer (an EMA copy, a step
    counter) would update twice. Kept as written, the pair is correct. Only a step of what the
    loop itself steps, after it, in no loop but those around it: a second training loop's own
    optimizer, or a fine-tuning loop stepping the same one, is no remainder step."""
    model = facts.model
    stepped = {
        dotted(node.func.value)  # type: ignore[union-attr]
        for node in walk(loop.node)
        if isinstance(node, cst.Call) and _method(node) == "step"
    }
    for node in walk(loop.scope):
        if (
            isinstance(node, cst.Call)
            and _method(node) == "step"
            and not within_node(model, node, loop.node)
            and model.scope_of(node) is loop.scope
            and dotted(node.func.value) in stepped  # type: ignore[union-attr]
            and model.order(node) > model.order(loop.node)
            and _in_the_loops_around(model, node, loop.node)
            and facts.flow.kind_of(dotted(node.func.value), node) in (Kind.OPTIMIZER, Kind.SCALER)  # type: ignore[union-attr]
        ):
            return (
                f"the optimizer also steps at line {model.line(node)}, outside the accumulating "
                "loop (a remainder step for its last batches): accumulate() already steps at "
                "the loader's last batch, so that step would run a second time"
            )
    return None


def _in_the_loops_around(model: ScriptModel, node: cst.CSTNode, loop: cst.CSTNode) -> bool:
    """Every loop around ``node`` is also around ``loop`` (an epoch loop around both)."""
    around = model.index.enclosing_loop(node)
    return around is None or within_node(model, loop, around)


def _draws_from_a_loader(loop: Loop, facts: Facts) -> bool:
    """``for it in range(max_iters): xb, yb = next(batches)`` (or a ``get_batch()``) in a script
    with a DataLoader: the loop is not over the loader, yet the loader's end reaches
    ``accumulate()`` (HF Accelerate's and accelify's ``sync_with_dataloader``), at the entry
    after the batch that ended it rather than at that batch."""
    return not facts.flow.reads_loader(loop) and bool(facts.model.names_of(Kind.DATALOADER))


def _undivided_backward(found: ManualAccumulation, facts: Facts) -> str | None:
    """Why the setting cannot go on the Accelerator: a backward elsewhere in the file (an LR
    finder, a warm-up or fine-tuning loop of its own) whose loss ``accelerator.backward`` would
    divide too, though the original never did. A loop accumulating by the same steps is not
    one: its division is removed as well."""
    model = facts.model
    accumulating = [
        other.node
        for other in model.loops
        if (shape := _accumulation_shape(other, facts)) is not None
        and shape.steps_code == found.steps_code
    ]
    for call in model.backward_calls:
        if not any(within_node(model, call, loop) for loop in accumulating):
            return (
                f"the backward at line {model.line(call)} does not accumulate, and "
                f"Accelerator(gradient_accumulation_steps={found.steps_code}) would divide its "
                "loss as well"
            )
    return None


def _conditional(model: ScriptModel, node: cst.CSTNode, owner: cst.CSTNode) -> bool:
    """``node`` runs under an ``if`` inside ``owner`` (``if i % accum == 0: opt.zero_grad()``)."""
    return conditional(model, node, owner)


#: what runs its parts on some runs only: an ``if``, a conditional expression, a ``try``, a
#: ``match``, the right operand of ``and``/``or``
BRANCHES: tuple[type[cst.CSTNode], ...] = (
    cst.If,
    cst.IfExp,
    cst.Try,
    cst.TryStar,
    cst.Match,
    cst.BooleanOperation,
)


def conditional(
    model: ScriptModel,
    node: cst.CSTNode,
    owner: cst.CSTNode | None = None,
    branches: tuple[type[cst.CSTNode], ...] = (cst.If,),
) -> bool:
    """``node`` runs under one of ``branches`` inside ``owner``; without an owner, inside its
    own function (or class body, or module): a call there does not run on every run of it."""
    for ancestor in model.ancestors(node):
        if ancestor is owner:
            return False
        if owner is None and isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            return False
        if isinstance(ancestor, branches):
            return True
    return False


def within_node(model: ScriptModel, node: cst.CSTNode, container: cst.CSTNode) -> bool:
    return node is container or any(a is container for a in model.ancestors(node))


def _accumulation_shape(loop: Loop, facts: Facts) -> ManualAccumulation | None:
    """The recognised shape in ``loop`` (division, backward, ``% steps`` test), unchecked."""
    model = facts.model
    body = list(walk(loop.node.body))
    backward = next(
        (
            c
            for c in body
            if isinstance(c, cst.Call)
            and isinstance(c.func, cst.Attribute)
            and c.func.attr.value == "backward"
        ),
        None,
    )
    if backward is None:
        return None
    loss = dotted(backward.func.value)  # type: ignore[union-attr]
    if loss is None:
        return None
    division = _find_division(body, loss)
    if division is None:
        return None
    node, steps = division
    steps_code = model.module.code_for_node(steps)
    condition = next(
        (
            n
            for n in body
            if isinstance(n, cst.If)
            and _tests_modulo(n.test, steps_code, model)
            and _steps_optimizer(n, facts)
        ),
        None,
    )
    if condition is None:
        return None
    statement = model.parent(node)
    assert isinstance(statement, cst.SimpleStatementLine)
    found = ManualAccumulation(
        line=model.line(node),
        steps_code=steps_code,
        loss=loss,
        loop=loop.node,
        division=node,
        division_statement=statement,
        condition=condition,
        steps=steps,
    )
    return found


def stepped_every(loop: Loop, facts: Facts) -> cst.If | None:
    """``if (step + 1) % accum == 0: optimizer.step()`` (or ``scaler.step(optimizer)``) in a
    training loop, whatever else the accumulation looks like: gradients summed over several
    backwards by hand."""
    return _stepped_every_in(loop.node, facts)


def stepped_every_in_step(function: cst.FunctionDef, facts: Facts) -> cst.If | None:
    """The same test in a step function a training loop calls per batch
    (``self._step(batch, i)`` running the backward, then ``if (i + 1) % accum == 0:``)."""
    return _stepped_every_in(function, facts)


def _stepped_every_in(owner: cst.For | cst.While | cst.FunctionDef, facts: Facts) -> cst.If | None:
    function = owner if isinstance(owner, cst.FunctionDef) else None
    function = function or facts.placement.enclosing_function(owner)
    for node in walk(owner.body):
        if not isinstance(node, cst.If) or facts.placement.enclosing_function(node) is not function:
            continue
        modulo = any(
            isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo)
            for n in walk(node.test)
        )
        if not (modulo and (_steps_optimizer(node, facts) or _scaler_steps(node, facts))):
            continue
        if _sums_several_backwards(node, owner, facts):
            return node
    return None


def _sums_several_backwards(
    condition: cst.If, owner: cst.For | cst.While | cst.FunctionDef, facts: Facts
) -> bool:
    """An optimizer stepped under ``condition`` steps on gradients summed over several
    backwards: no ``zero_grad()`` of it in ``owner`` outside the branch (every pass would wipe
    what the others summed) nor in the branch before its step (the step then reads the
    branch's own backward alone: a GAN's ``if step % 2 == 0: opt_g.zero_grad();
    g_loss.backward(); opt_g.step()`` spaces the generator's steps, it accumulates nothing).
    A scaler's step (``scaler.step(optimizer)``) names its optimizer as the argument."""
    model = facts.model
    stepped: list[tuple[str, cst.Call]] = []
    for node in walk(condition.body):
        if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)):
            continue
        if node.func.attr.value != "step":
            continue
        receiver = dotted(node.func.value)
        kind = facts.flow.kind_of(receiver, node)
        if kind is Kind.OPTIMIZER and receiver is not None:
            stepped.append((receiver, node))
        elif kind is Kind.SCALER and node.args and (name := dotted(node.args[0].value)):
            stepped.append((name, node))
    if not stepped:
        return True  # nothing to tell it by: as the test reads
    for optimizer, step in stepped:
        zeroed = [
            call
            for call in walk(owner.body)
            if isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "zero_grad"
            and dotted(call.func.value) == optimizer
        ]
        inside = [z for z in zeroed if within_node(model, z, condition.body)]
        outside = [z for z in zeroed if not within_node(model, z, condition.body)]
        if any(not _conditional(model, z, owner) for z in outside):
            continue  # zeroed on every pass, the ones the step skips too
        if any(model.order(z) < model.order(step) for z in inside):
            continue  # zeroed in the branch, before its step
        return True
    return False


def _scaler_steps(condition: cst.If, facts: Facts) -> bool:
    for node in walk(condition.body):
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "step"
            and facts.flow.kind_of(dotted(node.func.value), node) is Kind.SCALER
        ):
            return True
    return False


def _account_for_later_uses(found: ManualAccumulation, loop: Loop, facts: Facts) -> None:
    """Every later use in the function (or module), not only in the loop: a loss logged after
    the loop changes value too when the division goes. ``loss.item() * accum`` can be
    rewritten; any other use leaves the manual pattern in place."""
    model, loss = facts.model, found.loss
    division_line = model.line(found.division)
    for name in walk(loop.scope):
        if not isinstance(name, cst.Name) or name.value != loss or model.line(name) < division_line:
            continue
        if model.scope_of(name) is not loop.scope or facts.placement.inside(name, found.division):
            continue
        parent = model.parent(name)
        if (
            isinstance(parent, cst.Attribute)
            and parent.value is name
            and parent.attr.value == "backward"
        ):
            continue
        product = _times_steps(name, found.steps_code, model)
        if product is not None:
            found.multiplied.append(product)
            continue
        found.unaccounted = (
            f"`{loss}` is used at line {model.line(name)} after the division by "
            f"{found.steps_code}; its value would change"
        )
        return


def _find_division(
    body: list[cst.CSTNode], loss: str
) -> tuple[cst.CSTNode, cst.BaseExpression] | None:
    """``loss /= steps`` or ``loss = ... / steps`` among ``body``'s nodes, with its divisor."""
    for node in body:
        operands = updated_with(node, loss, cst.Divide)
        if operands is not None:
            return node, operands[1]
    return None


def _tests_modulo(test: cst.BaseExpression, steps_code: str, model: ScriptModel) -> bool:
    class Modulo(Visitor):
        found = False

        def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
            if (
                isinstance(node.operator, cst.Modulo)
                and model.module.code_for_node(node.right) == steps_code
            ):
                self.found = True

    visitor = Modulo()
    visit_code(test, visitor)
    return visitor.found


def _steps_optimizer(condition: cst.If, facts: Facts) -> bool:
    for node in walk(condition.body):
        is_step = (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "step"
        )
        if is_step and facts.flow.kind_of(dotted(node.func.value), node) is Kind.OPTIMIZER:
            return True
    return False


def _times_steps(name: cst.Name, steps_code: str, model: ScriptModel) -> cst.BinaryOperation | None:
    """``loss.item() * accum``: the undivided value, read back."""
    attribute = model.parent(name)
    call = model.parent(attribute) if isinstance(attribute, cst.Attribute) else None
    product = model.parent(call) if isinstance(call, cst.Call) else None
    if (
        isinstance(attribute, cst.Attribute)
        and attribute.attr.value == "item"
        and isinstance(product, cst.BinaryOperation)
        and isinstance(product.operator, cst.Multiply)
        and product.left is call
        and model.module.code_for_node(product.right) == steps_code
    ):
        return product
    return None


def factory_accumulation_steps(model: ScriptModel) -> dict[str, cst.BaseExpression]:
    """The functions of ``model`` that return an Accelerator they make with
    ``gradient_accumulation_steps`` other than 1, by name, with that argument: ACC304 reports
    such a factory where every module of the project that calls it trains with it without
    accumulating (`accumulation_unhandled` of each caller, asked with this argument)."""
    from accelify.analysis.facts import facts_of

    placement = facts_of(model).placement
    found: dict[str, cst.BaseExpression] = {}
    for binding in model.of_kind(Kind.ACCELERATOR):
        argument = accelerator_argument(binding.value, "gradient_accumulation_steps")
        if argument is None or is_one(argument.value):
            continue
        if isinstance(binding.scope, cst.FunctionDef) and placement.returns_name(
            binding.scope, binding.name
        ):
            found.setdefault(binding.scope.name.value, argument.value)
    return found


def is_one(value: cst.BaseExpression) -> bool:
    """``1``: the setting that accumulates nothing."""
    return isinstance(value, cst.Integer) and value.evaluated_value == 1


def accumulation_unhandled(model: ScriptModel, steps: cst.BaseExpression) -> bool:
    """Whether ``Accelerator(gradient_accumulation_steps=steps)`` in ``model`` shrinks every
    update: the script calls the accelerator's backward and nothing in it accumulates. Not when
    no such backward runs (an inference or pseudo-labelling script passing the setting as
    boilerplate; a GAN trainer calling ``loss.backward()``, which divides nothing), when any
    ``accumulate()``/``no_sync()`` context is used (whatever object it is called on: a trainer's
    ``self.accelerator``, one from a factory), when an optimizer step waits on ``% k`` (directly
    or through a name set from one), or when the loss is multiplied back by the steps before its
    backward (the script undoes the division and accumulates by hand). Nor when nothing in the
    file steps an optimizer (an engine class whose ``backward`` its callers drive, in another
    module; DeepSpeed steps inside its backward), the file sets ``sync_gradients`` itself
    (it marks the accumulation boundary by hand), or every step waits on ``sync_gradients`` in
    a method no loop of the file calls (`_driven_from_elsewhere`)."""
    steps_code = model.module.code_for_node(steps)
    tensor_backwards = {id(call) for call in model.backward_calls}
    backwards = [
        call
        for call in model.calls
        if _method(call) == "backward"
        and id(call) not in tensor_backwards
        and not (dotted(call.func.value) == "self" and own_method(model, call, "backward"))  # type: ignore[union-attr]
    ]
    if not backwards:
        return False  # also ``loss.backward()`` only: nothing divides the loss (ACC301 says so)
    if any(_method(call) in ("accumulate", "no_sync") for call in model.calls) or any(
        node.attr.value in ("accumulate", "no_sync") for node in model.member_uses
    ):
        return False  # also ``ctx = model.no_sync if ... else nullcontext`` (parler-tts)
    if any(_multiplied_back(call, steps_code, model) for call in backwards):
        return False
    steps = [
        call
        for call in model.calls
        if _method(call) == "step" and "sched" not in (dotted(call.func.value) or "")  # type: ignore[union-attr]
    ]
    if not steps or any(_sets_sync_gradients(assign) for assign in model.assignments):
        return False  # stepped elsewhere (a wrapper's callers, DeepSpeed's engine) or by hand
    if all(_driven_from_elsewhere(model, call) for call in steps):
        return False
    modulo_names = {
        dotted(target)
        for node in model.assignments
        if _has_modulo(node.value)
        for target in assigned_targets(node)
    }
    for call in steps:
        for ancestor in model.ancestors(call):
            if isinstance(ancestor, cst.If) and (
                _has_modulo(ancestor.test)
                or any(dotted(n) in modulo_names for n in walk(ancestor.test))
            ):
                return False
    return True


def _driven_from_elsewhere(model: ScriptModel, step: cst.Call) -> bool:
    """``step`` waits on ``sync_gradients`` (which only ``accumulate()`` turns off) in a function
    that runs in no loop of the file and that the file never calls from one: a base trainer's
    ``backward(loss)`` method, whose subclasses' training loops, in other modules, accumulate
    (a 3D-scene pre-training's BaseTrainer)."""
    if not any(
        isinstance(a, cst.If) and "sync_gradients" in model.module.code_for_node(a.test)
        for a in model.ancestors(step)
    ):
        return False
    function = model.index.enclosing_function(step)
    if function is None or any(isinstance(a, (cst.For, cst.While)) for a in model.ancestors(step)):
        return False
    name = function.name.value
    return not any(
        (
            (isinstance(call.func, cst.Name) and call.func.value == name)
            or (isinstance(call.func, cst.Attribute) and call.func.attr.value == name)
        )
        and any(isinstance(a, (cst.For, cst.While)) for a in model.ancestors(call))
        for call in model.calls
    )


def _sets_sync_gradients(assign: cst.Assign) -> bool:
    return any(
        isinstance(t, cst.Attribute) and t.attr.value == "sync_gradients"
        for t in assigned_targets(assign)
    )


def _method(call: cst.Call) -> str | None:
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else None


def _has_modulo(node: cst.CSTNode) -> bool:
    return any(
        isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Modulo)
        for n in walk(node)
    )


def _multiplied_back(backward: cst.Call, steps_code: str, model: ScriptModel) -> bool:
    """``accelerator.backward(loss * steps)`` (or ``(loss * steps).backward()``)."""
    func = backward.func
    subjects = [argument.value for argument in backward.args[:1]]
    if isinstance(func, cst.Attribute):
        subjects.append(func.value)
    losses = {dotted(subject) for subject in subjects} - {None}
    subjects += [  # ``loss = loss * steps`` above the backward
        node.value
        for node in model.assignments
        if any(dotted(target) in losses for target in assigned_targets(node))
    ]
    for subject in subjects:
        for node in walk(subject):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
                operands = {model.module.code_for_node(o) for o in (node.left, node.right)}
                if steps_code in operands or any(
                    o.endswith("gradient_accumulation_steps") for o in operands
                ):
                    return True
    return False
