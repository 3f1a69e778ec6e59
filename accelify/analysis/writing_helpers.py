"""Functions of the file that write files and do nothing else every rank needs: a
``dump_results(path, results)`` that opens the file and ``json.dump``s into it, a
``write_log(path, line)`` that appends a line, a method that ``to_csv``s its history. Known by
what they do, not by their name: a write in their body (any API `side_effects` knows, or a file
opened for writing), or a call of another such helper. Each call of one is then a write like
``json.dump(...)`` is: run on the main process only, at the call, with the writes inside left as
they are (the helper runs on one rank).

A helper qualifies only where guarding its calls changes nothing but who writes:
- it reads no rank (a file per rank, or one some ranks write: as it is);
- it returns no value and yields nothing (the other ranks would have none), has no ``global``
  or ``nonlocal``, stores into no attribute or subscript (``row[k] = v``, ``self.n = 1``),
  assigns none of its parameters, deletes nothing, and calls a mutating method
  (``append``, ``update``, ... `MUTATORS`) or ``setattr`` only on an object it binds itself:
  never on a parameter, ``self`` or a module global (``HISTORY.append(line)``: the other
  ranks read ``HISTORY`` too);
- it raises nothing, asserts nothing and exits nothing (``sys.exit``, ``os._exit``, ``exit``,
  ``quit``): the main process would stop alone and the other ranks wait on it;
- it runs no model, loader, collective, backward or accelerator, calls nothing it is handed,
  and calls no function of the file but other writing helpers; it saves no ``torch.save``
  (the saving step places its barrier), makes no directory (the other ranks may write into
  it) and draws no random numbers (the ranks' generators would drift apart); nor do the
  arguments of any call of it (`arguments_change_state`), else its writes are guarded inside
  it instead;
- every call of it in the file is a statement of its own (its result unused), and is made;
- the file reads no file back (a rank that reads what the main process writes needs a barrier
  the conversion would not place here).
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.analysis import collectives, names, side_effects
from accelify.analysis.call_graph import CallGraph
from accelify.analysis.flow import ObjectFlow
from accelify.analysis.placement import Placement
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import all_params, dotted, target_names, walk

#: Methods that change the object they are called on.
MUTATORS = frozenset(
    {"append", "extend", "insert", "update", "pop", "popitem", "clear", "add", "remove"}
    | {"setdefault", "discard", "sort", "reverse", "fill_", "zero_", "copy_"}
)
#: Call roots that draw random numbers.
_RANDOM_ROOTS = ("random.", "numpy.random.", "torch.rand", "torch.randn", "torch.randint")
#: Nodes that bind their ``target``.
BINDS = (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.NamedExpr)
#: Calls that end the process.
_EXITS = frozenset({"sys.exit", "os._exit", "builtins.exit", "builtins.quit", "os.abort"})


def writing_helpers(
    model: ScriptModel,
    placement: Placement,
    graph: CallGraph,
    flow: ObjectFlow,
    reads_files: bool,
) -> set[cst.FunctionDef]:
    """The functions of the file whose calls are writes (see the module's docstring)."""
    if reads_files:
        return set()
    candidates = _candidates(
        model,
        placement,
        flow,
        lambda f, left: (
            _calls_only(graph, f, left)
            and _called_as_statements(model, graph, f)
            and not any(
                arguments_change_state(model, graph, call, left) for call in graph.callers(f)
            )
        ),
    )
    return {f for f in candidates if _writes(model, graph, f, candidates, set())}


def writes_only(
    model: ScriptModel, placement: Placement, graph: CallGraph, flow: ObjectFlow, name: str
) -> int | None:
    """The line of the top-level function ``name`` of ``model`` (another module of the project)
    when it writes a file and does nothing else another rank needs, as for `writing_helpers`
    but whatever its callers: they are in the file that imports it. None otherwise."""
    function = next(
        (s for s in model.module.body if isinstance(s, cst.FunctionDef) and s.name.value == name),
        None,
    )
    if function is None:
        return None
    candidates = _candidates(model, placement, flow, lambda f, left: _calls_only(graph, f, left))
    if function not in candidates or not _writes(model, graph, function, candidates, set()):
        return None
    return model.line(function)


def saves_only(
    model: ScriptModel, placement: Placement, graph: CallGraph, flow: ObjectFlow, name: str
) -> bool:
    """The top-level function ``name`` of ``model`` (another module of the project) does
    nothing another rank needs, as for `writes_only`, except that it may ``torch.save`` and
    make directories: a checkpoint helper (``torch.save(state, path)``, then
    ``shutil.copyfile(path, best)``) whose caller's conversion runs each call on the main
    process between two barriers (`steps.saving`): every rank done with the step it saves
    before, no rank reading the file or writing into the folder before it is whole after."""
    function = next(
        (s for s in model.module.body if isinstance(s, cst.FunctionDef) and s.name.value == name),
        None,
    )
    if function is None:
        return False
    candidates = _candidates(
        model, placement, flow, lambda f, left: _calls_only(graph, f, left), saves=True
    )
    return function in candidates


def _candidates(
    model: ScriptModel,
    placement: Placement,
    flow: ObjectFlow,
    keep: Callable[[cst.FunctionDef, set[cst.FunctionDef]], bool],
    saves: bool = False,
) -> set[cst.FunctionDef]:
    """The functions of the file that do nothing but write (`_writes_only`), narrowed to a
    fixed point to those ``keep`` accepts among the ones left: a helper that calls another of
    the file needs that one to qualify too. ``saves``: a ``torch.save`` or a new directory
    counts as a write too (the caller places the barriers around each call)."""
    functions = [n for n in placement.all_nodes() if isinstance(n, cst.FunctionDef)]
    candidates = {f for f in functions if _writes_only(model, placement, flow, f, saves)}
    changed = True
    while changed:
        changed = False
        for function in list(candidates):
            if not keep(function, candidates):
                candidates.discard(function)
                changed = True
    return candidates


def _writes(
    model: ScriptModel,
    graph: CallGraph,
    function: cst.FunctionDef,
    helpers: set[cst.FunctionDef],
    seen: set[int],
) -> bool:
    """``function`` writes a file, itself or through another helper."""
    if id(function) in seen:
        return False
    seen.add(id(function))
    for node in walk(function.body):
        if not isinstance(node, cst.Call):
            continue
        if side_effects.opens_for_writing(node) or side_effects.once_per_run(model, node):
            if model.call_names(node) & {"builtins.input"}:
                continue
            return True
        for target in graph.targets(node):
            if target in helpers and _writes(model, graph, target, helpers, seen):
                return True
    return False


def _writes_only(
    model: ScriptModel,
    placement: Placement,
    flow: ObjectFlow,
    function: cst.FunctionDef,
    saves: bool = False,
) -> bool:
    """Nothing in ``function`` that another rank needs or must run too."""
    if function.asynchronous is not None or function.decorators:
        return False
    if model.reads_rank(function.body):
        return False  # a file per rank, or written by some ranks already: as it is
    if any(
        placement.inside(loop.node, function) and flow.reads_loader(loop) for loop in model.loops
    ):
        return False
    parameters = {p.name.value for p in all_params(function.params)} - {"self", "cls"}
    local = _locals(function) - {p.name.value for p in all_params(function.params)}
    for node in walk(function.body):
        if isinstance(node, (cst.Yield, cst.Global, cst.Nonlocal, cst.Lambda)):
            return False
        if isinstance(node, (cst.Raise, cst.Assert)):
            return False  # raised on the main process alone: the other ranks wait on it
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            return False
        if isinstance(node, cst.Return) and node.value is not None and not saves:
            return False  # (a saver's calls are statements of their own: no value is read)
        if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)):
            target = node.target
            if (
                isinstance(target, (cst.Attribute, cst.Subscript))
                or target_names(target) & parameters
            ):
                return False
            if any(isinstance(n, (cst.Attribute, cst.Subscript)) for n in walk(target)):
                return False
        if isinstance(node, cst.Del):
            return False
        if isinstance(node, cst.Call) and not _harmless_call(model, flow, node, local, saves):
            return False
        if isinstance(node, cst.Call) and dotted(node.func) in parameters:
            return False  # calls what it is handed (a model, a callback): not followed
    return True


