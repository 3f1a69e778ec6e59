"""The rewrites `accelify convert` and `accelify lint --fix` share, each written once: a convert
step calls one for each site it converts, a rule's fix for its one finding. Each returns plain
edits (`accelify.edits.kinds`) for a `Plan` to compose; what is rewritten where is the caller's
decision, made on the analysis."""

from __future__ import annotations

from collections.abc import Collection, Iterable

import libcst as cst

from accelify.analysis.syntax import dotted
from accelify.edits.code import expression, statement, with_keyword
from accelify.edits.kinds import Edit, Guard, InsertAfter, InsertBefore, Remove, Replace, Wrap
from accelify.edits.node_rewrites import (
    CallInstead,
    MethodInstead,
    MovedTo,
    OnDeviceAndBack,
    OnHostFirst,
    PrintInsteadOfWrite,
    Receiver,
    SentTo,
    StateOf,
    Swap,
    ThroughForward,
    WithKeyword,
    WithoutArgument,
    Wrapped,
)

#: The parameters of the Accelerator's clipping methods, in order.
CLIP_PARAMETERS = {
    "clip_grad_norm_": ("parameters", "max_norm", "norm_type"),
    "clip_grad_value_": ("parameters", "clip_value"),
}


def backward(
    call: cst.Call, acc: str, *, keep_scaling: bool = True, scalers: Collection[str] = ()
) -> Replace:
    """``loss.backward(...)`` -> ``acc.backward(loss, ...)``. A ``scaler.scale(loss)`` receiver
    (``scaler`` one of ``scalers``) keeps its scaling unless ``keep_scaling`` is False: convert
    drops it when the precision moved to the Accelerator (which scales fp16 losses itself), and
    keeps it when the script's AMP stays as written, as a lint fix does."""
    unscale = not keep_scaling and scaled_loss(call, scalers) is not None
    return Replace(call, CallInstead(f"{acc}.backward", receiver_first=True, unscale=unscale))


def backward_loss(
    call: cst.Call, *, keep_scaling: bool = True, scalers: Collection[str] = ()
) -> cst.BaseExpression:
    """The loss `backward` passes to ``acc.backward``."""
    receiver = call.func.value  # type: ignore[attr-defined]
    scaled = None if keep_scaling else scaled_loss(call, scalers)
    return scaled if scaled is not None else receiver


def scaled_loss(call: cst.Call, scalers: Collection[str]) -> cst.BaseExpression | None:
    """``loss`` of ``scaler.scale(loss).backward()``."""
    receiver = call.func.value  # type: ignore[attr-defined]
    if (
        isinstance(receiver, cst.Call)
        and isinstance(receiver.func, cst.Attribute)
        and receiver.func.attr.value == "scale"
        and dotted(receiver.func.value) in scalers
        and receiver.args
    ):
        return receiver.args[0].value
    return None


def clip_grad(call: cst.Call, acc: str, method: str) -> Replace | None:
    """``torch.nn.utils.clip_grad_norm_(...)`` -> ``acc.clip_grad_norm_(...)`` (and
    ``clip_grad_value_``): the Accelerator's unscale fp16 gradients first and clip what each
    backend holds. ``foreach=`` (a speed choice) goes; None when the call passes what the
    Accelerator's method does not take (`unaccepted_clip_argument`)."""
    if unaccepted_clip_argument(call, method) is not None:
        return None
    return Replace(call, CallInstead(f"{acc}.{method}", dropped=("foreach",)))


def unaccepted_clip_argument(call: cst.Call, method: str) -> str | None:
    """The first argument the Accelerator's ``method`` would not take, as written."""
    accepted = CLIP_PARAMETERS[method]
    for index, argument in enumerate(call.args):
        if argument.star:
            return f"{argument.star}{cst.Module([]).code_for_node(argument.value)}"
        if argument.keyword is not None and argument.keyword.value == "foreach":
            continue
        if argument.keyword is not None and argument.keyword.value not in accepted:
            return f"{argument.keyword.value}="
        if argument.keyword is None and index >= len(accepted):
            return f"argument {index + 1}"
    return None


def print_once(call: cst.Call, acc: str) -> Replace:
    """``print(...)`` -> ``acc.print(...)``: printed by the local main process only."""
    return Replace(call, CallInstead(f"{acc}.print"))


