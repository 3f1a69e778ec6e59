"""`ScriptModel`: one analysis of one training script, shared by the codemod and the lint rules.

It knows which names hold models, optimizers, DataLoaders, LR schedulers, gradient scalers,
device variables and the accelerator; which calls are ``.backward()``; which loops train and
which evaluate; and the scope (module or function) each lives in. Names are resolved through the
file's imports (`imports.ImportTable`), so ``import torch.optim as optim`` and ``from torch import
nn`` are seen for what they are.
"""

from __future__ import annotations

import builtins
import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import libcst as cst
from libcst.metadata import CodeRange

from accelify.analysis import names
from accelify.analysis.imports import ImportTable
from accelify.analysis.index import Index
from accelify.analysis.keyed_dicts import keyed_subscript
from accelify.analysis.loops import (
    enumerates,
    find_backward,
    first_enumerate_name,
    loop_source,
)
from accelify.analysis.syntax import (
    Assignment,
    Visitor,
    WalkedTree,
    all_params,
    argument_value,
    assigned_targets,
    children_of,
    dotted,
    is_generator_function,
    keyword_value,
    remember_walk,
    result_used,
    root_name,
    strip_self_methods,
    target_names,
    unpacked_pairs,
    walk,
)

if TYPE_CHECKING:
    from accelify.analysis.call_graph import CallGraph
    from accelify.analysis.outside_callers import Given, ProjectView

Scope = cst.Module | cst.FunctionDef
#: HF TrainingArguments' flags true on the process that saves or logs (not
#: ``control.should_save``, a step flag every rank shares).
_RANK_SETTINGS = ("args.should_save", "args.should_log")
#: The shapes a value keeps the rank through when a name is set to it (``is_main = rank == 0``,
#: ``rank = int(os.environ["RANK"])``, ``gpu = rank % 8``); a call's arguments are followed only
#: into a conversion (``int(...)``, ``os.getenv(...)``): ``loss = model(x.to(rank))`` is no rank.
_CONVERSIONS = frozenset({"int", "str", "bool", "float", "getattr", "get", "getenv", "environ"})
#: A model's method that builds its optimizer, by convention (nanoGPT, PyTorch Lightning).
OPTIMIZER_METHODS = {"configure_optimizers"}


def positions_of(
    module: cst.Module,
    source: str | None = None,
    parents: Mapping[int, cst.CSTNode] | None = None,
) -> Mapping[cst.CSTNode, CodeRange]:
    """Our cheaper pass where libcst's code generation has the internals it relies on (a private
    module of libcst, checked once per process: `positions.faithful`), libcst's own public
    `PositionProvider` where a libcst release moved or changed them. With the UTF-8 text the
    module was parsed from (``source``) and its nodes' ``parents``, statement by statement as
    they are asked about (`positions.StatementPositions`)."""
    try:
        from accelify.analysis.positions import Positions, StatementPositions, faithful

        if faithful():
            if source is not None and parents is not None and module.encoding == "utf-8":
                return StatementPositions(module, source, parents)
            return Positions(module)
    except ImportError:
        pass
    from libcst.metadata import MetadataWrapper, PositionProvider

    return MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)


class Kind(enum.Enum):
    MODEL = "model"
    OPTIMIZER = "optimizer"
    DATALOADER = "dataloader"
    SCHEDULER = "scheduler"
    SCALER = "scaler"
    DEVICE = "device"
    WRAPPER = "ddp wrapper"
    SAMPLER = "distributed sampler"
    ACCELERATOR = "accelerator"


@dataclass
class Binding:
    """A name (``model``, ``self.model``) bound to one of the objects the analysis tracks."""

    name: str
    kind: Kind
    scope: Scope
    statement: cst.SimpleStatementLine
    assign: cst.Assign | cst.AnnAssign
    value: cst.BaseExpression
    script: ScriptModel = field(repr=False, compare=False)
    #: made elsewhere and handed in: ``self.loader = loader`` in a constructor that receives a
    #: loader. The same object as the caller's; not where it is created.
    received: bool = False
    #: what the callers passed for a received binding (``train_loader`` for ``self.loader``)
    sources: list[str] = field(default_factory=list, compare=False)
    #: of ``sources``, those every caller hands on before ``prepare`` rebinds them
    #: (``Evaluator(val_loader)`` above the prepare call): the original, unprepared object
    unprepared_sources: list[str] = field(default_factory=list, compare=False)

    @property
    def prepared_sources(self) -> set[str]:
        """The callers' names whose prepared object this binding may hold."""
        return set(self.sources) - set(self.unprepared_sources)

    @property
    def line(self) -> int:
        return self.script.line(self.assign)


@dataclass
class Loop:
    node: cst.For
    scope: Scope
    iterable: str | None
    batch_names: set[str]
    trains: bool
    evaluates: bool
    #: the value of the name the loop iterates when that name wraps the loader (``pbar =
    #: tqdm(loader)``, ``batches = loader if full else islice(loader, n)``), seen through.
    through: cst.BaseExpression | None = None


@dataclass
class PrepareCall:
    """``model, optimizer = accelerator.prepare(model, optimizer)``: what went in, what came out."""

    call: cst.Call = field(repr=False)
    inputs: list[str]
    outputs: list[str]
    script: ScriptModel = field(repr=False, compare=False)

    @property
    def line(self) -> int:
        return self.script.line(self.call)


