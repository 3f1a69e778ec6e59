"""9. Prints and progress bars show once: ``print`` -> ``accelerator.print`` (the local main
process), ``tqdm(...)`` disabled on the other processes."""

from __future__ import annotations

from accelify.analysis import names
from accelify.convert.steps.context import Context
from accelify.edits.plan import expression, with_keyword


def run(ctx: Context) -> None:
    for call in ctx.model.calls:
        qualified = ctx.model.call_names(call)
        if qualified & names.PRINT and not ctx.facts.ranks.under_rank_guard(call):
            ctx.plan.replace(
                call,
                lambda updated: updated.with_changes(func=expression(f"{ctx.acc}.print")),
                ctx.line(call),
                f"print -> {ctx.a('print')} (local main process only)",
            )
            ctx.need(call)
        elif qualified & names.TQDM and not any(
            a.keyword and a.keyword.value == "disable" for a in call.args
        ):
            acc = ctx.acc
            ctx.plan.replace(
                call,
                lambda updated, acc=acc: updated.with_changes(
                    args=with_keyword(
                        updated.args, "disable", expression(f"not {acc}.is_local_main_process")
                    )
                ),
                ctx.line(call),
                "progress bar shown on the local main process only",
            )
            ctx.need(call)