def stream_write_once(call: cst.Call, acc: str, stream: str) -> Replace:
    """``sys.stdout.write(s)`` -> ``acc.print(s, end="")`` (``sys.stderr`` passed on as its
    ``file``): written by the local main process only, as a print is."""
    function = f"{acc}.print"
    return Replace(call, PrintInsteadOfWrite(function, None if stream == "sys.stdout" else stream))


def save(call: cst.Call, acc: str, barriers: Iterable[cst.CSTNode] = ()) -> list[Edit]:
    """``torch.save(...)`` -> ``acc.save(...)`` (written by the main process), with
    ``acc.wait_for_everyone()`` before each of ``barriers``: the places every rank reaches
    before the save (`Ranks.barrier_places`), so no rank reads the file before it is whole."""
    return [Replace(call, CallInstead(f"{acc}.save")), *(barrier(b, acc) for b in barriers)]


def barrier(anchor: cst.CSTNode, acc: str) -> InsertBefore:
    """``acc.wait_for_everyone()`` before ``anchor``, a statement every rank reaches."""
    return InsertBefore(anchor, statement(f"{acc}.wait_for_everyone()"))


def barrier_after(anchor: cst.CSTNode, acc: str) -> InsertAfter:
    """``acc.wait_for_everyone()`` after ``anchor``: the others wait for what it did."""
    return InsertAfter(anchor, statement(f"{acc}.wait_for_everyone()"))


def gathered_state(acc: str) -> StateOf:
    """``obj.state_dict()`` -> ``acc.get_state_dict(obj)``: the whole state of a model (its
    unwrapped model's) or of an optimizer (in torch's one-process format), gathered for the
    main process under FSDP and ZeRO-3 (a collective there, so only where every rank runs it).
    Convert's saving steps (a model's and an optimizer's saved state) and ACC503's fix write
    this same edit."""
    return StateOf(f"{acc}.get_state_dict")


def full_state(state: cst.Call, acc: str) -> Replace:
    """``obj.state_dict()`` (``state``, a model's or an optimizer's) ->
    ``acc.get_state_dict(obj)``: see `gathered_state`."""
    return Replace(state, gathered_state(acc))


def unwrap(model: cst.CSTNode, acc: str) -> Replace:
    """``model`` -> ``acc.unwrap_model(model)``: the model itself, not its DDP wrapper."""
    return Replace(model, Wrapped(f"{acc}.unwrap_model"))


#: The function a conversion adds to a file whose training step calls a method of a prepared
#: model (``loss = model.training_step(batch)``) that runs the model's forward (``self(x)``):
#: DDP averages the gradients of the forward its wrapper runs, and of nothing else, so the method
#: runs as the wrapper's forward (DDP's own advice; PyTorch Lightning routes its
#: ``training_step`` the same way). On one process, and under a wrapper that is the model itself
#: (FSDP2), the method is called as it was. Plain PyTorch: it runs on accelify's runtime and on
#: Hugging Face Accelerate alike. A forward the model's instance already holds (mixed precision's
#: autocast wrapper, which both runtimes set there at prepare) is put back before the method
#: runs, so its ``self(x)`` runs under autocast as on one process, and stays for later calls.
THROUGH_FORWARD = '''\
def {name}(accelerator, model, method, /, *args, **kwargs):
    """model.<method>(...) run as the forward of the prepared model: DDP averages the
    gradients of the forward it runs itself, and of no other method (accelify convert)."""
    inner = accelerator.unwrap_model(model)
    if inner is model:
        return getattr(model, method)(*args, **kwargs)
    own = inner.__dict__.get("forward")  # mixed precision's autocast forward, if set

    def put_back():
        if own is None:
            inner.__dict__.pop("forward", None)
        else:
            inner.forward = own

    def forward(*args, **kwargs):
        put_back()  # the method's own self(x) runs the model's forward
        return getattr(inner, method)(*args, **kwargs)

    inner.forward = forward
    try:
        return model(*args, **kwargs)
    finally:
        put_back()
'''


def through_forward(call: cst.Call, helper: str, acc: str) -> Replace:
    """``model.training_step(batch)`` -> ``helper(acc, model, "training_step", batch)``: the
    method runs as the prepared model's forward (`THROUGH_FORWARD`, defined as ``helper``)."""
    return Replace(call, ThroughForward(helper, acc))


