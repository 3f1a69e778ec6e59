"""Accelerators the file did not construct itself: returned by a factory (of this module or
another one of the project), held by a class (``self.accelerator``, also in an ``nn.Module``,
also set by a base class such as HF's ``Trainer``), received as a parameter, or imported from
a module of the project (``from .common import accelerator``). A file that
uses an accelerator object it got from anywhere is an Accelerator file, and every fact about
accelerators covers these names too.

From this file alone: a name assigned from a call of a local function that returns an
``Accelerator(...)`` is one; so is a name (a local, ``self.x``, a parameter) used the way only an
accelerator is used (``.prepare(``, ``.unwrap_model(``, ``.gather_for_metrics(``,
``.accumulate(``...), or named ``accelerator`` and used as one (``.is_main_process``,
``.wait_for_everyone()``). Modules (``torch.autocast``) and settings (``args.process_index``)
never are.
"""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.analysis.objects import bind
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.syntax import assigned_targets, dotted, is_assignment, walk

_LIBRARIES = ("torch", "deepspeed", "accelerate", "accelify", "lightning", "pytorch_lightning")
_TRAINING_LIBRARIES = frozenset(
    {*_LIBRARIES, "transformers", "diffusers", "peft", "trl", "timm", "torchvision", "datasets"}
)
_SETTINGS = ("args", "config", "cfg", "opt", "opts", "hparams", "FLAGS", "training_args")


def add_accelerator_objects(model: ScriptModel) -> None:
    """Bind every accelerator the file got from elsewhere (see the module docstring)."""
    uses = _accelerator_uses(model)
    evidence = set(uses)
    factories = local_factories(model)
    if model.project is not None:
        factories |= model.project.accelerator_factories(model)
    known = {(b.name, id(b.scope)) for b in model.of_kind(Kind.ACCELERATOR)}
    for assign in model.assignments if evidence or factories else ():
        if len(assigned_targets(assign)) != 1 or not _may_hold_an_object(assign.value):
            continue
        target = assigned_targets(assign)[0]
        from_factory = isinstance(assign.value, cst.Call) and dotted(assign.value.func) in factories
        # ``accelerator, logger = setup(args)``: an element used as an accelerator is one
        unpacked = isinstance(target, (cst.Tuple, cst.List))
        elements = [e.value for e in target.elements] if unpacked else [target]  # type: ignore[union-attr]
        for element in elements:
            name = dotted(element)
            if (
                name is None
                or name.count(".") > 1
                or (name.count(".") and not name.startswith("self."))
            ):
                continue
            scope = model.scope_of(assign)
            if (name, id(scope)) in known:
                continue
            if name not in evidence and not (from_factory and not unpacked):
                continue
            bind(model, name, Kind.ACCELERATOR, scope, assign, known)
    bound = {binding.name for binding in model.of_kind(Kind.ACCELERATOR)}
    model.inherited_accelerators = {
        name
        for name in uses
        if name not in bound
        and (name.startswith("self.") or name in model.imports.bound or _held(name))
    }
    for function, received in model.given_parameters.items():
        for name, given in received.items():
            if given.kind is Kind.ACCELERATOR:  # every caller of the project hands one
                model.accelerator_params.setdefault(function, set()).add(name)
                _bind_kept_attributes(model, function, name, known)
    for name, nodes in uses.items():
        if "." in name:
            continue
        for node in nodes:
            for function in _functions_around(model, node):
                parameters = {
                    p.name.value for p in (*function.params.params, *function.params.kwonly_params)
                }
                if name in parameters:
                    model.accelerator_params.setdefault(function, set()).add(name)
                    break


