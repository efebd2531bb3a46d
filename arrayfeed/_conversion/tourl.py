"""``convert`` to object storage (``-o s3://bucket/train.zarr``), where nothing can be renamed.

A local conversion is built in a hidden workspace and renamed into place (:mod:`.atomic`). An
object store has no rename, so the guarantee comes from the order of writes instead (the
storage layer's Zarr writer and ``mark_complete``): the store's root group is written first with a record that
says ``complete: false``, which readers refuse; then the arrays and every chunk; then the copy
is read back and verified; and only then the record with ``complete: true``, the last object
written. An interrupted conversion therefore never looks complete, and running it again
replaces the unfinished store (without ``overwrite``: an unfinished store holds nothing anyone
can read). An error or Ctrl-C also removes what was written, as far as it can.

Only Zarr is written to object storage. A shuffle that needs its inputs staged stages them in a
local temporary directory. The Zarr writer's functions are imported where they are called, so that
importing arrayfeed does not import zarr.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .._errors import ArrayfeedError, ConfigError, CorruptDataError, OutputExistsError
from .._storage import ConversionRecord, Format, RemotePath, remote_error, written_by_arrayfeed
from .atomic import Workspace, deferred_interrupts
from .copy import Copy
from .verify import verify_copy

__all__ = ["check_url_destination", "staging_workspace", "url_writing", "write_to_url"]


def check_url_destination(output: RemotePath, fmt: Format, overwrite: bool) -> None:
    """Refuse what a conversion must not write to or replace at ``output``."""
    if fmt != "zarr":
        raise ConfigError(
            f"`output` '{output}' is on object storage, where arrayfeed writes Zarr stores only "
            "(an HDF5 file cannot be written in place there); end it in .zarr."
        )
    from .._storage import destination_state

    state = destination_state(output)
    if state == "other":
        raise OutputExistsError(
            f"`output` '{output}' holds objects that are not a Zarr store, so arrayfeed will not "
            "replace them; remove them yourself or choose another URL."
        )
    if state in ("converted", "zarr") and not overwrite:
        raise OutputExistsError(
            f"`output` '{output}' already holds a Zarr store; pass `overwrite=True` (command "
            "line: --overwrite) to replace it (on object storage the old store is deleted "
            "before the new one is written), or choose another URL."
        )


def staging_workspace(output: RemotePath) -> Workspace:
    """A local workspace (in the temporary directory) for what a shuffle stages."""
    return Workspace(Path(tempfile.gettempdir()) / (output.name or "output.zarr"))


@contextlib.contextmanager
def url_writing(output: RemotePath) -> Iterator[None]:
    """Name a failed write to object storage (credentials, access, missing bucket …)."""
    try:
        yield
    except ArrayfeedError:
        raise
    except Exception as exc:
        raise remote_error(exc, output.url, writing=True) from exc


def write_to_url(output: RemotePath, copy: Copy) -> ConversionRecord:
    """Run ``copy`` (a Zarr copy whose writes go through :func:`url_writing`) into a new store
    at ``output``, verify it, then mark it complete."""
    from .._storage import mark_complete, remove_store

    finished = False
    try:
        with deferred_interrupts() as interrupts:
            if copy.seed is not None:
                copy.stage(interrupts)
            record = copy.write(output, interrupts, finish=False)
            verify_copy(copy, output, record, output, interrupts, check_record=False)
            interrupts.shield()
            with url_writing(output):
                mark_complete(output, record)  # the last write
                stored = written_by_arrayfeed(output.url, storage_options=output.storage_options)
            if stored != record:
                raise CorruptDataError(
                    f"the record written on '{output}' reads back differently; the store was "
                    "changed by someone else meanwhile. Convert again."
                )
            finished = True
            return record
    finally:
        if not finished:
            remove_store(output)  # best effort: its record says unfinished in any case
