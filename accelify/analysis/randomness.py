"""Random state before training. Every rank runs the whole script: a value drawn from the global
generators before training (a synthetic dataset, a random target, a ``random_split``) must be
the same on every rank, or each rank trains toward a different goal. A script that seeds the
generators is fine as it is; one that does not and draws such values needs a seed."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelify.analysis import names
from accelify.analysis.script_model import ScriptModel


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
    seeded = any(model.call_names(call) & names.SEEDS for call in model.calls)
    training = [loop.node for loop in model.loops if loop.trains]
    setup, step = [], []
    for call in model.calls:
        if not _draws(model, call) or _in_per_sample_code(model, call):
            continue
        in_training = any(any(a is loop for a in model.ancestors(call)) for loop in training)
        (step if in_training else setup).append(call)
    torch_only = all(model.call_names(call) & names.RANDOM_DRAWS_TORCH for call in setup)
    return Randomness(seeded, setup, step, torch_only)


def _draws(model: ScriptModel, call: cst.Call) -> bool:
    qualified = model.call_names(call)
    if qualified & names.RANDOM_DRAWS_TORCH:
        return not any(a.keyword is not None and a.keyword.value == "generator" for a in call.args)
    return any(
        name.startswith(names.RANDOM_MODULES)
        and not name.endswith(("seed", "default_rng", "Generator", "RandomState"))
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
