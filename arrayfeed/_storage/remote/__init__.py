"""Object storage: what every format needs to read and write URLs, not a format of its own.

- :mod:`.paths`: :class:`~.paths.RemotePath` (a URL and its ``storage_options``, what sources
  pickle) and the fsspec filesystem behind a URL;
- :mod:`.errors`: a filesystem's errors as arrayfeed's named errors, each saying how to fix it;
- :mod:`.fetcher`: objects (Zarr chunks) fetched many at once, retried, and kept for a while;
- :mod:`.cache` (with :mod:`.cachespec`, :mod:`.cacheindex`, :mod:`.cacheclaims`,
  :mod:`.cachereport`): objects kept on local disk for every process of the host, bounded,
  each download claimed, every copy checked when read;
- :mod:`.tasks`: requests that a failed call leaves running, ended rather than abandoned;
- :mod:`.glob`: URLs matching a pattern.

The formats use these: Zarr stores, HDF5 files and ``.npy`` files each read their URLs in their
own subpackage (``zarr/``, ``hdf5/remote.py``, ``npy/remote.py``).
"""
