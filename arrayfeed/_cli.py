"""The ``arrayfeed`` command line (also ``python -m arrayfeed``): a thin layer over the public API.

Each subcommand is a function in :data:`COMMANDS` that adds its parser to the sub-parsers and sets
``run`` (``args -> exit code``) as its default; adding a subcommand is one function and one entry.
Errors are one line on stderr, ``arrayfeed: error: <what and how to fix>``, with a non-zero exit and
no traceback (set ``ARRAYFEED_TRACEBACK=1`` to see one for an unexpected error). SIGTERM is handled
like Ctrl-C, so an interrupted conversion cleans up after itself. Only ``bench`` imports TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ._conversion.convert import convert
from ._conversion.inspect import inspect
from ._conversion.layout import COMPRESSIONS, format_bytes
from ._conversion.verify import verify
from ._errors import ArrayfeedError, ConfigError
from ._version import __version__

__all__ = ["COMMANDS", "build_parser", "main", "parse_assignments", "parse_storage_options"]

SubParsers = Any  # argparse's _SubParsersAction, which is private

_CONVERT_EPILOG = """\
PATH is one of
  file.npy                a .npy file (memory-mapped)
  file.npz:KEY            an array of a .npz file (streamed, never loaded whole)
  file.h5:KEY             an HDF5 dataset (KEY may be a path such as group/x)
  store.zarr[:KEY]        a Zarr array, or the array KEY of a Zarr group
KEY may be left out when the file or store holds exactly one array.
PATH and OUTPUT may be URLs (s3://bucket/train.zarr:x, gs://, az://, https://; OUTPUT on
object storage is .zarr only), with credentials and endpoint from the environment
(AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL ...) or --storage-option KEY=VALUE.

To concatenate along the first axis, repeat NAME (x=a.npy x=b.npy) or give a glob
in quotes, so that the shell leaves it alone: x='parts/*.npy' or x='shards/*.h5:images'.
Matches are sorted lexicographically (zero-pad numbers: part-0010.npy).

Without --chunk-rows, chunks hold the largest power of two of rows whose bytes, summed
over the arrays, stay within 256 KiB (HDF5) or 1 MiB (Zarr); uncompressed HDF5 is
written contiguous.
--compression lzf means LZF for HDF5 and Blosc-LZ4 for Zarr; gzip is level 4.

The output appears only once it is complete and verified; an error, Ctrl-C or a full
disk leaves nothing at OUTPUT.

examples:
  arrayfeed convert x=train_x.npy y=train_y.npy -o train.h5
  arrayfeed convert images=raw.h5:images labels=raw.h5:labels -o train.zarr --compression lzf
  arrayfeed convert x='parts/*.npy' y=labels.npz:y -o train.h5 --shuffle --seed 0
"""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"arrayfeed: error: {message} (see '{self.prog} --help').\n")


def parse_assignments(items: Sequence[str]) -> dict[str, str | list[str]]:
    """``["x=a.npy", "y=b.h5:y", "x=c.npy"]`` → ``{"x": ["a.npy", "c.npy"], "y": "b.h5:y"}``.

    >>> parse_assignments(["x=a.npy", "y=b.h5:y", "x=c.npy"])
    {'x': ['a.npy', 'c.npy'], 'y': 'b.h5:y'}
    """
    inputs: dict[str, str | list[str]] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigError(
                f"'{item}' is not NAME=PATH; write e.g. x=train.npy or images=raw.h5:images "
                "(NAME is the array's name in OUTPUT)."
            )
        previous = inputs.get(name)
        if previous is None:
            inputs[name] = path
        elif isinstance(previous, list):
            previous.append(path)
        else:
            inputs[name] = [previous, path]
    return inputs


def parse_storage_options(items: Sequence[str] | None) -> dict[str, Any] | None:
    """``--storage-option KEY=VALUE`` items as fsspec ``storage_options`` (None when none).

    A VALUE that reads as JSON (``true``, ``64``, ``{"a": 1}``) is taken as such, anything else
    as a string; dots in KEY nest (``client_kwargs.region_name=eu-west-1``).

    >>> parse_storage_options(["anon=true", "endpoint_url=http://127.0.0.1:9000"])
    {'anon': True, 'endpoint_url': 'http://127.0.0.1:9000'}
    >>> parse_storage_options(["config_kwargs.max_pool_connections=64"])
    {'config_kwargs': {'max_pool_connections': 64}}
    """
    if not items:
        return None
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(
                f"'--storage-option {item}' is not KEY=VALUE; write e.g. --storage-option "
                "endpoint_url=http://127.0.0.1:9000 or --storage-option anon=true."
            )
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        *parents, leaf = key.split(".")
        node = options
        for parent in parents:
            node = node.setdefault(parent, {})
            if not isinstance(node, dict):
                raise ConfigError(f"'--storage-option {item}': '{parent}' is already a value.")
        node[leaf] = value
    return options


def _add_storage_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        dest="storage_options",
        help="an option of the fsspec filesystem of URLs (s3://, gs://, ...), e.g. "
        "endpoint_url=http://127.0.0.1:9000, key=..., secret=..., anon=true; repeat for more "
        "(AWS_* environment variables work too)",
    )


def _add_cache(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache",
        metavar="DIR",
        help="keep the objects read from object storage in DIR (local disk, shared by every "
        "process of the host), each checked when read again",
    )
    parser.add_argument(
        "--cache-limit",
        type=int,
        metavar="BYTES",
        help="the most bytes --cache holds (default: half the free disk there)",
    )


def _cache(args: argparse.Namespace) -> dict[str, Any]:
    """``--cache`` and ``--cache-limit`` as the public API's keyword arguments."""
    return {"cache": args.cache, "cache_limit": args.cache_limit}


