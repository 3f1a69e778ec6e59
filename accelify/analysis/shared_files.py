"""Files the ranks share: one written once (on the main process, as the conversion makes every
save) and read back by every rank, and paths made per process.

A checkpoint saved on the main process and loaded again by every rank (best weights reloaded
after training, a tutorial's save-then-load-for-inference) needs a barrier between the save and
the loads: without it rank 1 reads before rank 0 has written. A path made per process (a
``tempfile.TemporaryDirectory()``, ``os.getpid()``, a timestamp) is another file on every rank:
saved on one rank and read on all, the others find nothing, so such a save stays on every rank.
A data set downloaded or prepared by every rank at once (``download=True``, ``urlretrieve``,
extracting an archive, a helper that does those) races on its folder (``FileExistsError``): the
main process should do it first, the others then read what it wrote.

Two paths are the same file when their code is the same, after a name assigned once in its scope
is replaced by its value (``path = os.path.join(out, "best.pt")``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

import libcst as cst

from accelify.analysis import collectives, names, side_effects
from accelify.analysis.flow import ObjectFlow
from accelify.analysis.name_scopes import binding_owners, local_owner
from accelify.analysis.objects import bound_arguments
from accelify.analysis.placement import Placement
from accelify.analysis.rank_dependence import RankDependence
from accelify.analysis.script_model import Kind, ScriptModel
from accelify.analysis.split_shares import named_from_share
from accelify.analysis.syntax import (
    all_params,
    argument_value,
    assigned_targets,
    dotted,
    target_names,
    walk,
)

#: Where a path comes from when it is another file on every process: always (a temporary
#: directory, a pid) or by the clock (two ranks may get the same value, or not).
UNIQUE_PER_PROCESS = {
    "tempfile.TemporaryDirectory",
    "tempfile.mkdtemp",
    "tempfile.NamedTemporaryFile",
    "tempfile.mkstemp",
    "os.getpid",
    "uuid.uuid1",
    "uuid.uuid4",
    "secrets.token_hex",
    "secrets.token_urlsafe",
}
CLOCK = {
    "time.time",
    "time.time_ns",
    "time.strftime",
    "time.localtime",
    "datetime.datetime.now",
    "datetime.datetime.today",
    "datetime.datetime.utcnow",
    "datetime.date.today",
}
#: Calls that read a file, and the position and keyword of their path argument.
READERS = {
    "torch.load": (0, "f"),
    "numpy.load": (0, "file"),
    "numpy.loadtxt": (0, "fname"),
    "numpy.genfromtxt": (0, "fname"),
    "safetensors.torch.load_file": (0, "filename"),
    "safetensors.torch.load_model": (1, "filename"),
    "pandas.read_csv": (0, "filepath_or_buffer"),
    "pandas.read_json": (0, "path_or_buf"),
    "pandas.read_parquet": (0, "path"),
    "builtins.open": (0, "file"),
    # Accelerate's loader of a checkpoint (a weights file, or the folder save_model wrote)
    "accelerate.load_checkpoint_in_model": (1, "checkpoint"),
    "accelerate.utils.load_checkpoint_in_model": (1, "checkpoint"),
    "accelerate.utils.modeling.load_checkpoint_in_model": (1, "checkpoint"),
    "accelerate.load_checkpoint_and_dispatch": (1, "checkpoint"),
    "accelerate.big_modeling.load_checkpoint_and_dispatch": (1, "checkpoint"),
}
READING_METHODS = {"from_pretrained": (0, "pretrained_model_name_or_path")}
#: Calls that list a folder, and where its path (or pattern) is: they read which files the
#: folder holds, so a file saved into it must be there first.
LISTERS = {
    "glob.glob": (0, "pathname"),
    "glob.iglob": (0, "pathname"),
    "os.listdir": (0, "path"),
    "os.scandir": (0, "path"),
}
_JOIN = "os.path.join"
#: modules whose calls build a path from the parts handed them (`unresolved_read`)
_PATH_MODULES = frozenset({"os", "pathlib", "builtins", "str", "posixpath", "ntpath"})
#: Calls that write a file, and where their path is.
WRITERS = {
    "torch.save": (1, "f"),
    "numpy.save": (0, "file"),
    "numpy.savez": (0, "file"),
    "numpy.savez_compressed": (0, "file"),
    "numpy.savetxt": (0, "fname"),
    "torchvision.utils.save_image": (1, "fp"),
    "safetensors.torch.save_file": (1, "filename"),
    "safetensors.torch.save_model": (1, "filename"),
    "matplotlib.pyplot.savefig": (0, "fname"),
    "torchaudio.save": (0, "uri"),
    "soundfile.write": (0, "file"),
    "scipy.io.wavfile.write": (0, "filename"),
    "cv2.imwrite": (0, "filename"),
    "imageio.imwrite": (0, "uri"),
    "imageio.v2.imwrite": (0, "uri"),
    "imageio.v3.imwrite": (0, "uri"),
    "shutil.copy": (1, "dst"),
    "shutil.copy2": (1, "dst"),
    "shutil.copyfile": (1, "dst"),
}
#: The Accelerator's own writes, which write on the main process only whoever calls them,
#: and where their path is: a file, or the folder ``save_model`` writes the weights into.
ACCELERATOR_WRITERS = {"save": (1, "f"), "save_model": (1, "save_directory")}
WRITING_METHODS = {
    "save_pretrained": (0, "save_directory"),
    "savefig": (0, "fname"),
    "to_csv": (0, "path_or_buf"),
}
#: Methods that write a model into the folder they are handed.
_FOLDER_WRITERS = frozenset({"save_model", "save_pretrained"})
#: The files those folder writers put there (a model's weights and configs, a tokenizer's or
#: processor's files, a diffusers pipeline's): a file of another name in the folder
#: (``train_args.json`` written earlier, or by someone else) is not the write's.
_FOLDER_WRITTEN = re.compile(
    r"(model|weights|diffusion_pytorch_model|adapter|config|tokenizer|vocab|merges|spiece"
    r"|sentencepiece|special_tokens|added_tokens|chat_template|scheduler|preprocessor"
    r"|processor|pytorch_|tf_|flax_|.*\.(safetensors|bin|pt|pth|ckpt|model))",
    re.IGNORECASE,
)
#: Calls that open a file, and where their path is.
_OPENERS = {"builtins.open": (0, "file")}
#: Calls that delete a file, and where their path is.
DELETERS = {"os.remove": (0, "path"), "os.unlink": (0, "path")}
#: Renames that replace their destination in one step: the path that matters is the source.
_ATOMIC_RENAMES = {"os.replace": (0, "src"), "os.rename": (0, "src")}
#: Methods that delete the file their receiver names (``temporary.unlink()``).
_DELETING_METHODS = ("unlink", "rmdir")
#: Calls that download or unpack data into a folder.
DOWNLOADERS = {
    "urllib.request.urlretrieve",
    "torchvision.datasets.utils.download_url",
    "torchvision.datasets.utils.download_and_extract_archive",
    "torchvision.datasets.utils.extract_archive",
    "torchvision.datasets.utils.download_file_from_google_drive",
    "torch.hub.download_url_to_file",
    "torch_geometric.data.download_url",
    "torch_geometric.data.extract_zip",
    "torch_geometric.data.extract_tar",
    "torch_geometric.data.extract_gz",
    "shutil.unpack_archive",
    "gdown.download",
    "wget.download",
    "nltk.download",
}
DOWNLOADING_METHODS = {"extractall"}
#: Data set classes that download into their root folder when it is empty, asked or not.
DOWNLOADING_DATASETS = ("torch_geometric.datasets.", "ogb.nodeproppred.", "ogb.graphproppred.")
_MAX_DEPTH = 4
_Found = TypeVar("_Found")


@dataclass(frozen=True)
class PerProcessPath:
    """A path made per process, and the call that makes it so (``tempfile.mkdtemp()``)."""

    source: cst.Call
    clock: bool  # a timestamp: two ranks may get another path, or the same one


@dataclass(frozen=True)
class Download:
    """A statement that downloads or prepares data: ``call`` (a download, or the call of a helper
    that downloads) inside ``statement``, widened to the ``if``/``with``/``try`` blocks around it
    that do nothing else (``if not os.path.exists(root): ...`` checks and creates together)."""

    statement: cst.CSTNode
    call: cst.Call
    #: the ``if`` around it that the ranks may disagree on, or a call site of its function in
    #: one: no block every rank must enter can go there.
    divergent: cst.CSTNode | None
    #: the statement also does work every rank must do in step (a forward, a collective)
    with_shared_work: bool = False


@dataclass(frozen=True)
class CacheBuild:
    """``if os.path.exists(path): <read path> else: <build, write path>``: a file made once and
    read on later runs (a vocabulary pickle, preprocessed features), in code every rank runs.
    The conversion makes the write the main process's, yet every rank tests and reads: rank 1
    finds the file half written (and fails to unpickle it) or missing (and builds it again)."""

    statement: cst.If
    read: cst.Call
    write: cst.Call
    path: cst.BaseExpression  # as the write spells it
    #: the ``if`` around it that the ranks may disagree on, or a call site of its function in
    #: one: no block every rank must enter can go there.
    divergent: cst.CSTNode | None
    #: the statement also does work every rank must do in step (a forward, a collective):
    #: the ranks build in step, and none tests after the main process wrote
    with_shared_work: bool = False
    #: written by ``torch.save``, which the conversion makes ``accelerator.save`` with a
    #: barrier before it: a barrier that must not go inside a block the main process runs first
    saved_behind_a_barrier: bool = False


@dataclass(frozen=True)
class SharedFile:
    """``write`` saves a file that ``read`` loads on every rank."""

    write: cst.Call
    read: cst.Call
    path: cst.BaseExpression  # as the write spells it
    per_process: PerProcessPath | None
    #: for a write and a read in two functions: the calls that run them, in the first
    #: function that runs both (``self.save(p)`` then ``self.load(p)`` in ``train``)
    through: tuple[cst.CSTNode, cst.CSTNode] | None = None
    #: the write's path comes from outside what the file shows (`SharedFiles.unknown_path`):
    #: the read may be of that file, or of another
    unsure: bool = False
    #: the read opens what the call of the write's function in its own statement returns
    #: (``with open(trainer.test()) as f:``): no barrier fits between that call and the read,
    #: so it goes before this ``return`` of the function, once the file is written
    returned_at: cst.Return | None = None


class SharedFiles:
    def __init__(
        self, model: ScriptModel, placement: Placement, flow: ObjectFlow, ranks: RankDependence
    ) -> None:
        self.model = model
        self.placement = placement
        self.flow = flow
        self._ranks = ranks
        self._chains: dict[
            cst.FunctionDef | None, dict[cst.FunctionDef | None, list[cst.CSTNode]]
        ] = {}

    @cached_property
    def read_back(self) -> list[SharedFile]:
        """Each file written where every rank runs the write (the conversion makes it the main
        process's) and read on every rank after it: at most one pair per read."""
        found = []
        writes = self._writes()
        for read, read_path in self._reads():
            if self.model.under_rank_guard(read):
                continue
            for write, path in writes:
                if not self._same_file(path, read_path):
                    continue
                if self._may_follow(read, write):
                    found.append(SharedFile(write, read, path, self.per_process(path)))
                    break
                returned = self._returned_written(read_path, write)
                if returned is not None:
                    per_process = self.per_process(path)
                    found.append(SharedFile(write, read, path, per_process, returned_at=returned))
                    break
            else:
                unsure = self._maybe_read_back(read, read_path, writes)
                if unsure is not None:
                    found.append(unsure)
        for listing, listed in self._listings():
            if self.model.under_rank_guard(listing):
                continue
            for write, path in writes:
                folder = self._folder(path)
                if (
                    folder is not None
                    and self._same_file(folder, listed)
                    and self._may_follow(listing, write)
                ):
                    found.append(SharedFile(write, listing, path, self.per_process(path)))
                    break
        return found

    def _returned_written(
        self, read_path: cst.BaseExpression, write: cst.Call
    ) -> cst.Return | None:
        """The ``return`` of the function a call in ``read_path`` runs (``trainer.test()`` of
        ``open(trainer.test())``) that hands the path back below ``write``, a write of that
        function's own body: the one ``return`` of the function, outside any loop there. None
        for any other shape (the read's statement runs no such write)."""
        function = self.placement.enclosing_function(write)
        if function is None:
            return None
        for node in walk(read_path):
            if not isinstance(node, cst.Call):
                continue
            target = self.model.call_graph.callee(node)
            if target is None or target[0] is not function:
                continue
            returns = self.model.index.own_returns(function)
            if len(returns) != 1 or self.model.order(returns[0]) < self.model.order(write):
                return None
            if any(self.model.under_rank_guard(c) for c, _ in self.flow.calls_of(function)):
                return None  # a barrier there would wait for ranks that never call it
            if any(isinstance(a, (cst.For, cst.While)) for a in self._ancestors_in(returns[0])):
                return None
            return returns[0]
        return None

    def _ancestors_in(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """The nodes around ``node`` inside its function."""
        found = []
        for ancestor in self.model.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                break
            found.append(ancestor)
        return found

    def _maybe_read_back(
        self,
        read: cst.Call,
        read_path: cst.BaseExpression,
        writes: list[tuple[cst.Call, cst.BaseExpression]],
    ) -> SharedFile | None:
        """A checkpoint saved (``torch.save``) and a ``torch.load`` or ``open`` below it, after
        the loop that saves, on every rank, where either path is one the file does not show:
        the save's (`unknown_path`: a helper object handed its path by code outside the file)
        or the read's (`unresolved_read`: ``torch.load(trainer.early_stopping.path)``, or the
        path ``trainer.fit()`` returns). The read may be of the file just saved (the best
        weights reloaded). A barrier before the read costs a wait; none, a read before the
        write. The last such write above the read."""
        if not self.model.call_names(read) & {"torch.load", "builtins.open"}:
            return None
        found = None
        read_unresolved = self.unresolved_read(read_path)
        for write, path in writes:
            if not self.model.call_names(write) & names.TORCH_SAVE:
                continue
            if self._after_its_loop(read, write) and (read_unresolved or self.unknown_path(path)):
                found = SharedFile(write, read, path, None, unsure=True)
        return found

    def unresolved_read(self, path: cst.BaseExpression, depth: int = 0) -> bool:
        """A read's path the file does not let `_same_file` follow to a spelling: an attribute
        of an attribute (``trainer.early_stopping.path``), of an object no class of the file
        is seen making (a factory's stopper), what a call of the file's own code returns
        (``best_file = trainer.fit()``), or `unknown_path`. A constant, a join or an
        f-string is not. A setting (``args.ckpt``) counts as unresolved too: its value is not
        in the file, and a barrier too many costs a wait."""
        if depth > _MAX_DEPTH:
            return False
        if isinstance(path, cst.Name):
            values = self._values_of(path.value, path)
            if not values:
                return self.unknown_path(path)
            return all(self.unresolved_read(v, depth + 1) for v in values)
        if isinstance(path, cst.Attribute):
            if dotted(path.value) == "self":
                return self.unknown_path(path)
            values = self._attribute_values(path)
            if not values:
                return True
            return all(self.unresolved_read(v, depth + 1) for v in values)
        if isinstance(path, cst.Call):
            if self._constant_path(path) is not None or _template(path) is not None:
                return False
            called = self.model.call_names(path)
            return not any(n.split(".")[0] in _PATH_MODULES for n in called)
        return False

    def _after_its_loop(self, read: cst.Call, write: cst.Call) -> bool:
        """In the first function that runs both, ``read`` runs below ``write`` and outside
        every loop around it: once the loop that saves is done (`_call_chain`)."""
        writes = self._call_chain(write)
        for function, read_anchors in self._call_chain(read).items():
            write_anchors = writes.get(function)
            if write_anchors is None:
                continue
            return any(
                self.model.order(r) > self.model.order(w)
                and not any(
                    isinstance(loop, (cst.For, cst.While)) and self.placement.inside(w, loop)
                    for loop in self.model.ancestors(r)
                )
                for r in read_anchors
                for w in write_anchors
            )
        return False

    def unknown_path(self, path: cst.BaseExpression, depth: int = 0) -> bool:
        """``path`` is a value the file does not show: a parameter that no call of the file
        passes (the function, or the class whose constructor takes it, is used from outside),
        or ``self.path`` that nothing in its class sets, or set only from such values. A path
        the file spells (a constant, a join of names, a setting) is not."""
        if depth > _MAX_DEPTH:
            return False
        if isinstance(path, cst.Name):
            values = self._values_of(path.value, path)
            function = self._parameter_owner(path.value, path)
            if not values and function is not None:
                values = self._passed_or_default(function, path.value)
                if not values or self._passed_unseen(function, path.value):
                    return True
        elif isinstance(path, cst.Attribute) and dotted(path.value) == "self":
            values = self._attribute_values(path)
            if not values:
                return True
        else:
            return False
        return bool(values) and all(self.unknown_path(v, depth + 1) for v in values)

    def _listings(self) -> list[tuple[cst.Call, cst.BaseExpression]]:
        """Each folder listing (``glob.glob(os.path.join(out, "*.pt"))``, ``os.listdir(out)``)
        with the folder it lists: a pattern's own folder."""
        found = []
        for call in self.model.calls:
            path = _path(self.model, call, LISTERS, {})
            if path is None:
                continue
            if self.model.call_names(call) & {"glob.glob", "glob.iglob"}:
                path = self._folder(path)
            if path is not None:
                found.append((call, path))
        return found

    def _folder(self, path: cst.BaseExpression) -> cst.BaseExpression | None:
        """``out`` of ``os.path.join(out, f"epoch_{epoch}.pt")`` (the folder a joined path is
        in; a name holding such a join is followed); None for any other spelling."""
        if isinstance(path, cst.Name):
            values = self._values_of(path.value, path)
            path = values[0] if len(values) == 1 else path
        spliced = _spliced_folder(path)
        if spliced is not None:
            return spliced
        if not isinstance(path, cst.Call) or _JOIN not in self.model.call_names(path):
            return None
        parts = [a.value for a in path.args if a.keyword is None and not a.star]
        if len(parts) < 2 or len(parts) != len(path.args):
            return None
        if len(parts) == 2:
            return parts[0]
        return path.with_changes(args=path.args[:-1])

    @cached_property
    def written_by_one_rank_read_by_all(self) -> list[SharedFile]:
        """A file written under a rank test (``if accelerator.is_local_main_process:
        tokenizer.save_pretrained(out)``) and read below it, in the same function, by every
        rank (``AutoProcessor.from_pretrained(out)``): at most one pair per read. Also a
        write and a read in two functions that one function of the file runs in that order
        (``through``: a trainer's ``save()``, guarded inside or at every call, then ``load()``).
        Whether a barrier stands between them is the caller's question."""
        writes = [
            (call, path)
            for call in self.model.calls
            if (path := self._written_by_one_rank(call)) is not None
            and not side_effects.per_rank_path(self.model, call)
        ]
        found = []
        for read, read_path in self._reads() if writes else ():
            if self.model.under_rank_guard(read) or self._called_on_one_rank(read):
                continue
            function = self.placement.enclosing_function(read)
            for write, path in writes:
                if not self._reads_what_it_wrote(write, path, read_path):
                    continue
                if self.placement.enclosing_function(write) is function:
                    if self.model.order(write) < self.model.order(read):
                        found.append(SharedFile(write, read, path, self.per_process(path)))
                        break
                    continue
                through = self._called_in_order(write, read)
                if through is not None and not self.model.under_rank_guard(through[1]):
                    found.append(SharedFile(write, read, path, self.per_process(path), through))
                    break
        return found

    def _reads_what_it_wrote(
        self, write: cst.Call, path: cst.BaseExpression, read_path: cst.BaseExpression
    ) -> bool:
        """The read's path is the written one, or a file in the folder a model was saved into
        (``load_file(os.path.join(out, "model.safetensors"))`` after ``save_model(model,
        out)`` or ``save_pretrained(out)``)."""
        if self._same_file(path, read_path):
            return True
        func = write.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in _FOLDER_WRITERS):
            return False
        folder = self._folder(read_path)
        if folder is None or not self._same_file(path, folder):
            return False
        name = _file_name(read_path)
        return name is None or _FOLDER_WRITTEN.match(name) is not None

    @cached_property
    def read_by_the_other_ranks(self) -> list[tuple[SharedFile, cst.If]]:
        """A file written on some ranks and read, in the same function, by the ranks that do
        not write it, with the rank test that parts them: the two arms of one rank test (``if
        accelerator.is_main_process: torch.save(...)`` / ``else: torch.load(...)``), or an
        ``if not <test>:`` read below an ``if <test>:`` write. The ranks run both at the same
        time, so the readers find nothing there yet (a first run) or half of it.
        `written_by_one_rank_read_by_all` leaves reads under a rank test out; these are the
        ones that race with the write all the same. Whether a barrier orders them is the
        caller's question."""
        writes = [
            (call, path)
            for call in self.model.calls
            if (path := self._written_by_one_rank(call)) is not None  # most calls: None at once
            and not side_effects.per_rank_path(self.model, call)
            and (
                self.model.under_rank_guard(call)
                # ``accelerator.save(...)``, ``save_pretrained(..., is_main_process=...)``:
                # called by every rank, written by the main process
                or _accelerator_saving(self.model, call) is not None
                or side_effects.main_process_only(call)
            )
        ]
        found = []
        for read, read_path in self._reads() if writes else ():
            guard = self.model.rank_guard_of(read)
            if not isinstance(guard, cst.If):
                continue
            function = self.placement.enclosing_function(read)
            for write, path in writes:
                if (
                    self.placement.enclosing_function(write) is not function
                    or not (
                        self._other_ranks(write, read, guard)
                        if self.model.under_rank_guard(write)
                        else self._past_the_main_process(write, read, guard)
                    )
                    or not self._reads_what_it_wrote(write, path, read_path)
                ):
                    continue
                found.append((SharedFile(write, read, path, self.per_process(path)), guard))
                break
        return found

    def _other_ranks(self, write: cst.Call, read: cst.Call, guard: cst.If) -> bool:
        """``write`` runs on the ranks that do not run ``read`` (under ``guard``, the innermost
        rank test around it): the other arm of ``guard``, or an earlier ``if`` whose test is
        the one ``guard`` negates (``if main:`` above ``if not main:``), or the reverse."""
        model = self.model
        arms = (guard.body, guard.orelse) if guard.orelse is not None else (guard.body,)
        write_arm = [model.inside(write, arm) for arm in arms]
        read_arm = [model.inside(read, arm) for arm in arms]
        if len(arms) == 2 and any(write_arm) and any(read_arm):
            return write_arm != read_arm
        wrote = model.rank_guard_of(write)
        if not isinstance(wrote, cst.If) or model.order(write) > model.order(read):
            return False
        if not model.inside(read, guard.body) or not model.inside(write, wrote.body):
            return False
        code = model.module.code_for_node
        negated, other = _negated(guard.test), wrote.test
        if negated is None:
            negated, other = _negated(wrote.test), guard.test
        return negated is not None and code(negated) == code(other)

    def _past_the_main_process(self, write: cst.Call, read: cst.Call, guard: cst.If) -> bool:
        """``write`` (every rank calls it, the main process writes) runs above ``read``, which
        only the other ranks run: in ``if not accelerator.is_main_process:`` or in the ``else``
        of ``if accelerator.is_main_process:``."""
        model = self.model
        if model.order(write) > model.order(read) or model.inside(write, guard):
            return False
        negated = _negated(guard.test)
        if negated is not None:
            return model.inside(read, guard.body) and model.reads_rank(negated)
        return (
            guard.orelse is not None
            and model.inside(read, guard.orelse)
            and model.reads_rank(guard.test)
        )

    def _called_in_order(
        self, write: cst.Call, read: cst.Call
    ) -> tuple[cst.CSTNode, cst.CSTNode] | None:
        """A write and a read in two functions (``save()`` and ``load()`` methods): the calls
        that run them in the first function that runs both, the write's above the read's
        (`_call_chain`); None where no function of the file runs both in that order."""
        writes = self._call_chain(write)
        for function, read_anchors in self._call_chain(read).items():
            write_anchors = writes.get(function)
            if write_anchors is None:
                continue
            for r in read_anchors:
                for w in write_anchors:
                    if w is not r and self.model.order(w) < self.model.order(r):
                        return w, r
            return None
        return None

    def _written_by_one_rank(self, call: cst.Call) -> cst.BaseExpression | None:
        """The path ``call`` writes on the main process only: a write under a rank test, one
        told to write there only (``save_pretrained(d, is_main_process=...)``, also of the
        model ``accelerator.unwrap_model(model)`` returns), or ``accelerator.save(obj, path)``
        and ``accelerator.save_model(model, folder)``, which write on the main process whoever
        calls them."""
        saving = _accelerator_saving(self.model, call)
        if saving is not None:
            return _path(self.model, call, {}, {saving: ACCELERATOR_WRITERS[saving]})
        # asked of every call of the file: whether it writes at all is the cheap question
        path = _path(self.model, call, WRITERS, WRITING_METHODS) or _unwrapped_write(call)
        if path is None and side_effects.opens_for_writing(call):
            # ``with open(path, "w") as f: json.dump(stats, f)`` on the main process
            path = argument_value(call, "file", 0)
        if path is None:
            return None
        if self.model.under_rank_guard(call) or side_effects.main_process_only(call):
            return path
        if self._called_on_one_rank(call):
            return path
        return None

    def _called_on_one_rank(self, call: cst.Call) -> bool:
        """``call``'s function is called only under rank tests (``if
        accelerator.is_main_process: self.save(path)``), each call known."""
        function = self.placement.enclosing_function(call)
        if function is None:
            return False
        sites = next(iter(self._callers_chain(function).values()), [])
        return bool(sites) and all(self.model.under_rank_guard(site) for site in sites)

    @cached_property
    def deleted_after_read(self) -> list[SharedFile]:
        """A file every rank reads and that is deleted after, in the same function
        (``model.load_state_dict(torch.load(path))`` then ``os.remove(path)``): the conversion
        deletes on the main process, which would delete it while a slower rank has yet to read
        it (FileNotFoundError there). ``write`` is the deletion: at most one pair per deletion,
        with the last read before it."""
        found = []
        reads = [(r, p) for r, p in self._reads() if not self.model.under_rank_guard(r)]
        for deletion in self.model.calls:
            path = _path(self.model, deletion, DELETERS, {})
            if (
                path is None
                or self.model.under_rank_guard(deletion)
                or side_effects.per_rank_path(self.model, deletion)
                or self.per_process(path) is not None
            ):
                continue
            function = self.placement.enclosing_function(deletion)
            before = [
                read
                for read, read_path in reads
                if self.placement.enclosing_function(read) is function
                and self.model.order(read) < self.model.order(deletion)
                and self._same_file(path, read_path)
            ]
            if before:
                found.append(SharedFile(deletion, before[-1], path, None))
        return found

    def read_back_below(self, write: cst.Call) -> cst.Call | None:
        """The first call below ``write``, in its function and outside rank tests, that is
        handed the path ``write`` writes: what reads the file back on every rank
        (``load_dataset("json", data_files=path)`` after ``json.dump(data, f)`` into ``with
        open(path, "w") as f``). A write moved onto the main process needs a barrier before
        it, or the other ranks read the file before it is written. None: nothing in the
        function is handed that path again, or the path is made per process (each rank would
        read back a file of its own, which the main process never writes)."""
        found = self._written_path(write)
        if found is None:
            return None
        path, block = found
        if self.per_process(path) is not None:
            return None  # another file on each rank (a timestamp, a pid): a barrier is no fix
        function = self.placement.enclosing_function(write)
        for call in self.model.calls:
            if (
                self.model.order(call) <= self.model.order(block)
                or self.placement.inside(call, block)
                or self.placement.enclosing_function(call) is not function
                or self.model.under_rank_guard(call)
                or _only_reports(call)
                or self._writes_same_file(call, path)
            ):
                continue
            if any(self._same_file(path, argument.value) for argument in call.args):
                return call
            if self._loads_its_folder(call, path):
                return call
        return None

    def deleted_above(self, write: cst.Call) -> cst.Call | None:
        """The ``os.remove(path)`` above ``write``, in its function and outside rank tests, of
        the file ``write`` writes (a wav2vec2 script deletes a stale ``vocab.json`` on every
        rank, then writes it): moved onto the main process, the write races that deletion, a
        slower rank deleting the file the main process has just written."""
        found = self._written_path(write)
        if found is None:
            return None
        path, block = found
        function = self.placement.enclosing_function(write)
        for deletion in self.model.calls:
            deleted = _path(self.model, deletion, DELETERS, {})
            if (
                deleted is not None
                and self.model.order(deletion) < self.model.order(block)
                and self.placement.enclosing_function(deletion) is function
                and not self.model.under_rank_guard(deletion)
                and self._same_file(path, deleted)
            ):
                return deletion
        return None

    def _loads_its_folder(self, call: cst.Call, path: cst.BaseExpression) -> bool:
        """``AutoTokenizer.from_pretrained(args.output_dir)`` below ``open(os.path.join(
        args.output_dir, "vocab.json"), "w")``: handed the folder, the loader reads the files in
        it, the one just written among them (a wav2vec2 script writes its vocabulary, then
        builds its tokenizer from the folder)."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "from_pretrained"):
            return False
        folder = self._folder(path)
        first = next((a.value for a in call.args if a.keyword is None and not a.star), None)
        return folder is not None and first is not None and self._same_file(folder, first)

    def _writes_same_file(self, call: cst.Call, path: cst.BaseExpression) -> bool:
        """``call`` writes ``path`` again (``torch.save(sd, path)`` in the ``else`` of the
        ``save_file(sd, path)`` that writes the ``.safetensors`` form), or opens it for writing
        (``with open(path, "w") as f`` of the epoch's branch below the step's): another write of
        the file, not a read of it; also a call handed that open's handle (``json.dump(state,
        f)``), which writes through it."""
        found = self._written_path(call)
        written = None if found is None else found[0]
        if written is None and side_effects.opens_for_writing(call) and call.args:
            written = call.args[0].value
        return written is not None and self._same_file(path, written)

    def written_per_process(self, write: cst.Call) -> PerProcessPath | None:
        """The call that makes the path ``write`` writes another file on each process (a
        timestamp, a pid, a temporary folder), when it is one."""
        found = self._written_path(write)
        return None if found is None else self.per_process(found[0])

    def _written_path(self, write: cst.Call) -> tuple[cst.BaseExpression, cst.CSTNode] | None:
        """The path ``write`` writes, and the statement that writes it: the call itself, or the
        ``with open(path, "w") as f`` whose handle it is handed (``json.dump(data, f)``) or
        writes through (``f.write(report)``)."""
        path = _path(self.model, write, WRITERS, WRITING_METHODS)
        if path is not None:
            return path, write
        handles = {dotted(argument.value) for argument in write.args} - {None}
        if isinstance(write.func, cst.Attribute):
            handles.add(dotted(write.func.value))
        for ancestor in self.model.ancestors(write):
            if not isinstance(ancestor, cst.With):
                continue
            for item in ancestor.items:
                opener = item.item
                handle = dotted(item.asname.name) if item.asname is not None else None
                if (
                    handle in handles
                    and isinstance(opener, cst.Call)
                    and side_effects.opens_for_writing(opener)
                    and opener.args
                ):
                    return opener.args[0].value, ancestor
        return None

    def kept_on_every_rank(self, write: cst.Call) -> SharedFile | None:
        """A write of a per-process path that is read back: it stays on every rank."""
        return next(
            (s for s in self.read_back if s.write is write and s.per_process is not None), None
        )

    def unique_per_process(self, write: cst.Call) -> bool:
        """``write`` writes (or deletes) a path that is another file on every process (a
        temporary directory, a pid): N ranks write N files, none racing another. An
        ``os.replace(temporary, path)`` of such a file publishes it whole in one step (a
        benchmark's ``write_image_atomic``: ``path.with_name(f".{name}.{os.getpid()}.tmp")``,
        saved, replaced, unlinked in ``finally``): a rank that replaces ``path`` after another
        leaves a whole file there, never a torn one."""
        path = (
            _path(self.model, write, WRITERS, WRITING_METHODS)
            or _path(self.model, write, {**DELETERS, **_ATOMIC_RENAMES}, {})
            or _deleted_receiver(write)
        )
        found = self.per_process(path) if path is not None else None
        return found is not None and not found.clock

    def named_from_share(self, write: cst.Call) -> bool:
        """The path ``write`` writes (or ``open(path, "w")`` opens) is named from this rank's
        share of a ``split_between_processes`` block around it (`split_shares`): each rank
        writes the files of its own items. Also through the handle a call is handed
        (``json.dump(caption, f)`` in ``with open(f"out/{item['id']}.json", "w") as f``): its
        file is the one the ``with`` opened."""
        written = self._written_path(write)
        path = written[0] if written is not None else _path(self.model, write, _OPENERS, {})
        return path is not None and named_from_share(self.model, path)

    def unique_per_process_path(self, opened: cst.Call) -> bool:
        """``open(path, "w")`` of a path that is another file on every process."""
        path = _path(self.model, opened, _OPENERS, {})
        found = self.per_process(path) if path is not None else None
        return found is not None and not found.clock

    def per_process(self, path: cst.BaseExpression, depth: int = 0) -> PerProcessPath | None:
        """The call that makes ``path`` another file on every process, followed through the
        names it reads (assignments and ``with ... as name`` in scope), the attributes and
        parameters that hold it, and what a function of the file returns (``run_dir()`` that
        returns a timestamped folder)."""
        if depth > _MAX_DEPTH:
            return None
        members = {id(n.attr) for n in walk(path) if isinstance(n, cst.Attribute)}
        for node in walk(path):
            values: list[cst.BaseExpression] = []
            if isinstance(node, cst.Call):
                called = self.model.call_names(node)
                if called & UNIQUE_PER_PROCESS or called & CLOCK:
                    return PerProcessPath(node, clock=not called & UNIQUE_PER_PROCESS)
                values = self._returned_by(node)
            elif isinstance(node, cst.Attribute):
                values = self._attribute_values(node)
            elif isinstance(node, cst.Name) and id(node) not in members:
                values = self._values_of(node.value, path) or self._passed_for(node.value, path)
            for value in values:
                found = self.per_process(value, depth + 1)
                if found is not None:
                    return found
        return None

    def _returned_by(self, call: cst.Call) -> list[cst.BaseExpression]:
        """What every ``return`` of the function of this file that ``call`` runs hands back
        (not a class's construction: the instance is no path)."""
        target = self.model.call_graph.callee(call)
        if target is None or target[0].name.value == "__init__":
            return []
        returns = self.model.index.own_returns(target[0])
        return [r.value for r in returns if r.value is not None]

    def _attribute_values(self, node: cst.Attribute) -> list[cst.BaseExpression]:
        """What ``self.ckpt`` is set to in the class that reads it (``self.ckpt = ckpt``);
        for ``trainer.ckpt`` outside the class, where ``trainer`` is an instance a class of the
        file made, what that class (or a base of it) sets ``self.ckpt`` to."""
        spelling = dotted(node)
        if spelling is None:
            return []
        graph = self.model.call_graph
        if spelling.startswith("self."):
            owner = self.placement.class_of(node)
            keepers = [owner] if owner is not None else []
        else:
            receiver = dotted(node.value)
            made = graph.instance_class(receiver, node) if receiver is not None else None
            instance = self.model.classes.get(made) if made is not None else None
            if instance is None or "." in (receiver or "."):
                return []
            spelling = f"self.{node.attr.value}"
            keepers = [c for c in self.model.classes.values() if graph.is_or_derives(instance, c)]
        return [
            assign.value
            for assign in self.model.index.assignments_to(spelling)
            if any(self.placement.class_of(assign) is c for c in keepers)
        ]

    def _attribute_owner(self, node: cst.Attribute) -> str | None:
        """The class of this file whose instance holds the attribute: the class around
        ``self.x``, the class that made ``trainer`` for ``trainer.x`` (one name, no deeper)."""
        receiver = dotted(node.value)
        if receiver == "self":
            owner = self.placement.class_of(node)
            return owner.name.value if owner is not None else None
        if receiver is None or "." in receiver:
            return None
        return self.model.call_graph.instance_class(receiver, node)

    def _passed_for(self, name: str, at: cst.CSTNode) -> list[cst.BaseExpression]:
        """What the callers in this file pass for the parameter ``name`` of the function around
        ``at``: ``Trainer(model, ckpt=os.path.join(workdir, "best.pt"))`` for ``ckpt``."""
        function = self._parameter_owner(name, at)
        if function is None:
            return []
        return [
            argument.value
            for call, implicit in self._runs_of(function)
            for parameter, argument in bound_arguments(function, call, implicit)  # type: ignore[arg-type]
            if parameter == name
        ]

    def _parameter_owner(self, name: str, at: cst.CSTNode) -> cst.FunctionDef | cst.Lambda | None:
        """The function or lambda whose parameter ``name`` read at ``at`` is: the one around
        it, or an enclosing one whose parameter a nested ``def`` reads (a closure), by Python's
        scoping (`name_scopes`); None where ``name`` is no parameter there."""
        owner = local_owner(self.model, name, at)
        if owner is None and binding_owners(self.model, name, at) is None:
            owner = self.placement.enclosing_function(at)  # a node the analysis built
        if isinstance(owner, cst.FunctionDef | cst.Lambda) and name in _parameters(owner):
            return owner
        return None

    def _runs_of(self, function: cst.FunctionDef | cst.Lambda) -> list[tuple[cst.Call, int]]:
        """The file's calls of ``function``; of a lambda, the calls of the one name it is
        assigned to (``load = lambda path: ...`` then ``load(ckpt)``) where that name means
        it."""
        if isinstance(function, cst.FunctionDef):
            return self.flow.calls_of(function)
        assign = self.model.parent(function)
        if not (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
        ):
            return []
        name, scope = assign.targets[0].target.value, self.model.scope_of(assign)
        found = []
        for call in self.model.calls:
            if not (isinstance(call.func, cst.Name) and call.func.value == name):
                continue
            owners = binding_owners(self.model, name, call.func)
            if owners is None or len(owners) != 1 or owners[0] is not scope:
                return []  # the name means something else there: the calls are not known
            found.append((call, 0))
        if len(self.model.index.values_bound_to(name)) != 1:
            return []  # bound again: which calls run the lambda is not known
        return found

    @cached_property
    def downloads(self) -> list[Download]:
        """Statements that download or prepare data on every rank, outermost first."""
        helpers = self._download_helpers()
        found: list[Download] = []
        for call in self.model.calls:
            if not (self._downloads(call) or self._helper_called(call, helpers)):
                continue
            if self.placement.enclosing_function(call) in helpers:
                continue  # the helper's call sites are the downloads
            if self.model.under_rank_guard(call):
                continue
            line = self._line_of(call)
            if self._shared_work(line):
                found.append(Download(line, call, None, with_shared_work=True))
                continue
            statement = self._widened(line)
            if any(self.placement.inside(statement, d.statement) for d in found):
                continue
            found.append(Download(statement, call, self._divergent(statement)))
        return found

    @cached_property
    def cache_builds(self) -> list[CacheBuild]:
        """Each ``if`` that tests whether a file exists and reads it in one arm, builds and
        writes it (on every rank, as written) in the other (`CacheBuild`), outermost first."""
        writes, reads = self._writes(), self._reads()
        found: list[CacheBuild] = []
        for call in self.model.calls:
            tested = self._existence_tested(call)
            if tested is None:
                continue
            statement = next((a for a in self.model.ancestors(call) if isinstance(a, cst.If)), None)
            if (
                statement is None
                or statement.orelse is None
                or not self.placement.inside(call, statement.test)
                or self.model.under_rank_guard(statement)
                or any(self.placement.inside(statement, f.statement) for f in found)
            ):
                continue
            arms = (statement.body, statement.orelse)
            pair = self._read_and_written(arms, tested, reads, writes)
            if pair is None:
                continue
            read, write, path = pair
            found.append(
                CacheBuild(
                    statement,
                    read,
                    write,
                    path,
                    self._divergent(statement),
                    with_shared_work=self._shared_work(statement, saves=False),
                    saved_behind_a_barrier=bool(self.model.call_names(write) & names.TORCH_SAVE),
                )
            )
        return found

    def _existence_tested(self, call: cst.Call) -> cst.BaseExpression | None:
        """The path ``os.path.exists(p)``, ``os.path.isfile(p)``, ``Path(p).exists()`` or
        ``p.is_file()`` asks about, or None."""
        if self.model.call_names(call) & {"os.path.exists", "os.path.isfile"}:
            return call.args[0].value if call.args else None
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in ("exists", "is_file"):
            receiver = func.value
            if (
                isinstance(receiver, cst.Call)
                and receiver.args
                and (dotted(receiver.func) or "").endswith("Path")
            ):
                return receiver.args[0].value
            return None if call.args else receiver
        return None

    def _read_and_written(
        self,
        arms: tuple[cst.CSTNode, cst.CSTNode],
        tested: cst.BaseExpression,
        reads: list[tuple[cst.Call, cst.BaseExpression]],
        writes: list[tuple[cst.Call, cst.BaseExpression]],
    ) -> tuple[cst.Call, cst.Call, cst.BaseExpression] | None:
        """A read of ``tested`` in one arm and a write of it in the other."""
        inside = self.placement.inside
        for read, read_path in reads:
            if not self._same_file(tested, read_path):
                continue
            for write, path in writes:
                if not self._same_file(tested, path):
                    continue
                if any(inside(read, a) and inside(write, b) for a, b in (arms, arms[::-1])):
                    return read, write, path
        return None

    def _downloads(self, call: cst.Call) -> bool:
        called = self.model.call_names(call)
        if called & DOWNLOADERS or any(n.startswith(DOWNLOADING_DATASETS) for n in called):
            return True
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in DOWNLOADING_METHODS:
            return True
        return any(
            a.keyword is not None
            and a.keyword.value == "download"
            and not (isinstance(a.value, cst.Name) and a.value.value in ("False", "None"))
            for a in call.args
        )

    def _helper_called(self, call: cst.Call, helpers: set[cst.FunctionDef]) -> bool:
        return isinstance(call.func, cst.Name) and self.model.functions.get(call.func.value) in (
            helpers
        )

    def _download_helpers(self) -> set[cst.FunctionDef]:
        """Module-level functions that download (or call one that does) and do no training
        work: calling one is a download."""
        helpers: set[cst.FunctionDef] = set()
        for _ in range(_MAX_DEPTH):
            grown = set(helpers)
            for call in self.model.calls:
                function = self.placement.enclosing_function(call)
                if function is None or function in grown:
                    continue
                if self.model.functions.get(function.name.value) is not function:
                    continue
                if (self._downloads(call) or self._helper_called(call, grown)) and not (
                    self._shared_work(function)
                ):
                    grown.add(function)
            if grown == helpers:
                break
            helpers = grown
        return helpers

    def _shared_work(self, node: cst.CSTNode, depth: int = 0, saves: bool = True) -> bool:
        """Work every rank must do in step, never inside a block the main process runs first:
        a forward or backward, a collective, an optimizer step, a save (the conversion puts a
        barrier before it; not counted when ``saves`` is False), a loop over a DataLoader; here
        or in a function of the file that ``node`` calls."""
        saving = names.TORCH_SAVE if saves else frozenset()
        backwards = {id(c) for c in self.model.backward_calls}
        for inner in walk(node):
            callee = self._callee(inner)
            if (
                callee is not None
                and callee is not node
                and depth < _MAX_DEPTH
                and self._shared_work(callee, depth + 1, saves)
            ):
                return True
            if isinstance(inner, cst.For):
                loop = next((loop for loop in self.model.loops if loop.node is inner), None)
                if loop is not None and (loop.trains or self.flow.reads_loader(loop)):
                    return True
            if not isinstance(inner, cst.Call):
                continue
            called = self.model.call_names(inner)
            func = dotted(inner.func) or ""
            if (
                id(inner) in backwards
                or self.flow.is_forward(inner)
                or called & (collectives.FUNCTIONS | saving)
                or func.startswith(("accelerator.", "self.accelerator."))
                or func.endswith((".step", ".prepare"))
            ):
                return True
        return False

    def _callee(self, node: cst.CSTNode) -> cst.FunctionDef | cst.ClassDef | None:
        """The function of this file that ``node`` calls: ``helper(...)``, ``self.m(...)`` in
        the class that defines ``m``, or a class of the file it builds (its methods run)."""
        if not isinstance(node, cst.Call):
            return None
        if isinstance(node.func, cst.Name):
            name = node.func.value
            classes = (s for s in self.model.module.body if isinstance(s, cst.ClassDef))
            return self.model.functions.get(name) or next(
                (c for c in classes if c.name.value == name), None
            )
        if isinstance(node.func, cst.Attribute) and dotted(node.func.value) == "self":
            owner = self.placement.class_of(node)
            if owner is not None:
                for statement in owner.body.body:
                    if (
                        isinstance(statement, cst.FunctionDef)
                        and statement.name.value == node.func.attr.value
                    ):
                        return statement
        return None

    def _line_of(self, node: cst.CSTNode) -> cst.CSTNode:
        for ancestor in (node, *self.model.ancestors(node)):
            if isinstance(self.model.parent(ancestor), (cst.IndentedBlock, cst.Module)):
                return ancestor
        return node

    def _widened(self, statement: cst.CSTNode) -> cst.CSTNode:
        """Out through the ``if``/``with``/``try`` blocks around ``statement`` that do no
        shared work, up to the function's (or module's) own body."""
        current = statement
        while True:
            block = self.model.parent(current)
            owner = self.model.parent(block) if block is not None else None
            while isinstance(owner, (cst.Else, cst.ExceptHandler, cst.Finally, cst.If)) and not (
                isinstance(self.model.parent(owner), (cst.IndentedBlock, cst.Module))
            ):
                owner = self.model.parent(owner)  # an elif, an else, a handler: its statement
            if not isinstance(owner, (cst.If, cst.With, cst.Try)) or self._shared_work(owner):
                return current
            if self.model.under_rank_guard(owner) or _tests_rank(self.model, owner):
                return current
            current = owner

    def divergent_around(
        self,
        node: cst.CSTNode,
        depth: int = 0,
        decided_alike: Callable[[cst.If], bool] | None = None,
        outside: bool = False,
    ) -> cst.If | None:
        """The ``if`` the ranks may disagree on that ``node`` runs under: in its function, or
        around a call of that function (by name, or ``self.method()`` in its class), so far as
        the file shows. None: every rank that runs the function's callers gets there.
        ``decided_alike`` names the branches every rank decides alike though their tests read
        values this rank computed (a metric the conversion gathers). With ``outside``, a
        method's calls from outside its class count too (`_calls_of`)."""
        function = self.placement.enclosing_function(node)
        branch = self._ranks.divergent_branch(node, within=function)
        if branch is not None and decided_alike is not None:
            branch = None
            for ancestor in self.model.ancestors(node):
                if ancestor is function:
                    break
                if (
                    isinstance(ancestor, cst.If)
                    and not self.model.inside(node, ancestor.test)
                    and not self._ranks.uniform(ancestor.test)
                    and not decided_alike(ancestor)
                ):
                    branch = ancestor
        if branch is not None:
            return branch
        return self._first_at_callers(
            function,
            depth,
            lambda call, deeper: self.divergent_around(call, deeper, decided_alike, outside),
            outside,
        )

    def parting_before(
        self,
        node: cst.CSTNode,
        depth: int = 0,
        decided_alike: Callable[[cst.If], bool] | None = None,
        outside: bool = False,
    ) -> cst.If | cst.ExceptHandler | None:
        """Where some ranks may never get to ``node`` though no branch the ranks disagree on
        holds it: an ``except`` block around it, or a stop this rank may take alone above it
        (``if loss.item() > best: continue`` in its loop, ``if ...: return`` in its function);
        in its function or around a call of that function. A collective there waits for ranks
        that left."""
        function = self.placement.enclosing_function(node)
        handler = self._ranks.handler_around(node)
        if handler is not None:
            return handler
        order = self.model.order(node)
        for test, stop in self._ranks.per_process_stops():
            if self.model.order(test) >= order or (decided_alike and decided_alike(test)):
                continue
            if self.model.inside(node, test.test):
                continue  # ``if any(cb(loss) for cb in callbacks): break``: run before the stop
            if isinstance(stop, cst.Return):
                if function is not None and self.placement.enclosing_function(test) is function:
                    return test
                continue
            loop = self.model.index.enclosing_loop(test)
            if loop is not None and self.model.inside(node, loop):
                return test  # ``continue`` skips it this time, ``break`` every time after
        return self._first_at_callers(
            function,
            depth,
            lambda call, deeper: self.parting_before(call, deeper, decided_alike, outside),
            outside,
        )

    def barrier_unreached(
        self, places: list[cst.CSTNode], decided_alike: Callable[[cst.If], bool] | None = None
    ) -> cst.If | cst.ExceptHandler | None:
        """Why some ranks may never get to one of ``places`` (where barriers would go): an
        ``except`` block, a stop this rank may take alone, or a branch the ranks may decide
        differently, in its function or around any call of it in this file (a method's calls
        from other classes too: ``if logs["train_loss"] < self.best:
        trainer._save_checkpoint(path)`` in a callback). None: every rank reaches each. A
        barrier is only ever inserted where this is None; elsewhere it would wait for ranks
        that never come."""
        for place in places:
            found = self.parting_before(place, decided_alike=decided_alike, outside=True)
            if found is None:
                found = self.divergent_around(place, decided_alike=decided_alike, outside=True)
            if found is not None:
                return found
        return None

    def _first_at_callers(
        self,
        function: cst.FunctionDef | None,
        depth: int,
        find: Callable[[cst.Call, int], _Found | None],
        outside: bool = False,
    ) -> _Found | None:
        """What ``find`` sees first around a call of ``function`` in this file: a rank reaches
        the function's body only through one of its calls, so what holds a call holds the body
        too (``_MAX_DEPTH`` calls up at most)."""
        if function is None or depth >= _MAX_DEPTH:
            return None
        for call in self._calls_of(function, outside):
            found = find(call, depth + 1)
            if found is not None:
                return found
        return None

    def _calls_of(self, function: cst.FunctionDef, outside: bool = False) -> list[cst.Call]:
        """The calls through which a rank may run ``function``: for a method, ``self.name()``
        in its class; with ``outside``, also the calls from outside it
        (``trainer._save_checkpoint(path)`` in a callback, resolved or only possibly the
        method's): a barrier or a collective inside the method is reached by some ranks only
        when any of them is."""
        owner = self.placement.class_of(function)
        if owner is None:
            return self.placement.callers(function)
        inside = [
            call
            for call in self.model.calls
            if isinstance(call.func, cst.Attribute)
            and call.func.attr.value == function.name.value
            and dotted(call.func.value) == "self"
            and self.placement.class_of(call) is owner
        ]
        if not outside:
            return inside
        graph = self.model.call_graph
        others = [
            call
            for call in [*graph.callers(function), *graph.uncertain_callers(function)]
            if self.placement.class_of(call) is not owner
        ]
        return list(dict.fromkeys([*inside, *others]))

    def _divergent(self, statement: cst.CSTNode) -> cst.CSTNode | None:
        return self.divergent_around(statement)

    # --- the calls ------------------------------------------------------------------------------
    def _writes(self) -> list[tuple[cst.Call, cst.BaseExpression]]:
        found = []
        for call in self.model.calls:
            if self.model.under_rank_guard(call) or side_effects.per_rank_path(self.model, call):
                continue
            path = _path(self.model, call, WRITERS, WRITING_METHODS)
            if path is not None:
                found.append((call, path))
        for with_node in self.placement.withs():
            for item in with_node.items:
                opened = item.item
                if (
                    side_effects.opens_for_writing(opened)
                    and opened.args  # type: ignore[attr-defined]
                    and not self.model.under_rank_guard(with_node)
                ):
                    found.append((opened, opened.args[0].value))  # type: ignore[attr-defined]
        return found

    @cached_property
    def reads_files(self) -> bool:
        """The file reads some file back (a checkpoint, a log, settings) somewhere."""
        return bool(self._reads())

    @cached_property
    def written_on_one_rank(self) -> list[cst.Call]:
        """The file's writes that run on the main process only (``accelerator.save``, a write
        under a rank test): a project's other modules that read those files back must wait."""
        return [call for call in self.model.calls if self._written_by_one_rank(call) is not None]

    def file_reads(self) -> list[tuple[cst.Call, cst.BaseExpression]]:
        """Each call that reads a file (``torch.load(p)``, ``open(p)``), with its path."""
        return self._reads()

    def _reads(self) -> list[tuple[cst.Call, cst.BaseExpression]]:
        found = []
        for call in self.model.calls:
            if side_effects.opens_for_writing(call):
                continue
            path = _path(self.model, call, READERS, READING_METHODS)
            if path is not None:
                found.append((call, path))
        return found

    # --- paths ----------------------------------------------------------------------------------
    def _same_file(self, a: cst.BaseExpression, b: cst.BaseExpression) -> bool:
        return bool(_unselfed(self._spellings(a)) & _unselfed(self._spellings(b)))

    def _spellings(self, path: cst.BaseExpression, depth: int = 0) -> set[str]:
        """The path's code, and that of the one value its name holds: assigned once in scope,
        or passed for this parameter at every call site of the helper."""
        spellings = {self.model.module.code_for_node(path).strip()}
        if depth > _MAX_DEPTH:
            return spellings
        if not isinstance(path, (cst.Name, cst.Attribute)):
            substituted = self._substituted(path, depth)
            # and with what a kept argument's own name holds where the caller passes it:
            # ``os.path.join(self.dirpath, "best.pt")`` of a callback built as
            # ``ModelCheckpoint(ckpt_dir)`` in ``Fit.__init__(self, ckpt_dir="ckpt")`` is
            # ``os.path.join("ckpt", "best.pt")``, the ``"ckpt/best.pt"`` main() loads
            deeper = self._substituted(path, depth, follow_kept=True)
            spellings.add(self.model.module.code_for_node(substituted).strip())
            spellings.add(self.model.module.code_for_node(deeper).strip())
            for spelled in (path, substituted, deeper):
                constant = self._constant_path(spelled)
                if constant is not None:
                    spellings.add(constant)
            template = _template(path)
            if template is not None:
                spellings.add(template)
            joined = _joined(path, self.model)
            if joined is not None:
                spellings.add(joined)
            # ``paths["ckpt"]`` of ``paths = {"ckpt": os.path.join(out, "best.pt")}``: the
            # path the entry holds, as the load of ``os.path.join(out, "best.pt")`` spells it;
            # and what a function of the file returns (``pred_file = trainer.test()``, whose
            # ``return path`` names the file ``test()`` wrote)
            held = self._entry_values(path) if isinstance(path, cst.Subscript) else []
            for value in held or (self._returned_by(path) if isinstance(path, cst.Call) else []):
                spellings |= self._spellings(value, depth + 1)
            return spellings
        if isinstance(path, cst.Attribute):
            # ``self.path`` set in its class (``self.path = path``): the value's spellings too,
            # so a callback's ``torch.save(..., self.path)`` meets ``torch.load(ckpt)`` in the
            # function that built it with ``path=ckpt``; ``trainer.best_path`` outside the class
            # is the ``self.best_path`` its methods (and the objects they build) write. Set to
            # several values, it may be any of them (a barrier too many costs a wait; one too
            # few, a read before the write).
            owner = self._attribute_owner(path)
            if owner is not None:
                spellings.add(f"attribute:{owner}.{path.attr.value}")
            for value in _distinct(self.model, self._attribute_values(path)):
                spellings |= self._spellings(value, depth + 1)
            return spellings
        if not isinstance(path, cst.Name):
            return spellings
        opened = self._opened_path(path)
        if opened is not None:
            # ``torch.load(f)`` in ``with open(path, "rb") as f:`` reads ``path``: spelled as
            # the handle, two ``f`` of one function would be one file and a save through ``f``
            # and a load through ``fh`` two
            return self._spellings(opened, depth + 1)
        values = self._values_of(path.value, path)
        function = self._parameter_owner(path.value, path)
        listed = False
        if not values and function is not None:
            # a parameter is its function's own name for what the callers pass: ``path`` of
            # one helper is not ``path`` of another
            owner = function.name.value if isinstance(function, cst.FunctionDef) else "lambda"
            spellings = {f"{owner}({path.value})"}
            values = self._passed_or_default(function, path.value)
        elif not values:
            values = self._loop_values(path.value, path) or []
            listed = bool(values)
        if len({self.model.module.code_for_node(v).strip() for v in values}) == 1:
            spellings |= self._spellings(values[0], depth + 1)
        elif (function is not None or listed) and values:
            # ``load(self, path)`` called with ``args.resume`` and with ``args.ckpt``: it may
            # read either file, so it reads each of them (a barrier too many costs a wait; one
            # too few, a read before the write)
            for value in values:
                spellings |= self._spellings(value, depth + 1)
        return spellings

    def opened_at(self, read: cst.Call) -> cst.CSTNode:
        """Where ``read`` opens its file: the ``with open(path) as f:`` whose handle it reads
        (``torch.load(f)``), else the call itself. A barrier before the read goes before the
        ``with``: inside it the file is already open, and a rank past the barrier reads what
        it opened before the main process wrote it (or finds no file at all)."""
        path = _path(self.model, read, READERS, READING_METHODS)
        if isinstance(path, cst.Name):
            found = self._opener(path)
            if found is not None:
                return found[0]
        return read

    def opened_path(self, path: cst.BaseExpression) -> cst.BaseExpression:
        """The path a file handle ``f`` of ``with open(path) as f:`` was opened with, else
        ``path`` itself: what a summary names."""
        opened = self._opened_path(path) if isinstance(path, cst.Name) else None
        return path if opened is None else opened

    def _opened_path(self, handle: cst.Name) -> cst.BaseExpression | None:
        found = self._opener(handle)
        return None if found is None else found[1]

    def _opener(self, handle: cst.Name) -> tuple[cst.With, cst.BaseExpression] | None:
        """The ``with open(path, ...) as handle:`` around ``handle``, with its path."""
        for ancestor in self.model.ancestors(handle):
            if not isinstance(ancestor, cst.With):
                continue
            for item in ancestor.items:
                opener = item.item
                if (
                    item.asname is not None
                    and isinstance(item.asname.name, cst.Name)
                    and item.asname.name.value == handle.value
                    and isinstance(opener, cst.Call)
                    and "builtins.open" in self.model.call_names(opener)
                    and opener.args
                    and opener.args[0].keyword is None
                ):
                    return ancestor, opener.args[0].value
        return None

    def _constant_path(self, path: cst.BaseExpression) -> str | None:
        """The file a path made of constants only names, normalised: ``'best' + '_LSTM.pt'``
        saved in a helper and ``os.path.join('./', "best_LSTM.pt")`` loaded by the caller are
        ``path:best_LSTM.pt`` both. None when any part of it is not a constant string."""
        text = self._constant_text(path)
        return None if not text else f"path:{os.path.normpath(text)}"

    def _constant_text(self, node: cst.BaseExpression) -> str | None:
        if isinstance(node, cst.SimpleString):
            value = node.evaluated_value
            return value if isinstance(value, str) else None
        if isinstance(node, cst.ConcatenatedString):
            left, right = self._constant_text(node.left), self._constant_text(node.right)
            return None if left is None or right is None else left + right
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
            left, right = self._constant_text(node.left), self._constant_text(node.right)
            return None if left is None or right is None else left + right
        if isinstance(node, cst.FormattedString):
            if any(not isinstance(p, cst.FormattedStringText) for p in node.parts):
                return None
            return "".join(p.value for p in node.parts)  # type: ignore[union-attr]
        if isinstance(node, cst.Subscript):
            return self._constant_text_of_entry(node)
        if isinstance(node, cst.Call) and _JOIN in self.model.call_names(node):
            if not node.args or any(a.keyword is not None or a.star for a in node.args):
                return None
            parts = [self._constant_text(a.value) for a in node.args]
            if any(part is None for part in parts):
                return None
            return os.path.join(*parts)  # type: ignore[arg-type]
        return None

    def _constant_text_of_entry(self, node: cst.Subscript) -> str | None:
        """``CFG["ckpt_dir"]`` where ``CFG`` is bound once, at the module's level, to a dict
        written out (``CFG = {"ckpt_dir": "checkpoints", ...}``): the constant string it holds
        under that key. A script that changes the entry later is not followed: a path taken
        for the same file as another costs a barrier, never a read before the write."""
        if not isinstance(node.value, cst.Name) or len(node.slice) != 1:
            return None
        index = node.slice[0].slice
        if not isinstance(index, cst.Index) or not isinstance(index.value, cst.SimpleString):
            return None
        key = index.value.evaluated_value
        bound = [
            value
            for statement, value in self.model.index.values_bound_to(node.value.value)
            if self.model.scope_of(statement) is self.model.module
        ]
        if len(bound) != 1 or not isinstance(bound[0], cst.Dict):
            return None
        for element in bound[0].elements:
            if (
                isinstance(element, cst.DictElement)
                and isinstance(element.key, cst.SimpleString)
                and element.key.evaluated_value == key
            ):
                return self._constant_text(element.value)
        return None

    def _entry_values(self, entry: cst.Subscript) -> list[cst.BaseExpression]:
        """What ``paths["ckpt"]`` holds where ``paths`` (a name, ``self.paths``, a parameter
        every call of the file hands one) is a dict written out (``{"ckpt": p}`` or
        ``dict(ckpt=p)``), or that entry stored into (``paths["ckpt"] = p``): each such ``p``. A
        dict the file does not write out gives nothing."""
        key = _constant_key(entry)
        held = entry.value
        if key is None or not isinstance(held, (cst.Name, cst.Attribute)):
            return []
        if isinstance(held, cst.Attribute):
            containers = self._attribute_values(held)
        else:
            containers = self._values_of(held.value, entry)
            function = self._parameter_owner(held.value, entry)
            if not containers and function is not None:
                containers = self._passed_or_default(function, held.value)
        found = [v for c in containers if (v := _written_entry(self.model, c, key)) is not None]
        spelled = self.model.module.code_for_node(held).strip()
        for assign in self.model.assignments:
            for target in assigned_targets(assign):
                if (
                    isinstance(target, cst.Subscript)
                    and _constant_key(target) == key
                    and self.model.module.code_for_node(target.value).strip() == spelled
                    and isinstance(assign, cst.Assign)
                ):
                    found.append(assign.value)
        return found

    def _substituted(
        self, path: cst.BaseExpression, depth: int, follow_kept: bool = False
    ) -> cst.BaseExpression:
        """``path`` with each plain name in it (not an attribute's object, not a called
        function) replaced by the one value it holds: ``os.path.join(self.cfg.out, name)`` in
        ``save_checkpoint(self, name)``, which every call hands ``"best.pt"``, is
        ``os.path.join(self.cfg.out, "best.pt")``, the path a caller loads."""
        skipped = set()
        for node in walk(path):
            if isinstance(node, cst.Attribute):
                skipped |= {id(node.value), id(node.attr)}
            elif isinstance(node, cst.Call):
                skipped.add(id(node.func))
                skipped |= {id(a.keyword) for a in node.args if a.keyword is not None}
        replaced: dict[int, cst.BaseExpression] = {}
        for node in walk(path):
            kept = self._kept_argument(node)
            if kept is not None:
                deeper = self._kept_value(node, depth) if follow_kept else None
                replaced[id(node)] = deeper if deeper is not None else kept
                continue
            if not isinstance(node, cst.Name) or id(node) in skipped:
                continue
            values = self._values_of(node.value, node)
            function = self._parameter_owner(node.value, node)
            if not values and function is not None:
                values = self._passed_or_default(function, node.value)
            codes = {self.model.module.code_for_node(v).strip() for v in values}
            if len(codes) == 1 and depth < _MAX_DEPTH:
                value = values[0]
                if not isinstance(value, (cst.Name, cst.Attribute)):
                    value = self._substituted(value, depth + 1)
                replaced[id(node)] = value
        # at once: a replacement rebuilds the nodes around it, and a second one would look for
        # a node the first left behind
        return path.visit(_Replaced(replaced)) if replaced else path  # type: ignore[return-value]

    def _kept_argument(self, node: cst.CSTNode) -> cst.BaseExpression | None:
        """``self.dirpath`` in a method of a class whose ``__init__`` keeps its parameter there
        (``self.dirpath = dirpath``), and every construction in the file hands it one name
        (``ModelCheckpoint(ckpt_dir)``): that name, the caller's spelling of the same value, so
        ``os.path.join(self.dirpath, "best.pt")`` the callback saves is the
        ``os.path.join(ckpt_dir, "best.pt")`` its caller loads."""
        if not isinstance(node, cst.Attribute) or not isinstance(node.value, cst.Name):
            return None
        if node.value.value != "self":
            return None
        passed = set(self.flow.kept_arguments(dotted(node), node))
        if len(passed) != 1:
            return None
        (name,) = passed
        if name is not None:
            return cst.parse_expression(name)
        # or one entry of a name the caller holds (``ModelCheckpoint(config["ckpt_dir"])``),
        # spelled alike at every construction: the ``os.path.join(config["ckpt_dir"], ...)``
        # that caller loads
        values = self.flow.kept_argument_values(dotted(node), node)
        codes = {self.model.module.code_for_node(value).strip() for value in values}
        if len(codes) != 1 or not all(_entry_of_a_name(value) for value in values):
            return None
        return cst.parse_expression(codes.pop())

    def _kept_value(self, node: cst.Attribute, depth: int) -> cst.BaseExpression | None:
        """The one value the name every construction hands ``self.<attr>`` (`_kept_argument`)
        holds where the construction is: ``"ckpt"``, the default of ``Fit.__init__``'s
        ``ckpt_dir`` that ``ModelCheckpoint(ckpt_dir)`` passes on, no caller giving another.
        None where that is not one value."""
        passed = self.flow.kept_argument_values(dotted(node), node)
        if len(passed) != 1 or not isinstance(passed[0], cst.Name) or depth >= _MAX_DEPTH:
            return None
        name = passed[0]
        values = self._values_of(name.value, name)
        function = self._parameter_owner(name.value, name)
        if not values and function is not None:
            values = self._passed_or_default(function, name.value)
        if len({self.model.module.code_for_node(v).strip() for v in values}) != 1:
            return None
        value = values[0]
        if isinstance(value, (cst.Name, cst.Attribute)):
            return None
        return self._substituted(value, depth + 1)

    def _passed_or_default(
        self, function: cst.FunctionDef | cst.Lambda, name: str
    ) -> list[cst.BaseExpression]:
        """What each call of ``function`` in the file gives its parameter ``name``: the argument,
        or the default where a call leaves it out (``EarlyStopping(patience=2)`` saves to
        ``path="checkpoint.pt"``)."""
        default = next(
            (p.default for p in all_params(function.params) if p.name.value == name), None
        )
        values = []
        for call, implicit in self._runs_of(function):
            passed = [a.value for n, a in bound_arguments(function, call, implicit) if n == name]  # type: ignore[arg-type]
            if passed:
                values += passed
            elif default is not None and not _unpacks(call):
                values.append(default)
        return values

    def _passed_unseen(self, function: cst.FunctionDef | cst.Lambda, name: str) -> bool:
        """Some call of ``function`` may pass ``name`` in what it unpacks
        (``EarlyStopping(**cfg["early_stopping"])``), not by name nor position."""
        return any(
            _unpacks(call)
            and not any(n == name for n, _ in bound_arguments(function, call, implicit))  # type: ignore[arg-type]
            for call, implicit in self._runs_of(function)
        )

    def _loop_values(self, name: str, at: cst.CSTNode) -> list[cst.BaseExpression] | None:
        """What ``name`` takes, item by item, in the loop around ``at`` that binds it, where the
        loop goes over values the file lists: ``for path, n in (("train.txt", 96), ("val.txt",
        16)):`` gives ``path`` the two file names; ``for name, path in FILES.items()`` the
        values of a dict written out (here or in a name bound to it once). A file written
        at each ``path`` is each of those files, read back by every rank where the file
        opens them by name (``read_data("train.txt")``). None where no such loop binds it, or
        what it goes over is not written out (a path the file does not show: `unknown_path`)."""
        loop = next(
            (
                a
                for a in self.model.ancestors(at)
                if isinstance(a, cst.For) and name in target_names(a.target)
            ),
            None,
        )
        if loop is None or self.placement.enclosing_function(loop) is not (
            self.placement.enclosing_function(at)
        ):
            return None
        if any(
            self.model.scope_of(statement) is self.model.scope_of(loop)
            for statement, _ in self.model.index.values_bound_to(name)
        ):
            return None  # bound again beside the loop: which value is written is not known
        items = self._listed_items(loop.iter, loop)
        if items is None:
            return None
        found = []
        for item in items:
            value = _unpacked(loop.target, item, name)
            if value is None:
                return None
            found.append(value)
        return found

    def _listed_items(
        self, iterable: cst.BaseExpression, at: cst.CSTNode, depth: int = 0
    ) -> list[cst.BaseExpression] | None:
        """The items a loop over ``iterable`` takes, where the file writes them out: a list,
        tuple or set literal, a dict literal's keys, ``.items()``/``.values()``/``.keys()`` of
        a dict literal, or a name bound once (in scope) to one of those, or a parameter every
        call of the file hands one of those."""
        if depth > _MAX_DEPTH:
            return None
        if isinstance(iterable, cst.Name):
            values = self._values_of(iterable.value, at)
            function = self._parameter_owner(iterable.value, at)
            if not values and function is not None:
                # ``make(["a.txt", "b.txt"])``: what the one call of the file hands it
                values = self._passed_or_default(function, iterable.value)
                if self._passed_unseen(function, iterable.value):
                    return None
            if len(values) != 1:
                return None
            return self._listed_items(values[0], at, depth + 1)
        if isinstance(iterable, (cst.List, cst.Tuple, cst.Set)):
            if any(isinstance(e, cst.StarredElement) for e in iterable.elements):
                return None
            return [e.value for e in iterable.elements]
        if isinstance(iterable, cst.Dict):
            return self._dict_items(iterable, "keys")
        if (
            isinstance(iterable, cst.Call)
            and not iterable.args
            and isinstance(iterable.func, cst.Attribute)
            and iterable.func.attr.value in ("items", "values", "keys")
        ):
            held = iterable.func.value
            if isinstance(held, cst.Name):
                values = self._values_of(held.value, at)
                held = values[0] if len(values) == 1 else held
            if isinstance(held, cst.Dict):
                return self._dict_items(held, iterable.func.attr.value)
        return None

    @staticmethod
    def _dict_items(held: cst.Dict, view: str) -> list[cst.BaseExpression] | None:
        if any(not isinstance(e, cst.DictElement) for e in held.elements):
            return None  # ``**other``: entries the file does not write out
        entries = [e for e in held.elements if isinstance(e, cst.DictElement)]
        if view == "keys":
            return [e.key for e in entries]
        if view == "values":
            return [e.value for e in entries]
        return [cst.Tuple([cst.Element(e.key), cst.Element(e.value)]) for e in entries]

    def _values_of(self, name: str, at: cst.CSTNode) -> list[cst.BaseExpression]:
        """What ``name`` is bound to in the scope of ``at`` (or the module's): assignments and
        ``with X as name``. A parameter of the function around ``at`` hides the module's name:
        ``def test(model, model_path)`` reads what its callers pass, not the
        ``model_path = "./ckpt"`` of the script's ``__main__`` block (taken for it, a load of
        ``f"{model_path}/model.bin"`` looked like another file and got no barrier). Python's
        own scoping decides (`name_scopes`): a closure reading its enclosing function's
        parameter, a lambda's parameter, a comprehension's name are the function's own."""
        owners = binding_owners(self.model, name, at)
        if owners is not None:
            return [
                value
                for statement, value in self.model.index.values_bound_to(name)
                if any(self.model.scope_of(statement) is owner for owner in owners)
            ]
        # a node the analysis built (a substituted path): by the function around it
        scope = self.model.scope_of(at)
        function = self.placement.enclosing_function(at)
        scopes = {scope, self.model.module}
        hidden = function is not None and name in _parameters(function)
        if hidden and scope is not self.model.module:
            scopes = {scope}
        return [
            value
            for statement, value in self.model.index.values_bound_to(name)
            if self.model.scope_of(statement) in scopes
        ]

    def _may_follow(self, read: cst.Call, write: cst.Call) -> bool:
        """``read`` can run after ``write``: below it, or in a loop around both, in the first
        function that runs both (``load_checkpoint()`` called before the training loop whose
        ``save_checkpoint()`` writes the file reads what an earlier run wrote), or in a later
        run of that function: its callers run it again (``train(2)`` then ``train(4)``, a call
        in a loop), so a resume at its top reads what its previous run saved at its end. In
        functions called in an order the file does not show, it can."""
        writes = self._call_chain(write)
        common = False
        for function, read_anchors in self._call_chain(read).items():
            write_anchors = writes.get(function)
            if write_anchors is None:
                if common:
                    return False
                continue
            common = True
            if any(self._follows(r, w) for r in read_anchors for w in write_anchors):
                return True
        return not common

    def _follows(self, later: cst.CSTNode, earlier: cst.CSTNode) -> bool:
        """In one function: ``later`` is below ``earlier``, or in a loop around both."""
        if self.model.order(later) > self.model.order(earlier):
            return True
        return any(
            isinstance(loop, (cst.For, cst.While)) and self.placement.inside(earlier, loop)
            for loop in self.model.ancestors(later)
        )

    def _call_chain(self, node: cst.CSTNode) -> dict[cst.FunctionDef | None, list[cst.CSTNode]]:
        """Where ``node`` runs, function by function outwards: itself in its function, then the
        calls of that function in the one function that calls it, and so on (`_callers_chain`;
        ``None``: the module's own code)."""
        lam = self._lambda_around(node)
        if lam is not None:  # a lambda's body runs at its calls, not where it is written
            runs = [call for call, _ in self._runs_of(lam)]
            functions = {self.placement.enclosing_function(call) for call in runs}
            if len(functions) == 1:
                (function,) = functions
                return {function: list(runs), **self._callers_chain(function)}
        function = self.placement.enclosing_function(node)
        return {function: [node], **self._callers_chain(function)}

    def _lambda_around(self, node: cst.CSTNode) -> cst.Lambda | None:
        """The lambda whose body holds ``node``, inside the function around it."""
        for ancestor in self.model.ancestors(node):
            if isinstance(ancestor, cst.Lambda):
                return ancestor
            if isinstance(ancestor, cst.FunctionDef):
                return None
        return None

    def _callers_chain(
        self, function: cst.FunctionDef | None
    ) -> dict[cst.FunctionDef | None, list[cst.CSTNode]]:
        """The calls of ``function`` in the one function that makes them, then that function's
        calls, and so on while every call is known (none through a name the file cannot follow,
        never handed on as a value) and in a single function. Kept per function: every read and
        write in it shares the walk, and each step scans the file for references."""
        if function in self._chains:
            return self._chains[function]
        chain: dict[cst.FunctionDef | None, list[cst.CSTNode]] = {}
        self._chains[function] = chain
        graph = self.model.call_graph
        current = function
        for _ in range(_MAX_DEPTH - 1):
            if current is None:
                break
            sites: list[cst.CSTNode] = [call for call, _ in self.flow.calls_of(current)]
            if not sites or graph.uncertain_callers(current) or graph.references(current):
                break
            callers = {self.placement.enclosing_function(site) for site in sites}
            if len(callers) != 1:
                break
            (current,) = callers
            if current is function or current in chain:
                break  # recursion
            chain[current] = sites
        return chain


class _Replaced(cst.CSTTransformer):
    """Each node whose id is a key replaced by its value (its children left unvisited)."""

    def __init__(self, replaced: dict[int, cst.BaseExpression]) -> None:
        super().__init__()
        self.replaced = replaced

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) not in self.replaced

    def on_leave(self, original_node, updated_node):  # type: ignore[no-untyped-def]
        return self.replaced.get(id(original_node), updated_node)