def _bind_kept_attributes(
    model: ScriptModel, function: cst.FunctionDef, parameter: str, known: set[tuple[str, int]]
) -> None:
    """``self.state = state`` in a function whose ``state`` every call of the project hands
    the accelerator (``Trainer(accelerator)`` of train.py): ``self.state`` is that
    accelerator in every method, whatever it is called (as `ScriptModel._given_attributes`
    binds a prepared object's attribute)."""
    for assign in model.index.own_assignments(function):
        targets = assigned_targets(assign)
        if len(targets) != 1 or dotted(assign.value) != parameter:
            continue
        name = dotted(targets[0])
        if name is None or name.count(".") != 1 or not name.startswith("self."):
            continue
        scope = model.scope_of(assign)
        if (name, id(scope)) not in known:
            bind(model, name, Kind.ACCELERATOR, scope, assign, known, received=True)


def _may_hold_an_object(value: cst.BaseExpression) -> bool:
    """Not a literal, a comparison or arithmetic: something that can be an accelerator."""
    return isinstance(value, (cst.Call, cst.Name, cst.Attribute, cst.IfExp, cst.Subscript))


def _accelerator_uses(model: ScriptModel) -> dict[str, list[cst.Attribute]]:
    """Receivers (``x``, ``self.x``) used as accelerators, with the attributes that show it."""
    candidates: dict[str, list[cst.Attribute]] = {}
    proven: set[str] = set()
    foreign = _foreign_accelerators(model) if model.member_uses else set()
    trains = _imports_a_training_library(model)
    for node in model.member_uses:
        receiver = dotted(node.value)
        if receiver is None or receiver in foreign or not _may_be_an_accelerator(model, receiver):
            continue
        candidates.setdefault(receiver, []).append(node)
        if _held(receiver):
            # ``trainer.accelerator``: another object's, proven by a member only an HF
            # Accelerator has (Lightning's ``trainer.accelerator`` has none of them); held by
            # this object (``self.trainer.accelerator``: a callback holding its trainer), also
            # by a member it shares with process states (``is_main_process``,
            # ``wait_for_everyone``), which Lightning's device plugin has not either
            if trains and (
                _used_as_accelerator_only(model, node)
                or (
                    receiver.startswith("self.")
                    and node.attr.value in names.ACCELERATOR_SHARED_MEMBERS
                )
            ):
                proven.add(receiver)
        elif _named_accelerator(receiver) or (trains and _used_as_accelerator_only(model, node)):
            proven.add(receiver)
    return {name: nodes for name, nodes in candidates.items() if name in proven}


def _foreign_accelerators(model: ScriptModel) -> set[str]:
    """Names typed as, or built from, another library's class called ``Accelerator``:
    ``accel: ml.Accelerator`` or ``with Accelerator() as accel`` after ``Accelerator =
    argbind.bind(ml.Accelerator)`` (descript's audiotools, whose trainers many audio codecs copy).
    It has ``prepare_model`` and ``backward`` too, but not HF's other members: advice to call
    ``accel.clip_grad_norm_`` on it is an AttributeError."""
    found: set[str] = set()
    for function in model.index.of_type(cst.FunctionDef):
        assert isinstance(function, cst.FunctionDef)
        for param in (*function.params.params, *function.params.kwonly_params):
            if param.annotation is not None and _names_foreign_class(
                model, param.annotation.annotation
            ):
                found.add(param.name.value)
    for item in model.index.of_type(cst.WithItem):
        assert isinstance(item, cst.WithItem)
        if (
            item.asname is not None
            and isinstance(item.item, cst.Call)
            and _names_foreign_class(model, item.item.func)
        ):
            name = dotted(item.asname.name)
            if name is not None:
                found.add(name)
    for assign in model.assignments:
        if isinstance(assign.value, cst.Call) and _names_foreign_class(model, assign.value.func):
            found.update(n for t in assigned_targets(assign) if (n := dotted(t)) is not None)
    return found


