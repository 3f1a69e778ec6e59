"""Where a script tests whether its model is wrapped: ``if hasattr(model, "module"):``,
``isinstance(model, DDP)``, ``accelerator.num_processes > 1``. What runs in the other branch of
such a test runs only on the model itself (a one-process run, or the unwrapped module), so
reading the model's own attributes there, or saving its ``state_dict()``, is what the author
meant: ACC104 and ACC503 both leave it alone."""

from __future__ import annotations

import libcst as cst

from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import children_of, dotted

#: Words of a test of the wrapper (``module``) or of the run's number of processes.
WRAPPER_TESTS = ("module", "num_processes", "world_size", "distributed_type", "distributed")


def in_unwrapped_branch(script: ScriptModel, attribute: cst.Attribute) -> bool:
    """``attribute`` runs only where the model is not wrapped: in the ``else`` of a test that
    the wrapper is there (``if hasattr(model, "module"): model.module.generate(...) else:
    model.generate(...)``, ``m.module.state_dict() if hasattr(m, "module") else
    m.state_dict()``, ``isinstance(model, DDP)``, ``num_processes > 1``), or under the negation
    of one (``if not hasattr(model, "module"):``)."""
    owner = dotted(attribute.value) or ""
    for ancestor in script.ancestors(attribute):
        if not isinstance(ancestor, (cst.If, cst.IfExp)):
            continue
        test = ancestor.test
        negated = isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not)
        code = script.module.code_for_node(test)
        # a test of this object (hasattr, isinstance), or of the run's number of processes
        of_object = owner in code and ("isinstance(" in code or "module" in code)
        of_run = any(w in code for w in WRAPPER_TESTS if w != "module")
        in_else = ancestor.orelse is not None and contains(ancestor.orelse, attribute)
        if (of_object or of_run) and in_else != negated:
            return True
    return False


def contains(tree: cst.CSTNode, node: cst.CSTNode) -> bool:
    return tree is node or any(contains(child, node) for child in children_of(tree))
