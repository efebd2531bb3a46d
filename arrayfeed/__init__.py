"""arrayfeed: feed arrays on disk (``.npy`` memmaps, HDF5, Zarr) into ``tf.data`` for Keras.

>>> import numpy as np, arrayfeed as af
>>> ds = af.from_arrays(np.zeros((100, 3), np.float32), np.arange(100), batch_size=32, seed=0)
>>> len(ds)
4
"""

from typing import TYPE_CHECKING, Any

from ._convert import ConversionRecord, convert, written_by_arrayfeed
from ._errors import (
    ArrayfeedError,
    ConfigError,
    CorruptDataError,
    DestinationError,
    DtypeError,
    MapBatchError,
    OutputExistsError,
    ShapeError,
    SourceNotFoundError,
    StructureError,
)
from ._inspect import InspectReport, inspect
from ._shard import Shard
from ._sources import GatherInto, Source, open_array

if TYPE_CHECKING:
    from ._dataset import from_arrays

__version__ = "0.1.0.dev0"


def __getattr__(name: str) -> Any:
    # TensorFlow is imported on first use of `from_arrays`, so that the CLI and conversion
    # (which do not need it) start fast.
    if name == "from_arrays":
        from ._dataset import from_arrays

        return from_arrays
    raise AttributeError(f"module 'arrayfeed' has no attribute {name!r}")


__all__ = [
    "ArrayfeedError",
    "ConfigError",
    "ConversionRecord",
    "CorruptDataError",
    "DestinationError",
    "DtypeError",
    "GatherInto",
    "InspectReport",
    "MapBatchError",
    "OutputExistsError",
    "Shard",
    "ShapeError",
    "Source",
    "SourceNotFoundError",
    "StructureError",
    "__version__",
    "convert",
    "from_arrays",
    "inspect",
    "open_array",
    "written_by_arrayfeed",
]
