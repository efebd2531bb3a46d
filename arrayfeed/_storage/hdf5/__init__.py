"""HDF5 through h5py: files on disk and behind URLs, netCDF4 included.

- :mod:`.files`: recognising, opening (locks, SWMR) and checking a file (filters, fingerprint,
  the conversion record);
- :mod:`.source`: sources over datasets: memory-mapped when contiguous, else
  :class:`~.source.H5Source`, reopened by file name in every process;
- :mod:`.layout`: what reading a chunked dataset's raw chunks needs, asked of h5py once, or why
  they are read through h5py instead;
- :mod:`.rawchunks`: raw chunks read with ``os.pread`` and decoded outside h5py's lock, one
  at a time or a run at a time; :mod:`.chunks`: rows read from them
  (:class:`~.chunks.ChunkFile`: batches, and blocks over runs of chunks), and :mod:`.chunkboxes`:
  chunks that split rows copied out a box at a time;
- :mod:`.codecs` and :mod:`.compressors`: HDF5's filters decoded exactly, or not at all;
- :mod:`.cf`: netCDF/CF-packed variables decoded as xarray decodes them;
- :mod:`.describe`: layout facts for ``inspect`` and ``bench``;
- :mod:`.write`: the writer of ``convert``, and the written file opened again to verify it;
- :mod:`.remote`: files behind URLs, read-only, through ranged requests;
- :mod:`.backend`: the family's :class:`~.backend.Hdf5Backend`, registered here.
"""

from ..registry import register
from .backend import Hdf5Backend

register(Hdf5Backend())
