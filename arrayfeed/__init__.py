"""arrayfeed: feed arrays on disk (``.npy`` memmaps, HDF5, Zarr) into ``tf.data`` for Keras,
or as NumPy batches (:func:`batches`, no TensorFlow) for JAX and PyTorch.

>>> import numpy as np, arrayfeed as af
>>> ds = af.from_arrays(np.zeros((100, 3), np.float32), np.arange(100), batch_size=32, seed=0)
>>> len(ds), len(af.batches(np.zeros((100, 3), np.float32), batch_size=32, seed=0))
(4, 4)
"""

from typing import TYPE_CHECKING, Any

from ._conversion.convert import convert
from ._conversion.inspect import InspectReport, inspect
from ._conversion.verify import VerifyReport, verify
from ._errors import (
    ArrayfeedError,
    CacheError,
    ConfigError,
    CorruptDataError,
    DestinationError,
    DtypeError,
    LoaderError,
    MapBatchError,
    OutputExistsError,
    ShapeError,
    SourceNotFoundError,
    SourceUnavailableError,
    StructureError,
)
from ._pipeline.batches import Batches, batches, tuning
from ._pipeline.bench import BenchReport, bench
from ._pipeline.shard import Shard
from ._pipeline.tuningreport import Tuning
from ._storage import (
    CacheReport,
    Chunked,
    ConversionRecord,
    GatherInto,
    Source,
    cache_report,
    open_array,
    written_by_arrayfeed,
)
from ._version import __version__

if TYPE_CHECKING:
    from ._pipeline.dataset import from_arrays
    from ._pipeline.distribute import distribute, distributed_steps
    from ._pipeline.keras import ResumeCallback


def __getattr__(name: str) -> Any:
    # TensorFlow is imported on first use of `from_arrays` (or `distribute`), so that the CLI,
    # conversion and `batches` (which do not need it) start fast and run without it.
    if name == "from_arrays":
        from ._pipeline.dataset import from_arrays

        return from_arrays
    if name in ("distribute", "distributed_steps"):
        from ._pipeline import distribute as _distribute

        return getattr(_distribute, name)
    if name == "ResumeCallback":
        from ._pipeline.keras import ResumeCallback

        return ResumeCallback
    raise AttributeError(f"module 'arrayfeed' has no attribute {name!r}")


__all__ = [
    "ArrayfeedError",
    "Batches",
    "BenchReport",
    "CacheError",
    "CacheReport",
    "Chunked",
    "ConfigError",
    "ConversionRecord",
    "CorruptDataError",
    "DestinationError",
    "DtypeError",
    "GatherInto",
    "InspectReport",
    "LoaderError",
    "MapBatchError",
    "OutputExistsError",
    "ResumeCallback",
    "ShapeError",
    "Shard",
    "Source",
    "SourceNotFoundError",
    "SourceUnavailableError",
    "StructureError",
    "Tuning",
    "VerifyReport",
    "__version__",
    "batches",
    "bench",
    "cache_report",
    "convert",
    "distribute",
    "distributed_steps",
    "from_arrays",
    "inspect",
    "open_array",
    "tuning",
    "verify",
    "written_by_arrayfeed",
]