def _names_foreign_class(model: ScriptModel, node: cst.BaseExpression) -> bool:
    """``node`` names a class called ``Accelerator`` that is neither HF Accelerate's nor ours:
    imported from another library, or a module-level alias of one."""
    name = dotted(node)
    if name is None or name.rsplit(".", 1)[-1] != "Accelerator":
        return False
    resolved = model.imports.resolve(name)
    if resolved is not None:
        return resolved not in names.ACCELERATORS and not resolved.startswith(
            (".", *(f"{library}." for library in _LIBRARIES))
        )
    if "." in name:
        return False
    # ``Accelerator = argbind.bind(ml.Accelerator)``: a module-level alias of a foreign class
    return any(
        model.scope_of(assign) is model.module
        and any(
            isinstance(inner, (cst.Name, cst.Attribute)) and _names_foreign_class(model, inner)
            for inner in walk(assign.value)
            if inner is not assign.value
        )
        for assign in model.index.assignments_to(name)
    )


def _imports_a_training_library(model: ScriptModel) -> bool:
    """Only a file that imports torch or a library built on it can hold an unnamed accelerator:
    elsewhere ``self._files.prepare(root)`` is some other class's method (filelock's)."""
    return any(
        target.lstrip(".").split(".", 1)[0] in _TRAINING_LIBRARIES
        for target in model.imports.bound.values()
        if not target.startswith(".")
    )


def _used_as_accelerator_only(model: ScriptModel, node: cst.Attribute) -> bool:
    """``x.prepare(model)``, ``x.accumulate(model)``: a member only an accelerator has, called as
    one (``preprocessor.prepare()`` with nothing to prepare is some other class's method, and
    ``self.args.accumulate`` read as a value is a setting)."""
    member = node.attr.value
    if member not in names.ACCELERATOR_ONLY_MEMBERS:
        return False
    call = model.parent(node)
    if not isinstance(call, cst.Call) or call.func is not node:
        return False  # read, not called: a setting's value (``self.args.accumulate``, an int)
    return member not in names.ACCELERATOR_MEMBERS_WITH_ARGUMENTS or bool(call.args)


def _held(receiver: str) -> bool:
    """``trainer.accelerator``, ``self.trainer.accelerator``: the accelerator of an object the
    code was handed (an evaluator callback's ``on_test_batch(..., trainer)``), not a setting
    (``args.accelerator``)."""
    parts = receiver.split(".")
    if (
        len(parts) < 2
        or not _named_accelerator(receiver)
        or parts[-2] in (*_SETTINGS, "self", "cls")
    ):
        return False
    return len(parts) == 2 or (len(parts) == 3 and parts[0] == "self")


def _may_be_an_accelerator(model: ScriptModel, receiver: str) -> bool:
    parts = receiver.split(".")
    if _held(receiver):
        return True
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "self"):
        return False
    if len(parts) == 1 and receiver in model.imports.bound:
        # ``from .common import accelerator``: the project's own, shared accelerator
        imported = model.imports.bound[receiver]
        return _named_accelerator(receiver) and not imported.startswith(_LIBRARIES)
    if parts[-1] in _SETTINGS:
        return False  # ``args``, a trainer's ``self.args``: settings, whatever members they have
    return receiver not in ("self", "cls")


def _named_accelerator(receiver: str) -> bool:
    return receiver.rsplit(".", 1)[-1].lower().endswith("accelerator")


def _functions_around(model: ScriptModel, node: cst.CSTNode) -> list[cst.FunctionDef]:
    return [a for a in model.ancestors(node) if isinstance(a, cst.FunctionDef)]


def local_factories(model: ScriptModel) -> set[str]:
    """Module-level functions that return an ``Accelerator(...)`` (directly or through a name
    bound to one)."""
    return set(factory_constructions(model))


