"""Conformance tests that every :class:`~arrayfeed.storage.Source` backend must pass.

:class:`SourceTests` is a pytest base class, as ``zarr.testing`` ships ``StoreTests``: a backend's
test module subclasses it, implements :meth:`SourceTests.make_source` (write ``data`` the way the
backend's users write it, under ``tmp_path``, and return a source over it), and inherits a test
of every part of the contract: the ``Source`` protocol itself, each optional capability the source
implements (``GatherInto``, ``ReadRangeInto``, ``RunReader``, ``Chunked``, ``Verifiable``), pickling,
and reads through arrayfeed's own engine (``read_rows``, a shuffled epoch, and the window cache of
``shuffle="block"``). Every comparison is bit for bit: NaN payloads and ``-0.0`` count, byte order
does not. A third-party backend runs it like this::

    # tests/test_mybackend.py
    from pathlib import Path

    import numpy as np

    from arrayfeed.storage import Source
    from arrayfeed.testing import SourceTests
    from mybackend import MySource, write_my_format


    class TestMySource(SourceTests):
        dtypes = ("float32", "int64", "uint8")  # what the format stores (default: many)
        row_shapes = ((), (5, 3))  # shapes of one row (default: (), (3,), (4, 3))

        def make_source(self, data: np.ndarray, tmp_path: Path) -> Source:
            write_my_format(tmp_path / "data.my", data)
            return MySource(tmp_path / "data.my")

A source that cannot be pickled (an in-memory object bound to one process) sets
``picklable = False`` and says why in ``not_picklable_because``. This module imports pytest (it is
a test helper) but never TensorFlow.

:func:`sample_data` builds the arrays the tests store, and :func:`assert_same_rows` compares them:

>>> data = sample_data("float32", (2,), n_rows=4)
>>> data.shape, data.dtype
((4, 2), dtype('float32'))
>>> assert_same_rows(data.astype(">f4"), data)  # the same bits in another byte order: equal
"""

from .rows import assert_same_rows, sample_data
from .sources import SourceTests

__all__ = ["SourceTests", "assert_same_rows", "sample_data"]
