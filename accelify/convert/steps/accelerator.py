"""2. The ``Accelerator(...)`` itself: created in the scope that owns training, before the first
edit that needs it, threaded as a parameter into the helpers that need it. Runs last: it knows
every edit that needs the accelerator and every constructor argument the other steps found."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accelify.analysis.base_inits import own_init, runs_init_of
from accelify.analysis.objects import bound_arguments, methods_of
from accelify.analysis.script_model import Kind, Scope
from accelify.analysis.syntax import dotted, walk
from accelify.convert.steps import handed_accelerator
from accelify.convert.steps.context import Context
from accelify.edits.node_rewrites import WithKeyword
from accelify.edits.plan import statement


def run(ctx: Context, prepare_scope: Scope) -> None:
    handed_accelerator.thread(ctx)
    home = _home(ctx, prepare_scope)
    skipping = _subclass_skipping_the_home(ctx, home)
    if skipping is not None:
        ctx.left_as_is = skipping
        return
    create = f"{ctx.acc} = {ctx.constructor_code()}"
    if not ctx.acc.startswith("self.") and not isinstance(home, cst.Module):
        threading = _threading(ctx, home)
        if threading.stranded:
            ctx.left_as_is = _stranded(ctx, home, threading.stranded[0])
            return
        implicit = [f for f in threading.functions if _implicitly_called(ctx, f)]
        if implicit:
            ctx.left_as_is = _implicit(ctx, home, implicit[0])
            return
    threaded = _thread(ctx, home)
    anchor = _first_need(ctx, home, threaded)
    if anchor is None and ctx.acc.startswith("self."):
        # The constructor needs nothing of it itself (it prepares nothing: a model it keeps in
        # a dict entry leaves the whole set unprepared); every other method may: made last there.
        last = ctx.facts.placement.body_of(home)[-1]
        created = [statement(create), *map(statement, ctx.after_creation)]
        if isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return):
            ctx.plan.insert_before(last, *created)
        else:
            ctx.plan.insert_after(last, *created)
        ctx.plan.change(ctx.line(home), f"created {create} at the end of {home.name.value}()")
        return
    if anchor is None:
        return
    per_iteration = ctx.facts.placement.bound_per_iteration(home, ctx.constructor.values())
    if per_iteration:
        ctx.left_as_is = _per_iteration(ctx, *per_iteration[0])
        return
    late = _late_arguments(ctx, home, anchor)
    if late:
        ctx.to_withhold = late  # planned again with these arguments' constructs kept
        return
    # Early inserts: the Accelerator (and what its constructor reads) comes before whatever
    # other steps put at the same place, which uses it.
    _move_constructor_arguments_up(ctx, home, anchor)
    created = [statement(create), *(statement(code) for code in ctx.after_creation)]
    if anchor is ctx.prepare_anchor and not _needed_by(ctx, anchor):
        # Nothing before the prepare call needs it: created right above that call, after the
        # last object it prepares, not between a model and its optimizer.
        ctx.plan.insert_after(anchor, *created, early=True)
        ctx.plan.change(ctx.line(anchor), f"created {create} after line {ctx.line(anchor)}")
        return
    ctx.plan.insert_before(anchor, *created, early=True)
    ctx.plan.change(ctx.line(anchor), f"created {create} before line {ctx.line(anchor)}")


def _subclass_skipping_the_home(ctx: Context, home: Scope) -> tuple[int, str] | None:
    """``class Small(Model)`` whose own ``__init__`` does not run ``Model.__init__``, where
    ``self.accelerator`` would be created: a ``Small`` has none, and what it inherits from
    ``Model`` (the ``train()`` that now prepares through it) fails with AttributeError at the
    first step. The file stays as it is, with this line."""
    if not ctx.acc.startswith("self.") or not isinstance(home, cst.FunctionDef):
        return None
    graph = ctx.facts.calls
    owner = graph.owner(home)
    if owner is None or home.name.value != "__init__":
        return None
    for cls in graph.subclasses(owner):
        if runs_init_of(graph, cls, owner):
            continue
        init = own_init(cls)
        where = cls if init is None else init
        return ctx.line(where), skipped_init_review(
            cls.name.value, owner.name.value, ctx.acc, "" if init is None else " (this line)"
        )
    return None


def skipped_init_review(subclass: str, owner: str, acc: str, where: str) -> str:
    """Why a class is left as it is when a subclass does not run its ``__init__``."""
    return (
        f"left as it is: {subclass}.__init__{where} does not run {owner}.__init__, where the "
        f"conversion would create {acc}: a {subclass} would have none, and what it inherits "
        f"from {owner} would fail with AttributeError at its first use of it; call "
        f"super().__init__() in {subclass}.__init__, outside any condition ({owner}.__init__("
        "self, ...) where another base comes first), then convert"
    )


def _per_iteration(ctx: Context, name: str, loop: cst.For) -> tuple[int, str]:
    """The constructor would read ``name``, which ``loop`` binds anew for each run (``for lr,
    amp in configs:`` then ``GradScaler(enabled=amp)``): made before the loop it reads a name not
    bound yet (NameError), made in it there is an Accelerator per run in one process, whose
    settings (precision, accumulation) Hugging Face Accelerate's shared state refuses to change
    from one to the next. The file stays as it is, with this line."""
    arguments = ", ".join(f"{key}={code}" for key, code in ctx.constructor.items())
    return (
        ctx.line(loop),
        f"the Accelerator would be made with {arguments}, which reads {name}, set anew for each "
        f"run of this loop: one Accelerator per process cannot change these settings from one "
        f"run to the next (made before the loop, {name} is not yet set; made in it, a second "
        "Accelerator with other settings is refused by Hugging Face Accelerate); left as it "
        "is: give every run the same setting (or pass it to accelify launch, e.g. "
        "--mixed-precision), or start one process per run, then convert",
    )


def _stranded(ctx: Context, home: Scope, call: cst.Call) -> tuple[int, str]:
    """Why no call site can stay well-formed: a function that needs the accelerator (its
    prints, its saves) is called where none exists (``main()`` at the module's end), and the
    accelerator cannot be made higher up, since its constructor reads what only ``home``
    defines (``Accelerator(gradient_accumulation_steps=accum)`` in ``run(accum)``). Threaded
    anyway, the call would miss a required argument (a TypeError); unthreaded, the function's
    prints would run on every rank. So the file stays as it is, with this line."""
    local = locals_of(ctx, home)
    read = sorted(
        {
            n.value
            for code in ctx.constructor.values()
            for n in walk(cst.parse_expression(code))
            if isinstance(n, cst.Name) and n.value in local
        }
    )
    name = home.name.value if isinstance(home, cst.FunctionDef) else "the module"
    called = ctx.code(call.func)
    return (
        ctx.line(call),
        f"left as it is: {called}() needs the accelerator (what it prints or saves must run "
        f"once) and is called here, where none exists; it cannot be made higher up, since "
        f"{ctx.constructor_code()} reads {', '.join(read) or 'what'} of {name}(): no call "
        f"could pass it. Make one Accelerator where the run starts, hand it to {name}() (a "
        "setting that changes per call can be set on it there), then convert",
    )


def _implicit(ctx: Context, home: Scope, function: cst.FunctionDef) -> tuple[int, str]:
    """Why a method Python calls itself (``__post_init__``, ``__getitem__``) cannot take the
    accelerator: no call in the file passes its arguments, so a parameter added to it is
    missing at every implicit call (a TypeError on construction), and the accelerator cannot
    be a module-level global instead, since its constructor reads what only ``home``
    defines. So the file stays as it is, with this line."""
    name = home.name.value if isinstance(home, cst.FunctionDef) else "the module"
    method = _qualified_name(ctx, function)
    return (
        ctx.line(function),
        f"left as it is: {method}() needs the accelerator, and Python calls it itself (no "
        f"call in the file could pass it); it cannot be made at the module's level, since "
        f"{ctx.constructor_code()} reads what {name}() defines. Make one Accelerator where "
        f"the run starts and read what {method}() needs from it there, then convert",
    )


def _implicitly_called(ctx: Context, function: cst.FunctionDef) -> bool:
    """A method Python runs itself, through syntax or a protocol (``__post_init__`` of a
    dataclass, ``__getitem__`` of ``x[i]``, ``__len__``, ``__iter__``): no call in the file
    passes its arguments, so it can take no new parameter. ``__init__`` and ``__call__`` are
    not: ``Config(...)`` and ``early_stopping(loss, model)`` are their calls (the call graph
    finds them, and those it cannot place get review lines), and pass what they gain."""
    name = function.name.value
    return (
        ctx.facts.calls.owner(function) is not None
        and name.startswith("__")
        and name.endswith("__")
        and name not in ("__init__", "__call__")
    )


def _constructions(ctx: Context, function: cst.FunctionDef) -> list[cst.Call]:
    """The calls that make an instance of ``function``'s class (or a subclass): a method Python
    runs itself runs on an instance, so none of it runs before the first of them."""
    graph = ctx.facts.calls
    owner = graph.owner(function)
    if owner is None:
        return []
    classes = [owner, *graph.subclasses(owner)]
    return [call for cls in classes for call in ctx.model.index.calls_named(cls.name.value)]


def _needed_by(ctx: Context, statement_node: cst.CSTNode) -> bool:
    """An edit inside ``statement_node`` itself uses the accelerator."""
    placement = ctx.facts.placement
    return any(
        need is not statement_node and placement.inside(need, statement_node) for need in ctx.needs
    )


def _move_constructor_arguments_up(ctx: Context, home: Scope, anchor: cst.CSTNode) -> None:
    """``accum = 2`` set below the place the Accelerator is created moves up (`_late_arguments`
    found that each such name can)."""
    placement = ctx.facts.placement
    body = placement.body_of(home)
    for name, line in placement.assigned_after(anchor, home, set(ctx.constructor.values())):
        hoisted = _hoisted(ctx, body, anchor, name)
        if hoisted is not None:
            ctx.plan.remove(hoisted)
            ctx.plan.insert_before(anchor, hoisted.deep_clone(), early=True)
            code = ctx.code(hoisted).strip()
            ctx.plan.change(line, f"moved `{code}` up before line {ctx.line(anchor)}")


#: constructor arguments whose step can keep the script's own construct instead
WITHHOLDABLE = ("mixed_precision", "gradient_accumulation_steps")


def _late_arguments(ctx: Context, home: Scope, anchor: cst.CSTNode) -> dict[str, str]:
    """The constructor arguments that read a name ``home`` sets only at or after ``anchor``,
    the first statement that uses the accelerator, where that setting cannot move up
    (``use_amp = device == "cuda"`` below ``device = str(accelerator.device)``): no place
    comes both after what the argument reads and before the accelerator's first use. Made
    there anyway, the Accelerator reads a name not yet bound (NameError on every rank). Each
    with why; the conversion is planned again keeping the construct the argument would have
    replaced (the script's autocast, its manual accumulation), or the file is left as it is
    when no step can keep it (`left_as_is`)."""
    placement = ctx.facts.placement
    body = placement.body_of(home)
    found: dict[str, str] = {}
    for key, code in ctx.constructor.items():
        for name, line in placement.assigned_after(anchor, home, [code]):
            if _hoisted(ctx, body, anchor, name) is not None:
                continue
            blocker = _hoist_blocker(ctx, body, anchor, name)
            found[key] = (
                f"Accelerator({key}={code}) would read {name}, set at line {line}, below "
                f"line {ctx.line(anchor)}, which already uses the accelerator, and {name} "
                f"cannot be set earlier ({blocker}); to move it into the Accelerator, set "
                f"{name} before line {ctx.line(anchor)} from what exists there, then convert"
            )
            break
    if any(key not in WITHHOLDABLE or key in ctx.withheld for key in found):
        key, why = next(iter(found.items()))
        ctx.left_as_is = (ctx.line(anchor), f"left as it is: {why}")
        return {}
    return found


def _hoisted(
    ctx: Context, body: list[cst.CSTNode], anchor: cst.CSTNode, name: str
) -> cst.SimpleStatementLine | None:
    """The statement that sets ``name``, when it can move above ``anchor``: one the plan does
    not rewrite, remove or put in a block (moved as a copy, it would lose that edit; what
    the plan inserts beside it stays where it is)."""
    hoisted = ctx.facts.placement.hoistable(body, anchor, name)
    if hoisted is None:
        return None
    rewritten, _ = ctx.plan.edited_nodes()
    placement = ctx.facts.placement
    if any(node is hoisted or placement.inside(node, hoisted) for node in rewritten):
        return None
    if ctx.plan.removes(hoisted) or ctx.plan.block_around(hoisted) is not None:
        return None
    return hoisted


def _hoist_blocker(ctx: Context, body: list[cst.CSTNode], anchor: cst.CSTNode, name: str) -> str:
    """Why the statement that sets ``name`` below ``anchor`` cannot move above it, as advice
    says it."""
    start = body.index(anchor)
    for index in range(start, len(body)):
        line = body[index]
        if name not in {
            t for n in walk(line) if isinstance(n, cst.AssignTarget) for t in _names_of(n.target)
        }:
            continue
        if not isinstance(line, cst.SimpleStatementLine):
            return f"line {ctx.line(line)} sets it inside a block"
        if not (
            len(line.body) == 1
            and isinstance(line.body[0], cst.Assign)
            and [dotted(t.target) for t in line.body[0].targets] == [name]
        ):
            return f"line {ctx.line(line)} is not a plain assignment of {name} alone"
        value = line.body[0].value
        reads = {n.value for n in walk(value) if isinstance(n, cst.Name)}
        for earlier in body[start:index]:
            set_there = {
                t
                for n in walk(earlier)
                if isinstance(n, cst.AssignTarget)
                for t in _names_of(n.target)
            }
            clash = sorted(reads & set_there)
            if clash:
                uses = " from the accelerator" if _needed_by_or_is(ctx, earlier) else ""
                return f"it reads {clash[0]}, which line {ctx.line(earlier)} sets{uses}"
        if any(isinstance(n, (cst.Call, cst.Await, cst.Yield)) for n in walk(value)):
            return "its value calls a function, which the conversion does not move"
        return f"{name} is read or set in between, or the conversion edits that line"
    return f"{name} is set below it"


def _names_of(target: cst.BaseExpression) -> set[str]:
    """The names and dotted attributes an assignment target binds."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return {n for e in target.elements for n in _names_of(e.value)}
    if isinstance(target, cst.StarredElement):
        return _names_of(target.value)
    shown = dotted(target)
    return {shown} if shown is not None else set()


def _needed_by_or_is(ctx: Context, statement_node: cst.CSTNode) -> bool:
    placement = ctx.facts.placement
    return any(
        need is statement_node or placement.inside(need, statement_node) for need in ctx.needs
    )


def _home(ctx: Context, prepare_scope: Scope) -> Scope:
    """Where the accelerator is created: the scope that prepares, unless a function that needs
    it is called where it cannot be passed (``main()`` at the module's end): then the function
    that calls the preparing one from there (``main``), else the module."""
    if ctx.acc.startswith("self."):
        return _instance_home(ctx, prepare_scope)
    home = _home_by_calls(ctx, prepare_scope)
    if _handed_on(ctx, home) and _may_create_in(ctx, ctx.model.module, prepare_scope):
        return ctx.model.module
    return home


def _handed_on(ctx: Context, home: Scope) -> bool:
    """A function that would take the accelerator as a parameter is handed on somewhere
    (``sub.set_defaults(func=evaluate)``, then ``args.func(args)``), or Python calls it itself
    (a dataclass's ``__post_init__``): its callers cannot be found to pass it, and a required
    parameter they do not pass is a crash. Created at the module's level, the accelerator is a
    global every function reads, and none takes it."""
    if isinstance(home, cst.Module):
        return False
    graph = ctx.facts.calls
    return any(
        graph.references(function) or _implicitly_called(ctx, function)
        for function in _threading(ctx, home).functions
    )


def _home_by_calls(ctx: Context, prepare_scope: Scope) -> Scope:
    """`_home` as the calls of the functions that need the accelerator decide it."""
    if any(isinstance(ctx.model.scope_of(n), cst.Module) for n in ctx.needs):
        _read_constructor_at_the_call(ctx, prepare_scope, ctx.model.module)
        return ctx.model.module
    home = prepare_scope
    for _ in range(10):
        stranded = _threading(ctx, home).stranded
        if not stranded:
            return home
        callees = {f for call in stranded for f in ctx.facts.calls.targets(call)}
        roots = [f for f in callees if _reaches(ctx, f, home)]
        if len(roots) == 1 and _may_create_in(ctx, roots[0], prepare_scope):
            home = roots[0]
        elif _may_create_in(ctx, ctx.model.module, prepare_scope):
            return ctx.model.module
        else:
            return home
    return home


def _instance_home(ctx: Context, prepare_scope: Scope) -> Scope:
    """``self.accelerator`` is created where the class prepares, unless its ``__init__`` needs
    it too (``self.device = self.accelerator.device``, a print), or nothing is prepared where it
    would be made (a trainer whose objects come through setters, whose backward's method is the
    default home): ``__init__`` runs before any other method, so it is created there (when its
    arguments read nothing the preparing method alone defines)."""
    owner = (
        ctx.facts.calls.owner(prepare_scope) if isinstance(prepare_scope, cst.FunctionDef) else None
    )
    if owner is None or prepare_scope.name.value == "__init__":
        return prepare_scope
    init = methods_of(ctx.model, owner.name.value).get("__init__")
    if init is None or ctx.facts.calls.owner(init) is not owner:
        return prepare_scope
    placement = ctx.facts.placement
    prepares_there = ctx.prepare_anchor is not None and placement.inside(
        ctx.prepare_anchor, prepare_scope
    )
    needed = (
        not prepares_there
        or any(placement.inside(need, init) for need in ctx.needs)
        or bool(_calls_reaching_a_need(ctx, init, besides=prepare_scope))
        or any(_may_run_first(ctx, need, prepare_scope) for need in ctx.needs)
    )
    if needed and _may_create_in(ctx, init, prepare_scope):
        return init
    return prepare_scope


def _may_run_first(ctx: Context, need: cst.CSTNode, prepare_scope: Scope) -> bool:
    """``need`` is in a method that may run before ``prepare_scope`` made the accelerator: one
    the file calls from outside the class (``trainer.attach_data(...)`` before
    ``trainer.setup(...)``), or nothing calls; not one only ``prepare_scope`` runs."""
    placement, graph = ctx.facts.placement, ctx.facts.calls
    function = placement.enclosing_function(need)
    pending, seen = [function], set()
    while pending:
        current = pending.pop()
        if current is None:
            return True
        if current is prepare_scope or placement.inside(current, prepare_scope) or current in seen:
            continue
        seen.add(current)
        callers = graph.callers(current)
        if not callers:
            return True
        pending += [placement.enclosing_function(call) for call in callers]
    return False


def _read_constructor_at_the_call(ctx: Context, prepare_scope: Scope, home: Scope) -> None:
    """The constructor's arguments read the preparing function's parameters
    (``Accelerator(gradient_accumulation_steps=cfg["accum"])`` in ``train(cfg)``), and the
    accelerator is made in ``home``, which calls it once (``train(config)`` at the module's
    end, beside a print that needs it): they read what that call passes (``config["accum"]``),
    or the Accelerator would be made from a name that does not exist there (NameError on every
    rank). When no single call of ``home`` passes plain names, a review line says so."""
    if _may_create_in(ctx, home, prepare_scope) or not isinstance(prepare_scope, cst.FunctionDef):
        return
    calls = [c for c, _ in ctx.facts.flow.calls_of(prepare_scope) if ctx.model.scope_of(c) is home]
    passed: dict[str, cst.BaseExpression] = {}
    if len(calls) == 1:
        implicit = 1 if ctx.facts.calls.owner(prepare_scope) is not None else 0
        passed = {
            parameter: argument.value
            for parameter, argument in bound_arguments(prepare_scope, calls[0], implicit)
            if dotted(argument.value) is not None
        }
    for key, code in list(ctx.constructor.items()):
        value = cst.parse_expression(code)
        read = {n.value for n in walk(value) if isinstance(n, cst.Name)}
        local = read & locals_of(ctx, prepare_scope)
        if not local:
            continue
        if local <= set(passed):
            renamed = value.visit(PassedNames({name: passed[name] for name in local}))
            ctx.constructor[key] = cst.Module([]).code_for_node(renamed)
            continue
        ctx.plan.review(
            ctx.line(prepare_scope),
            f"Accelerator({key}={code}) reads {', '.join(sorted(local))}, which "
            f"{prepare_scope.name.value}() defines, but the accelerator is made outside it: "
            f"pass {key} a value that exists where it is made",
        )


class PassedNames(cst.CSTTransformer):
    """Names replaced by the expressions the call passes for them."""

    def __init__(self, passed: dict[str, cst.BaseExpression]) -> None:
        self.passed = passed

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return self.passed.get(original.value, updated)

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.Attribute:
        return updated.with_changes(attr=original.attr)  # ``cfg.accum``'s ``accum`` is no name


def locals_of(ctx: Context, scope: Scope) -> set[str]:
    """The names ``scope`` binds itself: its parameters and assignment targets. A parameter's
    default is read, not bound: ``False`` of ``def run(epochs, resume=False)`` is no local, or
    ``Accelerator(step_scheduler_with_optimizer=False)`` could not be made in ``run``'s caller
    (``main()``, whose print then took an accelerator nobody passed: a TypeError)."""
    found: set[str] = set()
    for n in walk(scope):
        parent = ctx.model.parent(n) if isinstance(n, cst.Name) else None
        if (isinstance(parent, cst.Param) and parent.name is n) or isinstance(
            parent, cst.AssignTarget
        ):
            found.add(n.value)
    return found


def _calls_reaching_a_need(
    ctx: Context, scope: Scope, besides: Scope | None = None
) -> list[cst.Call]:
    """The calls in ``scope`` that run a method using ``self.accelerator``
    (``params = self.get_parameters()`` in ``__init__``, whose prints become
    ``self.accelerator.print``): the accelerator must exist before the first of them, not
    only before the uses in ``scope``'s own lines. The uses in ``besides`` (the method that
    prepares, where it is otherwise created) do not count."""
    if not ctx.acc.startswith("self.") or not isinstance(scope, cst.FunctionDef):
        return []
    placement, graph = ctx.facts.placement, ctx.facts.calls
    reaching = {placement.enclosing_function(need) for need in ctx.needs} - {None, scope, besides}
    grown = True
    while grown:
        grown = False
        for call in ctx.model.calls:
            caller = placement.enclosing_function(call)
            if caller is None or caller in reaching or caller is scope:
                continue
            if any(target in reaching for target in graph.targets(call)):
                reaching.add(caller)
                grown = True
    return [
        call
        for call in ctx.model.calls
        if placement.inside(call, scope)
        and any(target in reaching for target in graph.targets(call))
    ]


def _reaches(ctx: Context, function: cst.FunctionDef, target: Scope) -> bool:
    """``function`` runs ``target``: itself, or through the calls in its body."""
    placement, graph = ctx.facts.placement, ctx.facts.calls
    seen: set[cst.FunctionDef] = set()
    pending = [function]
    while pending:
        current = pending.pop()
        if current is target or placement.inside(target, current):
            return True
        if current in seen:
            continue
        seen.add(current)
        for call in ctx.model.calls:
            if placement.inside(call, current):
                pending += graph.targets(call)
    return False


def _may_create_in(ctx: Context, scope: Scope, prepare_scope: Scope) -> bool:
    """The constructor's arguments read nothing that only the preparing scope defines."""
    if scope is prepare_scope:
        return True
    local = locals_of(ctx, prepare_scope)
    for code in ctx.constructor.values():
        read = {n.value for n in walk(cst.parse_expression(code)) if isinstance(n, cst.Name)}
        if read & local:
            return False
    return True


@dataclass
class _Threading:
    """What giving the accelerator to the functions that need it takes."""

    #: functions and methods that gain the parameter
    functions: list[cst.FunctionDef] = field(default_factory=list)
    #: calls of them that pass it
    calls: list[cst.Call] = field(default_factory=list)
    #: calls of them where no accelerator exists to pass
    stranded: list[cst.Call] = field(default_factory=list)


def _threading(ctx: Context, home: Scope) -> _Threading:
    """Every function that needs the accelerator and is not inside ``home`` takes it; so does
    every function around a call of one of those, up to ``home``; and every function a call
    that passes it may run (an override of the same method)."""
    placement, graph = ctx.facts.placement, ctx.facts.calls
    found = _Threading()
    if isinstance(home, cst.Module):
        return found
    pending = [placement.top_function(need) for need in ctx.needs]
    seen_calls: set[cst.Call] = set()
    while pending:
        function = pending.pop()
        if function is None or function in found.functions:
            continue
        if placement.inside(function, home) or placement.inside(home, function):
            continue
        found.functions.append(function)
        for call in graph.callers(function):
            if call in seen_calls:
                continue
            seen_calls.add(call)
            caller = placement.top_function(call)
            if caller is None:
                found.stranded.append(call)
                continue
            found.calls.append(call)
            pending += [caller, *graph.targets(call)]
    return found


def _module_level_calls(ctx: Context) -> list[cst.CSTNode]:
    """Calls at the module's top level that run a function needing the (global) accelerator,
    or hand it on: it is created before the first of them."""
    placement, graph = ctx.facts.placement, ctx.facts.calls
    pending = [placement.top_function(need) for need in ctx.needs]
    seen: set[cst.FunctionDef] = set()
    found: list[cst.CSTNode] = []
    while pending:
        function = pending.pop()
        if function is None or function in seen:
            continue
        seen.add(function)
        # a function handed on (``set_defaults(func=evaluate)``) runs wherever it was handed;
        # one Python calls itself (``__post_init__``), once an instance is made
        implicit = _constructions(ctx, function) if _implicitly_called(ctx, function) else []
        for call in [*graph.callers(function), *graph.references(function), *implicit]:
            caller = placement.top_function(call)
            if caller is None:
                found.append(call)
            else:
                pending.append(caller)
    return found


def _thread(ctx: Context, home: Scope) -> list[cst.CSTNode]:
    """Give each function that needs the accelerator a parameter, and every call of it in the
    file the argument; returns the calls in ``home`` (it is created before the first)."""
    placement, plan, acc = ctx.facts.placement, ctx.plan, ctx.acc
    if acc.startswith("self."):
        return []  # the plan is confined to the class: every need is inside it
    if isinstance(home, cst.Module):
        _thread_into_another_module(ctx)
        return _module_level_calls(ctx)
    graph = ctx.facts.calls
    threading = _threading(ctx, home)
    for function in threading.functions:
        plan.add_parameter(function, acc)
        name = _qualified_name(ctx, function)
        plan.change(ctx.line(function), f"{name}() takes the accelerator as a parameter")
        called = [c for c in graph.callers(function) if c not in threading.stranded]
        passed = graph.references(function)
        for reference in passed:
            plan.review(
                ctx.line(reference),
                f"{name} is handed on here, not called: whoever calls it must pass {acc}={acc}",
            )
        uncertain = _uncertain_callers(ctx, function)
        for call in uncertain:
            plan.review(
                ctx.line(call),
                f"if {ctx.code(call.func)}() calls {name}() (the conversion cannot tell what "
                f"{_receiver_code(ctx, call)} is), it must pass {acc}={acc}",
            )
        if not called and not passed and not uncertain:
            plan.review(
                ctx.line(function),
                f"{name}() now takes `{acc}` and nothing in this file calls it: "
                f"callers in other files must pass {acc}={acc}",
            )
    for call in threading.calls:
        plan.wrap(call, WithKeyword(acc, acc))  # after whatever else rewrites the call
    for call in threading.stranded:
        plan.review(
            ctx.line(call),
            f"no {acc} exists here to pass to {ctx.code(call.func)}(): create one and pass "
            f"{acc}={acc}",
        )
    return [call for call in threading.calls if placement.inside(call, home)]


def _thread_into_another_module(ctx: Context) -> None:
    """The functions of another module in a combined script (`Options.foreign_from`: an engine
    whose driver trains at its top level) that need the accelerator take it as a parameter,
    and every call of one passes it: the driver's code its global, another of those functions
    its own parameter. Where one cannot take it (a method, a function handed on, a call whose
    target the analysis cannot tell), none does: they read the driver's global, which that
    module does not have, and `across` leaves both files as they are, with review lines."""
    start = ctx.options.foreign_from
    if start is None:
        return
    placement, graph = ctx.facts.placement, ctx.facts.calls
    functions: list[cst.FunctionDef] = []
    calls: list[cst.Call] = []
    pending = [placement.top_function(need) for need in ctx.needs]
    while pending:
        function = pending.pop()
        if function is None or ctx.line(function) < start or function in functions:
            continue
        if (
            graph.owner(function) is not None
            or graph.references(function)
            or _uncertain_callers(ctx, function)
        ):
            return
        functions.append(function)
        for call in graph.callers(function):
            calls.append(call)
            pending.append(placement.top_function(call))
    for function in functions:
        ctx.plan.add_parameter(function, ctx.acc)
        ctx.plan.change(
            ctx.line(function),
            f"{function.name.value}() takes the accelerator as a parameter (its callers pass it)",
        )
    for call in calls:
        ctx.plan.wrap(call, WithKeyword(ctx.acc, ctx.acc))


def _receiver_code(ctx: Context, call: cst.Call) -> str:
    func = call.func
    return ctx.code(func.value) if isinstance(func, cst.Attribute) else ctx.code(func)


def _uncertain_callers(ctx: Context, function: cst.FunctionDef) -> list[cst.Call]:
    """Calls that may run ``function`` (a method of the file's class) because the analysis does
    not know their receiver's class; not those whose receiver it knows is a library object
    (``scaler.update()`` of a GradScaler handed in, ``optimizer.step``): no class of the file
    is behind them, and a review line there ("if this calls ModelEma.update() ...") sends the
    reader to the wrong call."""
    found = []
    for call in ctx.facts.calls.uncertain_callers(function):
        receiver = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
        if receiver is not None and ctx.facts.flow.kind_of(receiver, call) in _LIBRARY_KINDS:
            continue
        found.append(call)
    return found


#: What the analysis tracks that no class of the file makes.
_LIBRARY_KINDS = {Kind.SCALER, Kind.OPTIMIZER, Kind.DATALOADER, Kind.DEVICE, Kind.SAMPLER}


def _qualified_name(ctx: Context, function: cst.FunctionDef) -> str:
    owner = ctx.facts.calls.owner(function)
    name = function.name.value
    return f"{owner.name.value}.{name}" if owner is not None else name


def _first_need(ctx: Context, home: Scope, call_sites: list[cst.CSTNode]) -> cst.CSTNode | None:
    placement = ctx.facts.placement
    body = placement.body_of(home)
    position = {id(line): index for index, line in enumerate(body)}
    indices = []
    for node in [*ctx.needs, *call_sites, *_calls_reaching_a_need(ctx, home)]:
        if isinstance(home, cst.Module) and not isinstance(ctx.model.scope_of(node), cst.Module):
            continue
        for candidate in (node, *ctx.model.ancestors(node)):
            if id(candidate) in position:
                indices.append(position[id(candidate)])
                break
    if not indices:
        return None
    first = max(min(indices), placement.first_free_index(home, before=min(indices)))
    return body[first] if first < len(body) else body[-1]