def _unpacks(call: cst.Call) -> bool:
    """``call`` hands over arguments the file does not spell one by one (``*args``,
    ``**kwargs``): any parameter may be among them."""
    return any(argument.star for argument in call.args)


def _unpacked(
    target: cst.BaseExpression, item: cst.BaseExpression, name: str
) -> cst.BaseExpression | None:
    """The part of ``item`` a loop target gives ``name``: the item itself for ``for name in``,
    its element in the same place for ``for name, n in`` over written-out tuples; None where
    the item is no such tuple (a name, a call: its parts are not shown)."""
    if isinstance(target, cst.Name):
        return item if target.value == name else None
    if not isinstance(target, (cst.Tuple, cst.List)) or not isinstance(item, (cst.Tuple, cst.List)):
        return None
    if len(target.elements) != len(item.elements) or any(
        isinstance(e, cst.StarredElement) for e in (*target.elements, *item.elements)
    ):
        return None
    for part, value in zip(target.elements, item.elements, strict=True):
        if name in target_names(part.value):
            return _unpacked(part.value, value.value, name)
    return None


def _distinct(model: ScriptModel, values: list[cst.BaseExpression]) -> list[cst.BaseExpression]:
    """``values`` with one of each code: an attribute set twice to the same path (an
    ``__init__`` that repeats ``self.best_path = os.path.join(...)``) holds one value."""
    seen: dict[str, cst.BaseExpression] = {}
    for value in values:
        seen.setdefault(model.module.code_for_node(value).strip(), value)
    return list(seen.values())


