"""Which LR schedulers ``prepare`` wrapped, and whether a wrapped one steps ``num_processes``
times per call: the facts ACC408 (stepped per epoch) and ACC410 (stepped in a fixed-count loop)
share. Accelerate's ``step_scheduler_with_optimizer`` (on by default, with ``split_batches``
off) makes a prepared scheduler step once per process at each ``step()``, as accelify's runtime
does (`runtime/scheduler.py`)."""

from __future__ import annotations

import re

import libcst as cst

from accelify.analysis.facts import Facts, facts_of
from accelify.analysis.handed_accelerators import method_owner
from accelify.analysis.loss_sources import last_binding
from accelify.analysis.objects import bound_arguments, callee
from accelify.analysis.prepare_outputs import same_object_names, source_of
from accelify.analysis.script_model import Kind, PrepareCall, ScriptModel, output_name
from accelify.analysis.syntax import (
    all_params,
    assigned_targets,
    dotted,
    has_parameter,
    is_accelerator_call,
    keyword_value,
    root_name,
    updated_with,
    walk,
)

#: Settings under which a prepared scheduler steps once per call, or that this file may set in a
#: way it cannot read (a config dict, an attribute, a flag): a mention other than the default.
_SETTINGS = re.compile(
    r"step_scheduler_with_optimizer(?!\s*=\s*True\b)|split_batches(?!\s*=\s*False\b)"
)
#: A schedule sized with the number of processes in mind: it is meant to step N times per call.
PROCESS_COUNT = re.compile(r"num_processes|world_size")
#: How many helpers up a step is followed to the loop that calls it (``train_step(...)``).
_DEPTH = 2


def steps_once_per_process(script: ScriptModel, depth: int = 0) -> bool:
    """Every Accelerator of the file is made here with Accelerate's defaults for stepping
    schedulers: ``step_scheduler_with_optimizer=True`` and ``split_batches=False``, no settings
    unpacked from elsewhere; or the file makes none and prepares with the one its callers in the
    project's other modules hand it, made there so (`_handed_with_defaults`)."""
    if _SETTINGS.search(script.source):
        return False
    made = [call for call in script.calls if is_accelerator_call(call)]
    if not made:
        return _handed_with_defaults(script, depth)
    return all(
        argument.keyword is not None and not argument.star
        for call in made
        for argument in call.args
    )


def steps_once_per_call(script: ScriptModel) -> cst.Call | None:
    """The first Accelerator of the file when every one is made here with
    ``step_scheduler_with_optimizer=False`` spelled out and batches left unsplit (no
    ``split_batches`` other than ``False`` anywhere in the file, nothing unpacked into the
    call): a prepared scheduler then steps once per ``step()``, whatever the process count, so
    each rank steps it once per batch of its 1/N shard."""
    made = [call for call in script.calls if is_accelerator_call(call)]
    if not made or re.search(r"split_batches(?!\s*=\s*False\b)", script.source):
        return None
    for call in made:
        if any(argument.star for argument in call.args):
            return None
        value = keyword_value(call, "step_scheduler_with_optimizer")
        if not (isinstance(value, cst.Name) and value.value == "False"):
            return None
    return made[0]


