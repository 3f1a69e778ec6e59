from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names, side_effects
from accelify.analysis.collectives import (
    backends_in_view,
    collective_backends,
    named,
    runtime_of,
)
from accelify.analysis.facts import facts_of
from accelify.analysis.rank_only_names import (
    names_tracker,
    tested_for_run,
    tracker_calls_without_a_run,
)
from accelify.analysis.repeated_effects import run_by_every_rank
from accelify.analysis.script_model import Binding, Kind, ScriptModel
from accelify.analysis.syntax import dotted, keyword_value, walk
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_at

_HUB = "from huggingface_hub import HfApi, create_repo, upload_folder\n"
#: A training script that logs to Weights & Biases itself (not through ``init_trackers``).
_WANDB = (
    "import torch\nimport wandb\n"
    "model = torch.nn.Linear(2, 2)\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "model, optimizer = accelerator.prepare(model, optimizer)\n"
)

_MLFLOW = _WANDB.replace("import wandb", "import mlflow")

#: A script whose Accelerator starts the wandb run through ``init_trackers``.
_LOGGING_WITH = (
    "import torch\nimport wandb\nfrom accelerate import Accelerator\n"
    "from accelerate.utils import LoggerType\n\n\n"
    "def main(args):\n"
    "    accelerator = Accelerator(log_with={log_with})\n"
    "    model = accelerator.prepare(torch.nn.Linear(2, 2))\n"
    "    accelerator.init_trackers('p', config=vars(args))\n"
    "    for x in range(3):\n"
    "        loss = model(torch.ones(2)).sum()\n"
    "        accelerator.backward(loss)\n"
)


