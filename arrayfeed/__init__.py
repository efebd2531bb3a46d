"""arrayfeed: feed arrays on disk (``.npy`` memmaps, HDF5, Zarr) into ``tf.data`` for Keras.

>>> import numpy as np, arrayfeed as af
>>> ds = af.from_arrays(np.zeros((100, 3), np.float32), np.arange(100), batch_size=32, seed=0)
>>> len(ds)
4
"""

from ._dataset import from_arrays
from ._errors import (
    ArrayfeedError,
    ConfigError,
    CorruptDataError,
    DtypeError,
    MapBatchError,
    ShapeError,
    SourceNotFoundError,
    StructureError,
)
from ._shard import Shard
from ._sources import GatherInto, Source, open_array

__version__ = "0.1.0.dev0"

__all__ = [
    "ArrayfeedError",
    "ConfigError",
    "CorruptDataError",
    "DtypeError",
    "GatherInto",
    "MapBatchError",
    "Shard",
    "ShapeError",
    "Source",
    "SourceNotFoundError",
    "StructureError",
    "__version__",
    "from_arrays",
    "open_array",
]
