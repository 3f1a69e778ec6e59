from collections.abc import Iterator

from accelify.analysis import side_effects
from accelify.analysis.collectives import backends_in_view, named
from accelify.analysis.facts import facts_of
from accelify.analysis.script_model import ScriptModel
from accelify.lint.rule import HEADER, Example, Finding, Rule

_HUB = "from huggingface_hub import HfApi, create_repo, upload_folder\n"


class UploadOnEveryRank(Rule):
    """An upload to the Hugging Face Hub (``upload_folder``, ``upload_file``, ``push_to_hub``,
    ``create_commit``, ``create_repo`` without ``exist_ok=True``) run by every rank: N processes
    push the same folder to one repo at once. The commits race (the Hub refuses all but one
    whose parent moved, so ranks crash at the end of a finished run) or land N times, and
    ``create_repo`` fails on every rank but the first. A Trainer's ``push_to_hub`` uploads from
    the main process by itself and is not reported."""

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
    )
    good = (
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
    )

    def check(self, script: ScriptModel) -> Iterator[Finding]:
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
