"""URLs and their filesystems: ``s3://``, ``gs://``, ``az://``, ``http(s)://``, any fsspec protocol.

``fsspec`` (and ``s3fs`` for S3) are optional (``pip install "arrayfeed[remote]"``) and imported
only on first use: a URL without them is a :class:`~arrayfeed.SourceUnavailableError` that says
what to install.

:class:`RemotePath` is a URL and its ``storage_options`` (what fsspec passes to the filesystem:
credentials, ``endpoint_url`` …); it is what sources and writers pickle, so that another process
reopens the same data. Credentials and the endpoint may also come from the environment as each
filesystem reads it (for S3: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL``, ``AWS_PROFILE`` …).
"""

from __future__ import annotations

import inspect
import os
import posixpath
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..._errors import DestinationError, SourceUnavailableError
from .cachespec import CacheSpec

__all__ = [
    "INSTALL",
    "RemotePath",
    "as_remote",
    "forget_filesystems",
    "is_url",
    "open_options",
    "protocol_of",
    "url_to_fs",
    "whole_object",
]

#: What to install for URLs.
INSTALL = 'pip install "arrayfeed[remote]"'

_URL_RE = re.compile(r"^(?P<protocol>[A-Za-z][A-Za-z0-9+.\-]*)://")
_BUCKETED = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"}
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs"}


def is_url(path: object) -> bool:
    """True for a :class:`RemotePath` or a string with a protocol (``s3://bucket/x.zarr``).

    >>> is_url("s3://bucket/train.zarr"), is_url("data/train.zarr"), is_url("C:/data/x.npy")
    (True, False, False)
    """
    return isinstance(path, RemotePath) or (isinstance(path, str) and bool(_URL_RE.match(path)))


def protocol_of(url: str) -> str:
    match = _URL_RE.match(url)
    return match["protocol"].lower() if match else "file"


@dataclass(frozen=True)
class RemotePath:
    """A URL and the ``storage_options`` its filesystem is built with, and the local cache its
    objects are kept in (None: none); pickles as all three."""

    url: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    cache: CacheSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage_options", dict(self.storage_options or {}))

    def __str__(self) -> str:
        return self.url

    @property
    def protocol(self) -> str:
        return protocol_of(self.url)

    @property
    def name(self) -> str:
        return posixpath.basename(self.url.rstrip("/"))

    @property
    def suffix(self) -> str:
        return posixpath.splitext(self.name)[1]

    def child(self, key: str) -> RemotePath:
        """The URL of ``key`` inside this one."""
        return RemotePath(
            f"{self.url.rstrip('/')}/{key.strip('/')}", self.storage_options, self.cache
        )

    def options(self, *, writing: bool = False) -> dict[str, Any]:
        """The options its filesystem is made with (see :func:`open_options`)."""
        return open_options(self.url, self.storage_options, writing=writing)

    def filesystem(self, *, writing: bool = False) -> tuple[Any, str]:
        """``(fsspec filesystem, path inside it)``; named errors when fsspec or the protocol's
        package is missing."""
        return url_to_fs(self.url, self.storage_options, writing=writing)

    def bucket_exists(self) -> bool | None:
        """Whether the bucket of this URL exists (None: the protocol has no buckets, or the
        question cannot be answered)."""
        if self.protocol not in _BUCKETED:
            return None
        fs, path = self.filesystem()
        try:
            fs.info(path.split("/", 1)[0])
        except FileNotFoundError:
            return False
        except Exception:
            return None
        return True


def forget_filesystems() -> None:
    """Drop the filesystems fsspec keeps for reuse: each holds the credentials and endpoint it
    read from the environment when it was made, so one made before the environment changed
    would reach the wrong place. Nothing to do where fsspec was never imported."""
    spec = sys.modules.get("fsspec.spec")
    if spec is None:
        return
    todo = [spec.AbstractFileSystem]
    while todo:
        cls = todo.pop()
        cls.clear_instance_cache()
        todo.extend(cls.__subclasses__())


