"""Decide every edit of a conversion from the `ScriptModel` of the untouched script.

Each `_plan_*` method is one transformation of DESIGN.md's list; each records its changes (and
the places it would not touch, as review notes) in the `Plan`. Edits that need the accelerator
are remembered, so that the `Accelerator(...)` is created before the first of them and threaded
as a parameter into the helpers that need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accelify.analysis import names
from accelify.analysis.script_model import (
    Kind,
    Loop,
    Scope,
    ScriptModel,
    Visitor,
    dotted,
    root_name,
    strip_self_methods,
)
from accelify.convert.accumulation import find_manual_accumulation
from accelify.convert.plan import Plan, expression, statement, with_keyword
from accelify.convert.scopes import Scopes

TARGET_IMPORTS = {
    "accelify": "from accelify import Accelerator",
    "accelerate": "from accelerate import Accelerator",
}


@dataclass
class Options:
    target: str = "accelify"
    mixed_precision: str | None = None


@dataclass
class _Accelerator:
    """The `Accelerator(...)` call being assembled: keyword arguments as source text."""

    kwargs: dict[str, str] = field(default_factory=dict)

    def code(self) -> str:
        arguments = ", ".join(f"{key}={value}" for key, value in self.kwargs.items())
        return f"Accelerator({arguments})"


class Planner:
    def __init__(self, model: ScriptModel, options: Options) -> None:
        self.model = model
        self.options = options
        self.plan = Plan()
        self.scopes = Scopes(model)
        self.constructor = _Accelerator()
        self.needs: list[cst.CSTNode] = []
        self.acc = "accelerator"

    # --- entry -----------------------------------------------------------------------------------
    def run(self) -> Plan:
        prepare_scope = self.scopes.prepare_scope()
        if prepare_scope is None:
            line = self.model.line(self.model.backward_calls[0])
            self.plan.review(line, "no model or optimizer found: nothing to prepare")
            return self.plan
        if self.scopes.is_method(prepare_scope):
            self.acc = "self.accelerator"
        self.plan.accelerator = self.acc
        self._plan_prepare(prepare_scope)
        self._plan_backward()
        self._plan_wrappers_and_process_groups()
        self._plan_model_moves()
        self._plan_batch_moves()
        self._plan_devices()
        self._plan_amp()
        self._plan_clipping()
        self._plan_unwrapped_access()
        self._plan_saving()
        self._plan_prints_and_progress_bars()
        self._plan_evaluation_gather()
        self._plan_accumulation()
        self._plan_collective_stops()
        self._plan_data_notes()
        if self.options.mixed_precision:
            self.constructor.kwargs.setdefault(
                "mixed_precision", repr(self.options.mixed_precision)
            )
        self._place_accelerator(prepare_scope)
        self.plan.add_import = TARGET_IMPORTS[self.options.target]
        return self.plan

    # --- helpers ---------------------------------------------------------------------------------
    def need(self, node: cst.CSTNode) -> None:
        self.needs.append(node)

    def _code(self, node: cst.CSTNode) -> str:
        return self.model.module.code_for_node(node)

    def line(self, node: cst.CSTNode) -> int:
        return self.model.line(node)

    def a(self, member: str) -> str:
        return f"{self.acc}.{member}"

    # --- 3. prepare ------------------------------------------------------------------------------
    def _plan_prepare(self, scope: Scope) -> None:
        kinds = (Kind.MODEL, Kind.OPTIMIZER, Kind.DATALOADER, Kind.SCHEDULER)
        chosen: dict[str, object] = {}
        last_statement = None
        for binding in self.model.of_kind(*kinds):
            if binding.scope is not scope:
                continue
            top = self.scopes.top_statement(binding.statement, scope)
            if top is None:
                continue
            chosen.setdefault(binding.name, binding.kind)
            if last_statement is None or self.scopes.index(top, scope) > self.scopes.index(
                last_statement, scope
            ):
                last_statement = top
        per_epoch = self.scopes.per_epoch_schedulers(scope, set(chosen))
        per_step = {n for n, kind in chosen.items() if kind is Kind.SCHEDULER} - per_epoch
        if per_epoch and not per_step:
            self.constructor.kwargs["step_scheduler_with_optimizer"] = "False"
        elif per_epoch:
            for name in per_epoch:
                chosen.pop(name)
                self.plan.review(
                    self.line(last_statement),
                    f"{name} is stepped once per epoch and another scheduler once per step: "
                    f"{name} is left unprepared so its schedule keeps its pace",
                )
        if not chosen or last_statement is None:
            return
        order = sorted(chosen, key=lambda n: list(Kind).index(chosen[n]))  # type: ignore[arg-type]
        targets = ", ".join(order)
        code = f"{targets} = {self.a('prepare')}({targets})"
        if len(code) > 88:
            code = f"{targets} = {self.a('prepare')}(\n    {targets}\n)"
        prepare = statement(code)
        self.plan.insert_after(last_statement, prepare)
        self.need(last_statement)
        self.plan.prepared = order
        self.scopes.prepare_anchor = last_statement
        self.plan.change(
            self.line(last_statement), f"prepare {targets} after line {self.line(last_statement)}"
        )

    # --- 4. backward -----------------------------------------------------------------------------
    def _plan_backward(self) -> None:
        acc = self.acc
        for call in self.model.backward_calls:
            receiver = call.func.value  # type: ignore[union-attr]
            scaled = _unscaled(receiver, self.model)
            loss = scaled if scaled is not None else receiver

            def rewrite(updated: cst.CSTNode, loss=loss, scaled=scaled) -> cst.CSTNode:
                assert isinstance(updated, cst.Call)
                receiver_now = updated.func.value  # type: ignore[union-attr]
                target = receiver_now.args[0].value if scaled is not None else receiver_now
                args = [cst.Arg(target), *updated.args]
                return updated.with_changes(func=expression(f"{acc}.backward"), args=args)

            code = self._code(loss)
            self.plan.replace(
                call, rewrite, self.line(call), f"{code}.backward() -> {self.a('backward')}({code})"
            )
            self.need(call)

    # --- 5. devices ------------------------------------------------------------------------------
    def _plan_model_moves(self) -> None:
        model_names = self.model.names_of(Kind.MODEL)
        for binding in self.model.of_kind(Kind.MODEL):
            stripped = _strip_moves(binding.value)
            if stripped is binding.value or binding.statement in self.plan.removals:
                continue
            if binding.value in self.plan.replacements:  # a DataParallel(...) already unwrapped
                continue
            if dotted(stripped) == binding.name:
                self.plan.remove(
                    binding.statement,
                    binding.line,
                    f"removed {binding.name} device move (prepare places the model)",
                )
                continue
            self.plan.replace(
                binding.value,
                lambda updated: _strip_moves(updated),
                binding.line,
                f"removed .to(device) of {binding.name} (prepare places the model)",
            )
        for line_statement, call in self.scopes.expression_statements():
            target = _move_receiver(call)
            if target is not None and dotted(target) in model_names | self.scopes.param_names(
                Kind.MODEL
            ):
                self.plan.remove(
                    line_statement,
                    self.line(call),
                    f"removed {dotted(target)} device move (prepare places the model)",
                )

    def _plan_batch_moves(self) -> None:
        for loop in self.model.loops:
            if not self.scopes.reads_loader(loop):
                continue
            batch = set(loop.batch_names) | self.scopes.derived_batch_names(loop)
            for node in self.scopes.walk(loop.node.body):
                if isinstance(node, cst.SimpleStatementLine):
                    self._batch_move_statement(node, batch)

    def _batch_move_statement(
        self, line_statement: cst.SimpleStatementLine, batch: set[str]
    ) -> None:
        for small in line_statement.body:
            if not isinstance(small, cst.Assign):
                continue
            moves = _batch_moves_in(small.value, batch)
            if not moves:
                continue
            if _is_identity_assignment(small, batch):
                self.plan.remove(
                    line_statement,
                    self.line(small),
                    "removed batch device move (batches arrive on accelerator.device)",
                )
                return
            for move in moves:
                self.plan.replace(
                    move,
                    _drop_move,
                    self.line(move),
                    "removed batch device move (batches arrive on accelerator.device)",
                )

    def _plan_devices(self) -> None:
        for binding in self.model.of_kind(Kind.DEVICE):
            self.plan.replace(
                binding.value,
                lambda _: expression(self.a("device")),
                binding.line,
                f"{binding.name} = {self.a('device')}",
            )
            self.need(binding.statement)
        for call in self.scopes.calls():
            if _calls_method(call, "cuda") and call not in self.plan.replacements:
                if not call.args:
                    acc = self.acc
                    self.plan.replace(
                        call,
                        lambda updated, acc=acc: updated.with_changes(
                            func=updated.func.with_changes(attr=cst.Name("to")),
                            args=[cst.Arg(expression(f"{acc}.device"))],
                        ),
                        self.line(call),
                        f".cuda() -> .to({self.a('device')})",
                    )
                    self.need(call)
            elif (
                _calls_method(call, "to")
                and call not in self.plan.replacements
                and call.args
                and _is_cuda_literal(call.args[0].value)
            ):
                self.plan.replace(
                    call.args[0].value,
                    lambda _: expression(self.a("device")),
                    self.line(call),
                    f'.to("cuda") -> .to({self.a("device")})',
                )
                self.need(call)
            for argument in call.args:
                if (
                    argument.keyword is not None
                    and argument.keyword.value == "device"
                    and _is_cuda_literal(argument.value)
                ):
                    self.plan.replace(
                        argument.value,
                        lambda _: expression(self.a("device")),
                        self.line(call),
                        f'device="cuda" -> device={self.a("device")}',
                    )
                    self.need(call)

    # --- 6. hand-written DDP ---------------------------------------------------------------------
    def _plan_wrappers_and_process_groups(self) -> None:
        for binding in self.model.of_kind(Kind.WRAPPER):
            call = strip_self_methods(binding.value)
            if not isinstance(call, cst.Call) or not call.args:
                continue
            inner = _strip_moves(call.args[0].value)
            wrapper = self._code(call.func)
            text = f"removed {wrapper} wrapping and device moves (prepare wraps the model)"
            if dotted(inner) == binding.name:
                self.plan.remove(binding.statement, binding.line, text)
            else:
                self.plan.replace(binding.value, lambda _, inner=inner: inner, binding.line, text)
        samplers = {b.name for b in self.model.of_kind(Kind.SAMPLER)}
        for binding in self.model.of_kind(Kind.SAMPLER):
            self.plan.remove(
                binding.statement,
                binding.line,
                f"removed DistributedSampler {binding.name} (prepare shards the data)",
            )
        for line_statement, call in self.scopes.expression_statements():
            qualified = self.model.call_names(call)
            if qualified & (names.INIT_PROCESS_GROUP | names.SET_CUDA_DEVICE):
                self.plan.remove(
                    line_statement,
                    self.line(call),
                    "removed process-group setup (the launcher and Accelerator do it)",
                )
            elif qualified & names.DESTROY_PROCESS_GROUP:
                self.plan.replace(
                    call,
                    lambda _: expression(f"{self.acc}.end_training()"),
                    self.line(call),
                    f"destroy_process_group() -> {self.a('end_training')}()",
                )
                self.need(call)
            elif isinstance(call.func, cst.Attribute) and call.func.attr.value == "set_epoch":
                owner = dotted(call.func.value)
                if owner in samplers or (owner or "").endswith(".sampler"):
                    self.plan.remove(
                        line_statement,
                        self.line(call),
                        "removed sampler.set_epoch (the prepared loader reshuffles each epoch)",
                    )
        for call in self.scopes.calls():
            qualified = self.model.call_names(call)
            replacement = None
            if qualified & names.BARRIER:
                replacement = f"{self.acc}.wait_for_everyone()"
            elif qualified & names.GET_RANK:
                replacement = f"{self.acc}.process_index"
            elif qualified & names.GET_WORLD_SIZE:
                replacement = f"{self.acc}.num_processes"
            elif _environ_rank(call) is not None:
                replacement = f"{self.acc}.{_environ_rank(call)}"
            if replacement is not None:
                self.plan.replace(
                    call,
                    lambda _, r=replacement: expression(r),
                    self.line(call),
                    f"{self._code(call)} -> {replacement}",
                )
                self.need(call)
            if self.model.call_names(call) & names.DATALOADERS:
                for argument in call.args:
                    if (
                        argument.keyword
                        and argument.keyword.value == "sampler"
                        and dotted(argument.value) in samplers
                    ):
                        self.plan.replace(
                            call,
                            _drop_sampler_argument(samplers),
                            self.line(call),
                            "DataLoader(sampler=DistributedSampler) -> shuffle=True "
                            "(prepare shards the data)",
                        )
        for attribute in self.scopes.attributes():
            name = dotted(attribute.value)
            if attribute.attr.value == "module" and self.scopes.is_model_name(name, attribute):
                acc = self.acc
                self.plan.replace(
                    attribute,
                    lambda updated, acc=acc: cst.Call(
                        expression(f"{acc}.unwrap_model"), [cst.Arg(updated.value)]
                    ),
                    self.line(attribute),
                    f"{name}.module -> {self.a('unwrap_model')}({name})",
                )
                self.need(attribute)

    # --- 7. AMP ----------------------------------------------------------------------------------
    def _plan_amp(self) -> None:
        scalers = {b.name for b in self.model.of_kind(Kind.SCALER)}
        amp_used = bool(scalers)
        dtype = "fp16"
        for binding in self.model.of_kind(Kind.SCALER):
            self.plan.remove(
                binding.statement,
                binding.line,
                f"removed GradScaler {binding.name} (the Accelerator scales fp16 losses)",
            )
        for line_statement, call in self.scopes.expression_statements():
            if isinstance(call.func, cst.Attribute) and dotted(call.func.value) in scalers:
                method = call.func.attr.value
                if method in ("update", "unscale_"):
                    self.plan.remove(
                        line_statement,
                        self.line(call),
                        f"removed {dotted(call.func)}() (the Accelerator handles the scaler)",
                    )
                elif method == "step" and call.args:
                    optimizer = call.args[0].value
                    self.plan.replace(
                        call,
                        lambda updated: cst.Call(
                            cst.Attribute(updated.args[0].value, cst.Name("step"))
                        ),
                        self.line(call),
                        f"{dotted(call.func)}({self._code(optimizer)}) -> "
                        f"{self._code(optimizer)}.step()",
                    )
        for with_node in self.scopes.withs():
            for item in with_node.items:
                call = item.item
                if isinstance(call, cst.Call) and self.model.call_names(call) & names.AUTOCASTS:
                    amp_used = True
                    if any("bfloat16" in self._code(a.value) for a in call.args):
                        dtype = "bf16"
                    self.plan.replace(
                        call,
                        lambda _: expression(f"{self.acc}.autocast()"),
                        self.line(call),
                        f"{self._code(call.func)}(...) -> {self.a('autocast')}()",
                    )
                    self.need(call)
        if amp_used and not self.options.mixed_precision:
            if dtype == "bf16":
                self.constructor.kwargs["mixed_precision"] = '"bf16"'
            else:
                self.constructor.kwargs["mixed_precision"] = (
                    '"fp16" if torch.cuda.is_available() else "no"'
                )
            self.plan.change(
                0,
                "mixed precision moved to Accelerator(mixed_precision="
                f"{self.constructor.kwargs['mixed_precision']})",
            )

    # --- 8. clipping -----------------------------------------------------------------------------
    def _plan_clipping(self) -> None:
        for call in self.scopes.calls():
            for qualified in self.model.call_names(call):
                method = names.CLIP_FUNCTIONS.get(qualified)
                if method:
                    self.plan.replace(
                        call,
                        lambda updated, method=method: updated.with_changes(
                            func=expression(f"{self.acc}.{method}")
                        ),
                        self.line(call),
                        f"torch.nn.utils.{method} -> {self.a(method)}",
                    )
                    self.need(call)
                    break

    # --- 9. saving and loading state -------------------------------------------------------------
    def _plan_unwrapped_access(self) -> None:
        """After prepare, a model may be a DDP wrapper: its state dict, its own attributes and
        methods (``model.fc1``, ``model.generate()``) are reached through ``unwrap_model``."""
        for attribute in self.scopes.attributes():
            member = attribute.attr.value
            if member in names.MODULE_API and member not in ("state_dict", "load_state_dict"):
                continue
            if member == "module" or member.startswith("__"):
                continue
            owner = attribute.value
            if not isinstance(owner, (cst.Name, cst.Attribute)) or owner in self.plan.replacements:
                continue
            if not self.scopes.is_model_name(dotted(owner), attribute):
                continue
            if not self.scopes.after_prepare(attribute) or self._is_binding_target(attribute):
                continue
            self._unwrap(
                owner,
                attribute,
                f"{dotted(owner)}.{member} -> {self.a('unwrap_model')}({dotted(owner)}).{member}",
            )

    def _unwrap(self, model: cst.BaseExpression, at: cst.CSTNode, text: str) -> None:
        """``model`` -> ``accelerator.unwrap_model(model)``."""
        acc = self.acc
        self.plan.replace(
            model,
            lambda updated: cst.Call(expression(f"{acc}.unwrap_model"), [cst.Arg(updated)]),
            self.line(at),
            text,
        )
        self.need(at)

    def _is_binding_target(self, attribute: cst.Attribute) -> bool:
        """``self.model = ...`` binds a name; it is not a use of the model."""
        parent = self.model.parent(attribute)
        return isinstance(parent, cst.AssignTarget) or (
            isinstance(parent, cst.Attribute)
            and isinstance(self.model.parent(parent), cst.AssignTarget)
        )

    def _plan_saving(self) -> None:
        guarded_writes = self._plan_file_writes()
        for line_statement, call in self.scopes.expression_statements():
            if not self.model.call_names(call) & names.TORCH_SAVE:
                continue
            self._unwrap_saved_model(call)
            if any(self.scopes.inside(call, block) for block in guarded_writes):
                continue  # writes into a file only the main process opens
            self.plan.replace(
                call,
                lambda updated: updated.with_changes(func=expression(f"{self.acc}.save")),
                self.line(call),
                f"torch.save -> {self.a('save')} (main process only)",
            )
            self.need(call)
            if not self.scopes.under_rank_guard(call):
                self.plan.insert_before(
                    line_statement, statement(f"{self.acc}.wait_for_everyone()")
                )

    def _unwrap_saved_model(self, call: cst.Call) -> None:
        """``torch.save(model, path)`` of a prepared model pickles the DDP wrapper otherwise."""
        if not call.args:
            return
        saved = call.args[0].value
        if isinstance(saved, (cst.Name, cst.Attribute)) and self.scopes.is_model_name(
            dotted(saved), call
        ):
            self._unwrap(
                saved, call, f"saves {self.a('unwrap_model')}({dotted(saved)}), not the DDP wrapper"
            )

    def _plan_file_writes(self) -> list[cst.With]:
        """``with open(path, "w") as f:`` runs on the main process only; every rank truncating
        and writing the same file races. A bare ``open`` for writing is left for review."""
        guarded = []
        for with_node in self.scopes.withs():
            if self.scopes.under_rank_guard(with_node) or not any(
                _opens_for_writing(item.item) for item in with_node.items
            ):
                continue
            acc = self.acc
            self.plan.replace(
                with_node,
                lambda updated, acc=acc: cst.If(
                    test=expression(f"{acc}.is_main_process"),
                    body=cst.IndentedBlock([updated.with_changes(leading_lines=[])]),
                    leading_lines=updated.leading_lines,
                ),
                self.line(with_node),
                f"file written on the main process only (if {self.a('is_main_process')}:)",
            )
            self.need(with_node)
            guarded.append(with_node)
        for call in self.scopes.calls():
            inside_guarded = any(self.scopes.inside(call, block) for block in guarded)
            if (
                _opens_for_writing(call)
                and not inside_guarded
                and not self.scopes.under_rank_guard(call)
            ):
                self.plan.review(
                    self.line(call),
                    "a file is written on every rank: "
                    "guard it with `if accelerator.is_main_process:`",
                )
        return guarded

    def _plan_prints_and_progress_bars(self) -> None:
        for call in self.scopes.calls():
            qualified = self.model.call_names(call)
            if qualified & names.PRINT and not self.scopes.under_rank_guard(call):
                self.plan.replace(
                    call,
                    lambda updated: updated.with_changes(func=expression(f"{self.acc}.print")),
                    self.line(call),
                    f"print -> {self.a('print')} (local main process only)",
                )
                self.need(call)
            elif qualified & names.TQDM and not any(
                a.keyword and a.keyword.value == "disable" for a in call.args
            ):
                acc = self.acc
                self.plan.replace(
                    call,
                    lambda updated, acc=acc: updated.with_changes(
                        args=with_keyword(
                            updated.args, "disable", expression(f"not {acc}.is_local_main_process")
                        )
                    ),
                    self.line(call),
                    "progress bar shown on the local main process only",
                )
                self.need(call)

    # --- 10. evaluation --------------------------------------------------------------------------
    def _plan_evaluation_gather(self) -> None:
        for loop in self.model.loops:
            if not loop.evaluates or not self.scopes.reads_loader(loop):
                continue
            self._gather_after_forward(loop)

    def _gather_after_forward(self, loop: Loop) -> None:
        body = loop.node.body.body
        for index, line_statement in enumerate(body):
            if (
                not isinstance(line_statement, cst.SimpleStatementLine)
                or len(line_statement.body) != 1
            ):
                continue
            assign = line_statement.body[0]
            if not isinstance(assign, cst.Assign) or not isinstance(assign.value, cst.Call):
                continue
            if not self.scopes.is_model_name(dotted(assign.value.func), assign):
                continue
            if len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Name):
                self.plan.review(
                    self.line(assign),
                    "evaluation output is not a plain name: "
                    "gather predictions and labels with accelerator.gather_for_metrics",
                )
                return
            output = assign.targets[0].target.value
            fed = {n.value for n in self.scopes.names_in(assign.value)}
            later = set()
            for following in body[index + 1 :]:
                later |= {n.value for n in self.scopes.names_in(following)}
            labels = sorted(
                name
                for name in loop.batch_names | self.scopes.derived_batch_names(loop)
                if name not in fed and name in later
            )
            gathered = [output, *labels]
            if len(gathered) == 1:
                code = f"{output} = {self.a('gather_for_metrics')}({output})"
            else:
                joined = ", ".join(gathered)
                code = f"{joined} = {self.a('gather_for_metrics')}(({joined}))"
            self.plan.insert_after(line_statement, statement(code))
            self.plan.change(
                self.line(assign),
                f"evaluation: {', '.join(gathered)} gathered from every rank (gather_for_metrics)",
            )
            self.need(line_statement)
            return
        self.plan.review(
            self.line(loop.node),
            "evaluation loop without a recognised forward pass: "
            "gather predictions and labels with accelerator.gather_for_metrics",
        )

    # --- gradient accumulation, collective stops, data -------------------------------------------
    def _plan_accumulation(self) -> None:
        for loop in self.model.loops:
            if not loop.trains:
                continue
            found = find_manual_accumulation(loop, self.model, self.scopes)
            if found is None:
                continue
            if found.unaccounted is not None:
                self.plan.review(
                    found.line, f"manual gradient accumulation kept: {found.unaccounted}"
                )
                continue
            self.constructor.kwargs["gradient_accumulation_steps"] = found.steps_code
            found.apply(self.plan, self.acc, self.scopes.model_names_in_scope(loop.scope))
            self.need(loop.node)

    def _plan_collective_stops(self) -> None:
        acc = self.acc
        for if_node, break_statement in self.scopes.per_process_breaks():
            self.plan.replace(
                break_statement,
                lambda _: statement(f"{acc}.set_trigger()"),
                self.line(if_node),
                "per-process stop made collective: set_trigger() / check_trigger()",
            )
            self.plan.insert_after(if_node, statement(f"if {acc}.check_trigger():\n    break\n"))
            self.need(if_node)

    def _plan_data_notes(self) -> None:
        if not self.model.of_kind(Kind.DATALOADER):
            line = self.line(self.model.backward_calls[0])
            self.plan.review(
                line,
                "batches do not come from a DataLoader: every rank trains on the same data; "
                "wrap the data in a DataLoader and prepare it to shard it",
            )
        if not self.model.of_kind(Kind.OPTIMIZER):
            line = self.line(self.model.backward_calls[0])
            self.plan.review(
                line,
                "parameters are updated by hand (no torch.optim optimizer): the update runs "
                "on every rank with DDP-averaged gradients; check it",
            )

    # --- 2. the Accelerator itself ---------------------------------------------------------------
    def _drop_unreachable(self, prepare_scope: Scope) -> None:
        """``self.accelerator`` exists only inside its class: nothing outside it is changed, and
        each place that would have needed it is listed for review."""
        owner = self.model.parent(self.model.parent(prepare_scope))
        plan = self.plan

        def outside(node: cst.CSTNode) -> bool:
            return not self.scopes.inside(node, owner)  # type: ignore[arg-type]

        dropped_lines = set()
        for node in [n for n in plan.replacements if outside(n)]:
            del plan.replacements[node]
            dropped_lines.add(self.line(node))
        for node in [n for n in plan.removals if outside(n)]:
            plan.removals.discard(node)
            dropped_lines.add(self.line(node))
        for inserts in (plan.before, plan.after):
            for node in [n for n in inserts if outside(n)]:
                del inserts[node]
        plan.changes = [note for note in plan.changes if note.line not in dropped_lines]
        for need in self.needs:
            if outside(need):
                plan.review(
                    self.line(need), f"left as is: {self.acc} is not reachable outside its class"
                )
        self.needs = [need for need in self.needs if not outside(need)]

    def _place_accelerator(self, prepare_scope: Scope) -> None:
        if self.acc.startswith("self."):
            self._drop_unreachable(prepare_scope)
        create = f"{self.acc} = {self.constructor.code()}"
        home = self.scopes.accelerator_home(prepare_scope, self.needs, self.acc)
        threaded = self.scopes.thread(home, self.needs, self.acc, self.plan)
        anchor = self.scopes.first_need(home, self.needs, threaded)
        if anchor is None:
            return
        used = set(self.constructor.kwargs.values())
        late = self.scopes.assigned_after(anchor, home, used)
        body = self.scopes.body_of(home)
        for name, line in late:
            hoisted = self.scopes.hoistable(body, anchor, name)
            if hoisted is not None:
                self.plan.removals.add(hoisted)
                self.plan.insert_before(anchor, hoisted.deep_clone())
                code = self.model.module.code_for_node(hoisted).strip()
                self.plan.change(line, f"moved `{code}` up before line {self.line(anchor)}")
                continue
            self.plan.review(
                line,
                f"{name} is set after the Accelerator is created; "
                f"move it before line {self.line(anchor)}",
            )
        self.plan.insert_before(anchor, statement(create))
        self.plan.change(self.line(anchor), f"created {create} before line {self.line(anchor)}")


def _calls_method(call: cst.Call, method: str) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == method


def _unscaled(receiver: cst.BaseExpression, model: ScriptModel) -> cst.BaseExpression | None:
    """``scaler.scale(loss)`` -> ``loss``."""
    if (
        isinstance(receiver, cst.Call)
        and isinstance(receiver.func, cst.Attribute)
        and receiver.func.attr.value == "scale"
        and dotted(receiver.func.value) in model.names_of(Kind.SCALER)
        and receiver.args
    ):
        return receiver.args[0].value
    return None


def _strip_moves(node: cst.CSTNode) -> cst.CSTNode:
    """``Net().to(device).train()`` -> ``Net().train()``: only the device moves go."""
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        inner = _strip_moves(node.func.value)
        if node.func.attr.value in names.DEVICE_MOVES and _is_pure_move(node):
            return inner
        if inner is not node.func.value:
            return node.with_changes(func=node.func.with_changes(value=inner))
    return node


def _is_pure_move(call: cst.Call) -> bool:
    if call.func.attr.value == "cuda":  # type: ignore[union-attr]
        return (
            all(a.keyword is not None and a.keyword.value == "non_blocking" for a in call.args)
            or len(call.args) <= 1
        )
    positional = [a for a in call.args if a.keyword is None]
    keywords = {a.keyword.value for a in call.args if a.keyword is not None}
    if keywords - {"device", "non_blocking"}:
        return False
    if len(positional) + ("device" in keywords) != 1:
        return False
    value = (
        positional[0].value
        if positional
        else next(a.value for a in call.args if a.keyword and a.keyword.value == "device")
    )
    return _looks_like_device(value)


def _looks_like_device(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.SimpleString):
        return str(node.evaluated_value).split(":")[0] in ("cuda", "cpu", "mps")
    name = dotted(node) or ""
    if name.split(".")[-1] in ("device", "dev", "rank", "local_rank", "gpu"):
        return True
    if isinstance(node, cst.Call):
        func = dotted(node.func) or ""
        return func.endswith("device")
    return isinstance(node, cst.Integer)


def _move_receiver(call: cst.Call) -> cst.BaseExpression | None:
    if (
        isinstance(call.func, cst.Attribute)
        and call.func.attr.value in names.DEVICE_MOVES
        and _is_pure_move(call)
    ):
        return call.func.value
    return None


def _batch_moves_in(node: cst.CSTNode, batch: set[str]) -> list[cst.Call]:
    found: list[cst.Call] = []

    class Moves(Visitor):
        def visit_Call(self, call: cst.Call) -> None:
            receiver = _move_receiver(call)
            if receiver is not None and root_name(receiver) in batch:
                found.append(call)

    node.visit(Moves())
    comps = _identity_comprehension_moves(node, batch)
    return found + comps


def _identity_comprehension_moves(node: cst.CSTNode, batch: set[str]) -> list[cst.Call]:
    """Moves inside ``{k: v.to(device) for k, v in batch.items()}``, whose variable is local."""
    found: list[cst.Call] = []
    if isinstance(node, cst.DictComp) and isinstance(node.value, cst.Call):
        receiver = _move_receiver(node.value)
        source = node.for_in.iter
        if (
            receiver is not None
            and isinstance(source, cst.Call)
            and isinstance(source.func, cst.Attribute)
            and root_name(source.func.value) in batch
        ):
            found.append(node.value)
    return found


def _is_identity_assignment(assign: cst.Assign, batch: set[str]) -> bool:
    """``x = x.to(device)``, ``a, b = a.to(d), b.to(d)``,
    ``batch = {k: v.to(d) for k, v in batch.items()}``: the statement does nothing else."""
    if len(assign.targets) != 1:
        return False
    target, value = assign.targets[0].target, assign.value
    if isinstance(value, cst.DictComp):
        source = value.for_in.iter
        return (
            bool(_identity_comprehension_moves(value, batch))
            and isinstance(source, cst.Call)
            and dotted(source.func.value) == dotted(target)
        )  # type: ignore[union-attr]
    if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
        if len(target.elements) != len(value.elements):
            return False
        return all(
            _move_receiver(v.value) is not None
            and dotted(_move_receiver(v.value)) == dotted(t.value)  # type: ignore[arg-type]
            if isinstance(v.value, cst.Call)
            else dotted(v.value) == dotted(t.value)
            for t, v in zip(target.elements, value.elements, strict=True)
        )
    if isinstance(value, cst.Call):
        receiver = _move_receiver(value)
        return receiver is not None and dotted(receiver) == dotted(target)
    return False


def _drop_move(updated: cst.CSTNode) -> cst.CSTNode:
    assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
    return updated.func.value


def _opens_for_writing(node: cst.BaseExpression) -> bool:
    if not isinstance(node, cst.Call) or dotted(node.func) != "open":
        return False
    mode = next(
        (a.value for a in node.args[1:2] if a.keyword is None),
        next((a.value for a in node.args if a.keyword and a.keyword.value == "mode"), None),
    )
    return isinstance(mode, cst.SimpleString) and any(c in str(mode.evaluated_value) for c in "wax")


def _is_cuda_literal(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.SimpleString) and str(node.evaluated_value).split(":")[0] == "cuda"


def _environ_rank(call: cst.Call) -> str | None:
    """``int(os.environ["LOCAL_RANK"])`` -> the Accelerator attribute that replaces it."""
    if dotted(call.func) != "int" or len(call.args) != 1:
        return None
    inner = call.args[0].value
    key = None
    if isinstance(inner, cst.Subscript) and dotted(inner.value) in ("os.environ",):
        index = inner.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            key = index.value.evaluated_value
    elif (
        isinstance(inner, cst.Call)
        and dotted(inner.func) in ("os.environ.get", "os.getenv")
        and inner.args
    ):
        first = inner.args[0].value
        if isinstance(first, cst.SimpleString):
            key = first.evaluated_value
    return {
        "LOCAL_RANK": "local_process_index",
        "RANK": "process_index",
        "WORLD_SIZE": "num_processes",
    }.get(str(key))


def _drop_sampler_argument(samplers: set[str]):
    def rewrite(updated: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(updated, cst.Call)
        kept = [
            a for a in updated.args if not (a.keyword and a.keyword.value in ("sampler", "shuffle"))
        ]
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=with_keyword(kept, "shuffle", cst.Name("True")))

    return rewrite
