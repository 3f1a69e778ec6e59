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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from accelify.analysis import names
from accelify.analysis.imports import ImportTable
from accelify.analysis.loops import find_backward, first_enumerate_name, loop_source
from accelify.analysis.syntax import Visitor, dotted, strip_self_methods, target_names, visit_code

Scope = cst.Module | cst.FunctionDef
RANK_WORDS = ("rank", "main_process", "is_master", "master_process")


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
    parents: dict[cst.CSTNode, cst.CSTNode] = field(default_factory=dict, repr=False)
    assignments: list[cst.Assign] = field(default_factory=list, repr=False)
    bindings: list[Binding] = field(default_factory=list)
    backward_calls: list[cst.Call] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    functions: dict[str, cst.FunctionDef] = field(default_factory=dict)
    module_classes: set[str] = field(default_factory=set)
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
    _positions: Mapping[cst.CSTNode, CodeRange] | None = field(default=None, repr=False)

    # --- names, positions, parents ----------------------------------------------------------
    def qualified(self, node: cst.CSTNode) -> set[str]:
        """What a name or attribute chain refers to through the file's imports:
        ``optim.SGD`` -> ``torch.optim.SGD`` after ``import torch.optim as optim``."""
        name = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
        if name is None:
            return set()
        resolved = self.imports.resolve(name)
        if resolved is not None:
            return {resolved}
        if "." not in name and hasattr(builtins, name):
            return {f"builtins.{name}"}
        return {name}

    def position(self, node: cst.CSTNode) -> CodeRange:
        # Positions cost a code-generation pass over the file: resolved on first use only.
        if self._positions is None:
            wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
            self._positions = wrapper.resolve(PositionProvider)
        return self._positions[node]

    def line(self, node: cst.CSTNode) -> int:
        return self.position(node).start.line

    def order(self, node: cst.CSTNode) -> int:
        """Source order: a statement comes before the statements below it and before what it
        contains. Compare with this, not `line`, when only "above or below" matters."""
        return self.orders[node]

    @cached_property
    def source(self) -> str:
        """The file's text (libcst round-trips it exactly), generated once."""
        return self.module.code

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def scope_of(self, node: cst.CSTNode) -> Scope:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Module)):
                return ancestor
        return self.module

    def under_rank_guard(self, node: cst.CSTNode) -> bool:
        """Inside ``if accelerator.is_main_process:``, ``if rank == 0:`` and the like: code only
        some ranks run."""
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.If):
                test = self.module.code_for_node(ancestor.test)
                if any(word in test for word in RANK_WORDS):
                    return True
        return False

    def call_names(self, call: cst.Call) -> set[str]:
        return self.qualified(call.func)

    # --- queries ------------------------------------------------------------------------------
    def of_kind(self, *kinds: Kind) -> list[Binding]:
        return [binding for binding in self.bindings if binding.kind in kinds]

    def names_of(self, *kinds: Kind) -> set[str]:
        """Names bound to ``kinds``; for accelerators also the parameters that receive one."""
        found = {binding.name for binding in self.of_kind(*kinds)}
        if Kind.ACCELERATOR in kinds:
            found.update(*self.accelerator_params.values(), self.inherited_accelerators)
        return found

    @property
    def prepared_names(self) -> set[str]:
        return {name for call in self.prepare_calls for name in call.outputs if name}

    @property
    def uses_accelerator(self) -> bool:
        """Created here, returned by a factory, held by a class or received as a parameter."""
        return bool(
            self.of_kind(Kind.ACCELERATOR) or self.accelerator_params or self.inherited_accelerators
        )

    @property
    def trains(self) -> bool:
        return bool(self.backward_calls)


def analyze(module: cst.Module, source: str | None = None) -> ScriptModel:
    """One traversal collects everything; positions are left for the first finding that needs
    one (libcst's scope analysis is not used: an import table answers what a name is)."""
    model = ScriptModel(module=module, imports=ImportTable.of_module(module))
    if source is not None:  # the text the module was parsed from: no code generation for it
        model.__dict__["source"] = source
    visit_code(module, _Collector(model))
    from accelify.analysis.accelerator_objects import add_accelerator_objects

    add_accelerator_objects(model)
    model.prepare_calls = [
        prepare
        for assign in model.assignments
        if (prepare := _prepare_call(model, assign, model.names_of(Kind.ACCELERATOR))) is not None
    ]
    accelerators = model.names_of(Kind.ACCELERATOR) | {"accelerator", "self.accelerator"}
    model.backward_calls = [
        call
        for call in model.backward_calls
        if dotted(call.func.value) not in accelerators  # type: ignore[union-attr]
    ]
    from accelify.analysis.optimizer_models import add_models_fed_to_optimizers

    add_models_fed_to_optimizers(model)
    return model


