from collections.abc import Iterator

import libcst as cst

from accelify.analysis.collectives import runtime_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import argument_value
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, calls_accelerator

#: The reductions both runtimes carry out as their names say (HF Accelerate 1.15's
#: ``_reduce_across_processes``: ``ReduceOp.MAX`` for "max", ``SUM`` for any other name, then a
#: division for "mean").
_KNOWN = ("sum", "mean", "max")
#: Names accelify's runtime carries out as they say and HF Accelerate 1.15 does not, silently:
#: "min" is summed, and "none", documented as no operation, is summed too
#: (huggingface/accelerate#4282). Reported only in files whose Accelerator is HF's.
_HF_SUMS = {
    "min": 'use -accelerator.reduce(-x, "max") (or gather and take .min())',
    "none": 'use the tensor itself for this rank\'s value (or "sum" for the total)',
}
#: What a misspelt name most likely meant.
_MEANT = {"avg": "mean", "average": "mean", "total": "sum", "add": "sum"}
#: ``reduce`` as a function of Accelerate's utilities: its reduction is its second argument.
_HF = "from accelerate import Accelerator\naccelerator = Accelerator()\n"
_UTILITIES = {"accelerate.utils.reduce", "accelerate.utils.operations.reduce"}


class UnknownReduction(Rule):
    """``accelerator.reduce(loss, "mean ")`` (``"avg"``, ``"Mean"``...): a reduction name that
    is none of Accelerate's (``"sum"``, ``"mean"``, ``"max"``, ``"none"``). HF Accelerate tests
    the name only against ``"max"`` and ``"mean"``: any other sums the values over the ranks and
    returns the total, so a metric meant as a mean comes out N times too large, silently;
    accelify's runtime raises ``ValueError`` on every rank when the line is reached (after a
    whole epoch, or at the end of the run). In a file whose Accelerator is HF's, ``"min"`` (which
    accelify's runtime takes) and ``"none"`` (documented as no operation) are reported too:
    HF Accelerate 1.15 sums both (huggingface/accelerate#4282). Reported at the call, for a name
    written as a string (or a name bound once to one)."""

    code = "ACC431"
    name = "unknown-reduction"
    message = (
        'Use one of Accelerate\'s reductions ("sum", "mean", "max"): any other name is summed '
        "by HF Accelerate and refused (ValueError) by accelify's runtime"
    )
    why = "A reduction name Accelerate does not know sums silently or raises on every rank."
    bad = (
        # a trailing space: HF Accelerate sums the ranks' losses instead of averaging them
        Example(HEADER + "val = accelerator.reduce(loss.detach(), 'mean ')\n", 3, 7),
        Example(HEADER + "total = accelerator.reduce(correct, reduction='avg')\n", 3, 9),
        # through a constant of the file
        Example(
            HEADER + "REDUCTION = 'average'\nval = accelerator.reduce(loss, REDUCTION)\n", 4, 7
        ),
        # Accelerate's utility function
        Example(
            HEADER + "from accelerate.utils import reduce\nval = reduce(loss, reduction='Mean')\n",
            4,
            7,
        ),
        # HF Accelerate 1.15 sums "min" and "none"
        Example(_HF + "low = accelerator.reduce(loss, 'min')\n", 3, 7),
        Example(_HF + "mine = accelerator.reduce(correct, reduction='none')\n", 3, 8),
    )
    good = (
        HEADER + "val = accelerator.reduce(loss.detach(), 'mean')\n",
        HEADER + "total = accelerator.reduce(correct, reduction='sum')\n",
        HEADER + "total = accelerator.reduce(correct)\n",
        HEADER + "top = accelerator.reduce(correct, 'max')\n",
        # accelify's runtime takes "min" and "none" as they say
        HEADER + "low = accelerator.reduce(loss, 'min')\n",
        HEADER + "each = accelerator.reduce(correct, 'none')\n",
        _HF + "top = accelerator.reduce(loss, 'max')\n",
        # a name chosen at run time: nothing to tell
        HEADER + "val = accelerator.reduce(loss, args.reduction)\n",
        # functools.reduce is no collective
        HEADER + "from functools import reduce\nval = reduce(lambda a, b: a + b, [1, 2], 'x')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        for call in calls(script):
            if not (
                calls_accelerator(script, call, ("reduce",)) or script.call_names(call) & _UTILITIES
            ):
                continue
            given = argument_value(call, "reduction", 1)
            name = _literal(script, given) if given is not None else None
            if name is None or name in _KNOWN:
                continue
            if name in _HF_SUMS:
                if runtime_of(script) == "accelify":
                    continue
                yield self.finding(script, call, message=_hf_message(name))
                continue
            yield self.finding(script, call, message=_message(script, name))


def _literal(script: ScriptModel, value: cst.BaseExpression) -> str | None:
    """The string ``value`` is: written out, or a plain name the file binds once, to a string."""
    if isinstance(value, cst.SimpleString):
        evaluated = value.evaluated_value
        return evaluated if isinstance(evaluated, str) else None
    if not isinstance(value, cst.Name):
        return None
    bound = [v for _, v in script.index.values_bound_to(value.value)]
    if len(bound) != 1 or not isinstance(bound[0], cst.SimpleString):
        return None
    evaluated = bound[0].evaluated_value
    return evaluated if isinstance(evaluated, str) else None


def _message(script: ScriptModel, name: str) -> str:
    cleaned = name.strip().lower()
    meant = cleaned if cleaned in _KNOWN else _MEANT.get(cleaned)
    use = f'use "{meant}"' if meant is not None else 'use "sum", "mean" or "max"'
    hf = 'HF Accelerate divides only for "mean" and sums the ranks\' values for any other name ' + (
        "(this mean comes out num_processes times too large, silently)"
        if meant == "mean"
        else "(silently)"
    )
    ours = "accelify's runtime raises ValueError on every rank when this line runs"
    first, second = (ours, hf) if runtime_of(script) == "accelify" else (hf, ours)
    return f"Reduction {name!r} is none of Accelerate's: {use}; {first}, and {second}"


def _hf_message(name: str) -> str:
    return (
        f'HF Accelerate sums the ranks\' values under reduction {name!r} (it knows only "max" '
        f'and "mean" besides the sum; huggingface/accelerate#4282), so this value is '
        f"silently the total: {_HF_SUMS[name]}"
    )
