"""The errors arrayfeed raises.

Every error derives from :class:`ArrayfeedError` and also from the builtin a caller would
already catch (``ValueError``, ``TypeError``, ``FileNotFoundError`` …), so ``except ValueError``
keeps working. Messages name the argument, what was expected, what was received and the fix.
"""

from __future__ import annotations

__all__ = [
    "ArrayfeedError",
    "CacheError",
    "ConfigError",
    "CorruptDataError",
    "DestinationError",
    "DtypeError",
    "LoaderError",
    "MapBatchError",
    "OutputExistsError",
    "ResumeError",
    "ShapeError",
    "SourceNotFoundError",
    "SourceUnavailableError",
    "StructureError",
]


class ArrayfeedError(Exception):
    """Base class of every error raised by arrayfeed."""


class ConfigError(ArrayfeedError, ValueError):
    """An argument or environment setting has a value arrayfeed cannot use."""


class ShapeError(ArrayfeedError, ValueError):
    """Arrays are empty, 0-d, or disagree in length along the batch axis."""


class DtypeError(ArrayfeedError, TypeError):
    """An array's dtype cannot be fed to TensorFlow (object, structured, strings …)."""


class StructureError(ArrayfeedError, TypeError):
    """`x`, `y`, `sample_weight` or a `map_batch` result is not a supported structure."""


class SourceNotFoundError(ArrayfeedError, FileNotFoundError):
    """A file, HDF5 dataset or Zarr array named as a source does not exist."""


class SourceUnavailableError(ArrayfeedError, OSError):
    """A source exists but cannot be read here: locked by a writer, or needs a missing HDF5 filter."""


class CorruptDataError(ArrayfeedError, OSError):
    """Stored data is truncated, corrupted, missing or changed since it was opened."""


class CacheError(ArrayfeedError, OSError):
    """The cache directory of objects fetched from object storage cannot be used: not a
    directory, owned by another user, not writable, or its index is damaged."""


class LoaderError(ArrayfeedError, RuntimeError):
    """A loader process, which reads batches beside the training process, died or could not
    start; the message gives its exit code."""


class MapBatchError(ArrayfeedError, ValueError):
    """`map_batch` raised, or returned something inconsistent with its earlier results."""


class ResumeError(ArrayfeedError, ValueError):
    """A state given as ``resume=`` cannot resume this dataset: it was saved from another one
    (other rows, seed, shuffle mode or arrays), by a newer arrayfeed, or is not a state at all.
    The message says what differs."""


class ExtraNotInstalledError(ArrayfeedError, ImportError):
    """A part of arrayfeed that needs an optional dependency was used without it installed; the
    message gives the install command."""


class DestinationError(ArrayfeedError, OSError):
    """The output of a conversion cannot be written (read-only directory, full disk …)."""


class OutputExistsError(DestinationError, FileExistsError):
    """The output of a conversion already exists and overwriting was not asked for."""