def _handed_with_defaults(script: ScriptModel, depth: int) -> bool:
    """Each ``prepare`` of the file is called on a parameter of its function (``def
    fit(accelerator, model, ...)``), and every call of that function, all of them in the
    project's other modules, hands it an Accelerator that module makes with the defaults
    (`steps_once_per_process` of that module): its settings are those of the caller's."""
    project = script.project
    if project is None or not script.prepare_calls or depth > _DEPTH:
        return False
    facts = facts_of(script)
    # the function, its parameter that holds the Accelerator, and its class where it is the
    # ``__init__`` that keeps it (``self.accelerator = accelerator``, prepared in a method)
    functions: dict[int, tuple[cst.FunctionDef, str, str | None]] = {}
    for prepare in script.prepare_calls:
        func = prepare.call.func
        receiver = dotted(func.value) if isinstance(func, cst.Attribute) else None
        function = script.index.enclosing_function(prepare.call)
        if receiver is None or function is None:
            return False
        if has_parameter(function, receiver):
            # a method's callers build or call its class (``Trainer(accelerator, ...)``)
            functions[id(function)] = (function, receiver, method_owner(script, function))
            continue
        init, kept = facts.flow.kept_parameter(receiver, prepare.call)
        owner = facts.placement.class_of(init) if init is not None else None
        if init is None or kept is None or owner is None:
            return False
        functions[id(init)] = (init, kept, owner.name.value)
    for function, parameter, owner in functions.values():
        if script.call_graph.calls_of(function) or facts.flow.calls_of(function):
            return False  # called (or built) here too, with what this file holds
        callers = project.callers_of(function, owner=owner)
        if not callers:
            return False
        implicit = 0 if owner is None else 1  # a construction binds ``self``
        for caller, call, _ in callers:
            handed = next(
                (a.value for p, a in bound_arguments(function, call, implicit) if p == parameter),
                None,
            )
            if (
                handed is None
                or dotted(handed) not in caller.names_of(Kind.ACCELERATOR)
                or not steps_once_per_process(caller, depth + 1)
            ):
                return False
    return True


def prepared_schedulers(script: ScriptModel) -> dict[str, cst.Arg]:
    """Each scheduler that ``prepare`` returns, by the name it is bound to, with the argument
    that passed it."""
    flow = facts_of(script).flow
    found: dict[str, cst.Arg] = {}
    for prepare in script.prepare_calls:
        arguments = _passed(prepare)
        if arguments is None:
            continue
        for argument, given, output in zip(arguments, prepare.inputs, prepare.outputs, strict=True):
            if output and flow.kind_of(given, prepare.call) is Kind.SCHEDULER:
                found[output] = argument
    for assign in script.assignments:
        single = _prepare_scheduler_call(script, assign)
        if single is not None:
            found[single[0]] = single[1]
    return found


def _prepare_scheduler_call(script: ScriptModel, assign: cst.Assign) -> tuple[str, cst.Arg] | None:
    """``scheduler = accelerator.prepare_scheduler(scheduler)``: the name it binds and the
    argument that passed the scheduler. It wraps the scheduler as ``prepare`` does (one step
    per process at each call); a call whose result is dropped leaves the name unprepared."""
    call = assign.value
    if not (
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "prepare_scheduler"
        and len(call.args) == 1
        and not call.args[0].star
        and len(assigned_targets(assign)) == 1
    ):
        return None
    receiver = dotted(call.func.value)
    output = dotted(assigned_targets(assign)[0])
    if output is None or receiver not in script.names_of(Kind.ACCELERATOR):
        return None
    given = dotted(call.args[0].value)
    if facts_of(script).flow.kind_of(given, call) is not Kind.SCHEDULER:
        return None
    return output, call.args[0]


def _passed(prepare: PrepareCall) -> list[cst.Arg] | None:
    """The arguments in the order of its inputs and outputs; None when they do not line up
    (``*objects``, ``prepared = prepare(a, b)``)."""
    arguments = list(prepare.call.args)
    if any(argument.star for argument in arguments):
        return None
    if not (len(arguments) == len(prepare.inputs) == len(prepare.outputs)):
        return None
    return arguments


def sized_by_process_count(script: ScriptModel, name: str) -> bool:
    """``StepLR(optimizer, step_size=30 * accelerator.num_processes)``: sized for the steps each
    call takes, on purpose; also where ``prepare`` renamed it (`prepare_outputs`)."""
    names = same_object_names(script, name)
    return any(
        PROCESS_COUNT.search(script.module.code_for_node(binding.value))
        for binding in script.of_kind(Kind.SCHEDULER)
        if binding.name in names
    )