def _add_convert(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="copy arrays into an HDF5 file or Zarr store laid out for shuffled batch reads",
        description="Copy arrays into one HDF5 file (.h5, .hdf5) or Zarr v3 group (.zarr) laid "
        "out for fast shuffled batch reads: streaming, verified, atomic.",
        epilog=_CONVERT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "inputs", nargs="+", metavar="NAME=PATH", help="an array to write as NAME (see below)"
    )
    parser.add_argument(
        "-o", "--output", required=True, metavar="OUTPUT", help="file.h5, file.hdf5 or store.zarr"
    )
    parser.add_argument(
        "--chunk-rows", type=int, metavar="N", help="rows per chunk (default: from the row size)"
    )
    parser.add_argument("--compression", choices=COMPRESSIONS, default="none", help="default: none")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUTPUT")
    parser.add_argument(
        "--shuffle", action="store_true", help="store rows in one random order shared by all names"
    )
    parser.add_argument("--seed", type=int, metavar="S", help="seed of --shuffle")
    parser.add_argument(
        "--densify",
        action="store_true",
        help="write sparse matrices (AnnData CSR groups, e.g. file.h5ad:X) as dense arrays "
        "(without it they are copied as CSR groups)",
    )
    parser.add_argument(
        "--dask-scheduler",
        metavar="ADDRESS",
        help="convert on a Dask cluster (e.g. tcp://host:8786): workers write disjoint chunk "
        "runs of a .zarr OUTPUT they can all reach; needs arrayfeed[dask]",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar, no summary")
    _add_storage_option(parser)
    parser.set_defaults(run=_run_convert)


def _run_convert(args: argparse.Namespace) -> int:
    inputs = parse_assignments(args.inputs)
    start = time.monotonic()
    record = convert(
        inputs,
        args.output,
        chunk_rows=args.chunk_rows,
        compression=args.compression,
        overwrite=args.overwrite,
        shuffle=args.shuffle,
        seed=args.seed,
        progress=False if args.quiet else None,
        densify=args.densify,
        storage_options=parse_storage_options(args.storage_options),
        scheduler=args.dask_scheduler,
    )
    if not args.quiet:
        seconds = time.monotonic() - start
        layout = (
            "contiguous" if record.chunk_rows is None else f"chunks of {record.chunk_rows} rows"
        )
        shuffled = "" if record.shuffle_seed is None else f", shuffled (seed {record.shuffle_seed})"
        size = _size(args.output, parse_storage_options(args.storage_options))
        print(
            f"arrayfeed: wrote {args.output}: {', '.join(record.arrays)} ({record.rows} rows), "
            f"{layout}, compression {record.compression}{shuffled}, {size} in {seconds:.1f} s"
        )
    return 0


def _size(path: str, storage_options: dict[str, Any] | None = None) -> str:
    if "://" in path:  # object storage: what the listing says
        arrays = inspect(path, storage_options=storage_options).arrays
        return format_bytes(sum(a.stored_bytes or 0 for a in arrays))
    if os.path.isdir(path):
        total = sum(
            os.path.getsize(os.path.join(root, f))
            for root, _, files in os.walk(path)
            for f in files
        )
    else:
        total = os.path.getsize(path)
    return format_bytes(total)


def _add_bench(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="measure how fast arrayfeed reads your arrays, and what would be faster",
        description="Time from_arrays over your arrays, read together as one dataset, for each "
        "shuffle mode (and the storage's own slab-read ceiling for chunked arrays), then say "
        "which shuffle mode to use and whether `arrayfeed convert` would pay off.",
        epilog="PATH is NAME=PATH[:KEY], PATH:KEY, a .npy file, or an HDF5 file / Zarr group "
        "(every array in it).\n\nexamples:\n  arrayfeed bench train.h5\n"
        "  arrayfeed bench x=images.npy y=labels.zarr --batch-size 512",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH")
    parser.add_argument("--batch-size", type=int, default=256, metavar="N", help="default: 256")
    parser.add_argument(
        "--seconds", type=float, default=3.0, metavar="S", help="time per measurement (default 3)"
    )
    _add_storage_option(parser)
    _add_cache(parser)
    parser.set_defaults(run=_run_bench)


def _run_bench(args: argparse.Namespace) -> int:
    from ._bench import bench

    options = parse_storage_options(args.storage_options)
    report = bench(
        args.paths,
        batch_size=args.batch_size,
        seconds=args.seconds,
        storage_options=options,
        **_cache(args),
    )
    print(report.format())
    return 0


def _add_inspect(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show how arrays are stored and whether that suits shuffled batch reads",
        description="List the arrays of an HDF5 file, Zarr store, .npy or .npz file (shape, "
        "dtype, chunks, compression, size), say whether the layout suits shuffled batch reads, "
        "and print the `arrayfeed convert` command that would fix it. Reads metadata only.",
        epilog="PATH is a file or store, or one array of it: file.h5:KEY, store.zarr:KEY "
        "(KEY may be a path such as obsm/X_pca); URLs too.\n\nexamples:\n"
        "  arrayfeed inspect raw.h5\n  arrayfeed inspect data.h5ad:obsm/X_pca",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", metavar="PATH")
    _add_storage_option(parser)
    _add_cache(parser)
    parser.set_defaults(run=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    options = parse_storage_options(args.storage_options)
    print(inspect(args.path, storage_options=options, **_cache(args)))
    return 0


def _add_verify(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="re-read a store written by `arrayfeed convert` and check it against its record",
        description="Read every array of an HDF5 file or Zarr store that `arrayfeed convert` "
        "wrote, check each chunk's own checksum and each array's CRC-32 against the record "
        "stored with it, and print a one-line verdict. Exit 1 (naming the array and chunk) on "
        "any mismatch.",
        epilog="PATH is the file or store, or one array of it (store.zarr:KEY, file.h5:KEY), "
        "checked alone; URLs too.\n\nexamples:\n  arrayfeed verify train.h5\n"
        "  arrayfeed verify train.zarr:images",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", metavar="PATH")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _add_storage_option(parser)
    _add_cache(parser)
    parser.set_defaults(run=_run_verify)


def _run_verify(args: argparse.Namespace) -> int:
    options = parse_storage_options(args.storage_options)
    progress = False if args.quiet else None
    print(verify(args.path, progress=progress, storage_options=options, **_cache(args)))
    return 0


#: Subcommands, in the order ``--help`` lists them.
COMMANDS: list[Callable[[SubParsers], None]] = [_add_convert, _add_inspect, _add_verify, _add_bench]


def build_parser() -> argparse.ArgumentParser:
    """The ``arrayfeed`` argument parser with every subcommand of :data:`COMMANDS`."""
    parser = _Parser(
        prog="arrayfeed",
        description="Tools for the arrays arrayfeed feeds to tf.data: convert, inspect, verify, bench.",
    )
    parser.add_argument("--version", action="version", version=f"arrayfeed {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(subparsers)
    return parser


def _error(message: str) -> None:
    one_line = " ".join(message.split())
    print(f"arrayfeed: error: {one_line}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 2
    restore = None
    if threading.current_thread() is threading.main_thread():
        restore = signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up on kill
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        output = getattr(args, "output", None)
        _error("interrupted" + (f"; nothing was written to {output}." if output else "."))
        return 130
    except (ArrayfeedError, OSError) as exc:
        _error(str(exc) or type(exc).__name__)
        return 1
    except Exception as exc:
        if os.environ.get("ARRAYFEED_TRACEBACK"):
            raise
        _error(
            f"unexpected {type(exc).__name__}: {exc} (run again with ARRAYFEED_TRACEBACK=1 to see "
            "where, and please report it)."
        )
        return 1
    finally:
        if restore is not None:
            signal.signal(signal.SIGTERM, restore)