def factory_constructions(model: ScriptModel) -> dict[str, cst.Call]:
    """`local_factories` by name, each with the ``Accelerator(...)`` it returns (the first, where
    it returns several): what a caller's accelerator is made with (its ``mixed_precision``)."""
    found: dict[str, cst.Call] = {}
    for call in model.calls:
        if not model.call_names(call) & names.ACCELERATORS:
            continue
        functions = _functions_around(model, call)
        if not functions or functions[-1].name.value not in model.functions:
            continue
        function = functions[0]
        parent = model.parent(call)
        if isinstance(parent, cst.Return):
            found.setdefault(function.name.value, call)
            continue
        if not is_assignment(parent) or len(assigned_targets(parent)) != 1:
            continue
        bound = dotted(assigned_targets(parent)[0])
        if any(
            isinstance(node, cst.Return) and node.value is not None and dotted(node.value) == bound
            for node in walk(function.body)
        ):
            found.setdefault(function.name.value, call)
    return found


def without_accelerator(model: ScriptModel, node: cst.CSTNode) -> bool:
    """``node`` runs only where the script has no accelerator: the ``else`` of ``if
    self.accelerator is not None:`` (or of ``if accelerator:``), the body of ``if accelerator is
    None:``. A library that trains with or without one keeps its plain ``loss.backward()`` and
    device moves there, and advice to use the accelerator would call a method of None."""
    accelerators = model.names_of(Kind.ACCELERATOR)
    # _made_under scans every pair of the file's assignments: asked once per file (and again
    # only if the analysis has since found more accelerators or assignments), not per node
    key = (frozenset(accelerators), len(model.assignments))
    memo = model.__dict__.setdefault("_made_under", {})
    entry = memo.get(key)
    if entry is None:
        entry = memo[key] = (_made_under(model, accelerators), {})
    made_under, answers = entry
    if not model.complete:  # the call graph may still grow: asked afresh
        return _without_accelerator(model, node, accelerators, made_under, 0)
    # once the analysis is complete the answer is kept: rules ask it of every call of the
    # file (ACC101 and ACC105 of the same calls), and of a function's callers for each
    # node in it; kept with the node, so a node made later under a reused id is not taken
    # for it
    kept = answers.get(id(node))
    if kept is not None and kept[0] is node:
        return kept[1]
    answer = _without_accelerator(model, node, accelerators, made_under, 0, answers)
    answers[id(node)] = (node, answer)
    return answer


def _without_accelerator(
    model: ScriptModel,
    node: cst.CSTNode,
    accelerators: set[str],
    made_under: list[cst.BaseExpression],
    depth: int,
    answers: dict[object, tuple[cst.CSTNode, bool]] | None = None,
) -> bool:
    """Also where the test is the one the Accelerator is made under, negated (``accelerator =
    None`` then ``if not args.reference: accelerator = Accelerator(...)``: ``if
    args.reference:`` runs without one), and in a function every call of which in the file runs
    without one (an Accelerate fixture's ``train_reference``, called in that branch only); the
    same for an arm of an if-expression. ``answers``: each function's answer at each depth, kept
    by `without_accelerator` once the analysis is complete (asked for every node in it)."""
    # the ifs around ``node`` up to its function, each found through the index's memo (most
    # nodes asked about share their ancestors), not by a step and a type test per ancestor
    ancestor = model.index.nearest(node, _IFS_AND_FUNCTIONS)
    while ancestor is not None:
        if type(ancestor) is not cst.FunctionDef and not model.inside(node, ancestor.test):
            # ``torch.device("cuda:0") if args.reference else accelerator.device`` where the
            # Accelerator is made under ``not args.reference``: the plain-PyTorch reference arm
            present = _accelerator_present(ancestor.test, accelerators)
            if present is None:
                present = _same_test(ancestor.test, made_under)
            if present is not None and present is (not model.inside(node, ancestor.body)):
                return True
            if type(ancestor) is cst.If and _made_in_the_other_arm(model, ancestor, node):
                return True
        if type(ancestor) is cst.FunctionDef:
            if depth >= 3:
                return False
            key = (id(ancestor), depth)
            kept = answers.get(key) if answers is not None else None
            if kept is not None and kept[0] is ancestor:
                return kept[1]
            sites = [call for call, _ in model.call_graph.calls_of(ancestor)]
            answer = bool(sites) and all(
                _without_accelerator(model, site, accelerators, made_under, depth + 1, answers)
                for site in sites
            )
            if answers is not None:
                answers[key] = (ancestor, answer)
            return answer
        ancestor = model.index.nearest(ancestor, _IFS_AND_FUNCTIONS)
    return False


