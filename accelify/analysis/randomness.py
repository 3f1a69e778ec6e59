"""Random state before training. Every rank runs the whole script: a value drawn from the global
generators before training (a synthetic dataset, a random target, a ``random_split``) must be
the same on every rank, or each rank trains toward a different goal. A script that seeds the
generators is fine as it is; one that does not and draws such values needs a seed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from accelify.analysis import names
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import (
    all_params,
    assigned_targets,
    keyword_argument,
    target_names,
    walk,
)


@dataclass
class Randomness:
    seeded: bool
    #: draws outside the training loops (done once, before or between them).
    setup_draws: list[cst.Call]
    #: draws inside a training loop (per-step random batches).
    step_draws: list[cst.Call]
    #: every setup draw is from torch's generator (not NumPy's or Python's).
    torch_only: bool = True


def randomness_of(model: ScriptModel) -> Randomness:
    seeded_families = _seeded_families(model)
    training = [loop.node for loop in model.loops if loop.trains]
    setup, step = [], []
    for call in model.calls:
        if not _draws(model, call) or _in_per_sample_code(model, call):
            continue
        in_training = any(any(a is loop for a in model.ancestors(call)) for loop in training)
        if in_training:
            step.append(call)
        elif not _after_training(model, call, training):
            setup.append(call)
    torch_only = all(model.call_names(call) & names.RANDOM_DRAWS_TORCH for call in setup)
    if setup:  # ``torch.manual_seed(0)`` does not seed ``np.random.shuffle(indices)``
        seeded = all(_family(model, call) in seeded_families for call in setup)
    else:
        seeded = bool(seeded_families)
    return Randomness(seeded, setup, step, torch_only)


def _after_training(model: ScriptModel, call: cst.Call, training: list[cst.For]) -> bool:
    """``call`` runs once every training loop of the file is done: it stands after all of them
    in the function (or module code) that holds them all, outside any loop around one of them
    (which would run it before that loop's next round). A sample picked for a final demo
    (``i = random.randrange(len(x))`` after the epochs) feeds no rank's training: it is not a
    setup draw, and needs no seed to be alike on every rank."""
    if not training:
        return False
    scope = model.index.enclosing_function(call)
    if any(model.index.enclosing_function(loop) is not scope for loop in training):
        return False
    if scope is not None and not _run_once(model, scope):
        return False  # ``train_one_epoch()`` run per epoch: its last draw precedes the next
    ancestors = list(model.ancestors(call))
    if any(
        isinstance(a, cst.For | cst.While) and any(model.inside(loop, a) for loop in training)
        for a in ancestors
    ):
        return False
    start = model.position(call).start
    return all(
        (model.position(loop).end.line, model.position(loop).end.column)
        <= (start.line, start.column)
        for loop in training
    )


def _run_once(model: ScriptModel, function: cst.FunctionDef) -> bool:
    """Every call of ``function`` in the file stands outside any loop, no call the analysis
    cannot follow may run it, and nothing hands it on to be called elsewhere."""
    graph = model.call_graph
    if graph.uncertain_callers(function) or graph.references(function):
        return False
    return all(
        not any(isinstance(a, cst.For | cst.While) for a in model.ancestors(caller))
        for caller in graph.callers(function)
    )


def _seeded_families(model: ScriptModel, seeds: list[cst.Call] | None = None) -> set[str]:
    families: set[str] = set()
    for call in model.calls if seeds is None else seeds:
        for name in model.call_names(call) & names.SEEDS:
            families |= _SEEDED_BY.get(name, set(_FAMILIES))
    return families


def draws_alike_per_step(
    model: ScriptModel,
    training: list[cst.CSTNode],
    rank_reads: Callable[[cst.CSTNode], bool],
    synchronized: frozenset[str] = frozenset(),
) -> tuple[list[cst.Call], cst.Call | None] | None:
    """Random values each training step draws (a GAN's noise, a random mask) from a global
    generator the script seeds with the same seed on every rank, and that seed call: every
    rank draws the same values, so what they feed repeats on each rank instead of adding to
    the batch. A step is the body of a loop of ``training``, or a function called from one
    (through the file's call graph). Per-sample code (``forward``, ``__getitem__``: dropout,
    augmentation) applies its draws to each rank's own samples: not counted. A seed that reads
    the rank (``seed + rank``, ``rank_reads``) seeds the ranks apart: None. ``synchronized``:
    the generators the conversion itself makes alike on every rank before training, in a
    script that sets no seed (`synchronize_rng_states` before its synthetic data): the same
    holds for them, with no seed call to name."""
    seeds = [call for call in model.calls if model.call_names(call) & names.SEEDS]
    if any(rank_reads(call) for call in seeds):
        return None
    families = _seeded_families(model, seeds) if seeds else set(synchronized)
    if not families:
        return None
    steps = _step_functions(model, training)
    batches = _batch_names(model, training)
    drawn = []
    for call in model.calls:
        if not _draws(model, call) or _in_per_sample_code(model, call):
            continue
        if _family(model, call) not in families:
            continue
        loops = [loop for loop in training if any(a is loop for a in model.ancestors(call))]
        function = model.index.enclosing_function(call)
        if not loops and function not in steps:
            continue
        # in a helper the loop calls, its parameters may be the batch (``add_noise(x)``)
        batch = set(batches) if loops else _parameter_names(function)
        if not _applied_to_the_batch(model, call, batch):
            drawn.append(call)
    return (drawn, seeds[0] if seeds else None) if drawn else None


def _batch_names(model: ScriptModel, training: list[cst.CSTNode]) -> set[str]:
    """The names a training loop binds to its batch, and those its body sets from them
    (``inputs, labels = inputs.to(device), ...``, ``noisy = inputs + ...``)."""
    found: set[str] = set()
    for loop in model.loops:
        if loop.node in training:
            found |= loop.batch_names | target_names(loop.node.target)
    assigns = [
        node
        for loop in training
        for node in walk(loop)
        if isinstance(node, (cst.Assign, cst.AnnAssign)) and node.value is not None
    ]
    grown = True
    while grown:
        grown = False
        for assign in assigns:
            if not _reads(assign.value, found):  # type: ignore[arg-type]
                continue
            for target in assigned_targets(assign):
                new = target_names(target) - found
                if new:
                    found |= new
                    grown = True
    return found


def _parameter_names(function: cst.FunctionDef | None) -> set[str]:
    if function is None:
        return set()
    return {param.name.value for param in all_params(function.params)} - {"self", "cls"}


def _reads(node: cst.CSTNode, batch: set[str]) -> bool:
    return any(isinstance(n, cst.Name) and n.value in batch for n in walk(node))


def _applied_to_the_batch(model: ScriptModel, call: cst.Call, batch: set[str]) -> bool:
    """The draw is shaped like a batch tensor (``torch.randn_like(inputs)``) or combined with
    one in arithmetic (``inputs + 0.1 * torch.randn(...)``): each rank applies the same values
    to its own samples, as an augmentation does, so nothing repeats across ranks. Noise fed to
    a model as its input (a GAN's ``netG(torch.randn(b, nz))``) is neither."""
    if not batch:
        return False
    first = call.args[0].value if call.args else None
    if first is not None and _whole_shape_of(first, batch):
        return True  # ``torch.randn(y.shape)``: elementwise with a batch tensor
    if (
        any(name.endswith("_like") for name in model.call_names(call))
        and first is not None
        and _reads(first, batch)
    ):
        return True
    outer = _arithmetic_around(model, call)
    if outer is not None and _reads_apart(outer, call, batch):
        return True
    if _paired_with_the_batch(model, call, outer or call, batch):
        return True
    return _named_then_applied(model, outer or call, batch)


#: draws that pick indices (negative samples, sampled items), not values fed in place of data
_INDEX_DRAWS = frozenset(
    {
        "torch.randint",
        "torch.randperm",
        "torch.multinomial",
        "numpy.random.randint",
        "numpy.random.choice",
        "numpy.random.permutation",
        "random.randint",
        "random.randrange",
        "random.choice",
        "random.sample",
    }
)


def _paired_with_the_batch(
    model: ScriptModel, call: cst.Call, drawn: cst.CSTNode, batch: set[str]
) -> bool:
    """Negative sampling: ``j = torch.randint(0, n_items, (u.size(0), k))`` then ``model(u,
    j)``. The draw's shape follows this rank's batch and every use hands it to a call beside
    that batch (another argument reads it): each rank pairs the draws with its own samples, so
    the pairs differ between ranks and no work repeats. Index draws only (`_INDEX_DRAWS`):
    noise a generator takes, alone or beside the batch's labels (a conditional GAN's
    ``netG(torch.randn(labels.size(0), nz), labels)``), replaces data: still counted."""
    if not model.call_names(call) & _INDEX_DRAWS:
        return False
    if not any(_reads(argument.value, batch) for argument in call.args):
        return False
    reads = _reads_of_its_name(model, drawn)
    if reads is None:
        return _beside_the_batch(model, drawn, batch)
    return bool(reads) and all(_beside_the_batch(model, read, batch) for read in reads)


def _beside_the_batch(model: ScriptModel, node: cst.CSTNode, batch: set[str]) -> bool:
    """``node`` is (in) an argument of a call another argument of which reads the batch."""
    argument: cst.CSTNode | None = None
    for ancestor in model.ancestors(node):
        if isinstance(ancestor, cst.Arg):
            argument = ancestor
            continue
        if isinstance(ancestor, cst.Call) and argument is not None:
            return any(
                other is not argument and _reads(other.value, batch) for other in ancestor.args
            )
        if isinstance(ancestor, (cst.BaseStatement, cst.BaseSmallStatement)):
            return False
    return False


def _arithmetic_around(model: ScriptModel, node: cst.CSTNode) -> cst.CSTNode | None:
    """The outermost arithmetic ``node`` is part of (``0.1 * torch.randn(...)``), not a call
    around that; None when ``node`` is not inside arithmetic."""
    outer: cst.CSTNode | None = None
    for ancestor in model.ancestors(node):
        if not isinstance(ancestor, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison)):
            break
        outer = ancestor
    return outer


def _reads_apart(outer: cst.CSTNode, inner: cst.CSTNode, batch: set[str]) -> bool:
    """``outer`` reads a batch name outside ``inner``."""
    skipped = {id(n) for n in walk(inner)}
    return any(
        isinstance(n, cst.Name) and n.value in batch and id(n) not in skipped for n in walk(outer)
    )


def _named_then_applied(model: ScriptModel, drawn: cst.CSTNode, batch: set[str]) -> bool:
    """The draw is given a name first (``noise = 0.1 * torch.randn(b, d)``) and every read of
    that name in its scope combines it with a batch tensor (``x = x + noise``, ``x += noise``):
    the same as writing the draw into that arithmetic. A read that goes anywhere else (a
    generator's input, ``netG(noise)``) keeps the draw counted."""
    reads = _reads_of_its_name(model, drawn)
    return bool(reads) and all(_combined_with_the_batch(model, read, batch) for read in reads)


def _reads_of_its_name(model: ScriptModel, drawn: cst.CSTNode) -> list[cst.Name] | None:
    """The reads, in its scope, of the one name ``drawn`` is assigned to (``noise = ...``);
    None where ``drawn`` is not the whole value of such an assignment."""
    assign = model.parent(drawn)
    if not (
        isinstance(assign, cst.Assign)
        and assign.value is drawn
        and len(assign.targets) == 1
        and isinstance(assign.targets[0].target, cst.Name)
    ):
        return None
    target = assign.targets[0].target
    scope = model.scope_of(assign)
    return [
        n
        for n in walk(scope)
        if isinstance(n, cst.Name)
        and n.value == target.value
        and n is not target
        and model.scope_of(n) is scope
    ]


def _combined_with_the_batch(model: ScriptModel, read: cst.Name, batch: set[str]) -> bool:
    """``read`` is an operand of arithmetic that also reads a batch name (``x + noise``), or
    the value added in place to one (``x += noise``)."""
    outer = _arithmetic_around(model, read)
    if outer is not None:
        return _reads_apart(outer, read, batch)
    parent = model.parent(read)
    return (
        isinstance(parent, cst.AugAssign)
        and parent.value is read
        and isinstance(parent.target, cst.Name)
        and parent.target.value in batch
    )


def _whole_shape_of(node: cst.BaseExpression, batch: set[str]) -> bool:
    """``y.shape`` or ``y.size()`` of a batch tensor: not ``real.size(0)``, a batch's length
    that a generator's noise is drawn for."""
    if isinstance(node, cst.Call) and not node.args:
        node = node.func
        attribute = "size"
    else:
        attribute = "shape"
    return (
        isinstance(node, cst.Attribute)
        and node.attr.value == attribute
        and isinstance(node.value, cst.Name)
        and node.value.value in batch
    )


def _step_functions(model: ScriptModel, training: list[cst.CSTNode]) -> set[cst.FunctionDef]:
    """The file's functions a training loop's body calls, directly or through others."""
    graph = model.call_graph
    found: set[cst.FunctionDef] = set()
    pending = [
        call
        for call in model.calls
        if any(any(a is loop for a in model.ancestors(call)) for loop in training)
    ]
    while pending:
        for function in graph.targets(pending.pop()):
            if function not in found:
                found.add(function)
                pending += [c for c in model.calls if model.index.enclosing_function(c) is function]
    return found


#: The generators a seed call seeds; one not named here (``set_seed``, ``seed_everything``)
#: seeds them all.
_FAMILIES = ("torch", "numpy", "random")
_SEEDED_BY = {
    "torch.manual_seed": {"torch"},
    "torch.random.manual_seed": {"torch"},
    "torch.cuda.manual_seed_all": {"torch"},
    "random.seed": {"random"},
    "numpy.random.seed": {"numpy"},
}


def _family(model: ScriptModel, call: cst.Call) -> str:
    """Which global generator a draw reads: a split drawn by ``np.random.shuffle`` before
    training differs between ranks unless NumPy's generator is seeded (or synchronized)."""
    qualified = model.call_names(call)
    if any(name.startswith("numpy.random.") for name in qualified):
        return "numpy"
    if any(name.startswith("random.") for name in qualified):
        return "random"
    return "torch"


def _draws(model: ScriptModel, call: cst.Call) -> bool:
    qualified = model.call_names(call)
    if qualified & names.RANDOM_DRAWS_TORCH:
        return keyword_argument(call, "generator") is None
    return any(
        name.startswith(names.RANDOM_MODULES)
        and not name.endswith(("seed", "default_rng", "Generator", "RandomState", ".Random"))
        for name in qualified
    )


def _in_per_sample_code(model: ScriptModel, call: cst.CSTNode) -> bool:
    """``__getitem__``/``forward``/``__iter__``: augmentation and dropout, per rank by design."""
    for ancestor in model.ancestors(call):
        if isinstance(ancestor, cst.FunctionDef) and ancestor.name.value in (
            "__getitem__",
            "__iter__",
            "forward",
            "__call__",
        ):
            return True
    return False