def through_forward_helper(name: str) -> cst.BaseStatement:
    """The definition of `THROUGH_FORWARD` under ``name``."""
    return statement(THROUGH_FORWARD.format(name=name))


def unwrap_module(attribute: cst.Attribute, acc: str) -> Replace:
    """``model.module`` (a DataParallel's inner model) -> ``acc.unwrap_model(model)``, which
    is the model whether or not it was wrapped."""
    return Replace(attribute, Wrapped(f"{acc}.unwrap_model", owner=True))


def use_device(node: cst.CSTNode, acc: str, *, as_string: bool = False) -> Replace:
    """A device (``torch.device("cuda:0")``, ``"cuda"``) -> ``acc.device``, this rank's; a string
    the script reads as one stays one (``str(acc.device)``)."""
    device = f"{acc}.device"
    return Replace(node, Swap(f"str({device})" if as_string else device))


def cuda_to_device(call: cst.Call, acc: str) -> Replace:
    """A ``.cuda()`` that stays -> ``.to(acc.device)``: this rank's GPU, or the CPU."""
    return Replace(call, MethodInstead("to", (f"{acc}.device",)))


def drop_move(call: cst.Call) -> Replace:
    """``x.to(device)`` -> ``x``: prepare already placed it."""
    return Replace(call, Receiver())


def numpy_from_host(call: cst.Call) -> Replace:
    """``x.numpy()`` -> ``x.cpu().numpy()``: ``x`` now arrives on the accelerator's device."""
    return Replace(call, OnHostFirst())


def on_model_device(
    call: cst.Call, device: str, inputs: Iterable[int], *, back: bool = True
) -> Replace:
    """A CPU-only script's ``model(x)`` on a tensor no prepared loader moved: ``x`` goes to
    the device prepare put the model on, the output comes back to the CPU (not with ``back``
    False: another prepared model takes it there)."""
    return Replace(call, OnDeviceAndBack(device, tuple(inputs), back))


def on_model_device_in_parts(
    call: cst.Call, device: str, inputs: Iterable[int], *, back: bool = True
) -> tuple[Edit, ...]:
    """`on_model_device` as edits of the inputs where they stand and a wrap of the call, for a
    call another rewrite replaces (``model.predict(x)`` run as the wrapper's forward,
    `through_forward`): a second replacement of the call would be refused, and the method would
    stay on the DDP wrapper, which has no such attribute."""
    sent: list[Edit] = [Replace(call.args[i].value, SentTo(device)) for i in inputs]
    return (*sent, Wrap(call, SentTo('"cpu"'))) if back else tuple(sent)


def back_on_host(value: cst.BaseExpression) -> Replace:
    """``lengths`` -> ``send_to_device(lengths, "cpu")``: a value an API takes on the host only
    (``pack_padded_sequence``'s lengths) that a prepared loader may hand over on the device; a
    list of ints, which ``.cpu()`` would not take, is handed back as it is."""
    return Replace(value, SentTo('"cpu"'))


def made_on_device(call: cst.Call, device: str) -> Replace:
    """``torch.randn(b, z)`` -> ``torch.randn(b, z, device=device)``."""
    return Replace(call, WithKeyword("device", device))


def made_then_moved(call: cst.Call, device: str) -> Replace:
    """``torch.randn(64, nz, generator=g)`` -> ``torch.randn(64, nz, generator=g).to(device)``:
    drawn where the original drew it, so its values and the generator's (or the global RNG's)
    stream stay the original's; a CPU generator with ``device="cuda"`` would raise."""
    return Replace(call, MovedTo(device))


def drop_device_argument(call: cst.Call, index: int) -> Replace:
    """``x.to("cuda:0", dtype=...)`` -> ``x.to(dtype=...)``: only the move goes."""
    return Replace(call, WithoutArgument(index))


def drop_statement(statement_node: cst.CSTNode) -> Remove:
    """A statement left doing nothing once its move goes (``x = x``, ``model.to(device)``)."""
    return Remove(statement_node)


def local_main_process_only(statement_node: cst.CSTNode, acc: str) -> Guard:
    """``statement`` under ``if acc.is_local_main_process:``, where ``accelerator.print`` prints
    (a print through ``functools.partial``, whose bound arguments a replacement would drop)."""
    return Guard(statement_node, f"{acc}.is_local_main_process")