def _constant_key(entry: cst.Subscript) -> str | None:
    """``"ckpt"`` of ``paths["ckpt"]``; None for any other index."""
    if len(entry.slice) != 1 or not isinstance(entry.slice[0].slice, cst.Index):
        return None
    index = entry.slice[0].slice.value
    key = index.evaluated_value if isinstance(index, cst.SimpleString) else None
    return key if isinstance(key, str) else None


def _written_entry(
    model: ScriptModel, written: cst.BaseExpression, key: str
) -> cst.BaseExpression | None:
    """The value at ``key`` of a dict written out: ``{"ckpt": p}`` or ``dict(ckpt=p)``."""
    if isinstance(written, cst.Dict):
        return next(
            (
                e.value
                for e in written.elements
                if isinstance(e, cst.DictElement)
                and isinstance(e.key, cst.SimpleString)
                and e.key.evaluated_value == key
            ),
            None,
        )
    if isinstance(written, cst.Call) and model.qualified(written.func) & {"builtins.dict", "dict"}:
        return next(
            (a.value for a in written.args if a.keyword is not None and a.keyword.value == key),
            None,
        )
    return None


def _entry_of_a_name(value: cst.BaseExpression) -> bool:
    """``config["ckpt_dir"]``, ``cfg.paths["out"]``: a name's entry under constant keys, the
    same value wherever the caller spells it alike (no call, no computed key)."""
    if isinstance(value, cst.Subscript):
        return all(
            isinstance(element.slice, cst.Index)
            and isinstance(element.slice.value, (cst.SimpleString, cst.Integer))
            for element in value.slice
        ) and (isinstance(value.value, cst.Name) or _entry_of_a_name(value.value))
    if isinstance(value, cst.Attribute):
        return isinstance(value.value, cst.Name) or _entry_of_a_name(value.value)
    return False