def _harmless_call(
    model: ScriptModel, flow: ObjectFlow, call: cst.Call, local: set[str], saves: bool = False
) -> bool:
    """``call`` in a writing helper changes nothing another rank reads: no save, collective,
    directory, random draw, exit, model or accelerator, and no mutating method called on an
    object the helper did not make itself (``local``: names it binds, not its parameters).
    ``saves``: a save and a directory are harmless (barriers go around the helper's calls)."""
    qualified = model.call_names(call)
    if qualified & collectives.FUNCTIONS:
        return False
    if not saves and qualified & (names.TORCH_SAVE | names.MAKEDIRS):
        return False  # a directory the other ranks may write into too: made on every rank
    if qualified & _EXITS or dotted(call.func) in ("exit", "quit"):
        return False  # the main process stops alone: the other ranks wait on it
    if random_draw(model, call):
        return False
    if (
        not saves
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value in ("mkdir", "makedirs")
    ):
        return False  # ``Path(out).mkdir(...)``: as above
    func = dotted(call.func) or ""
    if "accelerator" in func or func.endswith(".backward") or flow.is_model_name(func, call):
        return False
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in MUTATORS:
        receiver = call.func.value
        root = receiver
        while isinstance(root, (cst.Attribute, cst.Subscript)):
            root = root.value
        if not (isinstance(root, cst.Name) and root.value in local):
            return False  # a parameter, ``self`` or a module global: another rank reads it
    return dotted(call.func) not in ("setattr", "delattr")


