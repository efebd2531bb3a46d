"""Input specs ``path[:key]`` (``data/train.h5:images``, ``s3://bkt/train.zarr:x``): a path or URL
and the key of an array inside it.

A ``:`` after a suffix some backend claims files by (:func:`.registry.suffixes`) starts the key;
so does the last ``:`` of any other spec, except in a URL's host part (a port).
"""

from __future__ import annotations

import functools
import re

from .registry import suffixes
from .remote.paths import is_url

__all__ = ["split_spec", "split_url"]


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """``path:key`` and ``URL:key``, the path ending in a registered suffix."""
    names = "|".join(
        re.escape(s.lstrip(".")) for s in sorted(suffixes(), key=lambda s: (-len(s), s))
    )
    container = re.compile(rf"^(?P<path>.+?\.(?:{names}))(?::(?P<key>.*))?$", re.I)
    url = re.compile(rf"^(?P<path>[A-Za-z][\w+.\-]*://.+?\.(?:{names}))(?::(?P<key>.*))?$", re.I)
    return container, url


def split_spec(spec: str) -> tuple[str, str | None]:
    """Split an input spec ``path[:key]`` into its path and key (None when absent).

    >>> split_spec("data/train.h5:images")
    ('data/train.h5', 'images')
    >>> split_spec("x.npy")
    ('x.npy', None)
    >>> split_spec("shards/*.zarr:group/x")
    ('shards/*.zarr', 'group/x')
    >>> split_spec("s3://bucket/train.zarr:x")
    ('s3://bucket/train.zarr', 'x')
    """
    if is_url(spec):
        return split_url(spec)
    match = _patterns()[0].match(spec)
    if match is not None:
        return match["path"], match["key"] or None
    if ":" in spec:
        path, _, key = spec.rpartition(":")
        return path, key or None
    return spec, None


def split_url(spec: str) -> tuple[str, str | None]:
    """Split ``URL[:key]``; a ``:`` in the host part (a port) is not a key.

    >>> split_url("s3://bkt/train.zarr:images")
    ('s3://bkt/train.zarr', 'images')
    >>> split_url("http://host:8000/data/x")
    ('http://host:8000/data/x', None)
    >>> split_url("s3://bkt/data:x")
    ('s3://bkt/data', 'x')
    """
    match = _patterns()[1].match(spec)
    if match is not None:
        return match["path"], match["key"] or None
    protocol, rest = spec.split("://", 1)
    host, slash, path = rest.partition("/")
    if ":" in path:
        path, _, key = path.rpartition(":")
        return f"{protocol}://{host}{slash}{path}", key or None
    return spec, None