def _made_in_the_other_arm(model: ScriptModel, branch: cst.If, node: cst.CSTNode) -> bool:
    """Every Accelerator the file makes is made in the arm of ``branch`` that ``node`` is not
    in, directly or through functions called only there: a trainer that sets up DeepSpeed, DDP
    or Accelerate (``elif HAS_ACCELERATE: self._setup_accelerate()``, ``else: self.scaler =
    GradScaler()``) has no accelerator on the other arms."""
    other = branch.orelse if model.inside(node, branch.body) else branch.body
    if other is None:
        return False
    memo = model.__dict__.setdefault("_accelerator_sites", {})
    sites = memo.get("sites")
    if sites is None:
        sites = memo["sites"] = [
            call for call in model.calls if model.call_names(call) & names.ACCELERATORS
        ]
    return bool(sites) and all(_runs_only_in(model, site, other, 0) for site in sites)


def _runs_only_in(model: ScriptModel, node: cst.CSTNode, tree: cst.CSTNode, depth: int) -> bool:
    """``node`` is in ``tree``, or in a function every call of which in the file is (a few
    calls deep)."""
    if model.inside(node, tree):
        return True
    function = model.index.nearest(node, (cst.FunctionDef,))
    if function is None or depth >= 2:
        return False
    sites = [call for call, _ in model.call_graph.calls_of(function)]
    return bool(sites) and all(_runs_only_in(model, site, tree, depth + 1) for site in sites)


#: What `_without_accelerator` stops at going up (none of the three has subclasses).
_IFS_AND_FUNCTIONS = (cst.If, cst.IfExp, cst.FunctionDef)


def _made_under(model: ScriptModel, accelerators: set[str]) -> list[cst.BaseExpression]:
    """The tests of the ``if`` statements whose body makes an accelerator the file set to
    ``None`` before (``accelerator = None`` then ``if not args.reference: accelerator =
    Accelerator(...)``), and the one test every prepare call runs under (`_prepared_under`):
    where such a test is false, the script runs without one."""
    tests = []
    for assign in model.assignments:
        if (
            len(assigned_targets(assign)) != 1
            or dotted(assigned_targets(assign)[0]) not in accelerators
        ):
            continue
        if not (isinstance(assign.value, cst.Call) and dotted(assign.value.func) == "Accelerator"):
            continue
        target = dotted(assigned_targets(assign)[0])
        if not any(
            len(assigned_targets(other)) == 1
            and dotted(assigned_targets(other)[0]) == target
            and dotted(other.value) == "None"
            for other in model.assignments
        ):
            continue
        parents = list(model.ancestors(assign))
        block = next((a for a in parents if isinstance(a, cst.If)), None)
        if block is not None and any(a is block.body for a in parents):
            tests.append(block.test)
    prepared = _prepared_under(model)
    if prepared is not None:
        tests.append(prepared)
    return tests


def _prepared_under(model: ScriptModel) -> cst.BaseExpression | None:
    """The one test every prepare call of the file runs under (a forecasting experiment's
    ``if self.args.accelerate: self.model, ... = self.accelerator.prepare(...)``): where it is
    false nothing is prepared, and the script's other arms (``else: loss.backward();
    model_optim.step()``) are its plain single-device path. None where a prepare call runs
    outside such an ``if`` body or the calls' tests differ."""
    spelled: dict[str, cst.BaseExpression] = {}
    for prepare in model.prepare_calls:
        parents = list(model.ancestors(prepare.call))
        block = next((a for a in parents if isinstance(a, (cst.If, cst.FunctionDef))), None)
        if not isinstance(block, cst.If) or not any(a is block.body for a in parents):
            return None
        spelled.setdefault(_spelling(block.test), block.test)
    return next(iter(spelled.values())) if len(spelled) == 1 else None


