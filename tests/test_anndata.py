"""AnnData files (``.h5ad`` and Zarr, every layout anndata has written) read without anndata:
sparse ``X`` and layers, dense ``obsm``, categorical ``obs`` columns; what ``inspect`` says of them.

The files are written with h5py and zarr in anndata's own layout (``tests/_anndata.py``).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse

import arrayfeed as af
from arrayfeed._cli import main
from arrayfeed._storage import Categorical, SparseRows
from arrayfeed.testing import assert_same_rows
from tests._anndata import random_csr, write_anndata_zarr, write_h5ad

N_OBS, N_VARS = 400, 30
LABELS = ["B cell", "T cell", "NK", "monocyte"]

#: (format, anndata layout): the current one, 0.7's, and (HDF5) the one before 0.7.
LAYOUTS = [
    ("h5ad", None),
    ("h5ad", "0.7"),
    ("h5ad", "0.6"),
    ("zarr", None),
    ("zarr", "0.7"),
    ("zarr2", None),  # a Zarr format 2 store, as anndata before 0.12 wrote it
]


def _content() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    X = random_csr(N_OBS, N_VARS, 0.1, seed=3)
    counts = random_csr(N_OBS, N_VARS, 0.2, seed=4, dtype="int32")
    codes = rng.integers(-1, len(LABELS), N_OBS).astype(np.int8)
    pca = rng.normal(size=(N_OBS, 8)).astype(np.float32)
    return {"X": X, "counts": counts, "codes": codes, "pca": pca}


@pytest.fixture(scope="module")
def content() -> dict[str, Any]:
    return _content()


def _write(directory: Path, fmt: str, legacy: str | None, content: dict[str, Any]) -> Path:
    obs = {"cell_type": (content["codes"], LABELS)}
    if fmt == "h5ad":
        layers = {} if legacy == "0.6" else {"counts": content["counts"]}
        obsm = {} if legacy == "0.6" else {"X_pca": content["pca"]}
        path = directory / f"data-{legacy}.h5ad"
        return write_h5ad(path, content["X"], layers=layers, obsm=obsm, obs=obs, legacy=legacy)
    path = directory / f"data-{fmt}-{legacy}.zarr"
    return write_anndata_zarr(
        path,
        content["X"],
        layers={"counts": content["counts"]},
        obsm={"X_pca": content["pca"]},
        obs=obs,
        legacy=legacy,
        zarr_format=2 if fmt == "zarr2" else 3,
    )


@pytest.fixture(scope="module", params=LAYOUTS, ids=[f"{f}-{v or 'current'}" for f, v in LAYOUTS])
def stored(
    request: pytest.FixtureRequest,
    content: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, str | None]:
    fmt, legacy = request.param
    return _write(tmp_path_factory.mktemp("anndata"), fmt, legacy, content), legacy


def test_elements_read_as_anndata_stores_them(stored: Any, content: dict[str, Any]) -> None:
    path, legacy = stored
    every = np.arange(N_OBS)
    X = af.open_array(path, "X")
    assert isinstance(X, SparseRows) and X.shape == (N_OBS, N_VARS) and X.dtype == np.float32
    assert X.nnz == content["X"].nnz
    assert_same_rows(X.read(every), content["X"].toarray())
    assert_same_rows(af.open_array(f"{path}:X").read(every[::3]), content["X"].toarray()[::3])
    cell_type = af.open_array(path, "obs/cell_type")
    assert isinstance(cell_type, Categorical)
    assert cell_type.categories == tuple(LABELS)
    assert cell_type.shape == (N_OBS,) and cell_type.dtype == np.int8
    assert_same_rows(cell_type.read(every), content["codes"])
    if legacy != "0.6":
        counts = af.open_array(path, "layers/counts")
        assert counts.dtype == np.int32
        assert_same_rows(counts.read(every), content["counts"].toarray())
        assert_same_rows(af.open_array(path, "obsm/X_pca").read(every), content["pca"])


def test_a_training_stream_from_paths(stored: Any, content: dict[str, Any]) -> None:
    path, _ = stored
    dense = content["X"].toarray()
    x, y = f"{path}:X", f"{path}:obs/cell_type"
    for shuffle in (True, "block", False):
        seen = []
        for xb, yb, ids in af.batches(
            x, y, np.arange(N_OBS), batch_size=64, shuffle=shuffle, seed=1
        ):
            assert_same_rows(xb, dense[ids])
            assert_same_rows(yb, content["codes"][ids])
            seen.append(ids)
        assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(N_OBS))


def test_a_dense_x_is_a_plain_array(tmp_path: Path, content: dict[str, Any]) -> None:
    dense = content["X"].toarray()
    for path in (
        write_h5ad(tmp_path / "d.h5ad", dense),
        write_anndata_zarr(tmp_path / "d.zarr", dense),
    ):
        source = af.open_array(path, "X")
        assert not isinstance(source, SparseRows)
        assert_same_rows(source.read(np.arange(N_OBS)), dense)


def test_csc_matrices_are_refused_with_the_fix(tmp_path: Path, content: dict[str, Any]) -> None:
    csc = scipy.sparse.csc_matrix(content["X"])
    for path in (
        write_h5ad(tmp_path / "c.h5ad", content["X"], layers={"counts": csc}),
        write_anndata_zarr(tmp_path / "c.zarr", content["X"], layers={"counts": csc}),
    ):
        with pytest.raises(af.StructureError, match=r"stored by column \(CSC\).*\.tocsr\(\)"):
            af.open_array(path, "layers/counts")
        report = af.inspect(path)
        assert any("CSC" in p and "tocsr()" in p for p in report.problems)


def test_no_key_names_the_elements(stored: Any) -> None:
    path, legacy = stored
    if legacy == "0.6":  # no root encoding: listed as arrays, the sparse matrix as one
        with pytest.raises(af.SourceNotFoundError, match=r"no `key` names one") as caught:
            af.open_array(path)
        assert "'X'" in str(caught.value) and "X/data" not in str(caught.value)
        return
    with pytest.raises(af.SourceNotFoundError, match=r"AnnData file.*'X'.*'obs/cell_type'"):
        af.open_array(path)


def test_inspect_describes_elements_as_what_they_are(stored: Any) -> None:
    path, legacy = stored
    report = af.inspect(path)
    layouts = {a.name: a for a in report.arrays}
    assert not any(name.startswith("X/") for name in layouts)  # X, not its parts
    assert layouts["X"].encoding == "csr_matrix" and layouts["X"].shape == (N_OBS, N_VARS)
    assert layouts["X"].nnz == _content()["X"].nnz
    text = str(report)
    assert "float32 CSR" in text and "sparse CSR matrix (400 x 30" in text
    if legacy != "0.6":
        assert layouts["obs/cell_type"].encoding == "categorical"
        assert layouts["obs/cell_type"].categories == len(LABELS)
        assert "int8 codes, 4 categories" in text
        assert not any(name.startswith("obs/cell_type/") for name in layouts)
    for fix in report.fixes:
        words = shlex.split(fix)
        assert not any(w.endswith(("/data", "/indices", "/indptr")) for w in words), fix
        assert not any(w.endswith((":X", ":layers/counts")) for w in words), fix


def test_the_proposed_fix_converts(tmp_path: Path, content: dict[str, Any]) -> None:
    # Chunks of one row (a layout inspect flags), so that it proposes a conversion.
    path = write_h5ad(tmp_path / "f.h5ad", content["X"], obsm={"X_pca": content["pca"]})
    import h5py

    with h5py.File(path, "a") as f:
        del f["obsm/X_pca"]
        f.create_dataset("obsm/X_pca", data=content["pca"], chunks=(1, 8), compression="gzip")
    report = af.inspect(path)
    assert len(report.fixes) == 1
    words = shlex.split(report.fixes[0])
    assert main([*words[1:], "-q"]) == 0
    converted = Path(words[words.index("-o") + 1])
    assert_same_rows(af.open_array(converted, "obsm/X_pca").read(np.arange(N_OBS)), content["pca"])


@pytest.mark.slow
def test_keras_fit_on_a_csr_x_with_a_categorical_target(tmp_path: Path) -> None:
    import keras

    rng = np.random.default_rng(0)
    n, genes = 2048, 50
    codes = rng.integers(0, 3, n).astype(np.int8)
    X = random_csr(n, genes, 0.1, seed=5).tolil()
    for label in range(3):  # a marker gene per label makes the task learnable
        X[np.flatnonzero(codes == label), label] = 30.0
    path = write_h5ad(tmp_path / "cells.h5ad", X.tocsr(), obs={"cell_type": (codes, LABELS[:3])})
    assert af.open_array(path, "obs/cell_type").categories == tuple(LABELS[:3])

    for sparse in (False, True):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((genes,), sparse=sparse),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(3, activation="softmax"),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        ds = af.from_arrays(
            f"{path}:X", f"{path}:obs/cell_type", batch_size=128, seed=0, sparse=sparse
        )
        history = model.fit(ds, epochs=4, verbose=0)
        assert len(history.history["loss"]) == 4
        assert history.history["loss"][-1] < history.history["loss"][0]
        assert history.history["accuracy"][-1] > 0.9, history.history