def _unselfed(spellings: set[str]) -> set[str]:
    """Spellings with ``self.`` dropped: a class keeps what its caller handed it under the
    caller's name (``self.args = args``), so ``os.path.join(self.args.out, "ckpt.pt")`` in a
    method and ``os.path.join(args.out, "ckpt.pt")`` in ``main`` name one file. Two files taken
    for one cost a barrier every rank reaches; one file taken for two, a read before the write."""
    return spellings | {re.sub(r"\bself\.", "", spelling) for spelling in spellings}


def _template(path: cst.BaseExpression) -> str | None:
    """A path made per item from one pattern, its fields blanked: ``'{}.pkl'.format(epoch)``
    and ``f"{best_epoch}.pkl"`` are both ``template:{}.pkl``. A file saved per epoch and the best
    epoch's loaded after the loop (pyGAT's early stopping) are one family: the read may be of
    the file the last write made."""
    if isinstance(path, cst.Call) and isinstance(path.func, cst.Attribute):
        pattern = path.func.value
        if path.func.attr.value != "format" or not isinstance(pattern, cst.SimpleString):
            return None
        text = re.sub(r"\{[^{}]*\}", "{}", str(pattern.evaluated_value))
    elif isinstance(path, cst.FormattedString):
        text = "".join(
            part.value if isinstance(part, cst.FormattedStringText) else "{}" for part in path.parts
        )
    else:
        return None
    if "{}" not in text or not re.sub(r"\{\}|\s", "", text):
        return None
    return f"template:{text}"


