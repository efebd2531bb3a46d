"""Nested structures of leaves: tuples, lists and dicts (nesting allowed).

Pure Python. A structure is flattened once into a list of leaves plus a :class:`Treedef` that
rebuilds it; dict keys are visited in sorted order (as ``tf.nest`` does) and lists are rebuilt
as tuples, because ``tf.data`` signatures take tuples and Keras treats both alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._errors import StructureError

__all__ = ["Treedef", "flatten"]


@dataclass(frozen=True)
class Treedef:
    """The shape of a nested structure: ``kind`` is "leaf", "tuple" or "dict"."""

    kind: str
    children: tuple[Treedef, ...] = ()
    keys: tuple[Any, ...] = ()

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(child.num_leaves for child in self.children)

    def unflatten(self, leaves: Sequence[Any]) -> Any:
        """Rebuild the structure from leaves in flattening order."""
        if len(leaves) != self.num_leaves:
            raise StructureError(
                f"expected {self.num_leaves} leaves to rebuild the structure, got {len(leaves)}."
            )
        it = iter(leaves)
        return self._build(it)

    def _build(self, it: Iterator[Any]) -> Any:
        if self.kind == "leaf":
            return next(it)
        built = [child._build(it) for child in self.children]
        if self.kind == "dict":
            return dict(zip(self.keys, built, strict=True))
        return tuple(built)

    def leaf_paths(self, root: str) -> list[str]:
        """Readable names of the leaves, e.g. ``x['image']`` or ``y[1]``."""
        if self.kind == "leaf":
            return [root]
        names: list[str] = []
        labels = self.keys if self.kind == "dict" else range(len(self.children))
        for label, child in zip(labels, self.children, strict=True):
            names.extend(child.leaf_paths(f"{root}[{label!r}]"))
        return names


def _numbers(node: list[Any], is_leaf: Callable[[Any], bool]) -> bool:
    """True for a (nested) list whose first items are plain numbers that are not leaves: data
    meant as an array, not a structure."""
    first = node[0]
    while isinstance(first, list) and first:
        first = first[0]
    return isinstance(first, (int, float, complex, np.generic)) and not is_leaf(first)


def flatten(
    structure: Any, is_leaf: Callable[[Any], bool], name: str = "value"
) -> tuple[list[Any], Treedef]:
    """Flatten ``structure`` into its leaves and a :class:`Treedef`.

    ``is_leaf`` decides what counts as a leaf; anything that is neither a leaf, a tuple, a list
    nor a mapping raises :class:`StructureError` naming where it was found.
    """
    leaves: list[Any] = []
    treedef = _flatten(structure, is_leaf, name, leaves)
    return leaves, treedef


def _flatten(node: Any, is_leaf: Callable[[Any], bool], path: str, leaves: list[Any]) -> Treedef:
    if is_leaf(node):
        leaves.append(node)
        return Treedef("leaf")
    if isinstance(node, Mapping):
        try:
            keys = tuple(sorted(node))
        except TypeError:
            raise StructureError(
                f"`{path}` is a dict whose keys cannot be sorted ({list(node)!r}); "
                "use keys of one type, such as strings."
            ) from None
        if not keys:
            raise StructureError(f"`{path}` is an empty dict; give it at least one array.")
        children = tuple(_flatten(node[k], is_leaf, f"{path}[{k!r}]", leaves) for k in keys)
        return Treedef("dict", children, keys)
    if isinstance(node, (tuple, list)):
        if not node:
            raise StructureError(
                f"`{path}` is an empty {type(node).__name__}; give it at least one array."
            )
        if isinstance(node, list) and _numbers(node, is_leaf):
            raise StructureError(
                f"`{path}` is a list of numbers; a list is read as a structure (one array per "
                f"item), not as data. Wrap the data in an array: `np.asarray({path})`."
            )
        children = tuple(_flatten(v, is_leaf, f"{path}[{i}]", leaves) for i, v in enumerate(node))
        return Treedef("tuple", children)
    raise StructureError(
        f"`{path}` is a {type(node).__module__}.{type(node).__qualname__}, which is not an array-like "
        "(NumPy array, np.memmap, h5py.Dataset, zarr.Array, path to a .npy file, or "
        "arrayfeed.open_array(...)) nor a tuple, list or dict of them."
    )