def stepped_per_fixed_iteration(
    facts: Facts, step: cst.Call, sized_with: frozenset[str] = frozenset()
) -> cst.For | cst.While | None:
    """The loop of a fixed count that runs ``step`` (a ``scheduler.step()`` handed nothing)
    once per iteration, or None. Every rank runs all its iterations (nanoGPT's ``for it in
    range(max_iters)``), so the schedule must step once per call, as an unprepared one does: the
    conversion leaves such a scheduler out of ``prepare``, ACC401 does not ask for it there, and
    ACC410 reports a prepared one. The one definition all three ask; whether the step also runs
    once per optimizer step (outside ``accumulate()``, or under ``sync_gradients`` in it, as a
    manual accumulation's step becomes) is `flow.once_per_optimizer_step`, ACC401's business.
    None for a step handed an argument (an epoch, a metric). ``sized_with``: the
    schedule's own length (`schedule_length`); a loop bounded by that value counts as fixed
    whatever the value is (`_bounded_alike`)."""
    if step.args:
        return None
    return fixed_count_loop(facts, step, sized_with=sized_with)


def per_fixed_iteration_steps(
    facts: Facts, steps: list[cst.Call], sized_with: frozenset[str] = frozenset()
) -> list[tuple[cst.Call, cst.For | cst.While]] | None:
    """Each of one scheduler's ``steps`` with its fixed-count loop, when there is at least one
    and every one is `stepped_per_fixed_iteration`: the scheduler steps once per optimizer step
    of such a loop and nowhere else. None otherwise."""
    found = [(step, stepped_per_fixed_iteration(facts, step, sized_with)) for step in steps]
    if not found or any(loop is None for _, loop in found):
        return None
    return found  # type: ignore[return-value]


def fixed_count_loop(
    facts: Facts,
    node: cst.CSTNode,
    depth: int = _DEPTH,
    sized_with: frozenset[str] = frozenset(),
) -> cst.For | cst.While | None:
    """The ``for _ in range(n)`` (or ``while step < n``, `_counted_while`) that runs ``node``
    once per iteration, beside the backward it steps after, where ``n`` does not shrink with the
    shard; also around the call of the helper
    that ``node`` is in (``self.train_step(batch)``). None for any other loop nearest to it.
    Every rank runs all ``n`` iterations (nanoGPT's ``for it in range(max_iters): xb, yb =
    get_batch()``): a scheduler stepped there must step once per call, so left unprepared."""
    for ancestor in facts.model.ancestors(node):
        if isinstance(ancestor, cst.FunctionDef):
            break
        if isinstance(ancestor, cst.While):
            counted = _counted_while(facts, ancestor, sized_with=sized_with)
            return ancestor if counted and _trains(facts, ancestor) else None
        if isinstance(ancestor, cst.For):
            if _fixed_count(facts, ancestor, sized_with) and _trains(facts, ancestor):
                return ancestor
            return _counting_while_around(facts, ancestor, sized_with)
    function = facts.placement.enclosing_function(node)
    if function is None or depth == 0:
        return None
    found = {
        id(loop): loop
        for call, _ in facts.flow.calls_of(function)
        if (loop := fixed_count_loop(facts, call, depth - 1, sized_with)) is not None
    }
    calls = facts.flow.calls_of(function)
    return next(iter(found.values())) if calls and len(found) == len(calls) == 1 else None


def _fixed_count(facts: Facts, loop: cst.For, sized_with: frozenset[str] = frozenset()) -> bool:
    """``range(n)`` where ``n`` is no ``len()`` of a prepared object and no share of the
    processes, nor a name bound to one; or is the schedule's own length (`_bounded_alike`)."""
    iterated = loop.iter
    if not (isinstance(iterated, cst.Call) and dotted(iterated.func) == "range" and iterated.args):
        return False
    bound = iterated.args[1 if len(iterated.args) > 1 else 0].value
    return _bounded_alike(facts, bound, sized_with) or not _shrinks_with_the_shard(
        facts, bound, depth=2
    )


