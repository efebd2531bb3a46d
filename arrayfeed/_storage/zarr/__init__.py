"""Zarr (v3 and v2) through zarr-python: stores in local directories and on object storage.

- :mod:`.nodes`: stores and groups opened (a failed call on object storage ends the requests it
  left running), and the metadata files that make a directory a store;
- :mod:`.source`: :class:`~.source.ZarrSource` over a ``zarr.Array``;
- :mod:`.chunks`: unsharded arrays read chunk by chunk in the reader's own thread
  (:class:`~.chunks.ChunkReader`), with the decoders of :mod:`.codecs`;
- :mod:`.strict`: missing chunks as errors in stores written complete
  (:class:`~.strict.StrictStore`);
- :mod:`.errors`: what goes wrong, named (the store, the chunk, the fix);
- :mod:`.describe`: layout facts for ``inspect`` and ``bench``, and the conversion record;
- :mod:`.write`: the writer of ``convert``, locally or on object storage (where the record
  marks the store unfinished until the last write);
- :mod:`.backend`: the family's :class:`~.backend.ZarrBackend`, registered here.
"""

from ..registry import register
from .backend import ZarrBackend

register(ZarrBackend())