def _joined(path: cst.BaseExpression, model: ScriptModel) -> str | None:
    """The parts of a path joined by ``/``, each a constant's text or a value's code:
    ``os.path.join(args.out, "model.pt")`` saved and ``f"{args.out}/model.pt"`` loaded are both
    ``joined:args.out/model.pt``. None for any other shape (a conversion or format spec in the
    f-string, a part that is not a plain string)."""
    parts: list[str] = []
    if isinstance(path, cst.Call) and model.call_names(path) & {"os.path.join"}:
        for argument in path.args:
            if argument.star or argument.keyword is not None:
                return None
            value = argument.value
            if isinstance(value, cst.SimpleString):
                parts.append(str(value.evaluated_value))
            elif isinstance(value, (cst.Name, cst.Attribute)):
                parts.append(model.module.code_for_node(value).strip())
            else:
                return None
        text = "/".join(parts)
    elif isinstance(path, cst.FormattedString):
        for part in path.parts:
            if isinstance(part, cst.FormattedStringText):
                parts.append(part.value)
            elif (
                part.conversion is None
                and part.format_spec is None
                and isinstance(part.expression, (cst.Name, cst.Attribute))
            ):
                parts.append(model.module.code_for_node(part.expression).strip())
            else:
                return None
        text = "".join(parts)
    else:
        return None
    text = re.sub(r"/+", "/", text).removeprefix("./")
    return f"joined:{text}" if "/" in text else None