def _counted_while(
    facts: Facts,
    loop: cst.While,
    counted_in: cst.CSTNode | None = None,
    sized_with: frozenset[str] = frozenset(),
) -> bool:
    """``while step < max_steps:``, or ``while True:`` left by ``if step >= max_steps: break``
    at its own level (or by ``if step >= max_steps: return`` anywhere in it: a GPT-2
    fine-tuning's ``while True: for batch in loader: ...`` that returns from inside the loop
    over the loader), where ``step`` is counted up in ``counted_in`` (the loop itself unless
    given) and ``max_steps`` does not shrink with the shard (as `_fixed_count`'s ``range(n)``):
    every rank runs all its iterations."""
    where = counted_in if counted_in is not None else loop
    if _counter_below_a_bound(facts, loop.test, where, False, sized_with):
        return True
    if not (isinstance(loop.test, cst.Name) and loop.test.value == "True"):
        return False
    leaving = [s for s in loop.body.body if isinstance(s, cst.If) and _breaks(s)]
    leaving += [
        node
        for node in walk(loop.body)
        if isinstance(node, cst.If)
        and _ends_in_return(node)
        and facts.placement.enclosing_function(node) is facts.placement.enclosing_function(loop)
    ]
    return any(
        _counter_below_a_bound(facts, statement.test, where, True, sized_with)
        for statement in leaving
    )


def _ends_in_return(statement: cst.If) -> bool:
    """``if ...: ...; return`` (the body ends in a ``return``), with no ``else``."""
    body = statement.body.body if isinstance(statement.body, cst.IndentedBlock) else []
    if statement.orelse is not None or not body:
        return False
    line = body[-1]
    return isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[-1], cst.Return)


def _counting_while_around(
    facts: Facts, inner: cst.For, sized_with: frozenset[str] = frozenset()
) -> cst.While | None:
    """``while step < max_steps: for batch in loader: ...; step += 1``: the loop over the
    shard is not of a fixed count, but the while loop around it, counting optimizer steps in
    it, is: every rank runs ``max_steps`` of them, however short its shard (the loader is
    started again). None when the counter counts anything else (``epoch += 1`` after the
    inner loop: an epoch loop, ACC408's business)."""
    for ancestor in facts.model.ancestors(inner):
        if isinstance(ancestor, (cst.FunctionDef, cst.For)):
            return None
        if isinstance(ancestor, cst.While):
            counted = _counted_while(facts, ancestor, inner, sized_with)
            trains = facts.flow.reaches(inner, _DEPTH, _calls_backward)
            return ancestor if counted and trains else None
    return None


def _breaks(statement: cst.If) -> bool:
    """``if ...: break`` (the body is one ``break``), with no ``else``."""
    body = statement.body.body if isinstance(statement.body, cst.IndentedBlock) else []
    if statement.orelse is not None or len(body) != 1:
        return False
    line = body[0]
    return isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[0], cst.Break)


#: The comparisons of a counter with its bound, by whether the loop goes on while it holds.
_GOES_ON = (cst.LessThan, cst.LessThanEqual)
_STOPS = (cst.GreaterThan, cst.GreaterThanEqual)