def as_remote(
    path: str | os.PathLike[str] | RemotePath,
    storage_options: Mapping[str, Any] | None,
    cache: CacheSpec | None = None,
) -> RemotePath:
    """``path`` with ``storage_options`` and ``cache`` (a :class:`RemotePath` keeps its own
    unless given)."""
    if isinstance(path, RemotePath):
        return RemotePath(
            path.url,
            path.storage_options if storage_options is None else storage_options,
            path.cache if cache is None else cache,
        )
    return RemotePath(os.fspath(path), storage_options or {}, cache)


def open_options(
    url: str, storage_options: Mapping[str, Any], *, writing: bool = False
) -> dict[str, Any]:
    """``storage_options`` as the filesystem of ``url`` is made with them for reading: on S3,
    objects read whole in one request. s3fs (from 2025) asks for an object's size first (a
    HEAD: a second round trip for each Zarr chunk and metadata file, and a second request
    billed) to read large objects in parallel ranges (``max_concurrency``, 10 by default);
    chunks are read many at once already. Not for ``writing`` (the same option makes uploads
    of large objects serial), nor when ``storage_options`` sets ``max_concurrency``."""
    options = dict(storage_options)
    if writing or protocol_of(url) not in ("s3", "s3a") or "max_concurrency" in options:
        return options
    try:
        import fsspec

        s3 = fsspec.get_filesystem_class("s3")
    except Exception:  # s3fs missing: url_to_fs says what to install
        return options
    return {**options, **_one_request(s3)}


def whole_object(fs: Any) -> dict[str, Any]:
    """Keyword arguments that make ``fs.cat_file`` one request for the whole object, whatever
    ``fs`` was made with (a Zarr array the user opened; see :func:`open_options`); none when its
    ``storage_options`` set ``max_concurrency``."""
    if "max_concurrency" in (getattr(fs, "storage_options", None) or {}):
        return {}
    return _one_request(fs)


def _one_request(fs: Any) -> dict[str, Any]:
    """``max_concurrency=1`` where the ``cat_file`` of ``fs`` (an instance or its class) takes
    it (an s3fs that asks for sizes; older ones do not), else nothing."""
    cat = getattr(fs, "_cat_file", None) or getattr(fs, "cat_file", None)
    try:
        accepted = inspect.signature(cat).parameters if cat is not None else {}
    except (TypeError, ValueError):  # no signature to read
        accepted = {}
    return {"max_concurrency": 1} if "max_concurrency" in accepted else {}


def url_to_fs(url: str, options: Mapping[str, Any], *, writing: bool) -> tuple[Any, str]:
    error = DestinationError if writing else SourceUnavailableError
    protocol = protocol_of(url)
    options = open_options(url, options, writing=writing)
    try:
        import fsspec
    except ImportError:
        raise error(
            f"'{url}' is a URL, and reading or writing URLs needs fsspec (and s3fs for s3://), "
            f"which are not installed; {INSTALL}."
        ) from None
    try:
        fs, path = fsspec.core.url_to_fs(url, **dict(options))
    except ImportError as exc:
        package = _PACKAGES.get(protocol, f"the fsspec package for '{protocol}://'")
        extra = "" if protocol in ("s3", "s3a") else f" {package}"
        raise error(
            f"'{url}' needs {package}, which is not installed ({exc}); {INSTALL}{extra}."
        ) from None
    except ValueError as exc:
        raise error(
            f"'{url}': fsspec does not know the protocol '{protocol}://' ({exc}); check the URL."
        ) from None
    except TypeError as exc:
        raise error(
            f"`storage_options` {sorted(options)} do not fit the '{protocol}://' filesystem "
            f"({exc}); check their names (command line: --storage-option KEY=VALUE)."
        ) from None
    return fs, str(path)