def _spliced_folder(path: cst.BaseExpression) -> cst.BaseExpression | None:
    """``out`` of ``out + "/model.safetensors"`` or ``f"{out}/model.safetensors"``: a file
    name spliced onto a folder's value with one ``/``; None for any other spelling."""
    if isinstance(path, cst.BinaryOperation) and isinstance(path.operator, cst.Add):
        name = path.right
        if isinstance(name, cst.SimpleString) and isinstance(name.evaluated_value, str):
            text = name.evaluated_value
            if text.startswith("/") and "/" not in text[1:] and len(text) > 1:
                return path.left
        return None
    if isinstance(path, cst.FormattedString) and len(path.parts) == 2:
        folder, name = path.parts
        if (
            isinstance(folder, cst.FormattedStringExpression)
            and folder.conversion is None
            and folder.format_spec is None
            and isinstance(name, cst.FormattedStringText)
            and name.value.startswith("/")
            and "/" not in name.value[1:]
            and len(name.value) > 1
        ):
            return folder.expression
    return None


def _file_name(path: cst.BaseExpression) -> str | None:
    """The constant last part of a path in a folder (``"config.json"`` of
    ``os.path.join(out, "config.json")``, of ``out + "/config.json"`` or of
    ``f"{out}/config.json"``); None where it is not a constant."""
    last: cst.BaseExpression | cst.BaseFormattedStringContent | None = None
    if isinstance(path, cst.Call) and path.args:
        last = path.args[-1].value
    elif isinstance(path, cst.BinaryOperation):
        last = path.right
    elif isinstance(path, cst.FormattedString) and path.parts:
        last = path.parts[-1]
    if isinstance(last, cst.SimpleString) and isinstance(last.evaluated_value, str):
        return last.evaluated_value.rsplit("/", 1)[-1] or None
    if isinstance(last, cst.FormattedStringText):
        return last.value.rsplit("/", 1)[-1] or None
    return None


