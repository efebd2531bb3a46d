"""The entry points' arguments, defined once: signature, documentation, forwarding."""

from __future__ import annotations

import inspect
import pydoc
import re
from dataclasses import fields
from typing import Any

import numpy as np
import pytest

import arrayfeed as af
from arrayfeed._pipeline.api.options import ARGS_MARKER, FeedArgs, check_forwarded, takes_feed_args

KNOBS = [
    "batch_size",
    "shuffle",
    "seed",
    "shard",
    "drop_remainder",
    "map_batch",
    "num_threads",
    "start_epoch",
    "start_step",
    "resume",
    "sparse",
    "storage_options",
    "cache",
    "cache_limit",
    "processes",
]
ENTRY_POINTS = [af.from_arrays, af.batches]


def _documented(doc: str) -> list[str]:
    """The names the ``Args`` section of ``doc`` documents, in order."""
    section = inspect.cleandoc(doc).split("Args:\n", 1)[1]
    section = re.split(r"\n\S", section, maxsplit=1)[0]  # up to the next section
    return re.findall(r"^    (\w+):", section, flags=re.M)


def test_the_options_are_the_keyword_only_fields() -> None:
    assert FeedArgs.options() == KNOBS
    assert [f.name for f in fields(FeedArgs) if not f.kw_only] == ["x", "y", "sample_weight"]


def test_every_argument_is_documented_once_in_order() -> None:
    assert _documented(FeedArgs.__doc__ or "") == ["x", "y", "sample_weight", *KNOBS]


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_entry_points_show_every_argument_with_default_and_documentation(entry: Any) -> None:
    parameters = inspect.signature(entry).parameters
    assert list(parameters) == ["x", "y", "sample_weight", *KNOBS]
    for field in fields(FeedArgs):
        if field.name != "x":
            assert parameters[field.name].default == field.default, field.name
    assert parameters["x"].default is inspect.Parameter.empty
    assert all(parameters[k].kind is inspect.Parameter.KEYWORD_ONLY for k in KNOBS)
    assert parameters["batch_size"].annotation == "int"
    assert _documented(entry.__doc__) == ["x", "y", "sample_weight", *KNOBS]
    assert ARGS_MARKER.strip() not in entry.__doc__
    text = pydoc.render_doc(entry, renderer=pydoc.plaintext)
    assert "batch_size: 'int' = 32" in text and "storage_options: Options of the fsspec" in text


def test_each_entry_point_keeps_its_own_return_and_text() -> None:
    assert inspect.signature(af.batches).return_annotation == "Batches"
    assert inspect.signature(af.from_arrays).return_annotation == "tf.data.Dataset"
    assert "distribute_datasets_from_function" in af.from_arrays.__doc__
    assert "Raises:" in af.batches.__doc__ and af.batches.__name__ == "batches"


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_a_call_that_does_not_fit_is_a_type_error_naming_the_entry_point(entry: Any) -> None:
    name = entry.__name__
    with pytest.raises(
        TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'bach_size'$"
    ):
        entry(np.zeros(4), bach_size=2)
    with pytest.raises(  # the older name of `processes` is gone: no alias, no warning
        TypeError, match=rf"^{name}\(\) got an unexpected keyword argument 'map_processes'$"
    ):
        entry(np.zeros(4), map_processes=1)
    with pytest.raises(TypeError, match=rf"^{name}\(\) missing a required argument: 'x'$"):
        entry()
    with pytest.raises(TypeError, match=rf"^{name}\(\) too many positional arguments$"):
        entry(np.zeros(4), None, None, 32)


def test_arguments_arrive_as_given() -> None:
    @takes_feed_args
    def echo(args: FeedArgs) -> FeedArgs:
        """Echo.

        Args: FeedArgs
        """
        return args

    x = np.zeros(3)
    args = echo(x, sample_weight=None, batch_size=7, shard=None)
    assert args.x is x and args.y is None and args.batch_size == 7 and args.shard is None
    assert (args.shuffle, args.seed, args.storage_options) == (True, None, None)


def test_a_docstring_without_the_marker_is_refused() -> None:
    with pytest.raises(AssertionError, match="has no line 'Args: FeedArgs'"):

        @takes_feed_args
        def undocumented(args: FeedArgs) -> None:
            """No arguments listed."""


def test_forwarded_keywords_are_options() -> None:
    check_forwarded({"shuffle": False, "seed": 3, "storage_options": {}}, "from_arrays")
    with pytest.raises(TypeError, match=r"^from_arrays\(\) got an unexpected keyword argument 'y'"):
        check_forwarded({"y": None}, "from_arrays")
    with pytest.raises(TypeError, match="unexpected keyword argument 'sufle'"):
        af.distribute(_Strategy(), np.arange(10), global_batch_size=2, sufle=False)


class _Strategy:
    num_replicas_in_sync = 1