def arguments_change_state(
    model: ScriptModel, graph: CallGraph, call: cst.Call, helpers: set[cst.FunctionDef]
) -> bool:
    """``record(path, history.pop())``, ``log(path, next(it))``, ``log(path, torch.rand(1))``,
    ``log(path, step())``: an argument of ``call`` that changes an object every rank reads
    on, draws from a random generator, or calls a function of the file that is not one of
    ``helpers``: guarded, only the main process would."""
    for argument in call.args:
        for node in walk(argument.value):
            if not isinstance(node, cst.Call):
                continue
            if dotted(node.func) in ("next", "setattr", "delattr") or random_draw(model, node):
                return True
            if isinstance(node.func, cst.Attribute) and node.func.attr.value in MUTATORS:
                return True
            targets = graph.targets(node)
            if targets and not all(t in helpers for t in targets):
                return True
    return False


def random_draw(model: ScriptModel, call: cst.Call) -> bool:
    """``call`` draws from a random generator (``torch.rand(1)``, ``random.random()``)."""
    return any(q.startswith(_RANDOM_ROOTS) for q in model.call_names(call))


def _locals(function: cst.FunctionDef) -> set[str]:
    """Names ``function`` binds in its body: assignments, loop, ``with`` and comprehension
    targets, walruses."""
    found: set[str] = set()
    for node in walk(function.body):
        if isinstance(node, BINDS):
            found |= target_names(node.target)
        elif isinstance(node, cst.WithItem) and node.asname is not None:
            found |= target_names(node.asname.name)
    return found


def _calls_only(graph: CallGraph, function: cst.FunctionDef, helpers: set[cst.FunctionDef]) -> bool:
    """Every call in ``function`` of a function of the file runs a writing helper."""
    for node in walk(function.body):
        if isinstance(node, cst.Call):
            targets = graph.targets(node)
            if targets and not all(t in helpers for t in targets):
                return False
    return True


def _called_as_statements(model: ScriptModel, graph: CallGraph, function: cst.FunctionDef) -> bool:
    """``function`` is called in the file, only by calls that are statements of their own
    (``dump_results(path, results)``), and is not handed on by name (``callbacks =
    [write_log]``) where its calls cannot be seen. Every mention of its name counts, but
    that of an attribute of an imported module (``json.dump`` beside a top-level ``def
    dump``), which names another function."""
    calls = graph.callers(function)
    if not calls or graph.uncertain_callers(function):
        return False
    for call in calls:
        expression = model.parent(call)
        line = model.parent(expression) if isinstance(expression, cst.Expr) else None
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            return False
    name = function.name.value
    method = any(isinstance(a, cst.ClassDef) for a in model.ancestors(function))
    mentions = [
        n
        for n in walk(model.module)
        if (
            isinstance(n, cst.Name)
            and n.value == name
            and not (isinstance(p := model.parent(n), cst.Attribute) and p.attr is n)
        )
        or (
            isinstance(n, cst.Attribute)
            and n.attr.value == name
            and (method or _root_name(n) not in model.imports.bound)
        )
    ]
    called = {id(c.func) for c in calls} | {
        id(c.func.attr) for c in calls if isinstance(c.func, cst.Attribute)
    }
    return all(
        id(n) in called or n is function.name or id(model.parent(n)) in called for n in mentions
    )


def _root_name(node: cst.Attribute) -> str | None:
    """``json`` for ``json.dump``: an attribute of an imported module is never a function of
    the file (``def dump`` beside ``json.dump``)."""
    root: cst.BaseExpression = node
    while isinstance(root, cst.Attribute):
        root = root.value
    return root.value if isinstance(root, cst.Name) else None


#: What shows text on the terminal: a ``print``, or a write or flush of ``sys.stdout`` or
#: ``sys.stderr`` (a progress bar drawn by hand).
_TERMINAL = frozenset(
    {"builtins.print"}
    | {f"sys.{stream}.{method}" for stream in ("stdout", "stderr") for method in ("write", "flush")}
)


