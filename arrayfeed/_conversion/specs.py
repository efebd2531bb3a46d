"""Paths that name one array of a file or store: ``file.h5:key``, ``store.zarr:group/x``,
``s3://bucket/train.zarr:x``, the syntax of the command line, of :func:`arrayfeed.convert`'s
inputs and of :func:`arrayfeed.open_array`.

:func:`locate` splits such a path into the file or store and the key inside it, and
:func:`pick` finds the array a key names among those a file or store holds, or raises the error
that lists them. ``inspect``, ``verify`` and ``convert``'s inputs read paths through them.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path

from .._errors import SourceNotFoundError
from .._storage import is_url, split_spec

__all__ = ["locate", "pick"]


def locate(spec: str | os.PathLike[str]) -> tuple[Path | str, str | None]:
    """The file or store ``spec`` names (a URL stays a string) and the key of one array inside
    it (None: the whole file or store).

    A string that names an existing path as a whole is that path, so that a file named with a
    ``:`` still opens, as :func:`arrayfeed.open_array` takes it; an ``os.PathLike`` is always a
    path. A URL is split without asking whether it exists as written, which would cost a request.

    >>> path, key = locate("data/train.h5:images")
    >>> str(path), key
    ('data/train.h5', 'images')
    >>> locate("s3://bucket/train.zarr:x")
    ('s3://bucket/train.zarr', 'x')
    """
    if is_url(spec):
        return split_spec(os.fspath(spec))
    if isinstance(spec, str) and os.path.lexists(spec):
        return Path(spec), None
    key = None
    if isinstance(spec, str):
        spec, key = split_spec(spec)
    return Path(os.path.expanduser(os.fspath(spec))), key


def pick(
    path: Path | str, key: str, names: Collection[str], *, listed: Sequence[str] | None = None
) -> str:
    """The one of ``names`` (arrays of the file or store at ``path``) that ``key`` names, with or
    without a leading ``/``.

    Raises:
        SourceNotFoundError: ``key`` names none of them; the message lists ``listed`` (default:
            ``names``) and how to name one.

    >>> pick("train.h5", "/group/x", ["group/x", "y"])
    'group/x'
    """
    name = key.strip("/")
    if name in names:
        return name
    shown = sorted(names) if listed is None else list(listed)
    if shown in ([], [""]):  # a lone array (.npy, a Zarr array store) has no keys
        raise SourceNotFoundError(
            f"'{path}' holds one array, not a group of them, so it has no '{key}'; drop ':{key}'."
        )
    raise SourceNotFoundError(
        f"'{path}' has no array '{key}'; its arrays are {shown}. Name one as '{path}:NAME', or "
        f"give '{path}' alone for all of them."
    )
