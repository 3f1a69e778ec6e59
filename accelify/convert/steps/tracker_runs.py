"""A run on an experiment tracker started by the script itself (``wandb.init(...)``): once
converted, every rank starts it, and the experiment shows up as N runs, each with one rank's
values. Guarding it moves its ``wandb.log`` calls too (a log before ``init`` raises on the
other ranks), and those are spread through the training loop, so the conversion leaves the
code and says where the run starts; ``accelerator.init_trackers`` starts it on the main
process alone."""

from __future__ import annotations

import libcst as cst

from accelify.analysis import names
from accelify.convert.steps.context import Context


def run(ctx: Context) -> None:
    model = ctx.model
    if any(
        isinstance(call.func, cst.Attribute) and call.func.attr.value == "init_trackers"
        for call in model.calls
    ):
        return  # the Accelerator starts the run on the main process
    for call in model.calls:
        if not model.call_names(call) & names.TRACKER_RUN_STARTS or model.under_rank_guard(call):
            continue
        ctx.plan.review(
            ctx.line(call),
            "every rank starts this tracker run (N runs of one experiment): start it under "
            f"`if {ctx.acc}.is_main_process:` and log there too, or use "
            f"{ctx.acc}.init_trackers(...) and {ctx.acc}.log(...)",
        )