def main_process_only(statement_node: cst.CSTNode, acc: str) -> Guard:
    """``statement`` runs under ``if acc.is_main_process:``; consecutive ones share the ``if``."""
    return Guard(statement_node, f"{acc}.is_main_process")


def average_gradients(after: cst.CSTNode, module: str, acc: str, param: str) -> InsertAfter:
    """After a backward through a model no wrapper synchronises (one that trains itself, in its
    own method): each gradient of ``module`` becomes its mean over the ranks, as DDP makes it,
    before the optimizer reads it. On one process the mean is the gradient itself."""
    code = (
        f"for {param} in {module}.parameters():\n"
        f"    if {param}.grad is not None:\n"
        f'        {param}.grad = {acc}.reduce({param}.grad, "mean")\n'
    )
    return InsertAfter(after, statement(code))


def start_alike(created: cst.CSTNode, model: str, acc: str, *, move: bool) -> list[InsertAfter]:
    """After ``model`` is made: on this rank's device (``move``), and with rank 0's weights and
    buffers on every rank, which is what DDP does when it wraps a model; a model that is not
    wrapped (one that trains itself) needs both said."""
    edits = [InsertAfter(created, statement(f"{model}.to({acc}.device)"))] if move else []
    edits.append(InsertAfter(created, statement(f"broadcast({model}.state_dict())")))
    return edits


def use_gather_for_metrics(gather: cst.Call) -> Replace:
    """``acc.gather(x)`` -> ``acc.gather_for_metrics(x)``, which drops the samples repeated to
    even out the last batch."""
    return Replace(gather.func.attr, Swap("gather_for_metrics"))  # type: ignore[attr-defined]


def step_per_process(statement_node: cst.CSTNode, acc: str) -> Replace:
    """``scheduler.step()`` -> ``for _ in range(acc.num_processes): scheduler.step()``: an
    unprepared scheduler stepped per batch of a sharded loader, where one rank's batch stands
    for ``num_processes`` of the original's, steps as often as the original per epoch."""
    header = cst.parse_statement(f"for _ in range({acc}.num_processes):\n    pass\n")

    def repeat(node: cst.CSTNode) -> cst.CSTNode:
        inner = node.with_changes(leading_lines=())  # type: ignore[attr-defined]
        return header.with_changes(  # type: ignore[attr-defined]
            body=cst.IndentedBlock([inner]),
            leading_lines=node.leading_lines,  # type: ignore[attr-defined]
        )

    return Replace(statement_node, repeat)


def makedirs_exist_ok(race: cst.CSTNode, call: cst.Call) -> Replace | None:
    """``os.makedirs(d)`` / ``os.mkdir(d)`` that every rank runs, bare or as the whole ``if not
    os.path.exists(d):`` around it (``race``) -> ``os.makedirs(d, exist_ok=True)``: the ranks
    start together, and the one that comes second fails with FileExistsError (the check races
    too). None where the call is not spelled ``module.makedirs`` (a bare ``makedirs`` imported
    from os): the caller says what to write. Convert's side-effects step and ACC211's fix."""
    func = dotted(call.func) or ""
    if "." not in func or not func.endswith(("makedirs", "mkdir")):
        return None
    makedirs = expression(func.rsplit(".", 1)[0] + ".makedirs")

    def exist_ok(made: cst.Call) -> cst.Call:
        return made.with_changes(
            func=makedirs, args=with_keyword(made.args, "exist_ok", cst.Name("True"))
        )

    if isinstance(race, cst.If):
        return Replace(
            race,
            lambda updated: cst.SimpleStatementLine(
                [cst.Expr(exist_ok(call))],
                leading_lines=updated.leading_lines,  # type: ignore[attr-defined]
            ),
        )
    return Replace(call, lambda updated: exist_ok(updated))  # type: ignore[arg-type]


def whole_run_sum(anchor: cst.CSTNode, total: str, acc: str) -> InsertBefore:
    """``total = sum(gather_object([total])) / acc.num_processes`` before ``anchor``: a sum
    each rank folded from its own batches becomes the mean of the ranks' sums, so the batch
    mean shown after it (``total / len(loader)``, every rank with as many batches) is the whole
    run's. Python floats (float64, on no device); on one process ``sum([total]) / 1`` is
    ``total`` itself, to the last digit. A collective: ``anchor`` is one every rank reaches."""
    return InsertBefore(
        anchor, statement(f"{total} = sum(gather_object([{total}])) / {acc}.num_processes")
    )