@dataclass
class ScriptModel:
    module: cst.Module
    imports: ImportTable = field(default_factory=ImportTable)
    #: each node's parent, by the node's id (a node's own hash is a Python call, and this is
    #: asked for every step up the tree; the module keeps every node, so no id is reused)
    parents: dict[int, cst.CSTNode] = field(default_factory=dict, repr=False)
    #: the file's ``x = v`` and ``x: T = v`` statements, in source order
    assignments: list[Assignment] = field(default_factory=list, repr=False)
    bindings: list[Binding] = field(default_factory=list)
    backward_calls: list[cst.Call] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    functions: dict[str, cst.FunctionDef] = field(default_factory=dict)
    module_classes: set[str] = field(default_factory=set)
    #: DataLoader subclasses of the file that keep DataLoader's iteration (no ``__iter__`` or
    #: ``__len__`` of their own): prepare shards them as it does a DataLoader
    loader_classes: set[str] = field(default_factory=set)
    #: the others, by name, with the methods of their own that prepare would drop
    iterating_loader_classes: dict[str, list[str]] = field(default_factory=dict)
    #: the file's module-level classes by name
    classes: dict[str, cst.ClassDef] = field(default_factory=dict)
    #: what the file's functions and methods receive at their call sites (`objects`)
    received_parameters: dict[cst.FunctionDef, dict[str, Kind]] = field(
        default_factory=dict, repr=False
    )
    prepare_calls: list[PrepareCall] = field(default_factory=list)
    calls: list[cst.Call] = field(default_factory=list, repr=False)
    #: ``x.prepare``, ``self.accelerator.is_main_process``...: what shows an accelerator
    member_uses: list[cst.Attribute] = field(default_factory=list, repr=False)
    #: parameters that receive an accelerator (``def train(accelerator, model)``), by function
    accelerator_params: dict[cst.FunctionDef, set[str]] = field(default_factory=dict, repr=False)
    #: ``self.accelerator`` used in a class that never sets it (a subclass of HF's ``Trainer``)
    inherited_accelerators: set[str] = field(default_factory=set, repr=False)
    #: each node's place in source order (its index in the analysis's pre-order walk): "above"
    #: without a code-generation pass for positions
    orders: dict[cst.CSTNode, int] = field(default_factory=dict, repr=False)
    #: `_rank_exit` by function: where each leaves early on some ranks (None: it does not)
    _rank_exits: dict[int, tuple[int, cst.If] | None] = field(default_factory=dict, repr=False)
    #: `rank_decorator_test` by function: the rank test its decorator stands for (None: none)
    _rank_decorator_tests: dict[int, cst.BaseExpression | None] = field(
        default_factory=dict, repr=False
    )
    #: `answers_by_rank` by function: whether its answer differs between ranks
    _rank_answers: dict[int, bool] = field(default_factory=dict, repr=False)
    _positions: Mapping[cst.CSTNode, CodeRange] | None = field(default=None, repr=False)
    #: what calls of functions of the project's other modules return, by the call's id: the
    #: DataLoaders a ``get_dataloader()`` of ``dataset.py`` makes (`convert.project`)
    imported_returns: Mapping[int, list[tuple[tuple[int, ...], Kind | None]]] = field(
        default_factory=dict, repr=False
    )
    #: the module as the rest of the project sees it (`outside_callers`): None alone
    project: ProjectView | None = field(default=None, repr=False)
    #: what every call of the project's other modules hands a function's parameters: the
    #: accelerator, a prepared model or loader (`outside_callers.ProjectView.given`)
    given_parameters: dict[cst.FunctionDef, dict[str, Given]] = field(
        default_factory=dict, repr=False
    )
    #: the analysis's walk kept: `walk` of a node of this tree is a slice of it
    walked: WalkedTree = field(init=False, repr=False)
    #: `call_names` by the call's id, from when the walk has seen every import (None before)
    _call_names: dict[int, set[str]] | None = field(default=None, repr=False)
    #: `reads_rank` by the node's id, from when the walk has seen every binding (None before)
    _rank_reads: dict[int, bool] | None = field(default=None, repr=False)
    #: the analysis has added every binding: answers that depend on them may be kept
    complete: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        self.walked = WalkedTree(self.orders)

    # --- names, positions, parents ----------------------------------------------------------
    def qualified(self, node: cst.CSTNode) -> set[str]:
        """What a name or attribute chain refers to through the file's imports:
        ``optim.SGD`` -> ``torch.optim.SGD`` after ``import torch.optim as optim``."""
        name = dotted(node)  # None but for a Name or an attribute chain of them
        if name is None:
            return set()
        resolved = self.imports.resolve(name)
        if resolved is not None:
            return {resolved}
        if "." not in name and hasattr(builtins, name):
            return {f"builtins.{name}"}
        return {name}

    @cached_property
    def name_scopes(self) -> dict[int, Mapping[cst.CSTNode, object]]:
        """libcst's `ScopeProvider` per top-level statement, resolved on first use only
        (`name_scopes`): a pass over the whole module costs several times its parse."""
        return {}

    @cached_property
    def name_bindings(self) -> dict[tuple[str, int], tuple]:
        """Per name and top-level statement (by id), where the statement may bind the name
        (`name_scopes._bindings_in`): asked again for each read of the name."""
        return {}

    def position(self, node: cst.CSTNode) -> CodeRange:
        # Positions cost a code-generation pass over the file: resolved on first use only.
        if self._positions is None:
            # the text analysed, where it was handed over (`analyze`): no code generation for it
            source = self.__dict__.get("source")
            self._positions = positions_of(self.module, source, self.parents)
        return self._positions[node]

    def line(self, node: cst.CSTNode) -> int:
        return self.position(node).start.line

    def order(self, node: cst.CSTNode) -> int:
        """Source order: a statement comes before the statements below it and before what it
        contains. Compare with this, not `line`, when only "above or below" matters."""
        return self.orders[node]

    def inside(self, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
        """``node`` is ``outer`` or under it: its place in source order falls in ``outer``'s
        subtree (no walk up from ``node``)."""
        at, here = self.orders.get(outer), self.orders.get(node)
        if at is None or here is None:  # not both of the analysed tree
            return node is outer or any(a is outer for a in self.ancestors(node))
        return at <= here < self.walked.ends[at]

    @cached_property
    def source(self) -> str:
        """The file's text (libcst round-trips it exactly), generated once."""
        return self.module.code

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(id(node))

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        parents = self.parents  # `parent` inline: rules walk up from most nodes they ask about
        current = parents.get(id(node))
        while current is not None:
            yield current
            current = parents.get(id(current))

    def disables_grad(self, node: cst.CSTNode) -> bool:
        """``with torch.no_grad():`` (or ``inference_mode``), or a function decorated so: what
        runs inside computes no gradient."""
        if isinstance(node, cst.With):
            for item in node.items:
                call = item.item
                target = call.func if isinstance(call, cst.Call) else call
                if self.qualified(target) & names.NO_GRAD_CONTEXTS:
                    return True
        if isinstance(node, cst.FunctionDef):
            for decorator in node.decorators:
                target = decorator.decorator
                target = target.func if isinstance(target, cst.Call) else target
                if self.qualified(target) & names.NO_GRAD_CONTEXTS:
                    return True
        return False

    @cached_property
    def index(self) -> Index:
        """What encloses a node, assignments and calls by name, functions' own bodies: kept."""
        return Index(self)

    @cached_property
    def call_graph(self) -> CallGraph:
        """The file's one call resolver: which function or method each call runs."""
        from accelify.analysis.call_graph import CallGraph

        return CallGraph(self)

    def scope_of(self, node: cst.CSTNode) -> Scope:
        return self.index.scope_of(node)

    def under_rank_guard(self, node: cst.CSTNode) -> bool:
        """Inside ``if accelerator.is_main_process:``, ``if rank == 0:`` and the like: code only
        some ranks run; also after ``if not accelerator.is_main_process: return`` at the top of
        its function (BigVGAN's ``validate``), which the other ranks leave before reaching it."""
        return self.rank_guard_of(node) is not None

    def rank_guard_of(self, node: cst.CSTNode) -> cst.If | cst.FunctionDef | None:
        """What keeps ``node`` from some ranks (`under_rank_guard`), innermost first: the ``if``
        that reads the rank, the function a rank decorator wraps, or that function's early
        ``if <rank test>: return``. The launcher names it as the line to fix when a rank waits
        alone in a collective there (`accelify.runtime.launch.rank_guards`)."""
        for ancestor in self.ancestors(node):
            kind = type(ancestor)  # neither class has subclasses: no ABC check per ancestor
            if kind is cst.If and self.reads_rank(ancestor.test):  # type: ignore[attr-defined]
                return ancestor  # type: ignore[return-value]
            if kind is cst.FunctionDef:
                if self.rank_decorator_test(ancestor) is not None:  # type: ignore[arg-type]
                    return ancestor  # type: ignore[return-value]
                exit_at = self._rank_exit(ancestor)  # type: ignore[arg-type]
                if exit_at is not None and self.order(node) > exit_at[0]:
                    return exit_at[1]
        return None

    def rank_decorator_test(self, function: cst.FunctionDef) -> cst.BaseExpression | None:
        """The rank test a decorator puts around ``function``'s body, as the ``if`` it stands
        for: ``@accelerator.on_main_process`` (or ``@state.on_local_main_process``, Accelerate's
        documented way to run a helper once) runs the body where ``accelerator.is_main_process``
        holds and returns None elsewhere; ``on_process(k)`` where ``process_index == k``."""
        cache = self._rank_decorator_tests
        if id(function) not in cache:
            cache[id(function)] = next(
                (
                    test
                    for decorator in function.decorators
                    if (test := _decorator_rank_test(decorator.decorator)) is not None
                ),
                None,
            )
        return cache[id(function)]

    def _rank_exit(self, function: cst.FunctionDef) -> tuple[int, cst.If] | None:
        """Where ``function``'s body leaves early on some ranks: the place of the first
        statement of its own body shaped ``if <rank test>: return``, no else, and that
        statement. ``if process_index == 1: raise ...`` is not one: the rank that raises ends
        the whole run (the launcher stops the others), so no rank goes on without it."""
        cache = self._rank_exits
        if id(function) not in cache:
            cache[id(function)] = None
            body = function.body
            for statement in body.body if isinstance(body, cst.IndentedBlock) else ():
                if (
                    isinstance(statement, cst.If)
                    and statement.orelse is None
                    and _returns(statement.body)
                    and self.reads_rank(statement.test)
                ):
                    cache[id(function)] = (self.order(statement.body), statement)
                    break
        return cache[id(function)]

    def reads_rank(self, value: cst.CSTNode) -> bool:
        """``value`` depends on this process's rank: it reads a member or a function named for
        it (``accelerator.is_main_process``, ``state.process_index``, ``args.local_rank``,
        ``dist.get_rank()``), the launcher's variable (``os.environ["LOCAL_RANK"]``), a
        parameter or a global named for it (``def worker(rank, world_size)``), a rank alias
        (`rank_aliases`), or a name the file sets from one of those, followed through what it
        is set to: ``reciprocal_rank = (1.0 / ranks).mean()`` is a metric, ``lora_rank`` a
        setting and ``for rank in range(n)`` a count, none of them the process's rank.
        Kept per node once the walk is done (every ``if`` around a node is asked again for
        each node under it)."""
        memo = self._rank_reads
        if memo is None:
            return self._reads_rank(value, deep=True, seen=set())
        found = memo.get(id(value))
        if found is None:
            found = memo[id(value)] = self._reads_rank(value, deep=True, seen=set())
        return found

    def rank_answer_read(self, value: cst.CSTNode) -> cst.Call | None:
        """The call of a function that `answers_by_rank` through which ``value`` reads the rank
        (``if stats is not None:`` after ``stats = collect_rollouts(n)``), or None: what a
        finding names so that the reader sees why the test differs between ranks."""
        answers: list[cst.Call] = []
        self._reads_rank(value, deep=True, seen=set(), answers=answers)
        return answers[0] if answers else None

    def _reads_rank(
        self,
        value: cst.CSTNode,
        deep: bool,
        seen: set[tuple[int, str]],
        answers: list[cst.Call] | None = None,
    ) -> bool:
        stack = [value]
        while stack:
            node = stack.pop()
            if isinstance(node, cst.SimpleString):
                text = node.evaluated_value
                if (
                    isinstance(text, str)
                    and text.isidentifier()
                    and names.is_process_rank_name(text)
                    and isinstance(self.parent(node), (cst.Index, cst.Arg))
                ):
                    # os.environ["LOCAL_RANK"], getattr(args, "local_rank"); not ``"RANK" in
                    # os.environ``, launched or not, the same on every rank
                    return True
                continue
            if isinstance(node, cst.Attribute):
                member = node.attr.value
                if names.is_process_rank_name(member) or (dotted(node) or "").endswith(
                    _RANK_SETTINGS
                ):
                    return True
                if dotted(node.value) == "self" and member in self.rank_aliases:
                    return True
                stack.append(node.value)
                continue
            if isinstance(node, cst.Name):
                if self._name_reads_rank(node, seen, answers):
                    return True
                continue
            if isinstance(node, (cst.Lambda, cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(node, cst.Call) and self._calls_rank_answer(node):
                if answers is not None:
                    answers.append(node)
                return True  # ``stats = collect_rollouts(n)``: None on the other ranks
            if isinstance(node, cst.Call) and not deep:
                function = (dotted(node.func) or "").rsplit(".", 1)[-1]
                stack.append(node.func)
                if function not in _CONVERSIONS:
                    continue
                stack.extend(argument.value for argument in node.args)
                continue
            if isinstance(node, cst.Arg):
                stack.append(node.value)  # not its keyword: ``f(rank=0)`` reads no ``rank``
                continue
            stack.extend(children_of(node))
        return False

    def _calls_rank_answer(self, call: cst.Call) -> bool:
        """``call`` runs a function of the file that `answers_by_rank`."""
        found = self.call_graph.callee(call)
        return found is not None and self.answers_by_rank(found[0])

    def answers_by_rank(self, function: cst.FunctionDef) -> bool:
        """``function`` returns one value on some ranks and another on the rest: ``if not
        accelerator.is_main_process: return None`` above ``return stats`` (a PPO trainer's
        rollout or evaluation), ``return`` of different values in the two arms of a rank test,
        or a value from a body a rank decorator runs on one process (the others get None). A
        caller's test of the answer (``if stats is not None: accelerator.wait_for_everyone()``)
        is then a rank test: only some ranks enter it."""
        cache = self._rank_answers
        found = cache.get(id(function))
        if found is None:
            cache[id(function)] = False  # a recursive call reads no rank while it is asked
            found = cache[id(function)] = self._answers_by_rank(function)
        return found

    def _answers_by_rank(self, function: cst.FunctionDef) -> bool:
        if is_generator_function(function):
            return False
        code = self.module.code_for_node
        answers: set[str] = set()
        guarded = False
        for node in self.index.own_nodes(function):
            if type(node) is not cst.Return:
                continue
            answers.add(code(node.value) if node.value is not None else "None")
            guard = self.rank_guard_of(node)
            if guard is not None and (guard is function or self.inside(guard, function)):
                guarded = True
        if self.rank_decorator_test(function) is not None:
            return bool(answers - {"None"})  # the other ranks get None from the decorator
        if not guarded:
            return False
        if not _ends_in_exit(function.body):
            answers.add("None")  # falling off the end answers None
        return len(answers) > 1

    def _name_reads_rank(
        self,
        read: cst.Name,
        seen: set[tuple[int, str]],
        answers: list[cst.Call] | None = None,
    ) -> bool:
        """A name read: the rank when named for it (a parameter, a global, an import, a local
        set other than by a loop: ``rank, world_size = setup()``), an alias, or set from a
        value that reads it. The name is looked up in the function it is read in, then in the
        ones around it, then in the module."""
        name = read.value
        if name in self.rank_aliases:
            return True
        scope: cst.CSTNode = self.scope_of(read)
        values = self._rank_name_values.get((id(scope), name))
        while values is None and not isinstance(scope, cst.Module):
            scope = self.scope_of(scope)
            values = self._rank_name_values.get((id(scope), name))
        key = (id(scope), name)
        if key in seen:
            return False
        seen.add(key)
        if not values:
            return names.is_process_rank_name(name)
        if names.is_process_rank_name(name) and any(
            id(value) not in self._loop_iterables for value in values
        ):
            return True  # ``rank, world_size = setup()``: named so, and set once, not counted
        return any(self._reads_rank(v, deep=False, seen=seen, answers=answers) for v in values)

    @cached_property
    def _loop_iterables(self) -> set[int]:
        """The iterables of the file's loops (a loop's target is a count, not a rank)."""
        return {
            id(node.iter)  # type: ignore[attr-defined]
            for node in self.index.of_type((cst.For, cst.CompFor))
        }

    @cached_property
    def _rank_name_values(self) -> dict[tuple[int, str], list[cst.CSTNode]]:
        """What the file sets each plain name to: assignments (also ``+=``, annotated, a
        walrus), loop targets (the loop's iterable: ``for rank in range(n)``) and parameters
        (the parameter itself: what the callers pass), by the function (or module) they are
        set in: `Index.values_set_to`, less ``with ... as name``."""
        values: dict[tuple[int, str], list[cst.CSTNode]] = {}
        for name in self.index.names_set():
            for node, value in self.index.values_set_to(name):
                if not isinstance(node, cst.With):
                    values.setdefault((id(self.scope_of(node)), name), []).append(value)
        return values

    @cached_property
    def rank_aliases(self) -> frozenset[str]:
        """Names, ``self.`` attributes, properties and methods whose every value is a rank test:
        ``is_main = accelerator.is_main_process``; a trainer's ``def is_main(self): return
        self.accelerator.is_main_process``; ``self.can_checkpoint = self.is_local_main if local
        else self.is_main``. A test that reads one is a rank guard like the test it stands for.
        Only values shaped like a test count (names, ``and``/``or``/``not``, comparisons,
        conditional expressions): ``f"cuda:{rank}"`` is a device, not a guard."""
        values: dict[str, list[cst.BaseExpression]] = {}
        for assign in self.assignments:
            if len(assigned_targets(assign)) != 1:
                continue
            target = assigned_targets(assign)[0]
            if isinstance(target, cst.Name):
                values.setdefault(target.value, []).append(assign.value)
            elif isinstance(target, cst.Attribute) and dotted(target.value) == "self":
                values.setdefault(target.attr.value, []).append(assign.value)
        for call in self.calls:  # ``setattr(self, "is_main", accelerator.is_main_process)``
            if type(call.func) is cst.Name and call.func.value == "setattr":
                member = _set_member(call)
                if member is not None:
                    values.setdefault(member[0], []).append(member[1])
        methods = [
            statement
            for owner in self.classes.values()
            for statement in owner.body.body
            if isinstance(statement, cst.FunctionDef)
        ]
        for function in (*self.functions.values(), *methods):
            returned = _only_return(function)
            if returned is not None:
                values.setdefault(function.name.value, []).append(returned)
        aliases: set[str] = set()
        self.__dict__["rank_aliases"] = frozenset()  # what `reads_rank` asks while growing
        for _ in range(3):  # an alias of an alias: ``can_checkpoint`` from ``is_main``
            found = {
                name
                for name, exprs in values.items()
                if name not in aliases
                and all(  # not through `reads_rank`'s memo: its answers grow with the aliases
                    isinstance(value, _TEST_SHAPES)
                    and self._reads_rank(value, deep=True, seen=set())
                    for value in exprs
                )
            }
            if not found:
                break
            aliases |= found
            self.__dict__["rank_aliases"] = frozenset(aliases)
        return frozenset(aliases)

    def call_names(self, call: cst.Call) -> set[str]:
        """`qualified` of what ``call`` calls; asked by most rules of every call, so kept once
        the walk has seen every import."""
        memo = self._call_names
        if memo is None:
            return self.qualified(call.func)
        found = memo.get(id(call))
        if found is None:
            found = memo[id(call)] = self.qualified(call.func)
        return set(found)

    # --- queries ------------------------------------------------------------------------------
    def of_kind(self, *kinds: Kind) -> list[Binding]:
        return [binding for binding in self.bindings if binding.kind in kinds]

    def names_of(self, *kinds: Kind) -> set[str]:
        """Names bound to ``kinds``; for accelerators also the parameters that receive one."""
        found = {binding.name for binding in self.of_kind(*kinds)}
        if Kind.ACCELERATOR in kinds:
            found.update(*self.accelerator_params.values(), self.inherited_accelerators)
        return found

    def prepared_before(self, node: cst.CSTNode) -> set[str]:
        """The names a ``prepare`` call at or above ``node`` (in source order) returned."""
        here = self.order(node)
        found = {
            name
            for call in self.prepare_calls
            if self.order(call.call) <= here
            for name in call.outputs
            if name
        }
        return found | self.given_prepared(node)  # handed prepared by the project's callers

    def given_prepared(self, node: cst.CSTNode) -> set[str]:
        """The parameters of the functions around ``node`` that every call of the project's
        other modules hands a prepared object (``loader`` in ``def evaluate(model, loader)``):
        another function's parameter of the same name is another object."""
        found: set[str] = set()
        if self.given_parameters:
            for function in self.ancestors(node):
                given = self.given_parameters.get(function, {})  # type: ignore[call-overload]
                found |= {name for name, g in given.items() if g.prepared}
        return found

    def _given_attributes(self) -> set[str]:
        """``self.model`` set from a constructor's parameter that every construction in the
        project's other modules hands a prepared object (`given_parameters`)."""
        if not self.given_parameters:
            return set()
        from accelify.analysis.objects import received_name  # objects builds on this module

        found = set()
        for binding in self.bindings:
            given = self.given_parameters.get(binding.scope)  # type: ignore[call-overload]
            if not (binding.received and given and isinstance(binding.scope, cst.FunctionDef)):
                continue
            parameter = received_name(binding.scope, binding.value)
            if parameter in given and given[parameter].prepared:
                found.add(binding.name)
        return found

    @property
    def prepared_names(self) -> set[str]:
        """What came out of ``prepare``, and the attributes that received it
        (``self.loader = loader`` in a class built with a prepared loader). Asked for every
        call and loop a rule looks at: kept once the analysis is complete (a copy is given)."""
        kept = self.__dict__.get("_prepared_names")
        if kept is not None:
            return set(kept)
        prepared = {name for call in self.prepare_calls for name in call.outputs if name}
        prepared |= self._given_attributes()
        prepared |= self._returned_prepared(prepared)
        received = [(b.name, b.prepared_sources) for b in self.bindings if b.received and b.sources]
        received += self._aliases()
        for _ in range(len(received)):
            grown = {name for name, sources in received if prepared & sources} - prepared
            if not grown:
                break
            prepared |= grown
        if self.complete:
            self.__dict__["_prepared_names"] = frozenset(prepared)
        return prepared

    def _aliases(self) -> list[tuple[str, set[str]]]:
        """``self.train_loader = data.train_loader``: a name bound to another name (or an
        attribute chain) holds the same object, prepared when that one is (a trainer that
        prepares a data module's loaders in place and keeps them)."""
        found = []
        for assign in self.assignments:
            if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
                continue
            target, value = dotted(assign.targets[0].target), dotted(assign.value)
            if target is not None and value is not None and target != value:
                found.append((target, {value}))
        return found

    def _returned_prepared(self, prepared: set[str]) -> set[str]:
        """``model, opt, train_dl = setup(cfg)`` where ``setup`` prepares what it returns: the
        caller's names hold the prepared objects."""
        from accelify.analysis.objects import returned_local  # objects builds on this module

        found = set()
        for name, at in self._factory_results():
            returned = returned_local(self, name, at)
            if returned is None or returned[0] not in prepared:
                continue
            inside = self.index.enclosing_function(returned[1])
            if any(
                returned[0] in p.outputs and self.index.enclosing_function(p.call) is inside
                for p in self.prepare_calls
            ):
                found.add(name)
        return found

    def _factory_results(self) -> Iterator[tuple[str, cst.CSTNode]]:
        """The names a call's result is bound to (``train_dl = make_loader("train")``), with the
        statement: the tracked bindings, and the plain ``name = f(...)`` assignments whose
        object the analysis cannot classify (a loader a helper loads and prepares:
        ``dataloader = accelerator.prepare(torch.load(path).loader(8)); return dataloader``)."""
        for binding in self.bindings:
            if not binding.received and isinstance(binding.value, cst.Call):
                yield binding.name, binding.statement
        for assign in self.assignments:
            if isinstance(assign, cst.Assign) and isinstance(assign.value, cst.Call):
                for target in assign.targets:
                    for name in target_names(target.target):
                        if "." not in name:
                            yield name, assign

    @property
    def uses_accelerator(self) -> bool:
        """Created here, returned by a factory, held by a class or received as a parameter;
        or the project's other modules hand the file's functions what an accelerator prepared
        (``accuracy(model, eval_loader)`` of a metrics module that names no accelerator: its
        loop reads one rank's shard all the same)."""
        return bool(
            self.of_kind(Kind.ACCELERATOR)
            or self.accelerator_params
            or self.inherited_accelerators
            or any(g.prepared for given in self.given_parameters.values() for g in given.values())
        )

    @property
    def trains(self) -> bool:
        return bool(self.backward_calls)


def value_classifier(model: ScriptModel) -> Callable[[cst.BaseExpression, str], Kind | None]:
    """What a value makes when bound to a name (`_Collector.classify`), for the analyses that
    ask of values no binding holds (what a property returns)."""
    return _Collector(model).classify


def analyze(
    module: cst.Module,
    source: str | None = None,
    imported_returns: Mapping[int, list[tuple[tuple[int, ...], Kind | None]]] | None = None,
    project: ProjectView | None = None,
    given: dict[cst.FunctionDef, dict[str, Given]] | None = None,
    star_imported: Mapping[str, str] | None = None,
) -> ScriptModel:
    """One traversal collects everything; positions are left for the first finding that needs
    one (libcst's scope analysis is not used: an import table answers what a name is).
    ``imported_returns``: what calls of the project's other modules return (`ScriptModel`);
    ``project``: what the project's other modules tell about this one (`outside_callers`);
    ``given``: what they hand its functions, where the caller has it without a whole view (the
    conversion: `convert.handed_loaders`); ``star_imported``: the library names its star
    imports of project modules bind (`star_imports`)."""
    model = ScriptModel(module=module, imports=ImportTable.of_module(module), project=project)
    for name, target in (star_imported or {}).items():  # ``from sibling import *``'s libraries
        model.imports.bound.setdefault(name, target)
    if project is not None:
        model.given_parameters = project.given(module)
    if given:
        model.given_parameters = {**model.given_parameters, **given}
    if imported_returns:
        model.imported_returns = imported_returns
    if source is not None:  # the text the module was parsed from: no code generation for it
        model.__dict__["source"] = source
    # the collector that walked the module knows its tables of optimizer makers: a factory's
    # ``return OPTIMIZERS[name](params)`` is classified with them
    collector = _Collector(model)
    _collect(model, collector)
    _bind_stepped_optimizers(model, collector)
    model._call_names = {}  # the imports are all seen
    model._rank_reads = {}  # and every binding and parent
    _drop_gpu_indexes_read_as_numbers(model)
    _see_through_progress_bars(model)
    from accelify.analysis.accelerator_objects import add_accelerator_objects

    add_accelerator_objects(model)
    from accelify.analysis.prepare_wrappers import classes_wrapping_prepare

    wrapping = classes_wrapping_prepare(model)
    model.prepare_calls = [
        prepare
        for assign in model.assignments
        if (prepare := _prepare_call(model, assign, model.names_of(Kind.ACCELERATOR), wrapping))
        is not None
    ]
    accelerators = model.names_of(Kind.ACCELERATOR) | {"accelerator", "self.accelerator"}
    # a held object's own accelerator (a runner's ``self.trainer.accelerator.backward(loss)``)
    members = {name.rsplit(".", 1)[-1] for name in accelerators if name.startswith("self.")}
    model.backward_calls = [
        call
        for call in model.backward_calls
        if (receiver := dotted(call.func.value) or "") not in accelerators  # type: ignore[union-attr]
        and not ("." in receiver and receiver.rsplit(".", 1)[-1] in members)
        and not (receiver == "self" and own_method(model, call, "backward"))
        and not result_used(call, model.parent(call))
    ]
    from accelify.analysis.objects import add_object_bindings
    from accelify.analysis.optimizer_models import add_models_fed_to_optimizers
    from accelify.analysis.scheduler_objects import add_schedulers_by_use

    add_object_bindings(model, collector.classify)
    models = len(model.bindings)
    add_models_fed_to_optimizers(model)
    if len(model.bindings) != models:
        # a model known only by the optimizer over its parameters (``MODELS[cfg.model](6, 3)``
        # of a registry) is what a factory returning it hands its callers, too
        add_object_bindings(model, collector.classify)
        add_models_fed_to_optimizers(model)
    add_schedulers_by_use(model)
    model.complete = True
    return model


#: Calls whose argument is where a device goes: ``.cuda(gpu)``, ``.to(gpu)``,
#: ``torch.device("cuda", gpu)``, ``torch.cuda.set_device(gpu)``.
_DEVICE_TAKING_CALLS = frozenset({"cuda", "to", "set_device", "device"})
#: Keywords that take a device (or a list of them): ``map_location=gpu``, ``device_ids=[gpu]``.
_DEVICE_KEYWORDS = frozenset({"device", "map_location", "output_device", "device_ids"})


def _drop_gpu_indexes_read_as_numbers(model: ScriptModel) -> None:
    """A GPU index (``gpu_id = args.gpu``, ``device = 0``) is a device only where every read of
    it hands it to something that takes a device. Read as the number it is anywhere else
    (``str(gpu_id)`` into ``CUDA_VISIBLE_DEVICES``, ``if gpu is not None``, a print, arithmetic)
    it stays what it is: made ``accelerator.device`` there, a number would silently become a
    ``torch.device``."""
    indexes = [
        b
        for b in model.bindings
        if b.kind is Kind.DEVICE and not b.received and _gpu_index_value(b.name, b.value)
    ]
    if not indexes:
        return
    numbers = {id(b) for b in indexes if not _read_only_as_a_device(model, b.name)}
    if numbers:
        model.bindings = [b for b in model.bindings if id(b) not in numbers]


def _gpu_index_value(name: str, value: cst.BaseExpression) -> bool:
    """``0``, ``args.gpu``, or a choice between such (``0 if args.no_cuda else 1``)."""
    if isinstance(value, cst.IfExp):
        return _gpu_index_value(name, value.body) and _gpu_index_value(name, value.orelse)
    return _is_gpu_index(name, value)


def _read_only_as_a_device(model: ScriptModel, name: str) -> bool:
    kind = cst.Attribute if "." in name else cst.Name
    for node in model.index.of_type(kind):
        if dotted(node) != name or _is_bound_here(model, node):  # type: ignore[arg-type]
            continue
        if not _in_a_device_place(model, node) and number_read(model, node) is None:
            return False
    return True


def number_read(model: ScriptModel, node: cst.CSTNode) -> str | None:
    """What a device does instead where ``node`` reads a GPU index as the number it is, for
    the reads the conversion reviews: formatted into a string, an operand of arithmetic,
    compared with a number (the multi-GPU tutorial's ``if self.gpu_id == 0:``), an index."""
    parent = model.parent(node)
    if isinstance(parent, cst.FormattedStringExpression) or (
        isinstance(parent, cst.BinaryOperation)
        and not isinstance(parent.operator, cst.MatrixMultiply)
    ):
        return "it shows `cuda:0` on a GPU where it showed `0`"
    comparison = model.parent(parent) if isinstance(parent, cst.ComparisonTarget) else parent
    if isinstance(comparison, cst.Comparison):
        operands = [comparison.left, *(target.comparator for target in comparison.comparisons)]
        if any(o is node for o in operands) and any(isinstance(o, cst.Integer) for o in operands):
            return "a device never equals a number, so this test's outcome changes"
    if isinstance(parent, cst.Index):
        return "a device is no index (TypeError on a GPU)"
    return None


def _is_bound_here(model: ScriptModel, node: cst.CSTNode) -> bool:
    """A binding of the name, or the same spelling that is no read of it (``args.gpu``'s
    ``gpu``, a keyword ``f(gpu=...)``, a parameter, a definition's name)."""
    parent = model.parent(node)
    if isinstance(parent, (cst.AssignTarget, cst.AnnAssign, cst.AugAssign)):
        return getattr(parent, "target", None) is node
    if isinstance(parent, cst.Attribute):
        return parent.attr is node
    if isinstance(parent, cst.Arg):
        return parent.keyword is node
    return isinstance(parent, (cst.Param, cst.FunctionDef, cst.ClassDef, cst.ImportAlias))


def _in_a_device_place(model: ScriptModel, node: cst.CSTNode) -> bool:
    parent = model.parent(node)
    while isinstance(parent, cst.Element):  # ``device_ids=[gpu]``
        parent = model.parent(model.parent(parent))
    if not isinstance(parent, cst.Arg):
        return False
    if parent.keyword is not None:
        return parent.keyword.value in _DEVICE_KEYWORDS
    call = model.parent(parent)
    if not isinstance(call, cst.Call):
        return False
    func = call.func
    last = func.attr.value if isinstance(func, cst.Attribute) else dotted(func)
    return last in _DEVICE_TAKING_CALLS


def _see_through_progress_bars(model: ScriptModel) -> None:
    """``pbar = tqdm(loader, ...)`` then ``for batch in pbar:``: the loop reads ``loader``, as
    ``for batch in tqdm(loader):`` does; likewise ``batches = loader if full else
    islice(loader, n)``, each branch reading the same loader; and ``batches = loader`` then ``if
    show: batches = tqdm(loader)``, each assignment reading it. Only a name its scope assigns
    before the loop and nowhere after, from a bar, ``enumerate``, ``islice`` or a choice
    between them; and ``loader = loaders[split]``, which reads the dict's entry."""
    for loop in model.loops:
        name = loop.iterable
        if name is None or "." in name:
            continue
        assigns = [
            a
            for a in model.index.assignments_to(name)
            if model.scope_of(a) is loop.scope and len(assigned_targets(a)) == 1
        ]
        whole = _iterates_the_name(loop.node.iter, name)  # not ``loader["x"]`` of it
        entry = None if assigns or not whole else _items_entry(model, loop, name)
        if entry is not None:  # ``for split, loader in loaders.items():``, as ``loaders[split]``
            loop.iterable, loop.through = entry
            continue
        if not assigns or any(model.order(a) > model.order(loop.node) for a in assigns):
            continue
        keyed = _keyed_read(assigns) if whole else None
        if keyed is not None:  # ``loader = loaders[split]``: as ``for x, y in loaders[split]:``
            loop.iterable, loop.through = keyed
            continue
        branches = [branch for a in assigns for branch in _choices(a.value)]
        if not any(isinstance(branch, cst.Call) for branch in branches):
            continue
        sources = {_wrapped_loader(model, branch) for branch in branches}
        if len(sources) == 1 and None not in sources and sources != {name}:
            value = assigns[-1].value
            loop.iterable = sources.pop()
            loop.through = value
            if any(enumerates(branch) for branch in branches):  # pbar = tqdm(enumerate(loader))
                loop.batch_names -= first_enumerate_name(loop.node.target)


def _keyed_read(assigns: list[Assignment]) -> tuple[str, cst.Subscript] | None:
    """``loader = loaders[split]`` as the one assignment of the name a loop iterates, with a
    key that is no literal: the container's name and the read. The loop takes its batches
    from whichever entry the key picks, as a loop over ``loaders[split]`` itself does."""
    if len(assigns) != 1:
        return None
    value = assigns[0].value
    if not isinstance(value, cst.Subscript) or keyed_subscript(value) is not value:
        return None
    container = dotted(value.value)
    return (container, value) if container is not None else None


def _iterates_the_name(iterated: cst.BaseExpression, name: str) -> bool:
    """``for x, y in loader:`` (also ``enumerate(loader)``, ``tqdm(loader)``): the loop reads
    what ``name`` holds, not an entry or attribute of it."""
    while isinstance(iterated, cst.Call) and iterated.args:
        iterated = iterated.args[0].value
    return isinstance(iterated, cst.Name) and iterated.value == name


def _items_entry(model: ScriptModel, loop: Loop, name: str) -> tuple[str, cst.Subscript] | None:
    """``for split, loader in loaders.items():`` around ``for x, y in loader:``, the nearest
    loop binding ``loader``: the container's name and ``loaders[split]``, the entry each turn
    reads (written for the analysis, in no file). The batches come from whichever entry the
    key picks, as in ``for split in loaders: for x, y in loaders[split]:``."""
    for ancestor in model.ancestors(loop.node):
        if not isinstance(ancestor, cst.For) or name not in target_names(ancestor.target):
            continue
        target, iterated = ancestor.target, ancestor.iter
        if not (
            isinstance(target, cst.Tuple)
            and len(target.elements) == 2
            and isinstance(target.elements[0].value, cst.Name)
            and dotted(target.elements[1].value) == name
            and isinstance(iterated, cst.Call)
            and not iterated.args
            and isinstance(iterated.func, cst.Attribute)
            and iterated.func.attr.value == "items"
        ):
            return None
        container = dotted(iterated.func.value)
        if container is None:
            return None
        key = cst.SubscriptElement(cst.Index(target.elements[0].value))
        return container, cst.Subscript(iterated.func.value, [key])
    return None


def _choices(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The values ``a if test else b`` may take; any other value is its only one."""
    return [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]


def _wrapped_loader(model: ScriptModel, value: cst.BaseExpression) -> str | None:
    """The loader ``value`` wraps: ``tqdm(loader)``, ``enumerate(loader)``, ``islice(loader,
    n)``; a bare name only as a branch beside one of those (``loader if full else ...``)."""
    if isinstance(value, cst.Name):
        return value.value
    if isinstance(value, cst.Call) and model.qualified(value.func) & (
        names.TQDM | {"builtins.enumerate", "itertools.islice"}
    ):
        return loop_source(value)
    return None


_TEST_SHAPES = (
    cst.Name,
    cst.Attribute,
    cst.BooleanOperation,
    cst.UnaryOperation,
    cst.Comparison,
    cst.IfExp,
)


def _set_member(call: cst.Call) -> tuple[str, cst.BaseExpression] | None:
    """``("is_main", value)`` of ``setattr(self, "is_main", value)``: the ``self.`` attribute it
    sets, a string written out, and what to."""
    if len(call.args) != 3 or any(a.keyword or a.star for a in call.args):
        return None
    owner, key, value = (a.value for a in call.args)
    if dotted(owner) != "self" or not isinstance(key, cst.SimpleString):
        return None
    member = key.evaluated_value
    return (member, value) if isinstance(member, str) and member.isidentifier() else None


def _only_return(function: cst.FunctionDef) -> cst.BaseExpression | None:
    """What a one-statement function (a property, after its docstring) returns."""
    body = function.body
    if not isinstance(body, cst.IndentedBlock):
        return None
    statements = [
        statement
        for statement in body.body
        if not (
            isinstance(statement, cst.SimpleStatementLine)
            and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, cst.SimpleString)
        )
    ]
    if len(statements) != 1 or not isinstance(statements[0], cst.SimpleStatementLine):
        return None
    line = statements[0].body
    if len(line) == 1 and isinstance(line[0], cst.Return) and line[0].value is not None:
        return line[0].value
    return None


def _prepare_call(
    model: ScriptModel, node: cst.Assign, accelerators: set[str], wrapping: set[int]
) -> PrepareCall | None:
    """``model, optimizer = accelerator.prepare(model, optimizer)``, for any accelerator; and
    ``loaders = {k: accelerator.prepare(v) for k, v in loaders.items()}``; also a trainer's own
    ``self.prepare(...)`` that hands everything to its accelerator's (``wrapping``: the ids of
    such classes, `prepare_wrappers`)."""
    value = node.value
    if isinstance(value, cst.DictComp) and _is_prepare(value.value, accelerators):
        outputs = [dotted(target) or "" for target in assigned_targets(node)]
        inputs = [root_name(value.for_in.iter) or ""]
        return PrepareCall(value.value, inputs, outputs, model)  # type: ignore[arg-type]
    if not isinstance(value, cst.Call) or not (
        _is_prepare(value, accelerators) or _wrapped_prepare(model, value, wrapping)
    ):
        return None
    outputs: list[str] = []
    for target in assigned_targets(node):
        elements = target.elements if isinstance(target, (cst.Tuple, cst.List)) else [target]
        outputs += [
            output_name(model, e.value if isinstance(e, cst.BaseElement) else e) for e in elements
        ]
    inputs = [dotted(argument.value) or "" for argument in value.args]
    if len(outputs) == 1 and len(inputs) > 1 and outputs[0]:
        outputs = _unpacked_later(model, node, outputs[0]) or outputs
    return PrepareCall(value, inputs, outputs, model)


def _unpacked_later(model: ScriptModel, node: cst.Assign, name: str) -> list[str] | None:
    """``prepared = accelerator.prepare(model, optimizer)`` then ``model, optimizer = prepared``
    in the same scope: the names the objects end up under are the unpacking's."""
    scope = model.scope_of(node)
    for later in model.assignments:
        if (
            model.orders[later] > model.orders[node]
            and dotted(later.value) == name
            and len(assigned_targets(later)) == 1
            and isinstance(assigned_targets(later)[0], (cst.Tuple, cst.List))
            and model.scope_of(later) is scope
            and not any(
                isinstance(e, cst.StarredElement)
                for e in assigned_targets(later)[0].elements  # type: ignore[attr-defined]
            )
        ):
            elements = assigned_targets(later)[0].elements  # type: ignore[attr-defined]
            return [output_name(model, element.value) for element in elements]
    return None


def output_name(model: ScriptModel, target: cst.BaseExpression) -> str:
    """A name or attribute chain; one entry of a dict as written with double quotes
    (``loaders["train"]``); else empty. How `PrepareCall.outputs` spell what they bind, and
    how a read of one is spelled to be found there."""
    name = dotted(target)
    if name is not None:
        return name
    if isinstance(target, cst.Subscript) and dotted(target.value) is not None:
        return model.module.code_for_node(target).replace("'", '"')
    return ""


def _wrapped_prepare(model: ScriptModel, value: cst.BaseExpression, wrapping: set[int]) -> bool:
    """``self.prepare(...)`` in a class whose ``prepare`` is its accelerator's."""
    if not (
        wrapping
        and isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "prepare"
        and dotted(value.func.value) == "self"
    ):
        return False
    owner = model.index.enclosing_class(value)
    return owner is not None and id(owner) in wrapping


#: The Accelerator's methods that hand back what they were given, prepared.
_PREPARE_METHODS = frozenset(
    {"prepare", "prepare_model", "prepare_data_loader", "prepare_optimizer", "prepare_scheduler"}
)


def prepared_inline(model: ScriptModel, node: cst.BaseExpression) -> bool:
    """``accelerator.prepare(test_loader)`` as it is read, also inside ``enumerate(...)`` or
    ``tqdm(...)`` (``for x, y in accelerator.prepare(test_loader):``): the prepared object, bound
    to no name."""
    while isinstance(node, cst.Call):
        if _is_prepare(node, model.names_of(Kind.ACCELERATOR)):
            return True
        if not node.args:
            return False
        node = node.args[0].value
    return False


def _is_prepare(value: cst.BaseExpression, accelerators: set[str]) -> bool:
    """``accelerator.prepare(...)``, also through an instance of a class of the file that
    holds ``self.accelerator`` (``train_loader = trainer.accelerator.prepare(train_loader)``),
    and ``accelerator.prepare_model(model)``, which wraps the model as ``prepare`` does; not
    with ``evaluation_mode=True``, which leaves it unwrapped (an evaluator's copy). Its
    one-object siblings ``prepare_data_loader``, ``prepare_optimizer`` and
    ``prepare_scheduler`` shard, place and wrap their object as ``prepare`` does too (a
    segmentation trainer's ``build_accelerator`` prepares each so)."""
    if not (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in _PREPARE_METHODS
    ):
        return False
    if value.func.attr.value == "prepare_model" and _evaluation_mode(value):
        return False
    receiver = dotted(value.func.value) or ""
    return receiver in accelerators or (
        "self.accelerator" in accelerators
        and receiver.count(".") == 1
        and receiver.endswith(".accelerator")
        and not receiver.startswith("self.")
    )


def _evaluation_mode(call: cst.Call) -> bool:
    """``prepare_model(model, evaluation_mode=...)`` with anything but a literal ``False``:
    Accelerate then skips the DistributedDataParallel wrapper (a choice made at run time is
    given the benefit of the doubt)."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "evaluation_mode":
            return not (isinstance(arg.value, cst.Name) and arg.value.value == "False")
    positional = [a for a in call.args if a.keyword is None]
    return len(positional) > 2 and not (
        isinstance(positional[2].value, cst.Name) and positional[2].value.value == "False"
    )


def _collect(model: ScriptModel, collector: _Collector) -> None:
    """The analysis's one walk, the largest cost after the parse: each node's parent and place
    in source order, then the collector's ``visit_<Node>`` for it, parents before children.
    Written out (not a visitor's ``on_visit``/``on_leave``) because it runs for every node."""
    orders, parents = model.orders, model.parents
    walked = model.walked
    nodes, ends = walked.nodes, walked.ends
    handlers: dict[type, Callable[[cst.CSTNode], object] | None] = {}

    def visit(node: cst.CSTNode, parent: cst.CSTNode | None) -> None:
        at = orders[node] = len(nodes)
        nodes.append(node)
        ends.append(0)
        if parent is not None:
            parents[id(node)] = parent
        kind = type(node)
        if kind in handlers:
            handler = handlers[kind]
        else:
            handler = handlers[kind] = getattr(collector, f"visit_{kind.__name__}", None)
        if handler is not None:
            handler(node)
        for child in children_of(node):
            visit(child, node)
        ends[at] = len(nodes)

    visit(model.module, None)
    remember_walk(walked)
    _loops_trained(model)


def own_method(model: ScriptModel, call: cst.Call, name: str) -> bool:
    """``self.<name>(...)`` in a class that defines ``<name>`` itself: a trainer's own
    ``backward(loss)`` method (which calls ``accelerator.backward``), not a tensor's."""
    owner = next((a for a in model.ancestors(call) if isinstance(a, cst.ClassDef)), None)
    return (
        owner is not None
        and isinstance(owner.body, cst.IndentedBlock)
        and any(
            isinstance(line, cst.FunctionDef) and line.name.value == name
            for line in owner.body.body
        )
    )


def _bind_stepped_optimizers(model: ScriptModel, collector: _Collector) -> None:
    """``opt = cfg["optimizer"](model.parameters(), lr=...)`` or ``optimizer =
    optimizer_cls(model.parameters())`` of ``optimizer_cls = getattr(torch.optim, args.opt)``:
    a class the script picks at run time, so no name says what it makes. Handed a model's
    parameters and stepped (``opt.step()``), it is the optimizer that trains that model, as
    sure as one whose class is written out; left unbound, it went unprepared and was reviewed
    as "parameters updated by hand". Asked after the walk: the steps may come later in the
    file."""
    stepped = {
        dotted(member.value)
        for member in model.index.attributes_named("step")
        if isinstance(model.parent(member), cst.Call)
    }
    bound = {id(b.assign) for b in model.bindings}
    for assign in model.assignments:
        targets = assigned_targets(assign) if isinstance(assign, cst.Assign) else [assign.target]
        name = dotted(targets[0]) if len(targets) == 1 else None
        value = strip_self_methods(assign.value)  # type: ignore[arg-type]
        if name is None or name not in stepped or id(assign) in bound:
            continue
        if not isinstance(value, cst.Call) or not _picked_at_run_time(model, value):
            continue
        statement = model.parent(assign)
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        if collector._inside_model_class(assign):
            continue
        scope = model.scope_of(assign)
        model.bindings.append(
            Binding(name, Kind.OPTIMIZER, scope, statement, assign, assign.value, model)  # type: ignore[arg-type]
        )


def _picked_at_run_time(model: ScriptModel, call: cst.Call) -> bool:
    """A call handed a model's parameters first (``X(model.parameters(), ...)`` or
    ``params=model.parameters()``) through something no import names: a table's entry
    (``cfg["optimizer"]``, ``OPTIMIZERS[name]``), a config's field, a local bound at run
    time. A library's callable (``torch_ema.ExponentialMovingAverage(model.parameters())``)
    is what its name says and is classified by it."""
    func = call.func
    if isinstance(func, (cst.Name, cst.Attribute)):
        spelt = dotted(func) or ""
        if spelt.split(".")[0] in model.imports.bound:
            return False
        defined = {f.name.value for f in model.index.of_type(cst.FunctionDef)}  # type: ignore[attr-defined]
        if spelt in defined or spelt in model.classes:
            return False
    elif not isinstance(func, cst.Subscript):
        return False
    handed = keyword_value(call, "params")
    if handed is None and call.args and call.args[0].keyword is None and not call.args[0].star:
        handed = call.args[0].value
    return (
        isinstance(handed, cst.Call)
        and isinstance(handed.func, cst.Attribute)
        and handed.func.attr.value == "parameters"
    )


def _loops_trained(model: ScriptModel) -> None:
    """Which loops run a backward in their own body (not in a nested loop's): asked after the
    walk, whose order then answers it (in the walk, each loop's body was walked again)."""
    for loop in model.loops:
        trains = any(True for _ in find_backward(loop.node.body, skip_loops=True))
        loop.trains = trains
        loop.evaluates = not trains and (loop.evaluates or _grad_off_in_body(model, loop))


#: Loops over counts (epochs, steps), whose batches come from elsewhere.
_COUNTING = frozenset({"range", "trange", *names.TRANGE})


def _grad_off_in_body(model: ScriptModel, loop: Loop) -> bool:
    """The loop turns gradients off inside its body for each batch (``for batch in loader:
    with torch.no_grad(): outputs = model(**batch)``): it evaluates as much as a loop under
    ``no_grad`` does. Not a loop over ``range`` (epochs, steps), whose body may evaluate once
    beside what it trains through a function."""
    source = loop.node.iter
    if isinstance(source, cst.Call) and dotted(source.func) == "enumerate" and source.args:
        source = source.args[0].value
    if isinstance(source, cst.Call) and dotted(source.func) in _COUNTING:
        return False
    body = loop.node.body
    if not isinstance(body, cst.IndentedBlock):
        return False
    grad_off = [s for s in body.body if isinstance(s, cst.With) and model.disables_grad(s)]
    # ``loss = self.train_step(batch)`` beside ``with torch.no_grad(): ema.update(model)``: the
    # loop trains through a function of the file, and its no_grad block is a part of that
    # training step (an EMA update, a teacher's forward), not an evaluation
    return bool(grad_off) and not any(
        model.call_graph.trains_through_calls(statement)
        for statement in body.body
        if statement not in grad_off
    )


class _Collector(Visitor):
    """What the one walk records about each kind of node (its ``visit_<Node>`` methods never
    stop the walk)."""

    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        #: the functions the walk has entered, innermost last (`_function_around`)
        self._functions: list[cst.FunctionDef] = []
        #: names bound to a dict of optimizer makers (``{"sgd": lambda p: optim.SGD(p, ...)}``)
        self._optimizer_tables: set[str] = set()
        #: tables (``{}`` or of optimizer makers) whose entries assigned one by one all make one
        self._filling_tables: set[str] = set()

    def visit_Import(self, node: cst.Import) -> None:
        self.model.imports.add(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.model.imports.add(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if isinstance(self.model.parent(node), cst.Module):
            self.model.classes[node.name.value] = node
        for base in node.bases:
            qualified = self.model.qualified(base.value)
            base_name = dotted(base.value)
            if (
                qualified & names.MODULE_BASES
                or any(_is_nn_model(name) for name in qualified)
                or base_name in self.model.module_classes
            ) and not _prepares_its_own(node):
                self.model.module_classes.add(node.name.value)
            if qualified & names.DATALOADERS or base_name in self.model.loader_classes:
                own = _iterates_its_own(node)
                if own:
                    self.model.iterating_loader_classes[node.name.value] = own
                else:
                    self.model.loader_classes.add(node.name.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if isinstance(self.model.parent(node), cst.Module):
            self.model.functions[node.name.value] = node
        elif self._in_module_scope(node):
            # ``if TRAIL_NUM == 1: def add_edge_feature(...)``: a function of the module's
            # scope all the same, called by the module's code under the same test; one of the
            # same name at top level is the one a call finds
            top = self.model.functions.get(node.name.value)
            if top is None or not isinstance(self.model.parent(top), cst.Module):
                self.model.functions[node.name.value] = node
        self._function_around()  # drops the functions whose walk ended before this one
        self._functions.append(node)

    def _in_module_scope(self, node: cst.CSTNode) -> bool:
        """No class (nor function, nor lambda) around ``node``: only module-level blocks
        (``if``, ``try``, ``with``, ``for``)."""
        parent = self.model.parent(node)
        while parent is not None and not isinstance(parent, cst.Module):
            if isinstance(parent, cst.ClassDef | cst.FunctionDef | cst.Lambda):
                return False
            parent = self.model.parent(parent)
        return True

    def _function_around(self) -> cst.FunctionDef | None:
        """The innermost function the walk is inside: `_collect` calls no ``leave_`` method, so
        the functions whose walk has ended (their end is recorded) are dropped here; a
        module-level statement after a function is in none, and after a nested ``def`` its
        outer function is the one around (the value being classified is not walked yet, so
        its parents are not known)."""
        functions, walked, orders = self._functions, self.model.walked, self.model.orders
        while functions and walked.ends[orders[functions[-1]]]:
            functions.pop()
        return functions[-1] if functions else None

    def visit_Assign(self, node: cst.Assign) -> None:
        self.model.assignments.append(node)
        for target in assigned_targets(node):
            self._bind(target, node.value, node)
            self._note_optimizer_table(target, node.value)
            self._bind_unpacked_optimizer(target, node)

    def _bind_unpacked_optimizer(self, target: cst.BaseExpression, assign: cst.Assign) -> None:
        """``optimizer, scheduler = get_optimizer_and_scheduler(params=model.parameters())``: a
        project's helper named for the optimizer it returns beside other things; the element
        named an optimizer is one, built over what the call is handed. (The scheduler is left:
        what it is sized in is the helper's business.)"""
        value = assign.value
        if not (isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, cst.Call)):
            return
        callee = (dotted(value.func) or "").rsplit(".", 1)[-1].lower()
        statement = self.model.parent(assign)
        if (
            "optimizer" not in callee
            or not isinstance(statement, cst.SimpleStatementLine)
            or self._inside_model_class(assign)
        ):
            return
        for element in target.elements:
            name = dotted(element.value) if isinstance(element, cst.Element) else None
            if name is not None and name.rsplit(".", 1)[-1].lower() in names.OPTIMIZER_NAMES:
                self.model.bindings.append(
                    Binding(
                        name=name,
                        kind=Kind.OPTIMIZER,
                        scope=self.model.scope_of(assign),
                        statement=statement,
                        assign=assign,
                        value=value,
                        script=self.model,
                    )
                )

    def _note_optimizer_table(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        """Remember ``OPTIMIZERS = {"sgd": lambda p: optim.SGD(p, lr=...), "adam": optim.Adam}``
        so that ``OPTIMIZERS[name](model.parameters())`` is read as the optimizer it builds; a
        later binding of the name to anything else forgets it. A table may also start empty and
        be filled entry by entry (`_note_optimizer_entry`)."""
        if isinstance(target, cst.Subscript):
            self._note_optimizer_entry(dotted(target.value), value)
            return
        name = dotted(target)
        if name is None:
            return
        self._optimizer_tables.discard(name)
        self._filling_tables.discard(name)
        if isinstance(value, cst.Dict) and self._optimizer_table(value):
            self._optimizer_tables.add(name)
            self._filling_tables.add(name)
        elif isinstance(value, cst.Dict) and not value.elements:
            self._filling_tables.add(name)

    def _note_optimizer_entry(self, table: str | None, value: cst.BaseExpression) -> None:
        """``OPTIMIZERS = {}`` then ``OPTIMIZERS["adam"] = lambda params, cfg:
        optim.Adam(params, lr=cfg.lr)``: a table of optimizer makers while every entry is one;
        an entry of anything else makes it an ordinary dict for good."""
        if table is None or table not in self._filling_tables:
            return
        if self._optimizer_maker(value):
            self._optimizer_tables.add(table)
        else:
            self._optimizer_tables.discard(table)
            self._filling_tables.discard(table)

    def _optimizer_table(self, table: cst.Dict) -> bool:
        """Every value of the dict makes an optimizer: an optimizer class, or a lambda whose
        body builds one."""
        return bool(table.elements) and all(
            isinstance(element, cst.DictElement) and self._optimizer_maker(element.value)
            for element in table.elements
        )

    def _optimizer_maker(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.Lambda):
            body = value.body
            return isinstance(body, cst.Call) and self._classify_call(body) is Kind.OPTIMIZER
        return any(
            _optimizer_class(qualified_name) for qualified_name in self.model.qualified(value)
        )

    def _looked_up_optimizer(self, call: cst.Call) -> bool:
        """``OPTIMIZERS[name](model.parameters())`` or ``{"sgd": optim.SGD, ...}[name](...)``:
        an optimizer picked from a table of optimizer makers by a config or a loop."""
        func = call.func
        if not isinstance(func, cst.Subscript):
            return False
        table = func.value
        if isinstance(table, cst.Dict):
            return self._optimizer_table(table)
        return dotted(table) in self._optimizer_tables

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:  # ``x: T = v`` binds as ``x = v`` does; ``x: T`` binds nothing
            self.model.assignments.append(node)
            self._bind(node.target, node.value, node)
            self._note_optimizer_table(node.target, node.value)

    def _bind(
        self,
        target: cst.BaseExpression,
        value: cst.BaseExpression,
        assign: cst.Assign | cst.AnnAssign,
    ) -> None:
        pairs = unpacked_pairs(target, value)
        if pairs is not None:  # ``self.train_loader, self.val_loader = DataLoader(a), ...``
            for element_target, element_value in pairs:
                self._bind(element_target, element_value, assign)
            return
        name = dotted(target)
        if name is None:
            return
        kind = self._classify(value, name) or self._device_parameter(value, name, assign)
        if kind is None or (kind is Kind.MODEL and self._is_layer(name)):
            return
        statement = self.model.parent(assign)
        if not isinstance(statement, cst.SimpleStatementLine):
            return
        if kind is not Kind.ACCELERATOR and self._inside_model_class(assign):
            return
        self.model.bindings.append(
            Binding(
                name=name,
                kind=kind,
                scope=self.model.scope_of(assign),
                statement=statement,
                assign=assign,
                value=value,
                script=self.model,
            )
        )

    def _device_parameter(
        self, value: cst.BaseExpression, name: str, assign: cst.CSTNode
    ) -> Kind | None:
        """``self.device = device`` in ``def __init__(self, ..., device="cpu")``: the device
        the script runs on, chosen by a parameter whose default names one (a ``--device``
        flag is usually what the caller passes), or is ``None`` (``.to(None)`` leaves the
        model and the tensors where they are made: the one device of a plain run). A parameter
        with no default is the caller's device too (``Trainer(model, ..., args.device)``):
        kept, it would go on naming the caller's device (``"cpu"``, or ``cuda`` = cuda:0 on
        every rank) while prepare places the model and the batches on this rank's."""
        if name.split(".")[-1].lower() != "device" or not isinstance(value, cst.Name):
            return None
        function = next(
            (a for a in self.model.ancestors(assign) if isinstance(a, cst.FunctionDef)), None
        )
        if function is None:
            return None
        for parameter in (*function.params.params, *function.params.kwonly_params):
            if parameter.name.value == value.value and parameter.default is None:
                return Kind.DEVICE
            if parameter.name.value == value.value and parameter.default is not None:
                default = parameter.default
                none = isinstance(default, cst.Name) and default.value == "None"
                return Kind.DEVICE if none or _is_device_literal(default) else None
        return None

    def _is_layer(self, name: str) -> bool:
        """``model.fc = nn.Linear(...)`` (or ``self.model.fc = ...``) replaces a layer of a model:
        not a model of its own."""
        return owning_model(name) != name

    def classify(self, value: cst.BaseExpression, name: str) -> Kind | None:
        """What ``value`` makes, when bound to ``name``: the test every binding passes."""
        return self._classify(value, name)

    def _inside_model_class(self, node: cst.CSTNode) -> bool:
        """``self.fc = nn.Linear(...)`` in a model's ``__init__`` is a layer, not a model to
        prepare; classes are visited before their bodies, so `module_classes` knows them."""
        for ancestor in self.model.ancestors(node):
            if isinstance(ancestor, cst.ClassDef):
                return ancestor.name.value in self.model.module_classes
        return False

    def _classify(self, value: cst.BaseExpression, name: str) -> Kind | None:
        core = strip_self_methods(value)
        if isinstance(core, cst.Call):
            return self._classify_call(core)
        if isinstance(core, cst.IfExp):
            return self._classify_choice(core, name)
        if isinstance(core, cst.Dict) and _loaders_by_key(core, self):
            return Kind.DATALOADER
        if isinstance(core, cst.DictComp) and self.classify(core.value, "") is Kind.DATALOADER:
            # ``{x: DataLoader(image_datasets[x], ...) for x in ["train", "val"]}`` (the
            # transfer-learning tutorial's loaders by phase)
            return Kind.DATALOADER
        if name.split(".")[-1].lower() == "device" and _is_device_literal(value):
            return Kind.DEVICE
        if _is_gpu_index(name, value):
            return Kind.DEVICE
        return None

    def _classify_choice(self, choice: cst.IfExp, name: str) -> Kind | None:
        """``torch.device("cuda") if c else torch.device("cpu")``: a device either way;
        ``DDP(model) if distributed else model``: a hand-written wrapper; a DistributedSampler
        or something else (None, a RandomSampler): a hand-written sampler."""
        kinds = {self._classify(branch, name) for branch in (choice.body, choice.orelse)} - {None}
        if kinds == {Kind.DEVICE}:
            return Kind.DEVICE
        if kinds == {Kind.WRAPPER} and name in {dotted(choice.body), dotted(choice.orelse)}:
            return Kind.WRAPPER
        if [self._classify(b, name) for b in (choice.body, choice.orelse)].count(Kind.SAMPLER) == 1:
            return Kind.SAMPLER  # ``DistributedSampler(ds) if distributed else None``
        return None

    def _classify_call(self, call: cst.Call) -> Kind | None:
        looked_up = _looked_up_in(call, self.model)
        if looked_up == "torch.optim.lr_scheduler":
            return Kind.SCHEDULER
        if looked_up == "torch.optim":
            return Kind.OPTIMIZER
        qualified = self.model.call_names(call)
        local = dotted(call.func)
        if qualified & names.ACCELERATORS:
            return Kind.ACCELERATOR
        if qualified & names.DATALOADERS or local in self.model.loader_classes:
            return Kind.DATALOADER
        if qualified & names.DDP_WRAPPERS:
            return Kind.WRAPPER
        if qualified & names.DISTRIBUTED_SAMPLERS:
            return Kind.SAMPLER
        if qualified & names.GRAD_SCALERS:
            return Kind.SCALER
        if qualified & names.DEVICE_CALLS:
            return Kind.DEVICE
        for qualified_name in qualified:
            if qualified_name.startswith(names.SCHEDULER_PREFIXES) or (
                qualified_name.startswith(names.SCHEDULER_FUNCTIONS_PREFIXES)
                and "schedule" in qualified_name
            ):
                return Kind.SCHEDULER
            if _optimizer_class(qualified_name):
                return Kind.OPTIMIZER
            if _is_nn_model(qualified_name) or qualified_name.startswith(names.MODEL_PREFIXES):
                return Kind.MODEL
        if local in self.model.module_classes:
            return Kind.MODEL
        if _optimizer_factory_call(call, self._function_around() or self.model.module):
            return Kind.OPTIMIZER
        if _scheduler_factory_call(call):
            return Kind.SCHEDULER
        if self._imported_model_optimizer(call) or self._looked_up_optimizer(call):
            return Kind.OPTIMIZER
        if self._optimizer_class_parameter(call):
            return Kind.OPTIMIZER
        return None

    def _optimizer_class_parameter(self, call: cst.Call) -> bool:
        """``optimizer_fn(self.model.parameters(), **optimizer_params)`` in a trainer's
        ``def __init__(self, model, optimizer_fn=torch.optim.Adam, ...)`` (torch-rechub's
        trainers): a call through a parameter of the enclosing function whose default is an
        optimizer class, handed a model's parameters first: whatever a caller passes in its
        place makes the optimizer over them."""
        func = call.func
        if not isinstance(func, cst.Name) or not call.args or call.args[0].keyword is not None:
            return False
        first = call.args[0].value
        if not (
            isinstance(first, cst.Call)
            and isinstance(first.func, cst.Attribute)
            and first.func.attr.value == "parameters"
        ):
            return False
        function = self._function_around()
        if function is None:
            return False
        for parameter in (*function.params.params, *function.params.kwonly_params):
            if parameter.name.value == func.value and parameter.default is not None:
                return any(
                    _optimizer_class(qualified)
                    for qualified in self.model.qualified(parameter.default)
                )
        return False

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value in names.ACCELERATOR_MEMBERS:
            self.model.member_uses.append(node)

    def _imported_model_optimizer(self, call: cst.Call) -> bool:
        """``model.configure_optimizers(...)`` of a model class from another file (nanoGPT's
        ``GPT``, a LightningModule): the convention's name says it builds the optimizer. A
        class of this file with that method is read instead (`objects`)."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in OPTIMIZER_METHODS):
            return False
        return not any(
            isinstance(line, cst.FunctionDef) and line.name.value in OPTIMIZER_METHODS
            for definition in self.model.classes.values()
            if isinstance(definition.body, cst.IndentedBlock)
            for line in definition.body.body
        )

    def visit_Call(self, node: cst.Call) -> None:
        self.model.calls.append(node)
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
            self.model.backward_calls.append(node)  # accelerator.backward is dropped after

    def visit_For(self, node: cst.For) -> None:
        iterable = loop_source(node.iter)
        batch_names = target_names(node.target)
        if enumerates(node.iter):
            batch_names -= first_enumerate_name(node.target)
        under_no_grad = any(map(self.model.disables_grad, self.model.ancestors(node)))
        self.model.loops.append(
            Loop(
                node=node,
                scope=self.model.scope_of(node),
                iterable=iterable,
                batch_names=batch_names,
                trains=False,  # `_loops_trained`, once the walk is done
                evaluates=under_no_grad,
            )
        )


def _iterates_its_own(node: cst.ClassDef) -> list[str]:
    """The methods by which a DataLoader subclass defines how it iterates or counts its
    batches (``__iter__``, ``__len__``): a prepared loader iterates a plain DataLoader over
    the same data set, sampler and collate_fn, so those overrides would be lost (its other
    attributes and methods are read through the prepared loader)."""
    return [
        statement.name.value
        for statement in node.body.body
        if isinstance(statement, cst.FunctionDef)
        and statement.name.value in ("__iter__", "__len__", "__next__")
    ]


def _prepares_its_own(node: cst.ClassDef) -> bool:
    """``self.accelerator.prepare(self.model, ...)`` in the class: a trainer that holds the
    model and its optimizer, even where it subclasses ``nn.Module`` (a DPO trainer's): its
    ``self.optimizer`` is an optimizer, not a layer, and an instance is no model to prepare.
    Also ``accelerator.prepare(self.model)`` through a method's parameter (a DDPM trainer's
    ``def train(self, data, accelerator)``): the class hands its own attributes to prepare."""
    prepares = [
        call
        for call in walk(node.body)
        if type(call) is cst.Call  # by exact type: no ABC check for each node of the class
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "prepare"
    ]
    if any((dotted(call.func.value) or "").startswith("self.") for call in prepares):  # type: ignore[union-attr]
        return True
    for method in node.body.body if prepares else ():
        if not isinstance(method, cst.FunctionDef):
            continue
        parameters = {p.name.value for p in all_params(method.params)} - {"self"}
        for call in walk(method):
            if (
                type(call) is cst.Call
                and isinstance(call.func, cst.Attribute)
                and call.func.attr.value == "prepare"
                and dotted(call.func.value) in parameters
                and any((dotted(a.value) or "").startswith("self.") for a in call.args)
            ):
                return True
    return False


#: Accelerate's decorators that run a function on some ranks only, and the attribute each tests
#: (``on_process``/``on_local_process`` compare an index with their argument).
_RANK_DECORATORS = {
    "on_main_process": "is_main_process",
    "on_local_main_process": "is_local_main_process",
    "on_last_process": "is_last_process",
    "on_process": "process_index",
    "on_local_process": "local_process_index",
}


def _decorator_rank_test(decorator: cst.BaseExpression) -> cst.BaseExpression | None:
    """``accelerator.on_main_process`` -> ``accelerator.is_main_process``; ``state.on_process(
    process_index=1)`` -> ``state.process_index == 1``. Only an attribute of an object counts:
    a bare ``on_main_process`` (``accelerate.tracking``'s, for trackers) tests a setting of the
    tracker it decorates, not the rank."""
    call = decorator if isinstance(decorator, cst.Call) else None
    target = call.func if call is not None else decorator
    if not isinstance(target, cst.Attribute) or target.attr.value not in _RANK_DECORATORS:
        return None
    tested = _RANK_DECORATORS[target.attr.value]
    attribute = cst.Attribute(value=target.value, attr=cst.Name(tested))
    if target.attr.value not in ("on_process", "on_local_process"):
        return attribute if call is None else None
    if call is None or len(call.args) != 1:
        return None
    index = call.args[0].value
    return cst.Comparison(attribute, [cst.ComparisonTarget(cst.Equal(), index)])


def _ends_in_exit(block: cst.BaseSuite) -> bool:
    """The block's last statement returns or raises, or is an ``if``/``else`` whose every arm
    does: control never falls off its end."""
    statements = block.body if isinstance(block, cst.IndentedBlock) else [block]
    last = statements[-1] if statements else None
    if isinstance(last, cst.If):
        orelse = last.orelse
        if orelse is None or not _ends_in_exit(last.body):
            return False
        return (
            _ends_in_exit(orelse.body)
            if isinstance(orelse, cst.Else)
            else _ends_in_exit(cst.IndentedBlock(body=[orelse]))
        )
    return _leaves(block)


def _leaves(block: cst.BaseSuite) -> bool:
    """The block is a bare exit: its last statement returns or raises (``if not main: return``)."""
    return isinstance(_last_small_statement(block), (cst.Return, cst.Raise))


def _returns(block: cst.BaseSuite) -> bool:
    """The block's last statement is a ``return``: the function goes on on the other ranks."""
    return isinstance(_last_small_statement(block), cst.Return)


def _last_small_statement(block: cst.BaseSuite) -> cst.BaseSmallStatement | None:
    statements = block.body if isinstance(block, cst.IndentedBlock) else [block]
    last = statements[-1] if statements else None
    if isinstance(last, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) and last.body:
        return last.body[-1]
    return None


def _optimizer_class(qualified_name: str) -> bool:
    """``torch.optim.SGD`` and the like: a class (capitalised) under an optimizer package, not a
    scheduler."""
    return names.is_optimizer_class(qualified_name)


def _optimizer_factory_call(call: cst.Call, scope: cst.CSTNode) -> bool:
    """``build_optimizer(model, cfg)`` or ``create_optimizer(model=net, ...)``: a project's
    helper handed the model it builds the optimizer for (not a dict of parameter groups)."""
    if (dotted(call.func) or "").rsplit(".", 1)[-1] not in names.OPTIMIZER_FACTORIES:
        return False
    return factory_handed_model(call, scope) is not None


#: What code calls on a model it trains and on no config: ``cfg`` of ``build_optimizer(cfg,
#: model)`` is read for its fields only
_MODULE_METHODS = frozenset(
    {
        "parameters",
        "named_parameters",
        "train",
        "eval",
        "state_dict",
        "load_state_dict",
        "to",
        "cuda",
        "modules",
        "zero_grad",
    }
)


def factory_handed_model(call: cst.Call, scope: cst.CSTNode) -> cst.BaseExpression | None:
    """The model a project's optimizer factory of another module is handed (its body is not
    read): ``model=``; else, of its plain positional names, the one ``scope`` (the call's
    function or module) uses as a module (``model.train()``, ``model.load_state_dict(...)``,
    ``model = build_model(cfg).to(device)``), not the config beside it (``build_optimizer(cfg,
    model)``: a project's own helper may take the config first); else the first (mmcv's
    ``build_optimizer(model, cfg)``). Read from the tree alone: the call is classified while
    the analysis is still being built."""
    given = keyword_value(call, "model")
    if given is not None:
        return given if isinstance(given, (cst.Name, cst.Attribute)) else None
    handed: list[cst.BaseExpression] = []
    for argument in call.args:
        if argument.star:
            break
        if argument.keyword is None:
            handed.append(argument.value)
    if not handed or not isinstance(handed[0], (cst.Name, cst.Attribute)):
        return None
    modules = _used_as_modules(scope)
    used = [value for value in handed if dotted(value) in modules]
    return used[0] if len(used) == 1 else handed[0]


def _used_as_modules(scope: cst.CSTNode) -> set[str]:
    """The names ``scope`` calls a module's method on (``model.train()``) or binds to a device
    move (``model = build_model(cfg).to(device)``)."""
    found: set[str] = set()
    for node in walk(scope):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if node.func.attr.value in _MODULE_METHODS:
                found.add(dotted(node.func.value) or "")
        elif isinstance(node, cst.Assign) and isinstance(node.value, cst.Call):
            func = node.value.func
            if isinstance(func, cst.Attribute) and func.attr.value in ("to", "cuda"):
                found |= {dotted(t.target) or "" for t in node.targets}
    found.discard("")
    return found


def _scheduler_factory_call(call: cst.Call) -> bool:
    """``get_scheduler(optimizer=self.optimizer, scheduler_config=cfg)``: a project's helper
    handed the optimizer it schedules (a trainer that steps it once per epoch, prepared); also
    a project's own scheduler class handed it (``WarmupCosineScheduler(optimizer, warmup,
    total)``, a talking-head trainer's), named as schedulers are."""
    last_name = (dotted(call.func) or "").rsplit(".", 1)[-1]
    if last_name not in names.SCHEDULER_FACTORIES and not last_name.endswith("Scheduler"):
        return False
    handed = argument_value(call, "optimizer")
    last = (dotted(handed) or "").rsplit(".", 1)[-1] if handed is not None else ""
    return "optim" in last.lower()


def _looked_up_in(call: cst.Call, model: ScriptModel) -> str | None:
    """``torch.optim`` for ``getattr(torch.optim, cfg.optimizer)(...)``: a class chosen by name
    from a module, as configs do."""
    func = call.func
    if not (isinstance(func, cst.Call) and dotted(func.func) == "getattr" and func.args):
        return None
    found = model.qualified(func.args[0].value)
    return found.pop() if len(found) == 1 else None


def owning_model(name: str) -> str:
    """The model an attribute chain belongs to: ``model`` for ``model.fc``, ``self.model`` for
    ``self.model.head.proj``. An optimizer over a submodule's parameters trains that model."""
    parts = name.split(".")
    keep = 2 if parts[0] == "self" and len(parts) > 1 else 1
    return ".".join(parts[:keep])


def _loaders_by_key(value: cst.Dict, collector: _Collector) -> bool:
    """``{"train": DataLoader(...), "val": DataLoader(...)}``: a dict of loaders, read as
    ``loaders[phase]``."""
    return bool(value.elements) and all(
        isinstance(element, cst.DictElement)
        and collector.classify(element.value, "") is Kind.DATALOADER
        for element in value.elements
    )


def _is_nn_model(qualified_name: str) -> bool:
    if not qualified_name.startswith(names.NN_PREFIX):
        return False
    if qualified_name.startswith(names.NN_NOT_MODELS):
        return False
    last = qualified_name.rsplit(".", 1)[-1]
    return last[:1].isupper() and not last.endswith("Loss") and last != "Parameter"


def _is_gpu_index(name: str, value: cst.BaseExpression) -> bool:
    """``gpu_id = args.gpu``, ``device = 0``: a GPU's index, which ``.cuda(gpu_id)`` and
    ``x.to(device)`` move to as to a device. A number, or a flag named as one GPU's index."""
    last = name.split(".")[-1].lower()
    if not (names.is_gpu_index_name(last) or last == "device"):
        return False
    if isinstance(value, cst.Integer):
        return True
    read = dotted(value)
    return read is not None and "." in read and names.is_gpu_index_name(read)


def _is_device_literal(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.SimpleString):
        text = value.evaluated_value
        return isinstance(text, str) and text.split(":")[0] in ("cuda", "cpu", "mps")
    if isinstance(value, cst.IfExp):
        return _is_device_literal(value.body) and _is_device_literal(value.orelse)
    return False
