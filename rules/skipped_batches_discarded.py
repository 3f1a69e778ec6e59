from collections.abc import Iterator

import libcst as cst

from accelify.analysis.collectives import runtime_of
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, calls, calls_accelerator

#: The module-level form: ``from accelerate import skip_first_batches``.
_FUNCTIONS = frozenset(
    {
        "accelerate.skip_first_batches",
        "accelerate.data_loader.skip_first_batches",
        "accelify.skip_first_batches",
        "accelify.data_loader.skip_first_batches",
    }
)

_HF_HEADER = HEADER.replace("from accelify import", "from accelerate import")

_RESUME = (
    _HF_HEADER
    + "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
    + "accelerator.load_state(args.resume)\n"
    + "{skip}"
    + "for step, batch in enumerate({loader}):\n"
    + "    accelerator.backward(model(batch))\n"
    + "    optimizer.step()\n"
)


class SkippedBatchesDiscarded(Rule):
    """``accelerator.skip_first_batches(loader, n)`` (and Accelerate's module-level
    ``skip_first_batches``) leaves ``loader`` as it is and returns a new loader that starts
    ``n`` batches in. Called as a statement (a LoRA fine-tuning script resuming from
    ``step_N``), its result is dropped: the resumed run trains again on the batches the
    checkpoint already saw. On one process too, on every backend. Not with accelify's runtime,
    whose ``skip_first_batches`` marks the prepared loader itself to skip ``n`` batches on its
    next pass (and returns it), so the statement does skip. Reported at the call; the
    fix is to iterate what it returns for the resumed epoch only (``active =
    accelerator.skip_first_batches(loader, n)`` in that epoch, else ``active = loader``):
    rebinding ``loader`` itself to Accelerate's skipping loader would skip ``n`` batches in
    every later epoch too."""

    code = "ACC417"
    name = "skipped-batches-discarded"
    message = (
        "Iterate the loader skip_first_batches returns: it leaves its argument as it is, so "
        "called as a statement it skips nothing and the resumed run trains on the same batches "
        "again"
    )
    why = "skip_first_batches returns a new loader; the one it is given is unchanged."
    bad = (
        Example(
            _RESUME.format(
                skip="accelerator.skip_first_batches(loader, resume_step)\n", loader="loader"
            ),
            5,
            1,
        ),
    )
    good = (
        _RESUME.format(
            skip="active = accelerator.skip_first_batches(loader, resume_step)\n",
            loader="active",
        ),
        # accelify's runtime: the prepared loader itself skips on its next pass
        _RESUME.replace(_HF_HEADER, HEADER).format(
            skip="accelerator.skip_first_batches(loader, resume_step)\n", loader="loader"
        ),
        # another object's method of the same name
        _HF_HEADER
        + "model, loader = accelerator.prepare(model, loader)\n"
        + "sampler.skip_first_batches(loader, 3)\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        if runtime_of(script) == "accelify":
            return
        for call in calls(script):
            if not isinstance(script.parent(call), cst.Expr):
                continue
            method = calls_accelerator(script, call, ("skip_first_batches",))
            if not method and not script.call_names(call) & _FUNCTIONS:
                continue
            loader = dotted(call.args[0].value) if call.args else None
            skip = script.module.code_for_node(call)
            yield self.finding(
                script,
                call,
                message=(
                    f"Iterate what {skip} returns: it leaves "
                    f"{loader or 'the loader it is given'} as it is and returns a new loader, so "
                    "as a statement it skips nothing and the resumed run trains again on the "
                    "batches the checkpoint already saw; iterate `active = "
                    f"{skip}` in the resumed epoch and `active = {loader or 'loader'}` in the "
                    f"others (rebound to Accelerate's skipping loader, {loader or 'the loader'} "
                    "would skip those batches in every later epoch too)"
                ),
            )
