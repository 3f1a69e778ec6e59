from collections.abc import Iterator

import libcst as cst

from accelify.analysis import names, side_effects
from accelify.analysis.collectives import backends_in_view, named
from accelify.analysis.facts import facts_of
from accelify.analysis.rank_only_names import tracker_calls_without_a_run
from accelify.analysis.repeated_effects import run_by_every_rank
from accelify.analysis.script_model import ScriptModel
from accelify.analysis.syntax import dotted
from accelify.lint.rule import HEADER, Example, Finding, Rule, accelerator_at

_HUB = "from huggingface_hub import HfApi, create_repo, upload_folder\n"
#: A training script that logs to Weights & Biases itself (not through ``init_trackers``).
_WANDB = (
    "import torch\nimport wandb\n"
    "model = torch.nn.Linear(2, 2)\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "model, optimizer = accelerator.prepare(model, optimizer)\n"
)


class UploadOnEveryRank(Rule):
    """An upload to the Hugging Face Hub (``upload_folder``, ``upload_file``, ``push_to_hub``,
    ``create_commit``, ``create_repo`` without ``exist_ok=True``) run by every rank: N processes
    push the same folder to one repo at once. The commits race (the Hub refuses all but one
    whose parent moved, so ranks crash at the end of a finished run) or land N times, and
    ``create_repo`` fails on every rank but the first. A Trainer's ``push_to_hub`` uploads from
    the main process by itself and is not reported.

    The same for a run on an experiment tracker: ``wandb.init(...)`` run by every rank of a
    script that prepares (and does not start its trackers with ``accelerator.init_trackers``)
    makes N runs of one experiment, each with one rank's values."""

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
    )
    good = (
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
        HEADER
        + _WANDB
        + "accelerator.init_trackers('p')\nrun = wandb.init(project='p', reinit=False)\n",
        # the other ranks' runs disabled
        HEADER
        + _WANDB
        + "wandb.init(project='p', mode='online' if accelerator.is_main_process else 'disabled')\n",
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
            accelerator = accelerator_at(script, found.call) or "accelerator"
            called = (dotted(found.call.func) or "wandb.log").rsplit(".", 1)[-1]
            yield self.finding(
                script,
                found.call,
                message=(
                    f"Call wandb.{called} on the main process only (under `if {accelerator}."
                    f"is_main_process:`): the run is started only there (wandb.init, line "
                    f"{script.line(found.start)}), and on every other rank wandb.{called} raises "
                    f"wandb.Error (You must call wandb.init() before wandb.{called}())"
                ),
            )

    def _tracker_runs(self, script: ScriptModel) -> Iterator[Finding]:
        """``wandb.init(...)`` that every rank runs in a script that prepares: each process
        starts its own run, so one experiment shows up N times (each with one rank's
        metrics). Not where ``accelerator.init_trackers`` is used (the Accelerator starts the
        run on the main process and the script's own call joins it), nor under a rank test,
        nor in a function only the main process calls."""
        if not script.prepare_calls or _inits_trackers(script):
            return
        facts = facts_of(script)
        in_view = backends_in_view(script)
        for call in script.calls:
            if not script.call_names(call) & names.TRACKER_RUN_STARTS:
                continue
            if any(script.mentions_rank(script.module.code_for_node(a.value)) for a in call.args):
                continue  # ``mode="disabled"`` on all ranks but the main one: one live run
            function = facts.placement.enclosing_function(call)
            if not facts.ranks.backend_guards.entered_by_all(call, within=function) & in_view:
                continue
            if function is not None and not run_by_every_rank(
                script,
                facts.placement,
                facts.ranks.backend_guards,
                facts.synchronising_call,
                function,
            ):
                continue
            yield self.finding(
                script,
                call,
                message=(
                    "Start the tracker run on the main process only (under `if "
                    "accelerator.is_main_process:`, with its logging), or use "
                    "accelerator.init_trackers and accelerator.log: every rank runs this, and "
                    "each starts its own run of the experiment"
                ),
            )

    def _uploads(self, script: ScriptModel) -> Iterator[Finding]:
        """Reported at the upload, where the guard goes, also when a helper holds it: guarding
        the upload is right whoever calls the helper."""
        in_view = backends_in_view(script)
        backends: dict[int, frozenset[str]] = {}
        uploads = {}
        for effect in facts_of(script).repeated_effects:
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


def _inits_trackers(script: ScriptModel) -> bool:
    """The script starts its trackers through the Accelerator (``init_trackers``)."""
    return any(
        isinstance(call.func, cst.Attribute) and call.func.attr.value == "init_trackers"
        for call in script.calls
    )
