"""The files a `convert` run reads, their conversion (parallel with ``--jobs``), and writing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from accelify.convert.conversion import Conversion, Options, convert_source, printing_module
from accelify.convert.handed_listeners import may_print_for_another_file
from accelify.convert.project import may_train_elsewhere
from accelify.convert.saver_modules import may_save_for_another_file
from accelify.errors import UserError
from accelify.source import python_files, write_atomically


def collect(paths: list[Path]) -> Iterator[tuple[Path, bool]]:
    """Files to convert, and whether each was named directly (named files are never skipped)."""
    for path in paths:
        if path.is_dir():
            for found in python_files(path):
                yield found, False
        else:
            yield path, True


def convert_file(path: Path, options: Options, named: bool) -> Conversion | UserError:
    try:
        data = path.read_bytes()
    except OSError as error:
        return UserError(f"cannot read: {error.strerror}", str(path))
    if (
        not named
        and b".backward(" not in data
        and not may_train_elsewhere(path, data)
        and not may_save_for_another_file(data, options)
    ):
        try:
            printing = (
                printing_module(data, path, options)
                if may_print_for_another_file(data, options)
                else None
            )
        except UserError:
            printing = None  # a module that trains nothing is not reported for not parsing
        return printing or Conversion(
            str(path), data, data, skipped="no .backward() call: not a training script"
        )
    try:
        return convert_source(data, path, options)
    except UserError as error:
        return error
    except Exception as error:  # our bug, not the user's: one line, the file left untouched
        return UserError(
            f"internal error, the file is left as it is ({type(error).__name__}: {error}); "
            "please report this file",
            str(path),
        )


def convert_all(
    files: list[tuple[Path, bool]],
    options: Options,
    jobs: int,
    progress: Callable[[int], None] | None = None,
) -> list[Conversion | UserError]:
    # each file's conversion knows the others converted with it (`Options.converted_with`)
    together = frozenset(str(path.resolve()) for path, _ in files)
    options = replace(options, converted_with=options.converted_with | together)
    if jobs <= 1 or len(files) < 2:
        results = []
        for path, named in files:
            results.append(convert_file(path, options, named))
            if progress:
                progress(1)
        return results
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(convert_file, path, options, named) for path, named in files]
        results = []
        for future in futures:
            results.append(future.result())
            if progress:
                progress(1)
        return results


def write(conversion: Conversion, destination: Path | None = None) -> None:
    write_atomically(
        destination or Path(conversion.path), conversion.converted, Path(conversion.path)
    )