def prints_only(
    model: ScriptModel, placement: Placement, graph: CallGraph, flow: ObjectFlow, name: str
) -> int | None:
    """The line of the top-level function ``name`` of ``model`` (another module of the
    project) when all it does is show text on the terminal (`_TERMINAL`): a ``log(msg)`` that
    prints, kuangliu's ``progress_bar(current, total, msg)`` that draws its bar with
    ``sys.stdout.write``. Its callers' conversion runs each call on the local main process, as
    ``accelerator.print`` would print (before, every rank drew the bar: each line shown N
    times). As `writes_only` asks of a writer (nothing another rank reads, returns, raises,
    saves, collectives, models, random draws, mutations of what it did not make), except that
    it may keep timings in module globals of its own (``global last_time``): names it declares
    ``global`` that no other function of the module reads or writes, so the ranks that skip
    it miss nothing. None otherwise."""
    function = next(
        (s for s in model.module.body if isinstance(s, cst.FunctionDef) and s.name.value == name),
        None,
    )
    if function is None or function.asynchronous is not None or function.decorators:
        return None
    if model.reads_rank(function.body):
        return None
    own_globals = _own_globals(model, function)
    if own_globals is None:
        return None
    state = module_state(model, function)
    if state is None:
        return None
    parameters = {p.name.value for p in all_params(function.params)} - {"self", "cls"}
    local = (_locals(function) - parameters) | own_globals | state
    shows = False
    for node in walk(function.body):
        if isinstance(node, (cst.Yield, cst.Nonlocal, cst.Lambda, cst.Raise, cst.Assert)):
            return None
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Del)):
            return None
        if isinstance(node, cst.Return) and node.value is not None:
            return None
        # a parameter bound anew (``msg = "".join(L)``) changes no caller's object
        if (
            isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign))
            and any(isinstance(n, (cst.Attribute, cst.Subscript)) for n in walk(node.target))
            and _root_of(node.target) not in state
        ):
            return None
        if not isinstance(node, cst.Call):
            continue
        if model.call_names(node) & _TERMINAL:
            shows = True
            continue
        if graph.targets(node) or dotted(node.func) in parameters:
            return None  # a function of the module, or one it is handed: not followed
        if side_effects.opens_for_writing(node) or side_effects.once_per_run(model, node):
            return None
        if not _harmless_call(model, flow, node, local):
            return None
    return model.line(function) if shows else None


def _root_of(target: cst.BaseExpression) -> str | None:
    while isinstance(target, (cst.Attribute, cst.Subscript)):
        target = target.value
    return target.value if isinstance(target, cst.Name) else None


def module_state(model: ScriptModel, function: cst.FunctionDef) -> set[str] | None:
    """Module-level objects ``function`` updates in place (``_state["n"] += 1`` of ``_state =
    {"n": 0}``): a counter only it keeps. None when another function of the module mentions
    one, or the module binds it more than once: then what it updates is read elsewhere, and
    the ranks that skip the call would read another value. The modules that import the helper
    check that they do not read it (`convert.project.imported_printers`)."""
    state: set[str] = set()
    for node in walk(function.body):
        if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)) and isinstance(
            node.target, (cst.Attribute, cst.Subscript)
        ):
            root = _root_of(node.target)
            if root is None:
                return None
            state.add(root)
    for name in state:
        top = [
            s
            for s in model.module.body
            if isinstance(s, cst.SimpleStatementLine)
            and isinstance(s.body[0], cst.Assign)
            and any(dotted(t.target) == name for t in s.body[0].targets)
        ]
        if len(top) != 1 or name in _locals(function):
            return None
    for other in walk(model.module):
        if not isinstance(other, cst.FunctionDef) or other is function:
            continue
        if any(isinstance(n, cst.Name) and n.value in state for n in walk(other)):
            return None
    return state


def _own_globals(model: ScriptModel, function: cst.FunctionDef) -> set[str] | None:
    """The names ``function`` declares ``global``, when no other function of the module
    mentions them (its top level may bind their first values); None when another does."""
    declared = {
        name.name.value
        for node in walk(function.body)
        if isinstance(node, cst.Global)
        for name in node.names
    }
    if not declared:
        return set()
    for other in walk(model.module):
        if not isinstance(other, cst.FunctionDef) or other is function:
            continue
        if any(isinstance(n, cst.Name) and n.value in declared for n in walk(other)):
            return None
    return declared