def _parameters(function: cst.FunctionDef | cst.Lambda) -> set[str]:
    params = function.params
    return {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}


def _negated(test: cst.BaseExpression) -> cst.BaseExpression | None:
    """``x`` of ``not x`` (``not (x)`` too); None where ``test`` is no negation."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return test.expression.with_changes(lpar=[], rpar=[])
    return None


def _tests_rank(model: ScriptModel, node: cst.CSTNode) -> bool:
    """An ``if`` whose own test reads the rank (``if rank == 0:``)."""
    if not isinstance(node, cst.If):
        return False
    return model.reads_rank(node.test)


def _accelerator_saving(model: ScriptModel, call: cst.Call) -> str | None:
    """``save`` for ``accelerator.save(obj, path)``, ``save_model`` for
    ``accelerator.save_model(model, folder)``: Accelerate's (and accelify's) saves write on the
    main process only, called by every rank (`ACCELERATOR_WRITERS`)."""
    func = call.func
    if (
        isinstance(func, cst.Attribute)
        and func.attr.value in ACCELERATOR_WRITERS
        and dotted(func.value) in model.names_of(Kind.ACCELERATOR)
    ):
        return func.attr.value
    return None


def _unwrapped_write(call: cst.Call) -> cst.BaseExpression | None:
    """The folder of ``accelerator.unwrap_model(model).save_pretrained(folder, ...)``: a writing
    method of the model the call returns (`_path` leaves a receiver it cannot name)."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in WRITING_METHODS):
        return None
    receiver = func.value
    if not (
        isinstance(receiver, cst.Call)
        and isinstance(receiver.func, cst.Attribute)
        and receiver.func.attr.value == "unwrap_model"
    ):
        return None
    position, keyword = WRITING_METHODS[func.attr.value]
    return argument_value(call, keyword, position)


