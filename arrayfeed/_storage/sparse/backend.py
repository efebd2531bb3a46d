"""The sparse family's backend: ``scipy.sparse`` CSR matrices, and AnnData's encoded elements
(sparse matrices, categoricals) inside HDF5 files and Zarr stores.

AnnData's elements live in another family's files: this backend reads no file of its own, but
:meth:`SparseBackend.open_element` is asked before HDF5 or Zarr opens a key as a plain array, so
``"cells.h5ad:X"`` opens the CSR matrix, not its ``data`` array. Like every backend, it imports
h5py and zarr (through :mod:`.anndata` and :mod:`.elements`) only in the methods that use them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..._errors import SourceNotFoundError, StructureError
from ..base import Source
from ..layout import StoreInfo
from ..registry import Backend, Location, OpenOptions
from .csr import from_scipy, is_scipy_sparse

__all__ = ["SparseBackend"]

#: Opens an encoded element (``key`` None: checks the file's root) in the files of a family.
Opener = Callable[[Location, str | None, bool | None], Source | None]


def _h5_element(location: Location, key: str | None, strict: bool | None) -> Source | None:
    # HDF5 files behind URLs are read as plain datasets only.
    if not isinstance(location, Path):
        return None
    from .anndata import open_h5_element

    return open_h5_element(location, key)


def _zarr_element(location: Location, key: str | None, strict: bool | None) -> Source | None:
    from .anndata import open_zarr_element

    return open_zarr_element(location, key, strict)


#: The families whose files hold AnnData's elements, and how each opens one.
_OPENERS: dict[str, Opener] = {"hdf5": _h5_element, "zarr": _zarr_element}


class SparseBackend(Backend):
    """CSR matrices read by rows: ``scipy.sparse`` objects, AnnData's ``csr_matrix`` groups."""

    name = "sparse"
    label = "sparse"
    order = 10  # first: AnnData's elements come before the plain arrays they are stored as

    def recognises(self, obj: Any) -> bool:
        return is_scipy_sparse(obj)

    def open_object(self, obj: Any) -> Source | None:
        return from_scipy(obj, "matrix") if is_scipy_sparse(obj) else None

    def source_of(self, obj: Any, name: str, *, for_copy: bool = False) -> Source | None:
        if for_copy:
            from .elements import node_component_of

            if (part := node_component_of(obj)) is not None:
                raise StructureError(
                    f"`{name}` is the `{part[1]}` array of the sparse matrix '{part[0]}', not rows "
                    "of data; copying it alone scrambles the matrix. Pass the matrix instead: its "
                    f"file and key ('FILE:{part[0]}'; copied as CSR, dense with `densify=True` / "
                    "--densify)."
                )
        return from_scipy(obj, name) if is_scipy_sparse(obj) else None

    def open_element(
        self, location: Location, key: str | None, options: OpenOptions, container: Backend
    ) -> Source | None:
        opener = _OPENERS.get(container.name)
        if opener is None:
            return None
        from .elements import component_of

        part = component_of(location, key) if options.for_copy else None
        if part is not None:
            raise StructureError(
                f"'{location}:{key}' is the `{part[1]}` array of the sparse matrix '{part[0]}', "
                "not rows of data; copying it alone scrambles the matrix. Name the matrix "
                f"instead: '{location}:{part[0]}' (copied as CSR; dense with `densify=True` / "
                "--densify)."
            )
        if options.field is not None:
            return None  # a field of a compound dataset is a plain column
        if key is None:
            opener(location, None, options.strict)  # an AnnData file raises, naming its elements
            key = _whole_matrix_key(location, container)
            if key is None:
                return None
        return opener(location, key, options.strict)

    def annotate(self, location: Location, info: StoreInfo, container: Backend) -> StoreInfo:
        if container.name not in _OPENERS or not isinstance(location, Path):
            return info  # elements are listed for local files only
        from .elements import annotate

        return annotate(location, info)


def _whole_matrix_key(location: Location, container: Backend) -> str | None:
    """The key to open in a file or store that holds sparse matrices when none is given: its
    one array or matrix (a matrix counts once, not as its three arrays). Raises, naming them,
    when there are several; None when it holds no sparse matrix (the container decides)."""
    if not isinstance(location, Path):
        return None
    from .elements import elements

    matrices = [e for e in elements(location) if e.kind.endswith("_matrix")]
    if not matrices:
        return None
    parts = {part for e in matrices for part in e.parts}
    names = sorted(
        {n for n in container.array_keys(location) or [] if n not in parts}
        | {e.name for e in matrices}
    )
    if len(names) == 1:
        return names[0]
    raise SourceNotFoundError(
        f"'{location}' holds {len(names)} arrays and sparse matrices and no `key` names one: "
        f"{names}. Name one: `open_array('{location}', KEY)`, or '{location}:KEY' as a path."
    )