class UploadOnEveryRank(Rule):
    """An upload to the Hugging Face Hub (``upload_folder``, ``upload_file``, ``push_to_hub``,
    ``create_commit``, ``create_repo`` without ``exist_ok=True``) run by every rank: N processes
    push the same folder to one repo at once. The commits race (the Hub refuses all but one
    whose parent moved, so ranks crash at the end of a finished run) or land N times, and
    ``create_repo`` fails on every rank but the first. A Trainer's ``push_to_hub`` uploads from
    the main process by itself and is not reported.

    The same for a run on an experiment tracker: ``wandb.init(...)`` (``mlflow.start_run``,
    ``comet_ml.Experiment``, ``neptune.init_run``, ``aim.Run``) run by every rank of a script
    that prepares (unless ``accelerator.init_trackers`` starts that tracker's run: the
    Accelerator's ``log_with`` names it) makes N runs of one experiment, each with one rank's
    values; and mlflow's module-level logging (``mlflow.log_metric``) run by every rank, which
    starts a run on each rank that has none (not under a test of ``mlflow.active_run()``)."""

    code = "ACC207"
    name = "upload-on-every-rank"
    message = (
        "Upload from the main process only (under `if accelerator.is_main_process:`): every rank "
        "runs this, and N uploads race on the same repo"
    )
    why = "Every rank pushing the same folder makes N racing commits to one repo."
    bad = (
        Example(
            HEADER + _HUB + "upload_folder(repo_id=repo, folder_path='out')\n",
            4,
            1,
        ),
        Example(HEADER + "model.push_to_hub('me/model')\n", 3, 1),
        Example(
            HEADER + _HUB + "api = HfApi()\n\n\ndef finish(path):\n"
            "    api.upload_folder(repo_id='me/run', folder_path=path)\n\n\nfinish('out')\n",
            8,
            5,
        ),
        Example(HEADER + _HUB + "create_repo('me/run', private=True)\n", 4, 1),
        # a run started on the tracker by every rank: N runs of one experiment
        Example(HEADER + _WANDB + "wandb.init(project='p', config={'lr': 0.1})\n", 8, 1),
        Example(
            HEADER + _WANDB + "\n\ndef main():\n    run = wandb.init(project='p')\n"
            "    run.log({'loss': 1.0})\n\n\nmain()\n",
            11,
            11,
        ),
        # mlflow's, comet's, neptune's runs started by every rank: N runs of one experiment
        Example(HEADER + _MLFLOW + "mlflow.start_run(run_name='r')\n", 8, 1),
        Example(HEADER + _WANDB + "import comet_ml\nexp = comet_ml.Experiment()\n", 9, 7),
        Example(HEADER + _WANDB + "import neptune\nrun = neptune.init_run()\n", 9, 7),
        # init_trackers starts the tensorboard run log_with names: mlflow's is the script's own,
        # started by every rank (its logging, in that run, is no second finding)
        Example(
            _LOGGING_WITH.format(log_with="'tensorboard'").replace("import wandb", "import mlflow")
            + "        with mlflow.start_run():\n"
            + "            mlflow.log_metric('loss', loss.item())\n",
            14,
            14,
        ),
        Example(  # no log_with: init_trackers starts no run at all
            HEADER + _WANDB + "accelerator.init_trackers('p')\nwandb.init(project='p')\n",
            9,
            1,
        ),
        # mlflow's logging by every rank, the run started on the main process only (or not at
        # all): mlflow starts a run on each rank that has none
        Example(
            HEADER
            + _MLFLOW
            + "if accelerator.is_main_process:\n    mlflow.start_run()\n"
            + "mlflow.log_metric('loss', 1.0)\n",
            10,
            1,
        ),
        Example(
            HEADER + _MLFLOW + "\n\ndef report(value):\n    mlflow.log_metrics({'loss': value})"
            "\n\n\nreport(1.0)\n",
            11,
            5,
        ),
        # the run started on the main process only, logged to by every rank: wandb.Error
        Example(
            HEADER
            + _WANDB
            + "if accelerator.is_main_process:\n    wandb.init(project='p')\n"
            + "wandb.log({'loss': 1.0})\n",
            10,
            1,
        ),
        Example(  # the same through helpers: one called on the main process, one by all
            HEADER + _WANDB + "\n\ndef start():\n    wandb.init(project='p')\n\n\n"
            "def report(metrics):\n    wandb.log(metrics)\n\n\n"
            "if accelerator.is_main_process:\n    start()\nreport({'loss': 1.0})\n",
            15,
            5,
        ),
        # the run started by the Accelerator's init_trackers, which Accelerate (and accelify's
        # runtime) runs on the main process only, logged to by every rank
        Example(
            _LOGGING_WITH.format(log_with="'wandb'") + "    wandb.log({'loss': loss.item()})\n",
            14,
            5,
        ),
        Example(  # a list naming it, and a helper every rank calls
            _LOGGING_WITH.format(log_with="['tensorboard', 'wandb']")
            + "    report(loss.item())\n\n\ndef report(value):\n    wandb.log({'loss': value})\n",
            18,
            5,
        ),
        Example(  # LoggerType.WANDB in a factory; the value gathered inside the call
            _LOGGING_WITH.format(log_with="LoggerType.WANDB").replace(
                "accelerator = Accelerator(log_with=LoggerType.WANDB)", "accelerator = make()"
            )
            + "    wandb.log({'loss': accelerator.gather(loss).mean().item()})\n\n\n"
            + "def make():\n    return Accelerator(log_with=LoggerType.WANDB)\n",
            14,
            5,
        ),
    )
    good = (
        # init_trackers with wandb: the log under the rank test, testing wandb.run, through
        # accelerator.log; above init_trackers (no run on any rank: not this rule's)
        _LOGGING_WITH.format(log_with="'wandb'")
        + "    if accelerator.is_main_process:\n        wandb.log({'loss': loss.item()})\n"
        + "    if wandb.run is not None:\n        wandb.log({'loss': loss.item()})\n"
        + "    accelerator.log({'loss': loss.item()})\n",
        _LOGGING_WITH.format(log_with="'wandb'").replace(
            "    accelerator.init_trackers",
            "    wandb.log({'start': 1})\n    accelerator.init_trackers",
        ),
        # log_with not certainly wandb (a flag, "all", tensorboard); the other ranks' disabled
        # runs started by the script beside init_trackers
        _LOGGING_WITH.format(log_with="args.report_to") + "    wandb.log({'loss': loss.item()})\n",
        _LOGGING_WITH.format(log_with="'all'") + "    wandb.log({'loss': loss.item()})\n",
        _LOGGING_WITH.format(log_with="'wandb' if args.wandb else None")
        + "    wandb.log({'loss': loss.item()})\n",
        _LOGGING_WITH.format(log_with="'wandb'")
        + "    if not accelerator.is_main_process:\n        wandb.init(mode='disabled')\n"
        + "    wandb.log({'loss': loss.item()})\n",
        # the other ranks start a disabled run, in the else or under the opposite test; the
        # log tests for a run, catches wandb's error, or runs under the rank test
        HEADER
        + _WANDB
        + "if accelerator.is_main_process:\n    wandb.init(project='p')\n"
        + "else:\n    wandb.init(mode='disabled')\nwandb.log({'loss': 1.0})\n",
        HEADER
        + _WANDB
        + "if accelerator.is_main_process:\n    wandb.init(project='p')\n"
        + "if not accelerator.is_main_process:\n    wandb.init(mode='disabled')\n"
        + "wandb.log({'loss': 1.0})\n",
        HEADER
        + _WANDB
        + "if accelerator.is_main_process:\n    wandb.init(project='p')\n"
        + "if wandb.run is not None:\n    wandb.log({'loss': 1.0})\n"
        + "try:\n    wandb.log({'loss': 1.0})\nexcept wandb.Error:\n    pass\n"
        + "accelerator.is_main_process and wandb.log({'loss': 1.0})\n",
        # HF Trainer: save_model calls the class's own push_to_hub, which returns on all ranks
        # but the main one
        HEADER
        + _HUB
        + "class Trainer:\n"
        + "    def train(self):\n"
        + "        accelerator.wait_for_everyone()\n"
        + "        self.save_model('out')\n\n"
        + "    def save_model(self, output_dir):\n"
        + "        self.push_to_hub(commit_message='Model save')\n\n"
        + "    def push_to_hub(self, commit_message):\n"
        + "        if not accelerator.is_main_process:\n"
        + "            return\n"
        + "        upload_folder(repo_id='me/run', folder_path='out')\n",
        HEADER
        + _HUB
        + "if accelerator.is_main_process:\n"
        + "    upload_folder(repo_id=repo, folder_path='out')\n",
        HEADER + _HUB + "create_repo('me/run', exist_ok=True)\n",
        HEADER
        + _HUB
        + "def finish(path):\n    upload_folder(repo_id='me/run', folder_path=path)\n\n\n"
        + "if accelerator.is_main_process:\n    finish('out')\n",
        HEADER + "trainer.push_to_hub()\n",
        # the run started on the main process only, or by the Accelerator's trackers
        HEADER
        + _WANDB
        + "if accelerator.is_main_process:\n    wandb.init(project='p')\n"
        + "    wandb.log({'loss': 1.0})\n",
        HEADER.replace("Accelerator()", "Accelerator(log_with='wandb')")
        + _WANDB
        + "accelerator.init_trackers('p')\nrun = wandb.init(project='p', reinit=False)\n",
        # mlflow's logging only where a run is active
        HEADER
        + _MLFLOW
        + "if accelerator.is_main_process:\n    mlflow.start_run()\n"
        + "if mlflow.active_run() is not None:\n    mlflow.log_metric('loss', 1.0)\n",
        # the other ranks' runs disabled
        HEADER
        + _WANDB
        + "wandb.init(project='p', mode='online' if accelerator.is_main_process else 'disabled')\n",
        # mlflow's run and its logging on the main process only; a script that never prepares
        HEADER
        + _MLFLOW
        + "if accelerator.is_main_process:\n    with mlflow.start_run():\n"
        + "        mlflow.log_metric('loss', 1.0)\n",
        HEADER
        + _MLFLOW
        + "\n\n@accelerator.on_main_process\ndef report(value):\n"
        + "    mlflow.log_metrics({'loss': value})\n\n\nreport(1.0)\n",
        HEADER + "import mlflow\nmlflow.start_run()\nmlflow.log_metric('loss', 1.0)\n",
        # a script that never prepares: one process
        HEADER + "import wandb\nwandb.init(project='p')\n",
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
        yield from self._uploads(script)
        yield from self._tracker_runs(script)
        yield from self._logs_without_a_run(script)

    def _logs_without_a_run(self, script: ScriptModel) -> Iterator[Finding]:
        """``wandb.log(...)`` run by every rank where only the main process started the run:
        the other ranks raise ``wandb.Error`` at it (`tracker_calls_without_a_run`)."""
        for found in tracker_calls_without_a_run(facts_of(script)):
            accelerator = accelerator_at(script, found.call)
            called = (dotted(found.call.func) or "wandb.log").rsplit(".", 1)[-1]
            # where no accelerator is in scope, the test wandb itself answers on every rank
            guard = (
                f"`if {accelerator}.is_main_process:`"
                if accelerator is not None
                else "`if wandb.run is not None:`"
            )
            start = f"wandb.init, line {script.line(found.start)}"
            func = found.start.func
            if isinstance(func, cst.Attribute) and func.attr.value == "init_trackers":
                start = (
                    f"{dotted(func) or 'init_trackers'}, line {script.line(found.start)}, starts "
                    "the wandb run that log_with names on the main process only"
                )
                if accelerator is not None and called == "log":
                    guard += f", or log through {accelerator}.log(...)"
            message = (
                f"Call wandb.{called} on the main process only (under {guard}): the run is "
                f"started only there ({start}), and on every other rank wandb.{called} raises "
                f"wandb.Error (You must call wandb.init() before wandb.{called}())"
            )
            collective = _collective_in(script, found.call)
            if collective is not None:  # ``wandb.log({"loss": accelerator.gather(loss)...})``
                name = (dotted(collective.func) or "gather").rsplit(".", 1)[-1]
                message = (
                    f"Compute {script.module.code_for_node(collective)} into a name above it, on "
                    f"every rank ({name}() is a collective: under a guard the other ranks would "
                    f"wait for it forever), then c{message[1:]}"
                )
            yield self.finding(script, found.call, message=message)

    def _tracker_runs(self, script: ScriptModel) -> Iterator[Finding]:
        """``wandb.init(...)`` (``mlflow.start_run``, ``comet_ml.Experiment``,
        ``neptune.init_run``, ``aim.Run``) that every rank runs in a script that prepares: each
        process starts its own run, so one experiment shows up N times (each with one rank's
        metrics). Not for a tracker ``accelerator.init_trackers`` starts (one its
        Accelerator's ``log_with`` may name: the Accelerator starts the run on the main
        process and the script's own call joins it), nor under a rank test,
        nor in a function only the main process calls. mlflow's module-level logging
        (``mlflow.log_metric``) starts a run where none is active: run by every rank, it makes
        one run per rank that has not started one, also beside ``init_trackers``; reported
        unless a ``start_run`` every rank runs is (guarding that one, with its logging, fixes
        both), or a test of ``mlflow.active_run()`` lets it run only inside a run."""
        if not script.prepare_calls:
            return
        starts = [
            call
            for call in script.calls
            if script.call_names(call) & names.TRACKER_RUN_STARTS
            and not any(script.reads_rank(a.value) for a in call.args)
            # ``mode="disabled"`` on all ranks but the main one: one live run
            and _run_by_every_rank(script, call)
        ]
        for call in starts:
            # the run ``init_trackers`` starts for ``log_with``'s trackers, which this one joins
            if not _started_by_accelerator(script, call):
                yield self.finding(script, call, message=_tracker_run_message(script, call))
        if any(_is_mlflow(script, call) for call in starts):
            return  # each rank logs to the run it started: no run starts at the log
        for call in script.calls:
            if (
                script.call_names(call) & names.TRACKER_AUTO_RUN_CALLS
                and _run_by_every_rank(script, call)
                and not tested_for_run(script, call, "mlflow.active_run")
            ):
                yield self.finding(script, call, message=_auto_run_message(script, call))

    def _uploads(self, script: ScriptModel) -> Iterator[Finding]:
        """Reported at the upload, where the guard goes, also when a helper holds it: guarding
        the upload is right whoever calls the helper."""
        in_view = backends_in_view(script)
        backends: dict[int, frozenset[str]] = {}
        uploads = {}
        for effect in facts_of(script).repeated_effects:
            if effect.helper is not None:
                continue  # another module's function that writes: ACC201's
            if side_effects.uploads(script, effect.effect) and effect.backends & in_view:
                key = id(effect.effect)
                uploads[key] = effect.effect
                backends[key] = backends.get(key, frozenset()) | (effect.backends & in_view)
        for key, upload in uploads.items():
            message = None
            if backends[key] != in_view:
                message = (
                    "Upload from the main process only: every rank runs this under "
                    f"{named(backends[key])}, and N uploads race on the same repo"
                )
            yield self.finding(script, upload, message=message)


def _tracker_run_message(script: ScriptModel, call: cst.Call) -> str:
    """The advice names the Accelerator bound where the run starts (``self.accelerator`` in a
    trainer); where none is bound yet (``wandb.init`` above ``accelerator = Accelerator(...)``,
    a terrain GAN's ``main``), a guard on it would be a NameError: the run moves below it, or
    is guarded by ``PartialState()``, which needs no Accelerator."""
    tail = "every rank runs this, and each starts its own run of the experiment"
    accelerator = accelerator_at(script, call)
    if accelerator is not None:
        other = f"use {accelerator}.init_trackers and {accelerator}.log"
        if _inits_trackers(script):  # ``log_with="tensorboard"``: the tracker is not in it
            tracker = _tracker_of(script, call)
            other = (
                f"name {tracker} in log_with= of the Accelerator and log through {accelerator}.log"
            )
        return (
            f"Start the tracker run on the main process only (under `if "
            f"{accelerator}.is_main_process:`, with its logging), or {other}: {tail}"
        )
    later = _accelerator_below(script, call)
    where = (
        f"move it below `{later.name} = Accelerator(...)` (line {script.line(later.assign)}) "
        f"under `if {later.name}.is_main_process:`, or "
        if later is not None
        else ""
    )
    package = "accelify" if runtime_of(script) == "accelify" else "accelerate"
    return (
        f"Start the tracker run on the main process only, with its logging: {where}guard it "
        f"with `if PartialState().is_main_process:` (from {package} import PartialState); "
        f"{tail}"
    )


def _run_by_every_rank(script: ScriptModel, call: cst.Call) -> bool:
    """No rank test around ``call`` keeps it to some ranks, nor around the calls of the
    function that holds it."""
    facts = facts_of(script)
    function = facts.placement.enclosing_function(call)
    if not facts.ranks.backend_guards.entered_by_all(call, within=function) & backends_in_view(
        script
    ):
        return False
    return function is None or run_by_every_rank(
        script, facts.placement, facts.ranks.backend_guards, facts.synchronising_call, function
    )


def _is_mlflow(script: ScriptModel, call: cst.Call) -> bool:
    return any(name.startswith("mlflow.") for name in script.call_names(call))


def _auto_run_message(script: ScriptModel, call: cst.Call) -> str:
    """mlflow's logging run by every rank: the guard is the main process's."""
    called = (dotted(call.func) or "mlflow.log_metric").rsplit(".", 1)[-1]
    accelerator = accelerator_at(script, call)
    if accelerator is not None:
        guard = f"under `if {accelerator}.is_main_process:`"
    else:
        package = "accelify" if runtime_of(script) == "accelify" else "accelerate"
        guard = f"under `if PartialState().is_main_process:` (from {package} import PartialState)"
    return (
        f"Log to mlflow from the main process only ({guard}): every rank runs this, and on "
        f"a rank with no active run mlflow.{called} starts one, so the experiment shows up as "
        "one run per rank, each with one rank's values"
    )


def _accelerator_below(script: ScriptModel, call: cst.Call) -> Binding | None:
    """The Accelerator made after ``call`` in the scope that runs it (or the module's)."""
    facts = facts_of(script)
    here = script.order(call)
    for binding in script.of_kind(Kind.ACCELERATOR):
        if "." in binding.name or script.order(binding.assign) <= here:
            continue
        if isinstance(binding.scope, cst.Module) or facts.placement.inside(call, binding.scope):
            return binding
    return None


def _collective_in(script: ScriptModel, call: cst.Call) -> cst.Call | None:
    """A collective among ``call``'s arguments (``accelerator.gather(loss).mean()``)."""
    accelerators = script.names_of(Kind.ACCELERATOR)
    for argument in call.args:
        for node in walk(argument.value):
            if isinstance(node, cst.Call) and collective_backends(script, node, accelerators):
                return node
    return None


def _started_by_accelerator(script: ScriptModel, start: cst.Call) -> bool:
    """The script starts its trackers through the Accelerator (``init_trackers``), and one of
    its Accelerators may name ``start``'s tracker in ``log_with`` (``"wandb"``, a flag, or one
    the file does not show): its run is the Accelerator's, which the script's own call joins.
    A tracker no ``log_with`` names (``with mlflow.start_run():`` beside
    ``log_with="tensorboard"``) is the script's own run, started on every rank."""
    if not _inits_trackers(script):
        return False
    tracker = _tracker_of(script, start)
    made = [call for call in script.calls if script.call_names(call) & names.ACCELERATORS]
    return not made or any(
        any(argument.star == "**" for argument in call.args)  # ``Accelerator(**kwargs)``
        or names_tracker(script, keyword_value(call, "log_with"), call, tracker) is not False
        for call in made
    )


def _inits_trackers(script: ScriptModel) -> bool:
    """The script starts its trackers through the Accelerator (``init_trackers``)."""
    return any(
        isinstance(call.func, cst.Attribute) and call.func.attr.value == "init_trackers"
        for call in script.calls
    )


def _tracker_of(script: ScriptModel, start: cst.Call) -> str:
    """The tracker a run start is of, as ``log_with`` names it: ``mlflow``, ``wandb``."""
    started = sorted(script.call_names(start) & names.TRACKER_RUN_STARTS)
    return started[0].split(".", 1)[0] if started else "it"
