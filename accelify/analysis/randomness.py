"""Random state before training. Every rank runs the whole script: a value drawn from the global
generators before training (a synthetic dataset, a random target, a ``random_split``) must be
the same on every rank, or each rank trains toward a different goal. A script that seeds the
generators is fine as it is; one that does not and draws such values needs a seed."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelify.analysis import names
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import keyword_argument


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
    seeded_families: set[str] = set()
    for call in model.calls:
        for name in model.call_names(call) & names.SEEDS:
            seeded_families |= _SEEDED_BY.get(name, set(_FAMILIES))
    training = [loop.node for loop in model.loops if loop.trains]
    setup, step = [], []
    for call in model.calls:
        if not _draws(model, call) or _in_per_sample_code(model, call):
            continue
        in_training = any(any(a is loop for a in model.ancestors(call)) for loop in training)
        (step if in_training else setup).append(call)
    torch_only = all(model.call_names(call) & names.RANDOM_DRAWS_TORCH for call in setup)
    if setup:  # ``torch.manual_seed(0)`` does not seed ``np.random.shuffle(indices)``
        seeded = all(_family(model, call) in seeded_families for call in setup)
    else:
        seeded = bool(seeded_families)
    return Randomness(seeded, setup, step, torch_only)


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