def _counter_below_a_bound(
    facts: Facts,
    test: cst.BaseExpression,
    counted_in: cst.CSTNode,
    leaves_when_true: bool,
    sized_with: frozenset[str] = frozenset(),
) -> bool:
    """``step < n`` (or ``n > step``) that keeps the loop going, or ``step >= n`` (``n <= step``)
    that leaves it, with ``step`` counted up in ``loop`` (an attribute also in a method of the
    file the loop calls: ``self.steps += 1`` of a trainer's ``train_step()``) and ``n`` not
    shrinking with the shard, or the schedule's own length (`_bounded_alike`)."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    operator = test.comparisons[0].operator
    left, right = test.left, test.comparisons[0].comparator
    counter_left = _GOES_ON if not leaves_when_true else _STOPS
    counter_right = _STOPS if not leaves_when_true else _GOES_ON
    if isinstance(operator, counter_left):
        counter, bound = left, right
    elif isinstance(operator, counter_right):
        counter, bound = right, left
    else:
        return False
    name = dotted(counter)
    if name is None:
        return False
    counted = _counted_up(counted_in, name) or (
        name.startswith("self.")
        and facts.flow.reaches(counted_in, _DEPTH, lambda node: _counted_up(node, name))
    )
    return counted and (
        _bounded_alike(facts, bound, sized_with)
        or not _shrinks_with_the_shard(facts, bound, depth=2)
    )


#: The arguments that give a scheduler's length in steps (torch's, transformers' and
#: diffusers' schedules), by keyword only: a positional one is not taken for it
_LENGTH_KEYWORDS = ("T_max", "total_iters", "total_steps", "num_training_steps")


def schedule_length(script: ScriptModel, name: str) -> frozenset[str]:
    """The value that sizes the scheduler bound to ``name`` (``CosineAnnealingLR(opt,
    T_max=num_train_steps)``), as `_value_keys` names it: a loop bounded by the same value
    (``while self.steps < self.num_train_steps`` where ``self.num_train_steps =
    num_train_steps``) runs as many iterations on every rank as the schedule has steps, whatever
    the value is (handed by a caller no one sees, or shard-sized): prepared, the schedule ends
    after 1/N of them. Empty when the scheduler is made more than one way, or not here. A name
    ``prepare`` bound from another is sized where that one was made (`prepare_outputs`)."""
    made = [
        binding.value
        for binding in script.of_kind(Kind.SCHEDULER)
        if binding.name == source_of(script, name) and isinstance(binding.value, cst.Call)
    ]
    if len(made) != 1:
        return frozenset()
    lengths = [
        a.value
        for a in made[0].args
        if a.keyword is not None and a.keyword.value in _LENGTH_KEYWORDS
    ]
    return _value_keys(script, lengths[0]) if len(lengths) == 1 else frozenset()


def _bounded_alike(facts: Facts, bound: cst.BaseExpression, sized_with: frozenset[str]) -> bool:
    """``bound`` is the value the schedule was sized with (`schedule_length`)."""
    return bool(sized_with) and bool(_value_keys(facts.model, bound) & sized_with)


def _value_keys(script: ScriptModel, value: cst.BaseExpression) -> frozenset[str]:
    """Names for the value ``value`` reads, the same wherever it is read: a parameter of the
    function around it that the function never rebinds (by the function), an attribute of the
    class around it (by the class), and for an attribute set once in its class, from such a
    parameter, and never updated in place, that parameter too (``self.num_train_steps =
    num_train_steps`` in ``__init__``). Empty for any other value."""
    name = dotted(value)
    if name is None:
        return frozenset()
    if "." not in name:
        parameter = _unchanged_parameter(script, value, name)
        return frozenset([parameter] if parameter else [])
    owner = script.index.enclosing_class(value)
    if not name.startswith("self.") or name.count(".") != 1 or owner is None:
        return frozenset()
    keys = {f"{id(owner)}:{name}"}
    assigned = script.index.assignments_in_class(name, value)
    updated = any(
        isinstance(node, cst.AugAssign) and dotted(node.target) == name for node in walk(owner)
    )
    if len(assigned) == 1 and isinstance(assigned[0].value, cst.Name) and not updated:
        parameter = _unchanged_parameter(script, assigned[0].value, assigned[0].value.value)
        if parameter:
            keys.add(parameter)
    return frozenset(keys)


def _unchanged_parameter(script: ScriptModel, at: cst.CSTNode, name: str) -> str | None:
    """``function-id:name`` where ``name`` is a parameter of the function around ``at`` that
    nothing in it rebinds; None otherwise."""
    function = script.index.enclosing_function(at)
    if function is None or not any(p.name.value == name for p in all_params(function.params)):
        return None
    if script.index.assigned_under(function).get(name):
        return None
    if any(
        isinstance(node, cst.AugAssign) and dotted(node.target) == name
        for node in walk(function.body)
    ):
        return None
    return f"{id(function)}:{name}"


def _counted_up(loop: cst.CSTNode, name: str) -> bool:
    """``name += 1`` (or ``name = name + 1``) somewhere in ``loop``."""
    for node in walk(loop):
        operands = updated_with(node, name, cst.Add)
        if operands is not None and (
            operands[0] is None or name in {dotted(operands[0]), dotted(operands[1])}
        ):
            return True
    return False


def _shrinks_with_the_shard(facts: Facts, bound: cst.BaseExpression, depth: int) -> bool:
    script = facts.model
    if PROCESS_COUNT.search(script.module.code_for_node(bound)):
        return True
    for node in walk(bound):
        if isinstance(node, cst.Call) and dotted(node.func) == "len":
            return _length_of_a_loader(facts, node)
        if isinstance(node, cst.Call) and callee(script, node) is not None:
            return True  # counted by a function of the file: not followed
        if not isinstance(node, cst.Name | cst.Attribute) or _inside_a_dotted_name(script, node):
            continue
        name = dotted(node)
        if name is None:
            continue
        if depth == 0:
            return True  # not followed further: it may be the shard's length
        values = [assign.value for assign in script.index.assignments_to(name)]
        if isinstance(node, cst.Name) and not values:
            # a parameter: what its callers pass (``train(..., len(loader))``); one no call
            # passes may be anything, so the loop is not taken as fixed (left prepared)
            passed = facts.flow.call_site_arguments(name, node)
            default = default_left_to_some_call(facts, name, node)
            if not passed and default is None:
                # a number setting of a function no call in the file runs (a CLI entry point:
                # ``def main(num_train_steps: int = 10000)`` handed to ``tyro.cli(main)``)
                return not _integer_default(facts, name, node)
            # what its callers pass, and the default where a call leaves it (``main()``)
            values = [argument.value for argument in passed]
            values += [default] if default is not None else []
        if any(_shrinks_with_the_shard(facts, value, depth - 1) for value in values):
            return True
    return False


def default_left_to_some_call(
    facts: Facts, name: str, at: cst.CSTNode
) -> cst.BaseExpression | None:
    """The default of ``name``, a parameter of the function around ``at``, where a call of
    that function in the file leaves it out (``def main(max_steps=5000)`` run as ``main()``)."""
    function = facts.placement.enclosing_function(at)
    if function is None:
        return None
    default = next((p.default for p in all_params(function.params) if p.name.value == name), None)
    if default is None:
        return None
    calls = facts.flow.calls_of(function)
    passed = facts.flow.call_site_arguments(name, at)
    return default if len(passed) < len(calls) else None


def _integer_default(facts: Facts, name: str, at: cst.CSTNode) -> bool:
    """``name`` is a parameter of the function around ``at`` with an integer literal default,
    and nothing in the file calls that function."""
    function = facts.placement.enclosing_function(at)
    if function is None or facts.flow.calls_of(function):
        return False
    return any(
        param.name.value == name and isinstance(param.default, cst.Integer)
        for param in all_params(function.params)
    )


def _inside_a_dotted_name(script: ScriptModel, node: cst.CSTNode) -> bool:
    """``self`` and ``cfg`` of ``self.cfg.max_steps`` (parts of a longer name, followed whole),
    and ``int`` of ``int(steps)`` (a function called, not a count)."""
    parent = script.parent(node)
    if isinstance(parent, cst.Call) and parent.func is node:
        return True
    return isinstance(parent, cst.Attribute)  # its value (``self.cfg``) or its attribute


def _length_of_a_loader(facts: Facts, length: cst.Call) -> bool:
    """``len(loader)`` of a prepared loader (it shrinks with the shard), or of any DataLoader
    (an unprepared one is ACC405's business); not ``len(train_data)``."""
    if not length.args:
        return True
    measured = dotted(length.args[0].value)
    prepared = facts.model.prepared_names
    return (
        measured in prepared
        or facts.flow.outer_name(measured, length) in prepared
        or facts.flow.kind_of(measured, length) is Kind.DATALOADER
    )


def _trains(facts: Facts, loop: cst.For | cst.While) -> bool:
    """The loop runs a backward per iteration (inline or in a function of the file it calls)
    and no loop over a DataLoader runs inside it, here or in a function it calls
    (``train_one_epoch(loader)``: that makes it an epoch loop, ACC408's business)."""
    if facts.flow.reaches(loop, _DEPTH, lambda node: _reads_a_loader_inside(facts, node, loop)):
        return False
    return facts.flow.reaches(loop, _DEPTH, _calls_backward)


def _reads_a_loader_inside(facts: Facts, node: cst.CSTNode, loop: cst.For | cst.While) -> bool:
    return any(
        inner.node is not loop and facts.placement.inside(inner.node, node)
        for inner in facts.model.loops
        if facts.flow.reads_loader(inner)
    )


def _calls_backward(node: cst.CSTNode) -> bool:
    return any(
        isinstance(call, cst.Call)
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "backward"
        for call in walk(node)
    )


#: How many bindings and helpers the sizing of a scheduler is followed through
#: (``total = len(loader) * epochs`` in a factory handed the loader).
_SIZING_DEPTH = 5
#: How many callers up a measured parameter is followed to the name its callers pass.
_CALLERS_DEPTH = 2


def sized_by_a_prepared_loader(script: ScriptModel, argument: cst.Arg) -> cst.Call | None:
    """The ``len(loader)`` a scheduler handed to ``prepare`` by ``argument`` was sized with,
    where ``loader`` is what an earlier ``prepare`` returned: each rank's share of the batches,
    1/N of them. None when the sizing reads no such length, or names the process count (sized
    for the N steps per call on purpose)."""
    prepare = next((a for a in script.ancestors(argument) if isinstance(a, cst.Call)), None)
    given = dotted(argument.value)
    if prepare is None or given is None:
        return None
    binding = last_binding(script, given, prepare)
    if not isinstance(binding, cst.Assign) or not isinstance(binding.value, cst.Call):
        return None
    found = _prepared_length(script, binding.value, binding, _SIZING_DEPTH, set())
    return found or None


def _prepared_length(
    script: ScriptModel, expression: cst.CSTNode, at: cst.CSTNode, depth: int, seen: set[int]
) -> cst.Call | bool | None:
    """The first ``len()`` of a loader prepared before it that ``expression`` reads, through the
    names it reads (their last binding above ``at``) and the file's functions it calls (their
    return values); False when a value on the way names the process count."""
    if id(expression) in seen:
        return None
    seen.add(id(expression))
    code = script.module.code_for_node(expression)
    if PROCESS_COUNT.search(code) or "WORLD_SIZE" in code:  # ``int(os.environ["WORLD_SIZE"])``
        return False
    skipped = script.names_of(Kind.MODEL, Kind.OPTIMIZER, Kind.ACCELERATOR)
    for node in walk(expression):
        if isinstance(node, cst.Call) and dotted(node.func) == "len" and len(node.args) == 1:
            if _prepared_before(script, node.args[0].value, node, _CALLERS_DEPTH):
                return node
            continue
        if depth <= 0:
            continue
        nested: list[tuple[cst.CSTNode, cst.CSTNode]] = []
        if isinstance(node, cst.Name) and node.value not in skipped:
            parent = script.parent(node)
            if isinstance(parent, cst.Call) and parent.func is node:
                continue  # a function called, followed through its return values below
            binding = last_binding(script, node.value, at)
            if isinstance(binding, cst.Assign):
                nested.append((binding.value, binding))
        elif isinstance(node, cst.Call):
            target = script.call_graph.callee(node)
            if target is not None:
                nested.extend(
                    (r.value, r)
                    for r in walk(target[0])
                    if isinstance(r, cst.Return) and r.value is not None
                )
        for value, where in nested:
            found = _prepared_length(script, value, where, depth - 1, seen)
            if found is not None:
                return found
    return None


def _returns(script: ScriptModel, prepare: PrepareCall, name: str, entry_of: str | None) -> bool:
    """``prepare`` returns ``name``, or the dict ``entry_of`` (``loaders = {k:
    accelerator.prepare(v) for ...}``) that ``name`` is an entry of."""
    return name in prepare.outputs or (
        entry_of in prepare.outputs and isinstance(script.parent(prepare.call), cst.DictComp)
    )


def preparing_call(script: ScriptModel, length: cst.Call) -> cst.Call | None:
    """The ``prepare`` that returned the loader ``len(loader)`` measures, when it is in the same
    function above it and the length names its output (or an entry of a dict it prepared);
    followed through an alias (``train_loader = loaders["train"]``) and a parameter every call
    fills from one place (``setup_scheduler(optimizer, opt, dataloader_train)``), two deep."""
    if not length.args:
        return None
    return _preparing(script, length.args[0].value, length, 2)


def _preparing(
    script: ScriptModel, measured: cst.BaseExpression, at: cst.CSTNode, depth: int
) -> cst.Call | None:
    name = output_name(script, measured)
    entry_of = root_name(measured) if isinstance(measured, cst.Subscript) else None
    placement = facts_of(script).placement
    function = placement.enclosing_function(at)
    found = None
    for prepare in script.prepare_calls:
        if (
            name
            and _returns(script, prepare, name, entry_of)
            and placement.enclosing_function(prepare.call) is function
            and script.order(prepare.call) < script.order(at)
        ):
            found = prepare.call
    plain = dotted(measured)
    if found is not None or depth <= 0 or plain is None:
        return found
    binding = last_binding(script, plain, at)
    if isinstance(binding, cst.Assign) and len(binding.targets) == 1:
        if isinstance(binding.value, (cst.Name, cst.Attribute, cst.Subscript)):
            return _preparing(script, binding.value, binding, depth - 1)  # an alias
        return None
    passed = facts_of(script).flow.call_site_arguments(plain, at)
    if binding is None and len(passed) == 1:
        return _preparing(script, passed[0].value, passed[0], depth - 1)  # a parameter
    return None


def _prepared_before(
    script: ScriptModel, measured: cst.BaseExpression, at: cst.CSTNode, depth: int
) -> bool:
    """``measured`` holds, at ``at``, what a ``prepare`` returned: an output of a prepare call
    above it in the same function (or both at the module's level), or a parameter every caller
    fills with such a name."""
    name = output_name(script, measured)
    if not name:
        return False
    facts = facts_of(script)
    function = facts.placement.enclosing_function(at)
    # ``loaders["train"]`` of ``loaders = {k: accelerator.prepare(v) for k, v in ...}``
    entry_of = root_name(measured) if isinstance(measured, cst.Subscript) else None
    for prepare in script.prepare_calls:
        if not _returns(script, prepare, name, entry_of):
            continue
        if facts.placement.enclosing_function(prepare.call) is function and script.order(
            prepare.call
        ) < script.order(at):
            return True
    if isinstance(measured, cst.Name):
        # ``train_dl = loaders["train"]`` after the prepare: the same loader under a new name
        binding = last_binding(script, name, at)
        if (
            isinstance(binding, cst.Assign)
            and len(binding.targets) == 1
            and binding.targets[0].target is not measured
            and isinstance(binding.value, (cst.Name, cst.Attribute, cst.Subscript))
            and _prepared_before(script, binding.value, binding, 0)
        ):
            return True
    if function is None or "." in name or depth <= 0:
        return False
    if name not in {param.name.value for param in all_params(function.params)}:
        return False
    sites = script.call_graph.calls_of(function)
    passed = [
        (argument, site)
        for site, implicit in sites
        for parameter, argument in bound_arguments(function, site, implicit)
        if parameter == name
    ]
    return bool(passed) and all(
        _prepared_before(script, argument.value, site, depth - 1) for argument, site in passed
    )
