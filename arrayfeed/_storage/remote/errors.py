"""Errors of object storage as arrayfeed's named errors, each saying how to fix it.

:func:`remote_error` turns an error of a filesystem (a missing bucket, missing credentials,
access denied, a server that keeps failing) into a :class:`~arrayfeed.SourceNotFoundError`,
:class:`~arrayfeed.SourceUnavailableError` or :class:`~arrayfeed.DestinationError`;
:func:`transient` says whether an error may go away on its own (what a retry is for), and
:func:`looking_at` names what goes wrong while arrayfeed looks at a URL to learn its format.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator, Mapping

from ..._errors import ArrayfeedError, DestinationError, SourceNotFoundError, SourceUnavailableError
from .paths import RemotePath, protocol_of

__all__ = ["looking_at", "missing_object", "remote_error", "transient"]

_TRANSIENT_NAMES = {
    "ClientConnectionError",
    "ClientOSError",
    "ClientPayloadError",
    "ConnectionClosedError",
    "ConnectTimeoutError",
    "EndpointConnectionError",
    "ReadTimeoutError",
    "ServerDisconnectedError",
    "ServerTimeoutError",
}
_TRANSIENT_ERRNOS = {errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _status(exc: BaseException) -> int | None:
    """The HTTP status behind ``exc`` (aiohttp, botocore), if any."""
    for e in _chain(exc):
        status = getattr(e, "status", None)
        if isinstance(status, int):
            return status
        response = getattr(e, "response", None)
        if isinstance(response, Mapping):
            code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(code, int):
                return code
    return None


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for e in _chain(exc) for cls in type(e).__mro__}


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` may go away on its own: a 5xx or 429, a timeout, a dropped connection."""
    if isinstance(exc, ArrayfeedError):
        return False
    status = _status(exc)
    if status is not None:
        return status >= 500 or status == 429
    if _names(exc) & _TRANSIENT_NAMES:
        return True
    return any(
        isinstance(e, (TimeoutError, ConnectionError))
        or (isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS)
        for e in _chain(exc)
    )


def _bucket_missing(exc: BaseException) -> bool:
    return any(
        "NoSuchBucket" in str(getattr(e, "response", "")) or "bucket does not exist" in str(e)
        for e in _chain(exc)
    )


def missing_object(exc: BaseException) -> bool:
    """A 404 for one object (not for its bucket)."""
    return isinstance(exc, FileNotFoundError) and not _bucket_missing(exc)


def remote_error(
    exc: BaseException, url: str, *, writing: bool = False, attempts: int = 1
) -> ArrayfeedError:
    """``exc``, raised for ``url``, as one of arrayfeed's named errors saying how to fix it."""
    if isinstance(exc, ArrayfeedError):
        return exc
    protocol = protocol_of(url)
    unavailable = DestinationError if writing else SourceUnavailableError
    detail = f"{type(exc).__name__}: {exc}"
    s3 = protocol in ("s3", "s3a")
    names = _names(exc)
    if names & {"NoCredentialsError", "PartialCredentialsError"}:
        how = (
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment, "
            "or pass storage_options={'key': ..., 'secret': ...} (command line: --storage-option "
            "key=... --storage-option secret=...); for a public bucket pass {'anon': True}"
            if s3
            else f"configure the credentials of '{protocol}://' or pass them in `storage_options`"
        )
        return unavailable(f"no credentials were found for '{url}' ({detail}); {how}.")
    status = _status(exc)
    if isinstance(exc, PermissionError) or status in (401, 403):
        how = (
            "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or storage_options 'key' and "
            "'secret'), that they are not expired, and that the bucket policy grants them "
            + ("s3:PutObject and s3:DeleteObject" if writing else "s3:GetObject and s3:ListBucket")
            if s3
            else f"check the credentials of '{protocol}://' and the permissions on the data"
        )
        return unavailable(
            f"access to '{url}' was denied ({status or 403}, {detail}): the credentials in use "
            f"are wrong or lack permission; {how}."
        )
    if _bucket_missing(exc) or (isinstance(exc, FileNotFoundError) and _no_bucket(url)):
        bucket = url.split("://", 1)[-1].split("/", 1)[0]
        endpoint = " and the endpoint (AWS_ENDPOINT_URL, or storage_options={'endpoint_url': ...})"
        return (DestinationError if writing else SourceNotFoundError)(
            f"the bucket '{bucket}' of '{url}' does not exist; check the bucket name"
            f"{endpoint if s3 else ''}" + (", or create the bucket first." if writing else ".")
        )
    if isinstance(exc, FileNotFoundError) and not writing:
        return SourceNotFoundError(f"nothing at '{url}' ({exc}); check the URL.")
    if transient(exc):
        return unavailable(
            f"'{url}' could not be {'written' if writing else 'read'} after {attempts} attempt"
            f"{'s' if attempts != 1 else ''} ({detail}): the server or the network keeps failing. "
            "Try again later, or check the endpoint and the network."
        )
    return unavailable(f"'{url}' could not be {'written' if writing else 'read'} ({detail}).")


def _no_bucket(url: str) -> bool:
    """Whether the bucket of ``url`` is known not to exist (asks the server)."""
    try:
        return RemotePath(url).bucket_exists() is False
    except Exception:
        return False


@contextlib.contextmanager
def looking_at(location: RemotePath) -> Iterator[None]:
    """What goes wrong while reading ``location`` to learn what it holds, as a named error: a
    missing object (or bucket) is a :class:`~arrayfeed.SourceNotFoundError`."""
    try:
        yield
    except ArrayfeedError:
        raise
    except FileNotFoundError:
        if location.bucket_exists() is False:
            raise remote_error(FileNotFoundError("bucket does not exist"), location.url) from None
        raise SourceNotFoundError(f"nothing at '{location}'; check the URL.") from None
    except Exception as exc:
        raise remote_error(exc, location.url) from None