def _same_test(test: cst.BaseExpression, made_under: list[cst.BaseExpression]) -> bool | None:
    """True where ``test`` is one an accelerator is made under, False where it is its negation
    (``args.reference`` against ``not args.reference``), None otherwise."""
    if not made_under:
        return None  # most files: no test to compare with, no code generated for this one
    spelled = _spelling(test)
    for made in made_under:
        if spelled == _spelling(made):
            return True
        if spelled == _spelling(_negated(made)) or _spelling(_negated(test)) == _spelling(made):
            return False
    return None


def _negated(test: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return test.expression
    return cst.UnaryOperation(operator=cst.Not(), expression=test)


def _spelling(test: cst.BaseExpression) -> str:
    return cst.Module(body=[]).code_for_node(test.with_changes(lpar=[], rpar=[]))


def _accelerator_present(test: cst.BaseExpression, accelerators: set[str]) -> bool | None:
    """What ``test`` being true says of an accelerator: there (True), absent (False), nothing
    (None)."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _accelerator_present(test.expression, accelerators)
        return None if inner is None else not inner
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        # ``elif HAS_ACCELERATE and hasattr(self, "accelerator"):`` then ``else: loss.backward()``:
        # the branch the test keeps names the accelerator, its ``else`` is the plain path
        sides = {
            _accelerator_present(test.left, accelerators),
            _accelerator_present(test.right, accelerators),
        } - {None}
        return sides.pop() if len(sides) == 1 else None
    if (
        isinstance(test, cst.Call)
        and dotted(test.func) == "hasattr"
        and len(test.args) == 2
        and isinstance(test.args[1].value, cst.SimpleString)
    ):
        owner = dotted(test.args[0].value)
        member = test.args[1].value.evaluated_value
        return True if owner is not None and f"{owner}.{member}" in accelerators else None
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        comparison = test.comparisons[0]
        if dotted(comparison.comparator) != "None" or not _is_accelerator(test.left, accelerators):
            return None
        if isinstance(comparison.operator, cst.IsNot):
            return True
        return False if isinstance(comparison.operator, cst.Is) else None
    return True if _is_accelerator(test, accelerators) else None


def _is_accelerator(node: cst.BaseExpression, accelerators: set[str]) -> bool:
    """One of the file's accelerators itself: not a setting about one
    (``self.config.disable_accelerator``)."""
    return dotted(node) in accelerators


def built_for_cpu_only(model: ScriptModel) -> bool:
    """Every accelerator the file builds is ``Accelerator(cpu=True)`` and it gets none from
    elsewhere: no GPU, so no fp16 loss scaling, no FSDP or DeepSpeed sharding."""
    built = [call for call in model.calls if model.call_names(call) & names.ACCELERATORS]
    received = model.accelerator_params or model.inherited_accelerators
    return bool(built) and not received and all(_passes_cpu_true(call) for call in built)


def _passes_cpu_true(call: cst.Call) -> bool:
    return any(
        a.keyword is not None and a.keyword.value == "cpu" and dotted(a.value) == "True"
        for a in call.args
    )


def gradients_averaged_by_hand(model: ScriptModel) -> bool:
    """The file prepares nothing and averages gradients itself (``dist.all_reduce(p.grad,
    ...)``): data parallelism written by hand, with the Accelerator kept for its process group,
    device and ``gather`` (an RL trainer's GRPO update). No wrapper and no loss scaler sit
    between its backward and its optimizer, so ``accelerator.backward`` and
    ``accelerator.clip_grad_norm_`` would compute the same thing (and under fp16 would scale
    gradients that its unprepared optimizer never unscales)."""
    if model.prepare_calls:
        return False
    return any(
        model.call_names(call) & names.ALL_REDUCE
        and call.args
        and isinstance(call.args[0].value, cst.Attribute)
        and call.args[0].value.attr.value == "grad"
        for call in model.calls
    )