def _prepare_call(
    model: ScriptModel, node: cst.Assign, accelerators: set[str]
) -> PrepareCall | None:
    """``model, optimizer = accelerator.prepare(model, optimizer)``, for any accelerator."""
    value = node.value
    if not (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "prepare"
        and dotted(value.func.value) in accelerators
    ):
        return None
    outputs: list[str] = []
    for target in node.targets:
        elements = (
            target.target.elements if isinstance(target.target, (cst.Tuple, cst.List)) else [target]
        )
        outputs += [
            dotted(e.value if isinstance(e, cst.Element) else e.target) or "" for e in elements
        ]
    inputs = [dotted(argument.value) or "" for argument in value.args]
    return PrepareCall(value, inputs, outputs, model)


class _Collector(Visitor):
    def __init__(self, model: ScriptModel) -> None:
        self.model = model
        self._open: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.model.orders[node] = len(self.model.orders)
        if self._open:
            self.model.parents[node] = self._open[-1]
        self._open.append(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        self._open.pop()

    def visit_Import(self, node: cst.Import) -> None:
        self.model.imports.add(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self.model.imports.add(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for base in node.bases:
            qualified = self.model.qualified(base.value)
            base_name = dotted(base.value)
            if qualified & names.MODULE_BASES or base_name in self.model.module_classes:
                self.model.module_classes.add(node.name.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if isinstance(self.model.parent(node), cst.Module):
            self.model.functions[node.name.value] = node

    def visit_Assign(self, node: cst.Assign) -> None:
        self.model.assignments.append(node)
        for target in node.targets:
            self._bind(target.target, node.value, node)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind(node.target, node.value, node)

    def _bind(
        self,
        target: cst.BaseExpression,
        value: cst.BaseExpression,
        assign: cst.Assign | cst.AnnAssign,
    ) -> None:
        name = dotted(target)
        if name is None:
            return
        kind = self._classify(value, name)
        if kind is None:
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
        if name.split(".")[-1] == "device" and _is_device_literal(value):
            return Kind.DEVICE
        return None

    def _classify_choice(self, choice: cst.IfExp, name: str) -> Kind | None:
        """``torch.device("cuda") if c else torch.device("cpu")``: a device either way;
        ``DDP(model) if distributed else model``: a hand-written wrapper."""
        kinds = {self._classify(branch, name) for branch in (choice.body, choice.orelse)} - {None}
        if kinds == {Kind.DEVICE}:
            return Kind.DEVICE
        if kinds == {Kind.WRAPPER} and name in {dotted(choice.body), dotted(choice.orelse)}:
            return Kind.WRAPPER
        return None

    def _classify_call(self, call: cst.Call) -> Kind | None:
        qualified = self.model.call_names(call)
        local = dotted(call.func)
        if qualified & names.ACCELERATORS:
            return Kind.ACCELERATOR
        if qualified & names.DATALOADERS:
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
            if qualified_name.startswith(
                names.OPTIMIZER_PREFIXES
            ) and not qualified_name.startswith(names.OPTIMIZER_EXCLUDED_PREFIXES):
                last = qualified_name.rsplit(".", 1)[-1]
                if last[:1].isupper():
                    return Kind.OPTIMIZER
            if _is_nn_model(qualified_name) or qualified_name.startswith(names.MODEL_PREFIXES):
                return Kind.MODEL
        if local in self.model.module_classes:
            return Kind.MODEL
        return None

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value in names.ACCELERATOR_MEMBERS:
            self.model.member_uses.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        self.model.calls.append(node)
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
            self.model.backward_calls.append(node)  # accelerator.backward is dropped after

    def visit_For(self, node: cst.For) -> None:
        iterable = loop_source(node.iter)
        batch_names = target_names(node.target)
        if isinstance(node.iter, cst.Call) and dotted(node.iter.func) == "enumerate":
            batch_names -= first_enumerate_name(node.target)
        has_backward = any(True for _ in find_backward(node.body, skip_loops=True))
        under_no_grad = any(self._is_no_grad(ancestor) for ancestor in self.model.ancestors(node))
        self.model.loops.append(
            Loop(
                node=node,
                scope=self.model.scope_of(node),
                iterable=iterable,
                batch_names=batch_names,
                trains=has_backward,
                evaluates=under_no_grad and not has_backward,
            )
        )

    def _is_no_grad(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.With):
            for item in node.items:
                call = item.item
                target = call.func if isinstance(call, cst.Call) else call
                if self.model.qualified(target) & names.NO_GRAD_CONTEXTS:
                    return True
        if isinstance(node, cst.FunctionDef):
            for decorator in node.decorators:
                target = decorator.decorator
                target = target.func if isinstance(target, cst.Call) else target
                if self.model.qualified(target) & names.NO_GRAD_CONTEXTS:
                    return True
        return False


def _is_nn_model(qualified_name: str) -> bool:
    if not qualified_name.startswith(names.NN_PREFIX):
        return False
    if qualified_name.startswith(names.NN_NOT_MODELS):
        return False
    last = qualified_name.rsplit(".", 1)[-1]
    return last[:1].isupper() and not last.endswith("Loss") and last != "Parameter"


def _is_device_literal(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.SimpleString):
        text = value.evaluated_value
        return isinstance(text, str) and text.split(":")[0] in ("cuda", "cpu", "mps")
    if isinstance(value, cst.IfExp):
        return _is_device_literal(value.body) and _is_device_literal(value.orelse)
    return False
