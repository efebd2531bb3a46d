"""NumPy: ``.npy`` files and ``.npz`` archives, arrays in memory and memory maps.

- :mod:`.files`: ``.npy`` files memory-mapped read-only (:class:`~.files.NpySource`), ``.npz``
  members loaded whole or streamed (:class:`~.files.NpzMemberSource`), and their layout facts;
- :mod:`.memory`: :class:`~.memory.ArraySource` over an ``np.ndarray`` or ``np.memmap``, and
  :class:`~.memory.MappedSource`, rows at a byte offset of a file mapped once per process (what
  ``.npy`` files and contiguous HDF5 datasets are read through);
- :mod:`.remote`: ``.npy`` files behind URLs, read with ranged requests;
- :mod:`.backend`: the family's :class:`~.backend.NpyBackend`, registered here.
"""

from ..registry import register
from .backend import NpyBackend

register(NpyBackend())
