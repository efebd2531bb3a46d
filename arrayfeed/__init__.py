"""arrayfeed: feed arrays on disk (``.npy`` memmaps, HDF5, Zarr) into ``tf.data`` for Keras,
or as NumPy batches (:func:`batches`, no TensorFlow) for JAX and PyTorch. What a training script
uses is here; what adding a storage format takes is in :mod:`arrayfeed.storage`.

>>> import numpy as np, arrayfeed as af
>>> ds = af.from_arrays(np.zeros((100, 3), np.float32), np.arange(100), batch_size=32, seed=0)
>>> len(ds), len(af.batches(np.zeros((100, 3), np.float32), batch_size=32, seed=0))
(4, 4)
"""

from typing import TYPE_CHECKING, Any

from ._bench import BenchReport, bench
from ._conversion.convert import convert
from ._conversion.inspect import InspectReport, inspect
from ._conversion.verify import VerifyReport, verify
from ._errors import (
    ArrayfeedError,
    ConfigError,
    CorruptDataError,
    DestinationError,
    DtypeError,
    LoaderError,
    MapBatchError,
    OutputExistsError,
    ResumeError,
    ShapeError,
    SourceNotFoundError,
    SourceUnavailableError,
    StructureError,
)
from ._pipeline.api.batches import Batches, batches, state, tuning
from ._pipeline.plan.shard import Shard
from ._pipeline.tune.report import Bound, Tuning
from ._storage import open_array
from ._version import __version__

if TYPE_CHECKING:
    from ._pipeline.api.dataset import from_arrays
    from ._pipeline.api.distribute import distribute, distributed_steps
    from ._pipeline.api.keras import DataWait, ResumeCallback


def __getattr__(name: str) -> Any:
    # TensorFlow is imported on first use of `from_arrays` (or `distribute`), so that the CLI,
    # conversion and `batches` (which do not need it) start fast and run without it.
    if name == "from_arrays":
        from ._pipeline.api.dataset import from_arrays

        return from_arrays
    if name in ("distribute", "distributed_steps"):
        from ._pipeline.api import distribute as _distribute

        return getattr(_distribute, name)
    if name in ("ResumeCallback", "DataWait"):
        from ._pipeline.api import keras as _keras

        return getattr(_keras, name)
    raise AttributeError(f"module 'arrayfeed' has no attribute {name!r}")


__all__ = [
    "ArrayfeedError",
    "Batches",
    "BenchReport",
    "Bound",
    "ConfigError",
    "CorruptDataError",
    "DataWait",
    "DestinationError",
    "DtypeError",
    "InspectReport",
    "LoaderError",
    "MapBatchError",
    "OutputExistsError",
    "ResumeCallback",
    "ResumeError",
    "ShapeError",
    "Shard",
    "SourceNotFoundError",
    "SourceUnavailableError",
    "StructureError",
    "Tuning",
    "VerifyReport",
    "__version__",
    "batches",
    "bench",
    "convert",
    "distribute",
    "distributed_steps",
    "from_arrays",
    "inspect",
    "open_array",
    "state",
    "tuning",
    "verify",
]
