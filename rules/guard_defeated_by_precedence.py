from collections.abc import Iterator

import libcst as cst

from accelify.analysis import side_effects
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule


class GuardDefeatedByPrecedence(Rule):
    """A rank guard written as ``is_main and X or Y``: ``and`` binds tighter than ``or``, so it
    reads ``(is_main and X) or Y``, and ``Y`` runs on every rank where the guard is false. When
    ``Y`` must run once (an ``input()`` prompt, which only the first process can answer, an
    ``rmtree``, a write, an upload), the other ranks crash, hang or race on it. Reported at that
    call in ``Y``; ``Y`` without such a call (a default value) is the idiom working as meant.
    In an ``if`` test, the block runs on every rank where ``Y`` holds: reported at ``Y`` when the
    block writes, deletes or uploads and synchronises nothing (parenthesizing must not put a
    collective on one rank). The same slip with ``&`` (``if epoch == n - 1 & is_main:``, read
    ``epoch == (n - 1 & is_main)``) is reported at the ``&``, on the same conditions."""

    code = "ACC208"
    name = "guard-defeated-by-precedence"
    message = (
        "Guard this with an `if`: `guard and X or Y` runs Y on every rank where the guard is "
        "false, and this must run once"
    )
    why = "`and` binds tighter than `or`: the right side of `or` escapes the rank guard."
    bad = (
        Example(  # a trainer's property for the rank test: the prompt and rmtree on every rank
            "import shutil\nfrom accelerate import Accelerator\n\n\nclass Trainer:\n"
            "    def __init__(self, clear=None):\n        self.accelerator = Accelerator()\n"
            "        if self.is_main and clear is True or (clear is None and "
            "input('clear?') == 'y'):\n"
            "            shutil.rmtree('results')\n\n"
            "    @property\n    def is_main(self):\n"
            "        return self.accelerator.is_main_process\n",
            8,
            47,
        ),
        Example(
            HEADER + "answer = accelerator.is_main_process and args.ask or input('Overwrite? ')\n",
            3,
            54,
        ),
        Example(
            HEADER
            + "import shutil\nis_main = accelerator.is_main_process\n"
            + "is_main and args.keep or shutil.rmtree(args.output_dir)\n",
            5,
            26,
        ),
        # a rank test put in a comparison with `&`: `epoch == (n - 1 & is_main)`, so at epoch 0
        # every other rank saves too (a research trainer's last-epoch save)
        Example(
            HEADER
            + "import torch\n"
            + "for epoch in range(n):\n"
            + "    if epoch == n - 1 & accelerator.is_main_process:\n"
            + "        torch.save(state, 'ckpt.pt')\n",
            5,
            17,
        ),
        # the guard of a block: at the last step every rank saves
        Example(
            HEADER
            + "import torch\n"
            + "if accelerator.is_main_process and step % 100 == 0 or step == last:\n"
            + "    torch.save(state, 'ckpt.pt')\n",
            4,
            55,
        ),
    )
    good = (
        HEADER + "name = accelerator.is_main_process and args.name or 'default'\n",
        # a bit mask compared, no rank test in it
        HEADER
        + "import torch\nif step & 1 == 0 and accelerator.is_main_process:\n"
        + "    torch.save(state, 'ckpt.pt')\n",
        # the rank's number masked: every other rank saves, as meant
        HEADER
        + "import torch\nif accelerator.process_index & 1 == 0:\n"
        + "    torch.save(state, 'ckpt.pt')\n",
        HEADER
        + "import torch\n"
        + "if accelerator.is_main_process and args.save or accelerator.is_local_main_process:\n"
        + "    torch.save(state, 'ckpt.pt')\n",
        # a collective in the block: parenthesizing would hang it; not this rule's advice
        HEADER
        + "import torch\n"
        + "if accelerator.is_main_process and step % 100 == 0 or step == last:\n"
        + "    accelerator.wait_for_everyone()\n    torch.save(state, 'ckpt.pt')\n",
        HEADER
        + "import shutil\n"
        + "accelerator.is_main_process and (args.keep or shutil.rmtree(args.output_dir))\n",
        HEADER + "import shutil\nargs.clean and args.keep or shutil.rmtree(args.output_dir)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        yield from self._guards_and_or(script)
        yield from self._guards_in_a_comparison(script)

    def _guards_in_a_comparison(self, script: ScriptModel) -> Iterator[Finding]:
        """``if epoch == n - 1 & accelerator.is_main_process:``: ``&`` binds tighter than
        ``==``, so the rank test is a bit of the number compared (``epoch == (n - 1 & False)``
        on the other ranks: ``epoch == 0``), and every rank runs the block at some epoch."""
        ranks = facts_of(script).ranks
        for node in script.index.of_type(cst.Comparison):
            if len(node.comparisons) != 1:
                continue
            target = node.comparisons[0]
            for side in (node.left, target.comparator):
                if not (
                    isinstance(side, cst.BinaryOperation) and isinstance(side.operator, cst.BitAnd)
                ):
                    continue
                guards = [
                    o for o in (side.left, side.right) if _boolean(o) and ranks.is_rank_test(o)
                ]
                if len(guards) != 1:
                    continue
                guard, operand = guards[0], side.right if guards[0] is side.left else side.left
                branch = _if_testing(script, node)
                effect = _once_per_run_in(script, branch.body) if branch is not None else None
                if effect is None or _synchronises(script, branch.body):  # type: ignore[union-attr]
                    continue
                code = script.module.code_for_node
                left = code(operand if side is node.left else node.left)
                right = code(operand if side is target.comparator else target.comparator)
                meant = f"{left}{code(target.operator)}{right} and {code(guard)}"
                yield self.finding(
                    script,
                    side,
                    message=(
                        f"Write `{meant}`: `&` binds tighter than `{code(target.operator).strip()}`"
                        f", so `{code(side)}` is one number compared, the rank test a bit of it, "
                        f"and the other ranks run the block too whenever the comparison holds "
                        f"with that bit 0 ({code(effect.func)}, line {script.line(effect)})"
                    ),
                )

    def _guards_and_or(self, script: ScriptModel) -> Iterator[Finding]:
        ranks = facts_of(script).ranks
        for node in script.index.of_type(cst.BooleanOperation):
            if not (
                isinstance(node.operator, cst.Or)
                and isinstance(node.left, cst.BooleanOperation)
                and isinstance(node.left.operator, cst.And)
            ):
                continue
            guards = _operands(node.left)
            if not any(ranks.is_rank_test(guard) for guard in guards):
                continue
            if any(ranks.is_rank_test(part) for part in _or_operands(node.right)):
                continue  # ``is_main and X or rank == -1``: the other side is a guard too
            guard = script.module.code_for_node(next(g for g in guards if ranks.is_rank_test(g)))
            branch = script.parent(node)
            if isinstance(branch, cst.If) and branch.test is node:
                effect = _once_per_run_in(script, branch.body)
                if effect is not None and not _synchronises(script, branch.body):
                    yield self.finding(
                        script,
                        node.right,
                        message=(
                            f"Parenthesize the guard: `{guard} and X or Y` reads "
                            f"`({guard} and X) or Y`, so where this is true every rank runs the "
                            f"block ({script.module.code_for_node(effect.func)}, line "
                            f"{script.line(effect)}); write `{guard} and (X or Y)`"
                        ),
                    )
                continue
            for call in walk(node.right):
                if isinstance(call, cst.Call) and side_effects.once_per_run(script, call):
                    yield self.finding(
                        script,
                        call,
                        message=(
                            f"Guard this with `if {guard}:`: `{guard} and ... or ...` reads "
                            f"`({guard} and ...) or ...`, so this runs on every rank where "
                            "the guard is false, and it must run once"
                        ),
                    )


def _boolean(guard: cst.BaseExpression) -> bool:
    """A rank test that is true or false (``is_main_process``, ``rank == 0``), not the rank's
    number itself: ``process_index & 1 == 0`` is a bit mask, meant as written."""
    if isinstance(guard, (cst.Comparison, cst.UnaryOperation)):
        return True
    name = dotted(guard) if isinstance(guard, (cst.Name, cst.Attribute)) else None
    last = name.rsplit(".", 1)[-1] if name else ""
    return last.startswith("is_") or "main" in last


def _if_testing(script: ScriptModel, node: cst.CSTNode) -> cst.If | None:
    """The ``if`` whose test ``node`` is, or is one ``and``/``or`` operand of."""
    child, parent = node, script.parent(node)
    while isinstance(parent, (cst.BooleanOperation, cst.UnaryOperation)):
        child, parent = parent, script.parent(parent)
    return parent if isinstance(parent, cst.If) and parent.test is child else None


def _operands(chain: cst.BooleanOperation) -> list[cst.BaseExpression]:
    """``a and b and c`` -> ``[a, b, c]``."""
    found: list[cst.BaseExpression] = []
    for side in (chain.left, chain.right):
        if isinstance(side, cst.BooleanOperation) and isinstance(side.operator, cst.And):
            found += _operands(side)
        else:
            found.append(side)
    return found


def _or_operands(node: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or):
        return _or_operands(node.left) + _or_operands(node.right)
    return [node]


def _once_per_run_in(script: ScriptModel, block: cst.CSTNode) -> cst.Call | None:
    return next(
        (
            n
            for n in walk(block)
            if isinstance(n, cst.Call) and side_effects.once_per_run(script, n)
        ),
        None,
    )


def _synchronises(script: ScriptModel, block: cst.CSTNode) -> bool:
    """A collective in the block, or a call of the script's own function (which may reach
    one): parenthesizing would put it on one rank."""
    facts = facts_of(script)
    collectives = {id(use.call) for use in facts.collective_uses}
    return any(
        isinstance(n, cst.Call)
        and (
            id(n) in collectives
            or (isinstance(n.func, cst.Name) and n.func.value in script.functions)
        )
        for n in walk(block)
    )