def _deleted_receiver(call: cst.Call) -> cst.BaseExpression | None:
    """``temporary.unlink()``: the path object the method deletes."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _DELETING_METHODS:
        return func.value
    return None


def _path(
    model: ScriptModel,
    call: cst.Call,
    functions: dict[str, tuple[int, str]],
    methods: dict[str, tuple[int, str]],
) -> cst.BaseExpression | None:
    where = next((functions[n] for n in model.call_names(call) if n in functions), None)
    if where is None and isinstance(call.func, cst.Attribute):
        where = methods.get(call.func.attr.value)
        if where is not None and dotted(call.func.value) in ("self", None):
            where = None
    if where is None:
        return None
    position, keyword = where
    return argument_value(call, keyword, position)


#: Calls that only report a path or compute with its string (printed, logged, joined, made a
#: ``Path``): handed the path without opening the file.
_REPORTING = {
    *("print", "info", "debug", "warning", "warn", "error", "log", "format", "write"),
    *("Path", "PurePath", "join", "basename", "dirname", "abspath", "str", "repr"),
}


def _only_reports(call: cst.Call) -> bool:
    """``print(path)``, ``logger.info(...)``, ``os.path.join(path, ...)``: handed the path to
    show it or build another, not to open the file."""
    func = call.func
    name = func.attr.value if isinstance(func, cst.Attribute) else dotted(func)
    return name in _REPORTING
