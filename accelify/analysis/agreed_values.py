"""Values every rank holds alike once an evaluation is gathered. A metric folded from gathered
predictions and labels (``correct += (outputs.argmax(1) == targets).sum().item()``) covers the
whole set on every rank, as does an ``evaluate`` metric fed them (``metric.add_batch(...)``,
then ``metric.compute()``); so does what a function returns from such metrics (``return correct /
total``), and a name of the caller set only from them, constants, counters and settings (``acc =
evaluate(model, val_loader)``, ``best = acc``). A test that reads only such names (``acc >
best``) is decided alike by every rank, though it reads values this rank computed.

A model's forward in eval mode of agreed inputs is agreed too: the prepared model's parameters
are the same on every rank, so a greedy generation after training (``logits =
model(torch.tensor([generated], device=device))``, ``next_tok = logits[0, -1].argmax().item()``)
decides its ``if next_tok == eos: break`` alike everywhere (a sampled token is not: the draws
are each rank's own). A list is bound to what ``append``/``extend``/``insert`` put in it.

Which evaluations are gathered is the caller's answer (a conversion gathers some and leaves
others); this module only follows the values.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.analysis.evaluation import Evaluation
from accelify.analysis.facts import Facts
from accelify.analysis.objects import bound_arguments, star_forwarded
from accelify.analysis.script_model import Kind
from accelify.analysis.syntax import attributes_in_targets, dotted, unpacked_names, walk

#: Where names are agreed: a function's own body, or the module's own code.
Scope = cst.FunctionDef | cst.Module

#: Builtins whose result is the same wherever their arguments are.
_PURE_BUILTINS = {"float", "int", "round", "abs", "max", "min", "bool", "str", "range", "len"}

#: Tensor methods whose result is the same wherever the tensor and the arguments are.
_PURE_METHODS = {
    "mean", "sum", "float", "double", "numpy", "detach", "exp", "sqrt", "argmax", "std",
    "compute",  # an ``evaluate`` metric's, over what it was fed
}  # fmt: skip
#: Modules of pure math: a function of theirs gives the same result of the same arguments.
_PURE_MODULES = (
    "torch.mean", "torch.exp", "torch.sum", "torch.cat", "torch.stack", "math.", "numpy.mean",
    "statistics.",
    # element-wise and reducing math of numpy and torch (a per-class F1 of gathered counts:
    # ``2 * tp / np.maximum(2 * tp + fp + fn, 1)``); none draws a random number
    "numpy.maximum", "numpy.minimum", "numpy.sum", "numpy.clip", "numpy.round",
    "numpy.concatenate", "numpy.stack", "numpy.where", "numpy.divide", "numpy.nanmean",
    "numpy.asarray", "numpy.array", "torch.maximum", "torch.minimum", "torch.clamp",
    "torch.where", "torch.round", "torch.div",
)  # fmt: skip

#: Calls that make a tensor of the values they are handed: where it is placed (``device=``)
#: differs between ranks, its values do not.
_TENSOR_OF = {"torch.tensor", "torch.as_tensor", "torch.LongTensor", "torch.Tensor"}
_PLACING_KEYWORDS = {"device", "dtype", "requires_grad"}
#: Reads of a file by its path: every rank of a run on one file system finds the same
#: (`AgreedValues._shared_file_read`).
_SHARED_FILE_READS = {"os.path.exists", "os.path.isfile", "os.path.isdir", "torch.load"}
#: ``torch.load`` keywords that place or check what it reads, not which values it reads.
_LOAD_PLACING_KEYWORDS = {"map_location", "weights_only", "mmap"}
#: List methods that put their last argument into the list.
_LIST_FILLS = {"append", "extend", "insert"}
#: Methods that change a list or dict in place without a value of their own to follow.
_LIST_CHANGES = {"pop", "clear", "remove", "sort", "reverse", "update", "setdefault", "popitem"}

#: The node types `AgreedValues._bindings` reads a binding from (none has a subclass in
#: libcst, so a test of the exact type is the ``isinstance`` chain's answer, without its
#: five abstract-class checks for each of a function's nodes)
_BINDING_NODES = frozenset(
    {cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.AsName, cst.Call}
)

#: How a metric object of Hugging Face's ``evaluate`` folds a batch in: fed gathered
#: predictions and references, its ``compute()`` covers the whole set on every rank.
_METRIC_FOLDS = ("add_batch", "add")
#: Calls that make the same empty metric object on every rank of the same arguments.
_METRIC_LOADERS = ("evaluate.load", "datasets.load_metric")

#: Helpers followed into helpers: an evaluation that calls a function that returns a metric.
_MAX_DEPTH = 3


class AgreedValues:
    def __init__(self, facts: Facts, gathered: Callable[[Evaluation], bool]) -> None:
        self.facts = facts
        self.model = facts.model
        self.gathered = gathered
        self._names: dict[tuple[int, bool], frozenset[str]] = {}
        self._returns: dict[tuple[int, bool], bool] = {}
        self._state_names: frozenset[str] | None = None
        self._attribute_writes: dict[str, list[cst.CSTNode]] | None = None
        self._attributes: dict[str, bool] = {}
        self._state: frozenset[str] | None = None

    def test_agreed(self, test: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """Every rank decides ``test`` (read at ``at``) alike: it reads only constants,
        counters, settings and values of gathered evaluations."""
        function = self.facts.placement.enclosing_function(at) or self.model.module
        return self._agreed(test, function, self.names(function), 0)

    def branch_agreed(self, branch: cst.If) -> bool:
        """Every rank takes ``branch`` alike: the ``decided_alike`` test of the walks that ask
        whether some ranks may not reach a save or a write (`SharedFiles.divergent_around`)."""
        return self.test_agreed(branch.test, branch)

    def names(self, function: Scope, depth: int = 0, handed: bool = False) -> frozenset[str]:
        """The names of ``function`` every rank holds alike: the greatest set of names whose
        every binding there is agreed, given the metrics of its gathered evaluations. With
        ``handed``, for a call that hands it only agreed values: its parameters are agreed
        too (but ``self``/``cls``, the instance's own state)."""
        key = (id(function), handed)
        if key in self._names:
            return self._names[key]
        self._names[key] = frozenset()  # a function that reaches itself agrees on nothing
        seeds, folded = self._metrics(function)
        bindings = self._bindings(function, folded, handed, depth)
        agreed = set(seeds) | set(bindings)
        changed = True
        while changed:
            changed = False
            for name, values in bindings.items():
                if name in agreed and not all(
                    value is not None and self._agreed(value, function, agreed, depth)
                    for value in values
                ):
                    agreed.discard(name)
                    changed = True
        self._names[key] = frozenset(agreed)
        return self._names[key]

    def _metrics(self, function: Scope) -> tuple[set[str], set[int]]:
        """The names the gathered evaluations of ``function`` fold into, and the ids of their
        folding statements."""
        seeds: set[str] = set()
        folded: set[int] = set()
        for evaluation in self.facts.evaluations:
            if evaluation.loop.scope is not function or not self.gathered(evaluation):
                continue
            for sink in evaluation.sinks:
                folded |= {id(node) for node in walk(sink)}
                for node in walk(sink):
                    if isinstance(node, (cst.AugAssign, cst.AssignTarget)):
                        name = dotted(node.target)
                        if name is not None and "." not in name:
                            seeds.add(name)
                    elif (  # ``metric.add_batch(predictions=..., references=...)``
                        isinstance(node, cst.Call)
                        and isinstance(node.func, cst.Attribute)
                        and node.func.attr.value in _METRIC_FOLDS
                        and isinstance(node.func.value, cst.Name)
                    ):
                        seeds.add(node.func.value.value)
        return seeds, folded

    def _bindings(
        self, function: Scope, folded: set[int], handed: bool = False, depth: int = 0
    ) -> dict[str, list[cst.BaseExpression | None]]:
        """What each plain name of ``function`` is bound to, outside the gathered evaluations'
        folding statements (None: a value not followed: a parameter, a loop target, ``with
        ... as``); an element unpacked from a value not written out (``acc, n = f()``) is bound
        to the whole value."""
        found: dict[str, list[cst.BaseExpression | None]] = {}
        for node in self.model.index.own_nodes(function):
            if type(node) not in _BINDING_NODES or id(node) in folded:
                continue
            bound: list[tuple[cst.BaseExpression, cst.BaseExpression | None]] = []
            if isinstance(node, cst.Assign):
                bound = [(target.target, node.value) for target in node.targets]
            elif isinstance(node, (cst.AugAssign, cst.AnnAssign)):
                bound = [(node.target, node.value)]
            elif isinstance(node, (cst.For, cst.CompFor)):
                bound = [(node.target, None)]
            elif isinstance(node, cst.AsName):
                bound = [(node.name, None)]  # type: ignore[list-item]
            elif (  # ``generated.append(next_tok)``: the list holds what is put in it
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in _LIST_FILLS
                and isinstance(node.func.value, cst.Name)
                and node.args
            ):
                bound = [(node.func.value, node.args[-1].value)]
            # ``state["done"] = loss.item() < 0.3``, ``log.best = acc``: a write through a
            # subscript or an attribute binds what the root name holds
            bound = [(_written_root(target), value) for target, value in bound]
            guards = self._guards(node, function) if bound else []
            for target, value in bound:
                elements = self._returned_elements(target, value, depth)
                for name, written in unpacked_names(target, value):
                    if written is None and name in elements:
                        written = elements[name]
                    # bound under a test or in a loop the ranks may take differently
                    # (``else: bad += 1`` after ``if epoch_loss < best``): not agreed
                    found.setdefault(name, []).extend(guards)
                    # ``acc, n = evaluate(...)``: an element of a value not written out is
                    # agreed where the whole value is (a tuple of agreed values)
                    found.setdefault(name, []).append(value if written is None else written)
        if isinstance(function, cst.FunctionDef):
            for parameter in (*function.params.params, *function.params.kwonly_params):
                name = parameter.name.value
                # handed agreed values, a parameter holds one: as agreed as what it is handed
                agreed = name not in ("self", "cls") and (
                    handed or self._handed_alike(function, name)
                )
                found.setdefault(name, []).append(cst.Name("True") if agreed else None)
        return found

    def _returned_elements(
        self, target: cst.BaseExpression, value: cst.BaseExpression | None, depth: int
    ) -> dict[str, cst.BaseExpression]:
        """``val_loss, val_acc, n = evaluate(...)`` where every ``return`` of ``evaluate`` (a
        function of the file) is a tuple written out as long as the targets: each name whose
        element is agreed in every return is bound to an agreed value (``True``), though
        another element (``meter.avg``, a meter's state) is not: the metric a gathered count
        gives is decided alike whatever the tuple holds beside it."""
        if not (
            isinstance(target, (cst.Tuple, cst.List))
            and isinstance(value, cst.Call)
            and depth < _MAX_DEPTH
            and all(
                isinstance(e, cst.Element) and isinstance(e.value, cst.Name)
                for e in target.elements
            )
        ):
            return {}
        targets = self.facts.calls.targets(value)
        if len(targets) != 1:
            return {}
        returns = [r.value for r in self.model.index.own_returns(targets[0])]
        if not returns or not all(
            isinstance(r, cst.Tuple) and len(r.elements) == len(target.elements) for r in returns
        ):
            return {}
        agreed = self.names(targets[0], depth + 1)
        found: dict[str, cst.BaseExpression] = {}
        for index, element in enumerate(target.elements):
            values = [r.elements[index].value for r in returns]  # type: ignore[union-attr]
            if all(
                not isinstance(r.elements[index], cst.StarredElement)  # type: ignore[union-attr]
                and self._agreed(v, targets[0], agreed, depth + 1)
                and not self._reads_own_state(v)
                for r, v in zip(returns, values, strict=True)
            ):
                found[element.value.value] = cst.Name("True")  # type: ignore[attr-defined]
        return found

    def _handed_alike(self, function: cst.FunctionDef, parameter: str) -> bool:
        """Every call of ``function`` in the file passes ``parameter`` a value every rank holds
        alike where it is called (``cb.on_epoch_end(epoch, {"val_acc": acc})`` of a gathered
        ``acc``): followed into the parameter as a local's binding is; a call that leaves it
        out hands its default (a constant, a setting). Not for a function the file never calls
        (its callers are elsewhere) nor a call that hands ``*args`` or ``**kwargs``, unless
        it hands on the ``*args`` of the function around it (``getattr(cb, hook)(self,
        *args)`` in ``def _run_callbacks(self, hook, *args)``): then what each call of that
        function hands (`objects.star_forwarded`)."""
        calls = self.facts.flow.calls_of(function)
        if not calls:
            return False
        for call, implicit in calls:
            forwarded = self._star_forwarded(call)
            if forwarded is not None:
                if not self._forwarded_alike(function, call, implicit, parameter, forwarded):
                    return False
                continue
            passed = [a for n, a in bound_arguments(function, call, implicit) if n == parameter]
            if not passed and not any(a.star for a in call.args):
                if not self._default_alike(function, parameter):
                    return False
                continue
            if len(passed) != 1 or passed[0].star:
                return False
            if not self.test_agreed(passed[0].value, call):
                return False
        return True

    def _star_forwarded(self, call: cst.Call) -> list[list[cst.Arg]] | None:
        """What ``call``'s ``*args`` holds at each call of the function around it, when it
        hands that function's ``*args`` on and every such call can be told argument by
        argument; else None."""
        forwarded = star_forwarded(self.model, call)
        outer = self.model.index.enclosing_function(call)
        if not forwarded or outer is None:
            return None
        if len(forwarded) != len(self.model.call_graph.calls_of(outer)):
            return None  # a caller hands ``*x`` or ``**x`` of its own: not told one by one
        return forwarded

    def _forwarded_alike(
        self,
        function: cst.FunctionDef,
        call: cst.Call,
        implicit: int,
        parameter: str,
        forwarded: list[list[cst.Arg]],
    ) -> bool:
        """Every list of arguments ``call``'s ``*args`` may hold passes ``parameter`` a value
        every rank holds alike where it is written (in the outer call). A list that leaves out
        a parameter with no default is not a call of ``function`` (``_run_callbacks(
        "on_train_begin")`` runs another hook)."""
        for arguments in forwarded:
            pairs = bound_arguments(function, call, implicit, arguments)
            passed = [a for n, a in pairs if n == parameter]
            if not passed:
                if self._default_alike(function, parameter) or not _has_default(
                    function, parameter
                ):
                    continue
                return False
            if len(passed) != 1 or passed[0].star:
                return False
            if not self.test_agreed(passed[0].value, passed[0]):
                return False
        return True

    def _guards(self, node: cst.CSTNode, function: Scope) -> list[cst.BaseExpression]:
        """The tests of the ``if``/``while`` statements around ``node`` inside ``function``,
        and the iterables of the ``for`` loops: what decides whether (how often) it runs. A
        loop over ``range(...)`` of the function's parameters (an epoch loop) or over a
        DataLoader (every rank draws as many batches) runs as often on every rank; a loop over
        this rank's values (``for h in [v for v in history if v > 5]: stop = True``) does not."""
        found: list[cst.BaseExpression] = []
        for ancestor in self.model.ancestors(node):
            if ancestor is function:
                break
            if isinstance(ancestor, (cst.If, cst.While)):
                found.append(ancestor.test)
            elif isinstance(ancestor, cst.For) and not self._counted_alike(ancestor, function):
                found.append(ancestor.iter)
        return found

    def _counted_alike(self, loop: cst.For, function: Scope) -> bool:
        """``for epoch in range(epochs)`` with ``epochs`` a parameter of ``function``, or a loop
        over a DataLoader: as many rounds on every rank. (``range`` of other agreed names is
        asked of the iterable like any guard.)"""
        it = loop.iter
        if (
            isinstance(function, cst.FunctionDef)
            and isinstance(it, cst.Call)
            and dotted(it.func) == "range"
        ):
            parameters = {
                p.name.value for p in (*function.params.params, *function.params.kwonly_params)
            }
            if all(
                n.value in parameters
                for a in it.args
                for n in walk(a.value)
                if isinstance(n, cst.Name) and not _member_name(a.value, n)
            ):
                return True
        found = next((each for each in self.model.loops if each.node is loop), None)
        return found is not None and self.facts.flow.reads_loader(found)

    def _agreed(
        self,
        value: cst.BaseExpression,
        function: Scope,
        agreed: set[str] | frozenset[str],
        depth: int,
    ) -> bool:
        if any(not self._attribute_agreed(attribute) for attribute in _own_state_read(value)):
            return False
        return self.facts.ranks.uniform(
            value, agreed, lambda call: self._agreed_call(call, function, agreed, depth)
        )

    def _attribute_agreed(self, attribute: str) -> bool:
        """``self.<attribute>`` is not this rank's own: no write of it folds what a training
        loop computes from this rank's batches. A training loss a step keeps on the instance
        (``self.train_loss = total / len(self.loader)``, ``self.loss += loss.item()``) is this
        rank's own: a test or a metric that reads it is not every rank's. Settings, and state
        set from other values (``self.best_acc = acc`` of a gathered ``acc``), are judged as
        before, by the value read where the attribute is."""
        if attribute not in self._attributes:
            self._attributes[attribute] = not any(
                self._from_training(write) for write in self.attribute_writes().get(attribute, [])
            )
        return self._attributes[attribute]

    def state_agreed(self, attribute: str) -> bool:
        """``self.stop`` set through a trigger method (``def earlystopping(self): if
        self.val_losses[-1] >= self.last_loss: self.trigger += 1 ... if self.trigger >=
        self.patience: self.stop = True``): every rank holds the attribute alike when every
        write of it in the file (an attribute of that name on any object, a cautious reading)
        binds a value every rank holds alike in its function, under tests and loops every rank
        takes alike, reading only instance state that is itself agreed (followed through the
        locals it is made of); a list attribute likewise for what ``append``/``extend``/
        ``insert`` put in it (``self.val_losses.append(valid_loss)`` of a gathered loss). A
        stricter reading than `_attribute_agreed`, which a stop test needs: a flag one rank
        sets on its own validation loss leaves the others waiting."""
        if self._state is None:
            self._state = self._agreed_state()
        return attribute in self._state

    def _agreed_state(self) -> frozenset[str]:
        """The greatest set of attribute names whose every write is agreed given the others
        (a counter that reads itself, ``self.trigger += 1``, is agreed where the rest is)."""
        writes: dict[str, list[tuple[cst.BaseExpression | None, cst.CSTNode]]] = {}
        for name, nodes in self.attribute_writes().items():
            for node in nodes:
                value = getattr(node, "value", None) if not isinstance(node, cst.For) else None
                writes.setdefault(name, []).append((value, node))
        for call in self.model.calls:
            func = call.func
            if (
                isinstance(func, cst.Attribute)
                and isinstance(func.value, cst.Attribute)
                and func.attr.value in _LIST_FILLS | _LIST_CHANGES
            ):
                value = call.args[-1].value if call.args else cst.Name("True")
                writes.setdefault(func.value.attr.value, []).append((value, call))
        agreed = set(writes)
        changed = True
        while changed:
            changed = False
            for name in list(agreed):
                if not all(self._write_agreed(v, node, agreed) for v, node in writes[name]):
                    agreed.discard(name)
                    changed = True
        return frozenset(agreed)

    def _write_agreed(
        self, value: cst.BaseExpression | None, node: cst.CSTNode, state: set[str]
    ) -> bool:
        """``value`` written at ``node`` and the tests around it are agreed in their function,
        reading only attributes in ``state``."""
        if value is None:
            return False
        function = self.facts.placement.enclosing_function(node) or self.model.module
        agreed = self.names(function)
        for read in (value, *self._guards(node, function)):
            if read is value and self._module_constant(value):
                continue  # ``self.last_loss = torch.inf``
            if not self._agreed(read, function, agreed, 0):
                return False
            if not self._state_read_through(read, function) <= state:
                return False
        return True

    def _module_constant(self, value: cst.BaseExpression) -> bool:
        """``torch.inf``, ``math.pi``, ``np.nan``: a constant of an imported module."""
        name = dotted(value)
        if name is None or "." not in name or not isinstance(value, cst.Attribute):
            return False
        resolved = self.model.imports.resolve(name)
        return resolved is not None and resolved.split(".")[0] in ("torch", "math", "numpy")

    def _state_read_through(self, value: cst.BaseExpression, function: Scope) -> set[str]:
        """The instance attributes ``value`` reads, directly or through the locals of
        ``function`` it reads (``loss = self.val_losses[-1]``, then ``loss > best``)."""
        bound = {
            name: [node.value for node in nodes if node.value is not None]
            for name, nodes in self._assignments_by_name(function).items()
        }
        found = _own_state_read(value)
        pending = [n.value for n in walk(value) if isinstance(n, cst.Name)]
        seen: set[str] = set()
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            for each in bound.get(name, []):
                found |= _own_state_read(each)
                pending += [n.value for n in walk(each) if isinstance(n, cst.Name)]
        return found

    def _assignments_by_name(
        self, function: Scope
    ) -> dict[str, list[cst.Assign | cst.AugAssign | cst.AnnAssign]]:
        """The assignments in ``function``'s own body, by each name their targets bind
        (``a, b = ...`` under both), in order."""
        found: dict[str, list[cst.Assign | cst.AugAssign | cst.AnnAssign]] = {}
        for node in self.model.index.own_nodes(function):
            if not isinstance(node, cst.Assign | cst.AugAssign | cst.AnnAssign):
                continue
            targets = (
                [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            )
            for target in targets:
                for name in walk(target):
                    if isinstance(name, cst.Name):
                        found.setdefault(name.value, []).append(node)
        return found

    def _from_training(self, write: cst.CSTNode) -> bool:
        """``write`` stores what a training loop computed: it stands in one (``self.loss =
        loss.item()``), or it reads a name of its function that one binds (``total`` of
        ``self.train_loss = total / n``, followed through the names that name is made of)."""
        if not isinstance(write, cst.Assign | cst.AugAssign | cst.AnnAssign) or write.value is None:
            return False
        training = [loop.node for loop in self.model.loops if loop.trains]
        if any(self.model.inside(write, loop) for loop in training):
            return not self.facts.ranks.uniform(write.value)
        function = self.facts.placement.enclosing_function(write)
        if function is None:
            return False
        bindings = self._assignments_by_name(function)
        pending = [n.value for n in walk(write.value) if isinstance(n, cst.Name)]
        seen: set[str] = set()
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            for binding in bindings.get(name, []):
                if any(self.model.inside(binding, loop) for loop in training):
                    return True
                value = binding.value
                if value is not None:
                    pending += [n.value for n in walk(value) if isinstance(n, cst.Name)]
        return False

    def _agreed_call(
        self,
        call: cst.Call,
        function: Scope,
        agreed: set[str] | frozenset[str],
        depth: int,
    ) -> bool:
        arguments = all(self._agreed(a.value, function, agreed, depth) for a in call.args)
        func = call.func
        if self.model.call_names(call) & _TENSOR_OF:
            return all(
                self._agreed(a.value, function, agreed, depth)
                for a in call.args
                if a.keyword is None or a.keyword.value not in _PLACING_KEYWORDS
            )
        if arguments and call.args and self._forward_in_eval_mode(call, function):
            return True
        if self._shared_file_read(call, function, agreed, depth):
            return True
        if _size_of_a_data_set(call):
            return True
        if isinstance(func, cst.Name) and func.value in _PURE_BUILTINS:
            return arguments
        if isinstance(func, cst.Attribute) and func.attr.value in ("item", "tolist", "cpu"):
            return not call.args and self._agreed(func.value, function, agreed, depth)
        if self.model.call_names(call) & set(_METRIC_LOADERS):
            return arguments  # ``evaluate.load("accuracy")``: an empty metric on every rank
        if any(name.startswith(_PURE_MODULES) for name in self.model.call_names(call)):
            return arguments and bool(call.args)  # ``torch.mean(losses)``, ``math.exp(loss)``
        if isinstance(func, cst.Attribute) and func.attr.value in _PURE_METHODS:
            return arguments and self._agreed(func.value, function, agreed, depth)
        targets = self.facts.calls.targets(call)
        if len(targets) != 1 or depth >= _MAX_DEPTH:
            return False
        # ``return self.accuracy(correct, total)`` of gathered counts: a helper of the file
        # handed only agreed values returns an agreed value when its returns read nothing else
        return self.returns_agreed(targets[0], depth) or (
            arguments and self.returns_agreed(targets[0], depth, handed=True)
        )

    def _shared_file_read(
        self,
        call: cst.Call,
        function: Scope,
        agreed: set[str] | frozenset[str],
        depth: int,
    ) -> bool:
        """``os.path.exists(args.ckpt)``, ``torch.load(cfg.ckpt, map_location=device)`` of a
        path every rank holds alike, outside any loop (a resume before training): the ranks of
        a run share one file system and read the same file, so they find the same answer and
        the same state (``step = ck["step"]``). Not in a loop: there a file one rank writes
        while another looks (a stop file touched by hand, a checkpoint the main process saves)
        may be seen by one rank a step sooner than by another; nor for a test that decides a
        save (`_saves_under`)."""
        if not self.model.call_names(call) & _SHARED_FILE_READS:
            return False
        if self.model.index.enclosing_loop(call) is not None or not call.args:
            return False
        if self._saves_under(call):
            return False
        return all(
            self._agreed(a.value, function, agreed, depth)
            for a in call.args
            if a.keyword is None or a.keyword.value not in _LOAD_PLACING_KEYWORDS
        )

    def _saves_under(self, call: cst.Call) -> bool:
        """``if not os.path.exists(path): torch.save(state, path)``: the test decides a write
        (a name ending in ``save``: ``torch.save``, ``accelerator.save``, ``np.save``); the
        rank that writes first may change what a slower one finds."""
        for ancestor in self.model.ancestors(call):
            if isinstance(ancestor, (cst.FunctionDef, cst.Module)):
                return False
            if isinstance(ancestor, (cst.If, cst.IfExp)) and self.model.inside(call, ancestor.test):
                return any(
                    isinstance(node, cst.Call) and (dotted(node.func) or "").endswith("save")
                    for node in walk(ancestor)
                )
        return False

    def _default_alike(self, function: cst.FunctionDef, parameter: str) -> bool:
        """``parameter`` of ``function`` has a default every rank holds alike (``patience=2``)."""
        for param in (*function.params.params, *function.params.kwonly_params):
            if param.name.value == parameter:
                return param.default is not None and self.facts.ranks.uniform(param.default)
        return False

    def _forward_in_eval_mode(self, call: cst.Call, function: Scope) -> bool:
        """``model(x)`` of a model of the file switched to eval mode before it in ``function``
        (``model.eval()``, no ``model.train()`` between): the same parameters on every rank
        (prepare keeps them in step) and no dropout draws, so the same output of the same
        inputs. An ``eval()`` under a test or in a loop the forward is not in may not have run;
        a ``train()`` anywhere in a loop around the forward runs before its next round."""
        name = dotted(call.func)
        if name is None or self.facts.flow.kind_of(name, call) is not Kind.MODEL:
            return False
        switched: cst.CSTNode | None = None  # the ``eval()`` the forward runs after
        for node in self.model.index.own_nodes(function):
            if node is call:
                return switched is not None and not self._trained_again(call, switched, name)
            if _mode_switch(node, name) == "train":
                switched = None
            elif _mode_switch(node, name) == "eval" and self._runs_before(node, call, function):
                switched = node
        return False

    def _runs_before(self, node: cst.CSTNode, call: cst.CSTNode, function: Scope) -> bool:
        """Every block around ``node`` in ``function`` is around ``call`` too: ``node``, above
        ``call``, has run whenever ``call`` runs."""
        for ancestor in self.model.ancestors(node):
            if ancestor is function:
                return True
            if isinstance(ancestor, _BLOCKS) and not self.model.inside(call, ancestor):
                return False
        return True

    def _trained_again(self, call: cst.CSTNode, switched: cst.CSTNode, name: str) -> bool:
        """A loop around the forward calls ``train()`` and does not call the ``eval()`` again
        before it: from its second round on the forward runs in train mode."""
        for ancestor in self.model.ancestors(call):
            if self.model.inside(switched, ancestor):
                return False
            if isinstance(ancestor, (cst.For, cst.While)) and any(
                _mode_switch(node, name) == "train" for node in walk(ancestor)
            ):
                return True
        return False

    def returns_agreed(
        self, function: cst.FunctionDef, depth: int = 0, handed: bool = False
    ) -> bool:
        """Every ``return`` of ``function`` hands back values every rank holds alike (whatever
        it is handed: a metric of the whole gathered set; with ``handed``, as it is handed
        agreed values)."""
        key = (id(function), handed)
        if key not in self._returns:
            self._returns[key] = False
            returns = self.model.index.own_returns(function)
            agreed = self.names(function, depth + 1, handed)
            self._returns[key] = bool(returns) and all(
                self._agreed(r.value, function, agreed, depth + 1)  # type: ignore[arg-type]
                and not self._reads_own_state(r.value)  # type: ignore[arg-type]
                for r in returns
            )
        return self._returns[key]

    def _reads_own_state(self, value: cst.BaseExpression) -> bool:
        """``correct / n - self.train_loss``: a return may read what its instance holds, which
        each rank may set itself (a training loss kept on ``self`` by a step); the return is
        then not agreed, whatever it is handed. What only ``__init__`` sets (``self.loader``)
        and a method called on ``self`` are not such reads."""
        called = {id(node.func) for node in walk(value) if isinstance(node, cst.Call)}
        called |= self._loader_lengths(value)
        return any(
            isinstance(node, cst.Attribute)
            and isinstance(node.value, cst.Name)
            and node.value.value in ("self", "cls")
            and id(node) not in called
            and node.attr.value in self._set_after_construction()
            for node in walk(value)
        )

    def _loader_lengths(self, value: cst.BaseExpression) -> set[int]:
        """The ids of ``self.val_loader`` in ``len(self.val_loader)`` inside ``value``, of an
        attribute that holds a DataLoader: its batches per rank, as many on every rank (a
        prepared loader gives each rank as many; one left whole is the same everywhere), though
        the instance set it after construction (``fit(self, train_loader, val_loader)``)."""
        found: set[int] = set()
        for node in walk(value):
            if (
                isinstance(node, cst.Call)
                and dotted(node.func) == "len"
                and len(node.args) == 1
                and isinstance(node.args[0].value, cst.Attribute)
                and self.facts.flow.kind_of(dotted(node.args[0].value), node) is Kind.DATALOADER
            ):
                found.add(id(node.args[0].value))
        return found

    def attribute_writes(self) -> dict[str, list[cst.CSTNode]]:
        """Every statement of the file that writes an attribute, by the attribute's name (of
        whatever object: ``x.name = ...``, ``+=``, an unpacking's element, a loop's target):
        asked of every stop test and of every helper's return, so the file is walked once."""
        if self._attribute_writes is None:
            writes: dict[str, list[cst.CSTNode]] = {}
            for node in walk(self.model.module):
                for attribute in attributes_in_targets(node):
                    writes.setdefault(attribute.attr.value, []).append(node)
            self._attribute_writes = writes
        return self._attribute_writes

    def _set_after_construction(self) -> frozenset[str]:
        """Attribute names the file writes somewhere other than an ``__init__``."""
        if self._state_names is None:
            placement = self.facts.placement
            self._state_names = frozenset(
                name
                for name, writes in self.attribute_writes().items()
                if any(
                    (function := placement.enclosing_function(write)) is None
                    or function.name.value != "__init__"
                    for write in writes
                )
            )
        return self._state_names


def _has_default(function: cst.FunctionDef, parameter: str) -> bool:
    every = (*function.params.params, *function.params.kwonly_params)
    return any(p.name.value == parameter and p.default is not None for p in every)


def _own_state_read(value: cst.BaseExpression) -> set[str]:
    """The attributes of the instance ``value`` reads (``train_loss`` of ``val_loss -
    self.train_loss``), not the methods it calls on it."""
    called = {id(node.func) for node in walk(value) if isinstance(node, cst.Call)}
    return {
        node.attr.value
        for node in walk(value)
        if isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value in ("self", "cls")
        and id(node) not in called
    }


#: Blocks whose body may not run (or runs again): an ``eval()`` in one is not surely before.
_BLOCKS = (cst.If, cst.Else, cst.For, cst.While, cst.Try, cst.ExceptHandler)


def _mode_switch(node: cst.CSTNode, name: str) -> str | None:
    """``"eval"`` / ``"train"`` for ``model.eval()`` / ``model.train()`` of the model ``name``."""
    if (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value in ("eval", "train")
        and dotted(node.func.value) == name
    ):
        mode = node.args[0].value if node.func.attr.value == "train" and node.args else None
        if isinstance(mode, cst.Name) and mode.value == "False":
            return "eval"  # ``model.train(False)``: nn.Module's eval() is train(False)
        return node.func.attr.value
    return None


def _written_root(target: cst.BaseExpression) -> cst.BaseExpression:
    """The name a write goes into: ``state`` of ``state["done"]`` and of ``log.best``."""
    while isinstance(target, (cst.Subscript, cst.Attribute)):
        target = target.value
    return target


def _member_name(value: cst.BaseExpression, name: cst.Name) -> bool:
    """``epochs`` of ``cfg.epochs``: an attribute's name under ``value``, not a variable."""
    return any(isinstance(n, cst.Attribute) and n.attr is name for n in walk(value))


def _size_of_a_data_set(call: cst.Call) -> bool:
    """``len(loader.dataset)``: a DataLoader's data set is the whole set on every rank, prepared
    or not (a prepared loader shards the batches it draws, not its ``dataset``)."""
    func, args = call.func, call.args
    return (
        isinstance(func, cst.Name)
        and func.value == "len"
        and len(args) == 1
        and isinstance(args[0].value, cst.Attribute)
        and args[0].value.attr.value == "dataset"
    )


#: Text serializers: the same value gives the same bytes on every rank.
_DUMPERS = {"json.dump", "yaml.dump", "yaml.safe_dump"}
_TO_TEXT = {"json.dumps", "yaml.dump", "yaml.safe_dump"}


def dumps_agreed(agreed: AgreedValues, call: cst.Call) -> bool:
    """``json.dump(metrics, f)`` (``yaml.dump``, ``f.write(json.dumps(metrics))``) of values
    every rank holds alike: every rank writes the same bytes into the file."""
    names = agreed.model.call_names(call)
    if names & _DUMPERS and call.args:
        return agreed.test_agreed(call.args[0].value, call)
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "write" and len(call.args) == 1:
        text = call.args[0].value
        return (
            isinstance(text, cst.Call)
            and bool(agreed.model.call_names(text) & _TO_TEXT)
            and bool(text.args)
            and agreed.test_agreed(text.args[0].value, call)
        )
    return False
