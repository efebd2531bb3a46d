"""arrayfeed: feed arrays on disk (``.npy`` memmaps, HDF5, Zarr) into ``tf.data`` for Keras,
or as NumPy batches (:func:`batches`, no TensorFlow) for JAX and PyTorch. What a training script
uses is here; what adding a storage format takes is in :mod:`arrayfeed.storage`.

>>> import numpy as np, arrayfeed as af
>>> ds = af.from_arrays(np.zeros((100, 3), np.float32), np.arange(100), batch_size=32, seed=0)
>>> len(ds), len(af.batches(np.zeros((100, 3), np.float32), batch_size=32, seed=0))
(4, 4)
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._bench import BenchReport, bench
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
    ExtraNotInstalledError,
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
from ._storage import CacheReport, cache_report, open_array
from ._version import __version__

if TYPE_CHECKING:
    from ._pipeline.api.dataset import from_arrays
    from ._pipeline.api.distribute import distribute, distributed_steps
    from ._pipeline.api.keras import DataWait, ResumeCallback


#: Names that need TensorFlow (the ``tensorflow`` extra), and the modules that define them:
#: imported on first use, so that ``batches``, ``convert``, the command line and the loaders
#: start fast and run without it.
_WITH_TENSORFLOW = {
    "from_arrays": "dataset",
    "distribute": "distribute",
    "distributed_steps": "distribute",
    "ResumeCallback": "keras",
    "DataWait": "keras",
}
#: How to install it, into one's own project and into a clone.
INSTALL_TENSORFLOW = (
    "python -m pip install 'arrayfeed[tensorflow]' (from a clone of arrayfeed: "
    "python -m pip install -e '.[tensorflow]')"
)


def __getattr__(name: str) -> Any:
    if name not in _WITH_TENSORFLOW:
        raise AttributeError(f"module 'arrayfeed' has no attribute {name!r}")
    try:
        module = importlib.import_module(f"._pipeline.api.{_WITH_TENSORFLOW[name]}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] not in ("tensorflow", "keras"):
            raise
        return _needs_tensorflow(name, exc)
    return getattr(module, name)


def _needs_tensorflow(name: str, missing: ModuleNotFoundError) -> Any:
    """A stand-in for ``name`` that raises :class:`ExtraNotInstalledError` when used."""

    def needs_tensorflow(*args: Any, **kwargs: Any) -> Any:
        raise ExtraNotInstalledError(
            f"`arrayfeed.{name}` needs TensorFlow ({missing.name!r} is not installed): "
            f"{INSTALL_TENSORFLOW}. `arrayfeed.batches` gives the same batches as NumPy arrays "
            "without it."
        ) from missing

    needs_tensorflow.__name__ = needs_tensorflow.__qualname__ = name
    needs_tensorflow.__doc__ = f"``arrayfeed.{name}``: needs TensorFlow ({INSTALL_TENSORFLOW})."
    return needs_tensorflow


__all__ = [
    "ArrayfeedError",
    "Batches",
    "BenchReport",
    "Bound",
    "CacheError",
    "CacheReport",
    "ConfigError",
    "CorruptDataError",
    "DataWait",
    "DestinationError",
    "DtypeError",
    "ExtraNotInstalledError",
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
    "cache_report",
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
