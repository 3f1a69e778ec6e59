"""What every conversion step reads and writes: the script's analysis, the plan being built,
the accelerator's name and constructor arguments, and the nodes that need the accelerator."""

from __future__ import annotations

import builtins
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from accelify.analysis import names
from accelify.analysis.agreed_values import AgreedValues
from accelify.analysis.base_inits import runs_init_of
from accelify.analysis.evaluation import Evaluation
from accelify.analysis.facts import Facts, facts_of
from accelify.analysis.flow import SchedulerStep, dict_entries
from accelify.analysis.idle_members import OutputMembers
from accelify.analysis.loss_sources import runs_before
from accelify.analysis.objects import bound_arguments, returned_local
from accelify.analysis.own_values import ShardView
from accelify.analysis.script_model import Binding, Kind, Loop, ScriptModel
from accelify.analysis.syntax import all_params, assigned_targets, dotted, self_parameter, walk
from accelify.edits import rewrites
from accelify.edits.plan import NoteKind, Plan

if TYPE_CHECKING:
    from accelify.convert.project import ObjectSaver, StateSaver

#: ``accelerator.`` as review advice writes it, not part of a longer name (``self.accelerator.``).
_PLAIN_ACCELERATOR = re.compile(r"(?<![\w.])accelerator\.(?=\w)")

#: Where each name the converted code uses comes from, per target runtime.
TARGET_MODULES = {
    "accelify": {
        "Accelerator": "accelify",
        "set_seed": "accelify",
        "synchronize_rng_states": "accelify",
        "DistributedDataParallelKwargs": "accelify",
        "broadcast": "accelify.utils",
        "send_to_device": "accelify.utils",
        "gather_object": "accelify.utils",
        "PartialState": "accelify",
    },
    "accelerate": {
        "Accelerator": "accelerate",
        "set_seed": "accelerate.utils",
        "synchronize_rng_states": "accelerate.utils",
        "DistributedDataParallelKwargs": "accelerate",
        "broadcast": "accelerate.utils",
        "send_to_device": "accelerate.utils",
        "gather_object": "accelerate.utils",
        "PartialState": "accelerate",
    },
}


#: The parameter a helper outside the accelerator's class takes it under (`handed_in`).
HANDED_ACCELERATOR = "accelerator"


def import_lines(target: str, used: list[str]) -> list[str]:
    """``from accelify import Accelerator, set_seed``: one line per module, the modules and
    names in isort's order (classes before functions), as ruff's ``I001`` checks them."""
    by_module: dict[str, list[str]] = {}
    for name in used:
        by_module.setdefault(TARGET_MODULES[target][name], []).append(name)
    return [
        f"from {module} import {', '.join(sorted(set(names), key=_isort_name))}"
        for module, names in sorted(by_module.items())
    ]


def _isort_name(name: str) -> tuple[int, str]:
    """isort's ``order-by-type``: CONSTANTS, then Classes, then functions, each without case."""
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return (kind, name.lower())


@dataclass
class Options:
    target: str = "accelify"
    mixed_precision: str | None = None
    #: the files this run converts (resolved): a file that drives another's training prints
    #: through the accelerator that file's conversion creates only when both are converted
    converted_with: frozenset[str] = frozenset()
    #: the first line of another module's definitions in a combined script (`across`: a
    #: driver that trains at its top level, its engine's functions appended): those functions
    #: do not see the driver's globals, so each that needs the accelerator takes it as a
    #: parameter even where the driver's module creates it; None for a script of its own
    foreign_from: int | None = None


#: Functions followed back through the parameters that hand an instance of the class on.
_MAX_HANDED_DEPTH = 4


@dataclass
class Context:
    model: ScriptModel
    options: Options
    #: the scope that owns training: where prepare goes.
    scope: cst.Module | cst.FunctionDef | None = None
    plan: Plan = field(default_factory=Plan)
    #: ``accelerator``, or ``self.accelerator`` when training lives in a method.
    acc: str = "accelerator"
    #: keyword arguments of the ``Accelerator(...)`` call, as source text.
    constructor: dict[str, str] = field(default_factory=dict)
    #: nodes whose edits use the accelerator, each with what tells whether its edit is in
    #: effect once the plan is complete (None: it is).
    _needs: list[tuple[cst.CSTNode, Callable[[], bool] | None]] = field(
        default_factory=list, init=False
    )
    #: the statement the ``prepare`` call follows.
    prepare_anchor: cst.CSTNode | None = None
    #: the statement each prepared name's ``prepare`` call follows (a script that trains one
    #: model after another prepares each before its first use).
    prepared_after: dict[str, cst.CSTNode] = field(default_factory=dict)
    #: Every statement a prepare call of each name follows (`prepared_after` keeps the last:
    #: two helpers may each prepare their own ``train_loader``).
    prepared_anchors: dict[str, list[cst.CSTNode]] = field(default_factory=dict)
    #: models no optimizer trains: not prepared, so their device moves stay.
    frozen: set[str] = field(default_factory=set)
    #: those of them moved to the accelerator's device where they are made
    #: (`devices._unmoved_untrained_models`): they no longer stay where the script places them.
    moved_untrained: set[str] = field(default_factory=set)
    #: DataLoaders left out of prepare because their own sampler shards them by rank
    self_sharded: set[str] = field(default_factory=set)
    #: loaders prepared where they are handed to a trainer's method, by the caller's name, and
    #: the attributes a method that prepares the loaders it receives keeps them under.
    prepared_arguments: set[str] = field(default_factory=set)
    #: each method that prepares the loaders it receives, with its class, those loaders and
    #: the attributes it keeps them under (`shard_lengths` sizes what reads their len()).
    received_preparations: list[tuple[cst.ClassDef, cst.FunctionDef, list[str], dict[str, str]]] = (
        field(default_factory=list)
    )
    #: of those, the loaders a caller rebinds prepared before a loop (``train_loader =
    #: trainer.accelerator.prepare(train_loader)``), with each statement the prepare precedes:
    #: a loop of that function that runs before it still reads the loader as made.
    prepared_before: dict[str, list[cst.CSTNode]] = field(default_factory=dict)
    #: the ``len(loader)`` calls already sized in all ranks' steps, by id (`shard_lengths`)
    sized_lengths: set[int] = field(default_factory=set)
    #: dicts of loaders prepared entry by entry, each with the statement it is prepared after
    #: (`prepare._prepare_each_value`): a scheduler made below reads its loaders' shards
    loader_dicts_prepared_after: dict[str, cst.CSTNode] = field(default_factory=dict)
    #: Functions of the project's other modules that only write files, by the name calls use
    imported_writers: dict[str, str] = field(default_factory=dict)
    #: Functions of the project's other modules that run no backward and step no optimizer (an
    #: evaluation, whatever it is handed), by the name calls use
    imported_evaluators: set[str] = field(default_factory=set)
    #: Those of them that call a method of the model they are handed besides its forward,
    #: with that call and where it is (`project.imported_model_methods`)
    imported_model_methods: dict[str, str] = field(default_factory=dict)
    #: Functions of the project's other modules that save the state dict of a model they are
    #: handed, by the name calls use (`project.imported_state_savers`)
    imported_state_savers: dict[str, StateSaver] = field(default_factory=dict)
    #: Functions of the project's other modules that return a ``logging`` logger, by the name
    #: calls use (`project.imported_loggers`)
    imported_loggers: set[str] = field(default_factory=set)
    #: Classes of the project's other modules whose methods save the state dict of a model
    #: they are handed, by the name calls use (`project.imported_object_savers`)
    imported_object_savers: dict[str, ObjectSaver] = field(default_factory=dict)
    #: Members that run a model's layers of the module classes the script builds from the
    #: project's other modules, with where each is defined (`project.imported_layer_members`)
    imported_layer_members: dict[str, str] = field(default_factory=dict)
    #: What each returned output of the forward of the model classes the script builds from the
    #: project's other modules is computed with, by the name calls use
    #: (`project.imported_output_members`)
    imported_output_members: dict[str, OutputMembers] = field(default_factory=dict)
    #: The ids of the ``if`` statements `collective_stops` makes collective, once asked
    #: (`collective_stops.decided_alike`)
    collective_stops: set[int] | None = None
    #: Functions of the project's other modules that only show text on the terminal, by the
    #: name calls use, with where each is defined (`project.imported_printers`)
    imported_printers: dict[str, str] = field(default_factory=dict)
    #: meter classes of the project's other modules the script makes instances of, by the name
    #: its calls use (``AverageMeter`` of ``utils.py``: `project.imported_meters`)
    imported_meters: dict[str, cst.ClassDef] = field(default_factory=dict)
    #: Functions of the project's other modules whose body writes a file, by the name calls
    #: use, with where the write is (`project.imported_file_writers`)
    imported_file_writers: dict[str, str] = field(default_factory=dict)
    #: models left out of prepare that the conversion moves to the device where they are made
    #: (`devices._unmoved_untrained_models`): a tensor made on the CPU and handed to one would
    #: meet its weights on another device
    moved_models: set[str] = field(default_factory=set)
    #: training-step calls of a prepared model's method that runs its forward
    #: (``model.training_step(batch)``), each run as the wrapper's forward (`through_forward`)
    through_forward: list[cst.Call] = field(default_factory=list)
    #: Imports of the standard library an edit needs (``from functools import cached_property``)
    extra_imports: list[str] = field(default_factory=list)
    #: runtime names the converted code uses besides ``Accelerator``.
    uses: list[str] = field(default_factory=list)
    #: why the file is left as it is, found once the steps have run (the accelerator cannot
    #: reach every function that needs it): the plan becomes this review line alone.
    left_as_is: tuple[int, str] | None = None
    #: loops (by id) that evaluate only loaders left whole, so every rank evaluates all of it:
    #: their evaluation needs no gather (a loop that also trains, where none fits).
    left_whole: set[int] = field(default_factory=set)
    #: loaders left unprepared because a loop that writes a file on the main process reads
    #: them (by name: that loop): prepared, that process would write its own shard's results.
    kept_for_writes: dict[str, cst.CSTNode] = field(default_factory=dict)
    #: file-writing blocks the conversion leaves on every rank (they compute what every rank
    #: needs): a file they write is not "saved on the main process".
    written_everywhere: list[cst.With] = field(default_factory=list)
    #: file-writing blocks every rank runs with the file opened on the main process only (the
    #: others write to os.devnull): other writes inside them still need their own guard.
    opened_on_main: list[cst.With] = field(default_factory=list)
    #: model calls (by id) whose inputs go to the device and output back to the CPU
    #: (`host_inputs`): what they return is already on the host.
    host_calls: set[int] = field(default_factory=set)
    #: schedulers left out of ``prepare`` because they are stepped both per batch and per
    #: epoch: the line that makes each and its step calls (`scheduler_pace`).
    mixed_pace: dict[str, tuple[int, list[SchedulerStep]]] = field(default_factory=dict)
    #: constructor arguments kept out of the ``Accelerator(...)`` (``mixed_precision``), each
    #: with why: the Accelerator cannot read them where it is made, so the step that would
    #: move a construct into that argument keeps the construct as written, with this line.
    withheld: dict[str, str] = field(default_factory=dict)
    #: arguments found this round that the Accelerator cannot read where it is made
    #: (`accelerator._late_arguments`): the conversion is planned again without them.
    to_withhold: dict[str, str] = field(default_factory=dict)
    #: schedulers a previous round prepared while every loop that steps them trains on a
    #: loader left unprepared, each with why (`prepare.stepped_over_unprepared_loaders`): this
    #: round leaves them out of ``prepare``, so they keep the pace of the whole loader.
    left_whole_schedulers: dict[str, str] = field(default_factory=dict)
    #: such schedulers found this round: the conversion is planned again without them.
    to_leave_whole: dict[str, str] = field(default_factory=dict)
    #: statements that go right after the ``Accelerator(...)`` is created.
    after_creation: list[str] = field(default_factory=list)
    #: module-level helpers outside the class that owns ``self.accelerator`` that take it as
    #: the parameter `HANDED_ACCELERATOR`, with each call and the accelerator it passes
    #: (`handed_accelerator`).
    handed_in: dict[cst.FunctionDef, list[tuple[cst.Call, str]]] = field(default_factory=dict)

    @property
    def facts(self) -> Facts:
        return facts_of(self.model)

    @property
    def precision_carried(self) -> bool:
        """The script's AMP moves to ``Accelerator(mixed_precision=...)``: the analysis can say
        it in one value, and the Accelerator can read that value where it is made."""
        return self.facts.precision.carried and "mixed_precision" not in self.withheld

    @property
    def needs(self) -> list[cst.CSTNode]:
        """Nodes whose edits use the accelerator: it is created before the first of them."""
        return [node for node, when in self._needs if when is None or when()]

    def need(self, node: cst.CSTNode, when: Callable[[], bool] | None = None) -> None:
        """``node``'s edit uses the accelerator (if ``when()`` holds once the plan is done)."""
        if not self.plan.reaches(node):
            shown = self.code(node).strip().splitlines()[0]
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            self.plan.review(
                self.line(node),
                f"`{shown}` left as is: {self.acc} is not reachable outside its class",
            )
            return
        self._needs.append((node, when))

    def confine_to_class(self, owner: cst.ClassDef) -> None:
        """``self.accelerator`` exists only inside ``owner`` (and its subclasses that run its
        constructor): nothing outside them that needs the accelerator is changed, and each
        such place is listed for review."""
        placement = self.facts.placement
        graph = self.facts.calls
        classes = [owner, *(c for c in graph.subclasses(owner) if runs_init_of(graph, c, owner))]

        def lines(node: cst.CSTNode) -> range:
            span = self.model.position(node)
            return range(span.start.line, span.end.line + 1)

        def reaches(node: cst.CSTNode) -> bool:
            # the class's own body, its methods' default values and the ``class`` statement
            # itself run when the class is defined, before any instance (or accelerator)
            # exists: only code its methods run (or a method itself) reaches the instance
            runs_in = (
                node if isinstance(node, cst.FunctionDef) else placement.running_function(node)
            )
            return (
                runs_in is not None
                and any(placement.inside(runs_in, c) for c in classes)
                and not self.in_static(node)
            )

        self.plan.confine(reaches, lines)

    def in_static(self, node: cst.CSTNode) -> bool:
        """``node`` is in a static or class method (``@staticmethod def _print(message)``,
        called as ``self._print(...)``), or in a function of the class the file calls only
        through the class (``Trainer.validate(model=model, ...)``): there is no instance there,
        so ``self.accelerator`` is a NameError even inside the class that owns it."""
        return any(
            isinstance(a, cst.FunctionDef)
            and self._method(a)
            and (self_parameter(a) is None or self.facts.calls.without_instance(a))
            for a in (node, *self.model.ancestors(node))
        )

    def _method(self, function: cst.FunctionDef) -> bool:
        return self.facts.placement.is_method(function)

    def code(self, node: cst.CSTNode) -> str:
        return self.model.module.code_for_node(node)

    def line(self, node: cst.CSTNode) -> int:
        return self.model.line(node)

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement of a block that holds ``node`` (a line, or the ``with``/``if`` it
        heads)."""
        for ancestor in (node, *self.model.ancestors(node)):
            if isinstance(self.model.parent(ancestor), (cst.IndentedBlock, cst.Module)):
                return ancestor
        return node

    def a(self, member: str) -> str:
        return f"{self.acc}.{member}"

    def constructor_code(self) -> str:
        arguments = ", ".join(f"{key}={value}" for key, value in self.constructor.items())
        return f"Accelerator({arguments})"

    @property
    def agreed(self) -> AgreedValues:
        """Values every rank holds alike once converted (`covers_the_whole_set`)."""
        found = self.__dict__.get("_agreed")
        if found is None:
            found = self.__dict__["_agreed"] = AgreedValues(self.facts, self.covers_the_whole_set)
        return found

    def covers_the_whole_set(self, evaluation: Evaluation) -> bool:
        """Once converted, what ``evaluation`` folds covers the whole set on every rank: the
        evaluation step gathers it, the script already does, or its loader is left whole
        (every rank evaluates all of it)."""
        if not evaluation.sinks:
            return False
        if id(evaluation.loop.node) in self.left_whole:
            return True
        if evaluation.already_gathered:
            return not evaluation.syncs_itself
        return (
            evaluation.unsure is None
            and not evaluation.combined_by
            and not self.unprepared_loaders(evaluation.loop)
        )

    def shard_view(self) -> ShardView:
        """The loaders this conversion prepares, for `own_values` (ACC420's and ACC409's
        analysis): nothing is prepared yet in the script the conversion reads."""
        prepared = frozenset(self.plan.prepared) | frozenset(self.prepared_arguments)

        def sharded(loop: Loop) -> bool:
            return (
                self.facts.flow.kind_of(loop.iterable, loop.node) is Kind.DATALOADER
                and id(loop.node) not in self.left_whole
                and not self.unprepared_loaders(loop)
            )

        return ShardView(prepared, sharded)

    def unprepared_loaders(self, loop: Loop) -> list[str | None]:
        """The DataLoaders ``loop`` reads that no ``prepare`` call takes, followed back through
        the helpers' parameters to where they are made (None: made inline, in a call's
        arguments). Empty when the loop reads no known DataLoader."""
        flow = self.facts.flow
        prepared = set(self.plan.prepared) | self.model.prepared_names | self.prepared_arguments
        keyed = flow.keyed_loaders(loop)
        if keyed:  # ``loaders[split]``: a dict made before the prepare holds the loaders as made
            return sorted(
                {
                    name
                    for name, made in keyed
                    if name not in prepared or not self.after_prepare(made, name)
                }
            )
        rows = flow.row_loaders_unknown(loop)
        if rows:  # ``loader, opt = rest.pop(0), rest.pop(0)``: any loader a row holds
            return sorted(name for name in rows if name not in prepared)
        name, place = flow.loader_read(loop)
        if flow.kind_of(name, place) is not Kind.DATALOADER:
            return []
        origins = self.origins_past_namesakes(name, place, prepared)
        return sorted(
            {
                o
                for o, place in origins
                if (
                    o not in prepared
                    or self._another_local(o, place)
                    or self._read_before_its_prepare(o, loop)
                )
                and not self._received_prepared(o, prepared)
                and not self._prepared_attribute_of_an_instance(o, place)
                and not self._kept_dict_of_prepared_loaders(o, place, prepared)
            },
            key=lambda o: o or "",
        )

    def _kept_dict_of_prepared_loaders(
        self, name: str | None, place: cst.CSTNode, prepared: set[str]
    ) -> bool:
        """``self.loaders`` kept from ``T({"val": vl, "test": sl})``, every construction of
        which runs after the prepare and writes a dict of prepared loaders: what the loop reads
        (``self.loaders[name]``) is one of them, on the device and sharded, not a loader read
        whole (named so, its batches' labels stay on the device while the model's output
        would be sent back to the host: a mixed-device crash on a GPU)."""
        passed = self.facts.flow.kept_passed(name, place)
        for value, call in passed:
            held = dict_entries(self.model, value)
            if not held or not self.after_prepare(call):
                return False
            if not all(dotted(entry) in prepared for entry in held.values()):
                return False
        return bool(passed)

    def _read_before_its_prepare(self, name: str | None, loop: Loop) -> bool:
        """``for x, y in train_loader:`` that trains a teacher in ``main()`` before the
        statement a ``train_loader = d.accelerator.prepare(train_loader)`` precedes: that loop
        reads the loader as made. Only a loader nothing but such a rebinding prepares."""
        tops = self.prepared_before.get(name or "")
        if not tops or name in self.plan.prepared or name in self.model.prepared_names:
            return False
        placement = self.facts.placement
        function = placement.enclosing_function(loop.node)
        return all(
            placement.enclosing_function(top) is function
            and self.model.order(loop.node) < self.model.order(top)
            and not placement.inside(loop.node, top)
            for top in tops
        )

    def origins_past_namesakes(
        self, name: str | None, place: cst.CSTNode, prepared: set[str]
    ) -> set[tuple[str | None, cst.CSTNode]]:
        """`origin_sites` stopping at a ``prepared`` name only where it is the object prepared:
        ``loader`` of ``def accuracy(model, loader)`` called with ``val_loader`` is followed to
        ``val_loader``, though ``main()`` prepares a ``loader`` of its own."""
        return self.facts.flow.origin_sites(
            name, place, stop=prepared, another_object=self._another_local
        )

    def _another_local(self, name: str | None, place: cst.CSTNode, depth: int = 0) -> bool:
        """``loader`` read in ``evaluate(args)`` while the prepare call took the ``loader`` of
        ``train(args)``: a plain name local to another function than the one it was prepared
        in is another object under the same name (two sub-commands that each make their own).
        So is a parameter of that name when a call in the file hands it anything else
        (``finetune(model, finetune_loader)`` beside ``train(model, loader)`` that prepares its
        own ``loader``)."""
        anchor = self.prepared_after.get(name or "")
        if name is None or "." in name or anchor is None:
            return False
        function = self.facts.placement.enclosing_function(place)
        prepared_in = self.facts.placement.enclosing_function(anchor)
        if function is None or function is prepared_in:
            return False
        if any(
            self.facts.placement.enclosing_function(other) is function
            for other in self.prepared_anchors.get(name, [])
        ):
            return False  # ``train_teacher()`` prepares its own ``train_loader`` too
        returned = returned_local(self.model, name, place)
        if (
            returned is not None
            and returned[0] == name
            and self.facts.placement.enclosing_function(returned[1]) is prepared_in
        ):
            return False  # ``model, loader = setup()``: setup()'s own, prepared there
        if any(p.name.value == name for p in all_params(function.params)):
            return self._handed_another(function, name, depth)
        return any(
            binding.name == name and binding.scope is function for binding in self.model.bindings
        )

    def _prepared_attribute_of_an_instance(self, name: str | None, place: cst.CSTNode) -> bool:
        """``trainer.test_loader`` handed to ``trainer.accuracy(...)`` from outside the class,
        where ``trainer`` is an instance of the class (or a subclass of the class) whose
        constructor this conversion prepares ``self.test_loader`` in: the same object."""
        if name is None or name.count(".") != 1 or name.startswith("self."):
            return False
        if self.prepare_anchor is None or not self.acc.startswith("self."):
            return False
        instance, attribute = name.split(".")
        if f"self.{attribute}" not in self.plan.prepared:
            return False
        owner = self.facts.placement.class_of(self.prepare_anchor)
        graph = self.facts.calls
        made = graph.instance_class(instance, place)
        cls = self.model.classes.get(made) if made is not None else None
        return owner is not None and cls is not None and graph.is_or_derives(cls, owner)

    def _handed_another(self, function: cst.FunctionDef, parameter: str, depth: int) -> bool:
        """A call of ``function`` in the file hands its ``parameter`` an object that is not the
        one prepared under that name: a name nobody prepared, or another local of that name."""
        prepared = set(self.plan.prepared) | self.model.prepared_names | self.prepared_arguments
        for call, implicit in self.facts.flow.calls_of(function):
            argument = dict(bound_arguments(function, call, implicit)).get(parameter)
            handed = dotted(argument.value) if argument is not None else None
            if handed is not None and self._received_prepared(handed, prepared):
                continue  # ``self.train_loader`` a constructor kept from a prepared loader
            if handed is None or handed not in prepared:
                return True
            if depth < 4 and self._another_local(handed, call, depth + 1):
                return True
        return False

    def _received_prepared(self, name: str | None, prepared: set[str]) -> bool:
        """``self.loader`` a constructor received (``Trainer(model, optimizer, loader)``, also a
        base class's) where every caller handed it a prepared loader."""
        received = [b for b in self.model.bindings if b.name == name and b.received]
        sources = [source for binding in received for source in binding.sources]
        if any(self._handed_before_its_prepare(binding) for binding in received):
            return False
        return bool(sources) and all(source in prepared for source in sources)

    def _handed_before_its_prepare(self, binding: Binding) -> bool:
        """``evaluator = Evaluator(val_loader)`` above the statement the prepare of
        ``val_loader`` follows, in the prepare's own function: the instance keeps the loader
        as made (the prepare rebinds the name, not what the instance holds), so a loop over
        ``self.loader`` in its method reads all of it on every rank; gathered, each sample
        would count once per rank (2 ranks printed (28, 64) for (14, 32))."""
        function = binding.scope
        value = binding.value
        if not isinstance(function, cst.FunctionDef) or not isinstance(value, cst.Name):
            return False
        for call, implicit in self.model.call_graph.calls_of(function):
            for parameter, argument in bound_arguments(function, call, implicit):
                handed = dotted(argument.value)
                anchor = self.prepared_after.get(handed or "")
                if (
                    parameter == value.value
                    and anchor is not None
                    and self.model.scope_of(call) is self.model.scope_of(anchor)
                    and not self.after_prepare(call, handed)
                ):
                    return True
        return False

    def instance_outside_class(
        self, node: cst.CSTNode, owner: cst.ClassDef | None = None, depth: int = 0
    ) -> str | None:
        """``trainer`` for ``node`` outside the class that owns ``self.accelerator``, in a scope
        where ``trainer = Trainer(...)`` (or a factory that returns one: ``fitter =
        make_fitter(cfg)``) was created before it: the accelerator is reached there as
        ``trainer.accelerator``. ``owner``: that class, asked before the prepare call is
        planned (which names it otherwise)."""
        if not self.acc.startswith("self."):
            return None
        if owner is None and self.prepare_anchor is not None:
            owner = self.facts.placement.class_of(self.prepare_anchor)
        if owner is None or self.facts.placement.inside(node, owner):
            return None
        scope = self.model.scope_of(node)
        for assign in self.model.assignments:
            value = assign.value
            if (
                self.model.scope_of(assign) is scope
                and self.line(assign) < self.line(node)
                and runs_before(self.model, assign, node)
                and isinstance(value, cst.Call)
                and self.model.call_graph.made_by(value) == owner.name.value
                and len(assigned_targets(assign)) == 1
                and isinstance(assigned_targets(assign)[0], cst.Name)
            ):
                return assigned_targets(assign)[0].value
        return self._instance_parameter(node, owner, depth)

    def _instance_parameter(
        self, node: cst.CSTNode, owner: cst.ClassDef, depth: int = 0
    ) -> str | None:
        """``trainer`` of ``def on_epoch_end(self, trainer, logs)`` in a callback class, when
        every call in the file that may run that method passes the owner's ``self`` there
        (``callback.on_epoch_end(self, logs)`` in a method of the trainer); ``t`` of ``def
        run_epochs(t, epochs)`` when every call passes an instance of the owner its caller
        made or was handed in turn (``run_epochs(trainer, 3)`` after ``trainer = Trainer()``)."""
        placement, graph = self.facts.placement, self.facts.calls
        function = placement.enclosing_function(node)
        if function is None:
            return None
        calls = [*graph.callers(function), *graph.uncertain_callers(function)]
        implicit = 1 if graph.owner(function) is not None else 0
        found: set[str] = set()
        for call in calls:
            method = placement.enclosing_function(call)
            if method is None:
                return None
            if graph.owner(method) is owner and method.params.params:
                itself: str | None = method.params.params[0].name.value
            elif depth < _MAX_HANDED_DEPTH:
                itself = self.instance_outside_class(call, owner, depth + 1)
            else:
                itself = None
            if itself is None:
                return None
            passed = [
                parameter
                for parameter, argument in bound_arguments(function, call, implicit)
                if dotted(argument.value) == itself
            ]
            if len(passed) != 1:
                return None
            found.add(passed[0])
        if len(found) != 1:
            return None
        (name,) = found
        rebound = any(
            isinstance(n, cst.AssignTarget) and dotted(n.target) == name for n in walk(function)
        )
        return None if rebound else name

    def guard_main_process(self, node: cst.CSTNode, text: str) -> None:
        """``node`` under ``if accelerator.is_main_process:`` (``trainer.accelerator`` outside
        the class that owns it, through an instance the scope made)."""
        acc = self.accelerator_at(node)
        self.plan.add(
            rewrites.main_process_only(node, acc),
            line=self.line(node),
            text=text.replace(self.acc, acc),
            anywhere=acc != self.acc,
        )
        if acc == self.acc:
            self.need(node)

    def accelerator_at(self, node: cst.CSTNode) -> str:
        """What stands for the accelerator at ``node``: ``self.acc``; outside the class that
        owns ``self.accelerator``, the instance the scope made (``trainer.accelerator``), else
        the process state (`process_state`). Code that reads another than ``self.acc`` is
        planned ``anywhere`` and needs no accelerator created for it."""
        return self.reachable_accelerator(node) or self.process_state()

    def reachable_accelerator(self, node: cst.CSTNode) -> str | None:
        """The accelerator as code at ``node`` can reach it (``self.acc``, or
        ``trainer.accelerator`` outside the class that owns it); None where no Accelerator
        can be reached there (`accelerator_at` then falls back to the process state, which
        has no ``reduce`` nor ``gather``: review advice that needs them says how to hand the
        accelerator in instead)."""
        outside = self.instance_outside_class(node)
        if outside is not None:
            return f"{outside}.accelerator"
        if not self.plan.reaches(node):
            handed = self.facts.placement.top_function(node) in self.handed_in
            return HANDED_ACCELERATOR if handed else None
        return self.acc

    def advised_accelerator(self, node: cst.CSTNode) -> str | None:
        """The accelerator review advice at ``node`` may name: `reachable_accelerator`, and,
        for a plain name (``accelerator``), only in a function the conversion hands it to (it
        creates it there, or an edit there uses it) or at module level. None elsewhere: a
        module-level helper that gets no edit does not get the parameter either."""
        reached = self.reachable_accelerator(node)
        if reached is None or "." in reached:
            return reached
        placement = self.facts.placement
        if placement.top_function(node) in self.handed_in:
            return reached
        function = placement.enclosing_function(node)
        if function is None or (
            self.scope is not None
            and (self.scope is function or placement.inside(self.scope, function))
        ):
            return reached
        if any(need is function or placement.inside(need, function) for need in self.needs):
            return reached
        return None

    def named_in_scope(self, node: cst.CSTNode, text: str) -> str:
        """Review advice ``text`` written with the plain ``accelerator.`` (``with
        accelerator.no_sync(model):``), naming the accelerator code at ``node`` reaches
        instead (``self.accelerator`` in a trainer's method, ``trainer.accelerator`` beside
        the instance): advice is copied as written. Unchanged where none is reachable (the
        advice then stands for an accelerator to hand in)."""
        reached = self.advised_accelerator(node)
        if reached is None or reached == "accelerator":
            return text
        return _PLAIN_ACCELERATOR.sub(f"{reached}.", text)

    def review_at(self, node: cst.CSTNode, text: str, kind: NoteKind = NoteKind.PLAIN) -> None:
        """A review line at ``node``'s line, its advice in the names in scope there."""
        self.plan.review(self.line(node), self.named_in_scope(node, text), kind)

    def a_at(self, node: cst.CSTNode, member: str) -> str:
        """``accelerator.<member>`` as code at ``node`` reaches it, for review advice; where
        none is reachable, the member of an accelerator said to be handed in."""
        reached = self.advised_accelerator(node)
        if reached is not None:
            return f"{reached}.{member}"
        return f"accelerator.{member} (no accelerator is reachable here: hand it in as a parameter)"

    def main_process_test_at(self, node: cst.CSTNode) -> tuple[str, str]:
        """The test of the main process review advice at ``node`` may name, and what to add
        for it: the accelerator reached there (`advised_accelerator`); outside the class that
        holds ``self.accelerator`` with no instance named (``Trainer(OUT).fit()`` under ``if
        __name__ == "__main__":``), the process state and its import (review10a b1: the advice
        named ``self.accelerator`` where no ``self`` exists)."""
        reached = self.advised_accelerator(node)
        if reached is not None:
            return f"{reached}.is_main_process", ""
        if self.acc.startswith("self."):
            module = TARGET_MODULES[self.options.target]["PartialState"]
            return (
                "PartialState().is_main_process",
                f" (no accelerator is reachable here: from {module} import PartialState)",
            )
        return self.a_at(node, "is_main_process"), ""

    def process_state(self) -> str:
        """``PartialState()``: where ``self.accelerator`` cannot be reached and no instance is
        named (``best = Trainer(...).fit()`` in ``main``), the same process state, for what
        needs no Accelerator (prints, ``is_main_process``, ``wait_for_everyone``)."""
        if "PartialState" not in self.uses:
            self.uses.append("PartialState")
        return "PartialState()"

    def after_prepare(self, node: cst.CSTNode, name: str | None = None) -> bool:
        """``node`` runs after the prepare call (of ``name``, when given)."""
        anchor = self.prepared_after.get(name or "", self.prepare_anchor)
        if anchor is None:
            return False
        scope = self.model.scope_of(anchor)
        placement = self.facts.placement
        if node is anchor or placement.inside(node, anchor):
            return False  # the statement the prepare call follows (a multi-line optimizer)
        if placement.inside(node, scope) and self.model.scope_of(node) is scope:
            return self.model.line(node) > self.model.line(anchor)
        return True


def star_imported_from_the_project(ctx: Context, name: str) -> bool:
    """``save_model``, ``progress(loader)``: a name that no import binds and the file does not
    define, in a file that star imports a module of the project (KGAT's ``from
    utils.model_helper import *``): it comes from there, as no other name it reads can."""
    if (
        name in ctx.model.functions
        or name in ctx.facts.calls.classes
        or name in _BUILTINS
        or ctx.model.index.assignments_to(name)
    ):
        return False
    for node in walk(ctx.model.module):
        if not isinstance(node, cst.ImportFrom) or not isinstance(node.names, cst.ImportStar):
            continue
        if node.relative:
            return True
        root = (dotted(node.module) or "").split(".")[0] if node.module is not None else ""
        if root and root not in sys.stdlib_module_names and root not in names.KNOWN_LIBRARIES:
            return True
    return False


_BUILTINS = frozenset(dir(builtins))


def unwrap(ctx: Context, model: cst.BaseExpression, at: cst.CSTNode, text: str, **how) -> None:
    """``model`` -> ``accelerator.unwrap_model(model)``; outside the class that owns
    ``self.accelerator``, through the instance the scope made (``engine.model[0]`` in the
    driver that built ``engine``: ``engine.accelerator.unwrap_model(engine.model)[0]``)."""
    acc = ctx.reachable_accelerator(at)
    if acc is not None and acc != ctx.acc and acc.endswith(".accelerator"):
        text = text.replace(ctx.a("unwrap_model"), f"{acc}.unwrap_model")
        how = {**how, "anywhere": True}  # no accelerator of this scope is needed for it
        ctx.plan.add(rewrites.unwrap(model, acc), line=ctx.line(at), text=text, **how)
        return
    planned = ctx.plan.add(rewrites.unwrap(model, ctx.acc), line=ctx.line(at), text=text, **how)
    ctx.need(at, when=planned.in_effect)
