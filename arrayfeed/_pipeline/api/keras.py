"""Keras integration: resuming training with the same batches as an uninterrupted run.

``keras.callbacks.BackupAndRestore`` (Keras 3) saves the weights, the optimizer state and the
epoch counter, and after a restart ``fit`` continues at the saved epoch. An arrayfeed dataset
counts epochs by its own iterations, so a restarted process would start again at epoch 0 and feed
the batches of epoch 0 to Keras' epoch ``E``. :class:`ResumeCallback` moves the dataset to Keras'
epoch at every ``on_epoch_begin``, so Keras step ``k`` of epoch ``e`` always trains on batch
``(e, k)`` of the stream, resumed or not.

With ``save_freq=<int>``, Keras 3.15 records the batch in its backup but restarts the
interrupted epoch from its first batch (with the mid-epoch weights); the dataset follows Keras and
also starts that epoch from its first batch. Given the ``BackupAndRestore`` callback too,
:class:`ResumeCallback` saves the dataset's state beside each backup, at the same batches; a
dataset built with that state as ``resume=`` starts the interrupted epoch where the backup was
made (the rest of it dealt over the workers there are now), and Keras trains on it as a shorter
epoch.

On the JAX and torch backends, Keras reads a ``tf.data.Dataset`` by iterating it eagerly and
converting every batch to NumPy; :func:`serve_numpy_batches` lets it take an arrayfeed dataset's
NumPy batches directly instead (the same stream, see there).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import keras

from ..._errors import ConfigError
from ..read.sparse import SparseFeed
from .batches import Batches
from .resume import feeds_of, live_feeds, resumed_at
from .state import encode

__all__ = ["DataWait", "ResumeCallback", "guard_build_peeks", "serve_numpy_batches"]

# Keras 3 methods that draw a batch from the training data to build an unbuilt model (on the
# JAX and torch backends always, on TensorFlow under a distribution strategy), then drop that
# iterator and start the epochs with fresh ones. Each is ``(module, class, method)``.
_PEEKING_METHODS = (
    ("keras.src.trainers.trainer", "Trainer", "_symbolic_build"),
    ("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer", "_maybe_symbolic_build"),
)


def guard_build_peeks() -> None:
    """Make the pass Keras opens only to look at one batch give its epoch back.

    Every new iteration of an arrayfeed dataset is the next epoch. Before training an unbuilt
    model, Keras' ``fit``/``evaluate``/``predict`` iterate the dataset once to get one batch for
    building it and then start over, so without this Keras epoch ``k`` would train on epoch
    ``k + 1``. Wrapping those methods (idempotent; a no-op for a Keras without them) puts every
    dataset back where it was before the look: the epochs Keras trains on are ``0, 1, 2 …``, as on
    the TensorFlow backend. Keras offers no hook around this step, hence the wrapper. (``predict``
    of an unbuilt model on JAX and torch looks at its batch inline, outside that step: there the
    look uses up an epoch of the dataset, which matters only to a shuffled one.)
    """
    for module_name, class_name, method in _PEEKING_METHODS:
        # Only what the running Keras has loaded: another backend's trainer is never imported.
        cls = getattr(sys.modules.get(module_name), class_name, None)
        original = None if cls is None else cls.__dict__.get(method)
        if original is None or getattr(original, "_arrayfeed_guard", False):
            continue
        setattr(cls, method, _guarded(original))


def _guarded(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _giving_back_epochs():
            return original(self, *args, **kwargs)

    method._arrayfeed_guard = True  # type: ignore[attr-defined]
    return method


# Keras 3's adapter for tf.data, and its methods that iterate the dataset in Python, one batch at a
# time, for the backends that do not run tf.data inside their own graph (JAX, torch; NumPy
# iteration on any backend). ``get_tf_dataset`` (the TensorFlow backend) is left as it is.
_TF_DATASET_ADAPTER = ("keras.src.trainers.data_adapters.tf_dataset_adapter", "TFDatasetAdapter")
_PYTHON_ITERATING_METHODS = ("get_numpy_iterator", "get_jax_iterator", "get_torch_dataloader")


def serve_numpy_batches() -> None:
    """Make Keras take an arrayfeed dataset's NumPy batches without going through tf.data.

    Keras on JAX and torch iterates a ``tf.data.Dataset`` eagerly in its training loop: each batch
    is handed from tf.data's threads to the loop as tensors and converted back to NumPy, and the
    groups read by arrayfeed reach tf.data through a Python generator that needs the GIL while
    the loop holds it. For a dataset :func:`arrayfeed.from_arrays` returned (also behind
    ``prefetch`` and ``with_options``, which change nothing in its elements), the adapter's
    Python-iterating methods now yield the feed's NumPy batches directly (views of recycled group
    buffers): the same stream, bit for bit, as :func:`arrayfeed.batches` and as tf.data would
    give, with the epochs taken the same way. Other transformations (``map``, ``take``, Keras' own
    ``class_weight`` map, a multi-process ``keras.distribution`` that shards the dataset) and
    sparse leaves given as sparse tensors go through tf.data as before.

    Idempotent; a Keras without that adapter is left alone (tf.data is used, as before).
    """
    module_name, class_name = _TF_DATASET_ADAPTER
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError):  # another Keras layout: tf.data is still correct
        return
    for method in _PYTHON_ITERATING_METHODS:
        original = cls.__dict__.get(method)
        if original is None or getattr(original, "_arrayfeed_numpy", False):
            continue
        setattr(cls, method, _numpy_batches_first(original, method))


# tf.data transformations that hand on their input's elements unchanged: an arrayfeed dataset
# behind them is still served as NumPy batches.
_ELEMENTS_UNCHANGED = frozenset({"_PrefetchDataset", "PrefetchDataset", "_OptionsDataset"})


def _served_feed(dataset: Any) -> Any:
    """The dense feed whose batches ``dataset`` yields unchanged, or None."""
    while (feed := getattr(dataset, "_arrayfeed_feed", None)) is None:
        if type(dataset).__name__ not in _ELEMENTS_UNCHANGED:
            return None
        inputs = dataset._inputs()
        if len(inputs) != 1:
            return None
        dataset = inputs[0]
    return None if isinstance(feed, SparseFeed) else feed


def _numpy_batches_first(original: Callable[..., Any], method: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        feed = None if args or kwargs else _served_feed(getattr(self, "_dataset", None))
        if feed is None:
            return original(self, *args, **kwargs)
        # Each iteration of a Batches is the feed's next epoch, taken at its first batch, as each
        # iteration of the dataset is.
        epochs = Batches(feed)
        if method == "get_torch_dataloader":
            try:
                from keras.src.trainers.data_adapters.data_adapter_utils import (
                    get_torch_dataloader,
                )
            except ImportError:  # another Keras layout: tf.data is still correct
                return original(self)
            return get_torch_dataloader(epochs)
        return iter(epochs)

    wrapped._arrayfeed_numpy = True  # type: ignore[attr-defined]
    return wrapped


@contextlib.contextmanager
def _giving_back_epochs() -> Iterator[None]:
    """Inside: passes begun over arrayfeed datasets are looks, not epochs; after: each dataset
    starts at the position it had before."""
    before = [(feed, feed.next_position) for feed in live_feeds()]
    try:
        yield
    finally:
        for feed, position in before:
            if feed.next_position != position:
                feed.seek(*position)


class ResumeCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Keeps an arrayfeed dataset's epochs in step with Keras' epoch counter.

    Pass it to ``fit`` with the training dataset, next to ``keras.callbacks.BackupAndRestore``::

        train = af.from_arrays(x, y, batch_size=256, seed=0)  # a fixed seed: same stream again
        model.fit(train, epochs=10, callbacks=[
            keras.callbacks.BackupAndRestore("backup/"), af.ResumeCallback(train)])

    After a restart, the new process builds the same dataset and model, calls the same ``fit``,
    and trains epoch ``E`` on the same batches as a run that was never interrupted.

    To resume inside an epoch, also on another number of workers (``shard="auto"`` counts those
    there are), give it the ``BackupAndRestore`` callback as ``backup``: the dataset's state is
    saved beside each backup, and :meth:`saved_state` reads it back for ``resume=``::

        backup = keras.callbacks.BackupAndRestore("backup/", save_freq=100)
        train = af.from_arrays(x, y, batch_size=256, seed=0,
                               resume=af.ResumeCallback.saved_state(backup))
        model.fit(train, epochs=10, callbacks=[backup, af.ResumeCallback(train, backup=backup)])

    The epoch the backup was made in then trains on the rest of it (a shorter epoch: Keras warns
    that the input ran out of data), every row the interrupted run had not trained on once.

    Args:
        dataset: A dataset returned by :func:`arrayfeed.from_arrays`, or derived from one by
            transformations that keep one iteration = one epoch (``map``, ``prefetch``,
            ``with_options`` …; not ``repeat``, ``skip`` or ``take``). Each Keras epoch must be one
            full iteration: do not pass ``steps_per_epoch`` to ``fit``.
        backup: The ``keras.callbacks.BackupAndRestore`` of the same ``fit``, listed before this
            callback: the state is written to ``STATE_FILE`` in its ``backup_dir`` whenever it
            saves (its ``save_freq``).

    >>> import numpy as np, arrayfeed as af
    >>> ds = af.from_arrays(np.zeros((10, 2)), np.zeros(10), batch_size=4, seed=0)
    >>> callback = af.ResumeCallback(ds.prefetch(1))
    >>> callback.on_epoch_begin(3)  # what fit does; the next iteration of ds is epoch 3
    """

    #: The file in the backup directory that holds the dataset's state.
    STATE_FILE = "arrayfeed_state.json"

    def __init__(self, dataset: Any, backup: Any = None) -> None:
        super().__init__()
        self._feeds = feeds_of(dataset)
        self._backup = backup
        self._epoch, self._first = 0, 0  # the epoch running, and its first step
        self._since_saved, self._last_batch = 0, 0  # as BackupAndRestore counts them
        if not self._feeds:
            raise ConfigError(
                f"`dataset` ({type(dataset).__name__}) was not made by arrayfeed.from_arrays, nor "
                "derived from such a dataset by tf.data transformations; pass the dataset that "
                "from_arrays returned."
            )
        if backup is not None and len(self._feeds) != 1:
            raise ConfigError(
                f"`backup` saves the state of one arrayfeed dataset, but `dataset` is made of "
                f"{len(self._feeds)}; pass one dataset of from_arrays, or no `backup`."
            )
        for feed in self._feeds:
            # A saved state carries the seed (resume= takes it when `seed=None`).
            if feed.seed_drawn and feed.plan.mode.random and backup is None:
                raise ConfigError(
                    "ResumeCallback needs a dataset with a fixed seed: this one was built with "
                    "`seed=None`, so a restarted process would draw another seed and train on "
                    "other batches. Pass `seed=` to from_arrays (the same one in every run)."
                )

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        steps = (self.params or {}).get("steps")
        for feed in self._feeds:
            if steps is not None and steps != feed.plan.steps:
                raise ConfigError(
                    f"ResumeCallback needs every Keras epoch to be one full pass over the dataset, "
                    f"but fit runs {steps} steps per epoch and the dataset has {feed.plan.steps}; "
                    "drop `steps_per_epoch` from fit (or set it to len(dataset))."
                )

    @classmethod
    def saved_state(cls, backup: Any) -> dict[str, Any] | None:
        """The state the callback saved with ``backup`` (a ``BackupAndRestore`` or its
        directory), for ``resume=``; None when there is none (a first run)."""
        path = os.path.join(getattr(backup, "backup_dir", backup), cls.STATE_FILE)
        try:
            with open(path) as f:
                saved: dict[str, Any] = json.load(f)
        except FileNotFoundError:
            return None
        return saved

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        for feed in self._feeds:
            # A dataset built with `resume=` starts its epoch where the state said.
            start = resumed_at(feed)
            self._first = start[1] if start is not None and start[0] == epoch else 0
            feed.seek(epoch, self._first)
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        freq = getattr(self._backup, "save_freq", "epoch")
        if not isinstance(freq, int):
            return
        # BackupAndRestore's own count (keras/src/callbacks/backup_and_restore.py), so that a
        # state is saved at every batch where weights are.
        self._since_saved += batch + 1 if batch <= self._last_batch else batch - self._last_batch
        self._last_batch = batch
        if self._since_saved >= freq:
            self._since_saved = 0
            self._save(self._epoch, self._first + batch + 1)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._last_batch = 0
        if self._backup is not None and self._backup.save_freq == "epoch":
            self._save(epoch + 1, 0)

    def _save(self, epoch: int, step: int) -> None:
        """Write the dataset's state at ``(epoch, step)`` beside the backup, whole or not at all."""
        directory = self._backup.backup_dir
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, self.STATE_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump(encode(self._feeds[0], epoch, step), f)
        os.replace(path + ".tmp", path)


class DataWait(keras.callbacks.Callback):  # type: ignore[misc]
    """Add the share of each epoch that training waited for data to the epoch's logs, as
    ``data_wait`` (0 to 1): ``fit``'s progress line and its ``History`` show it.

    It is what arrayfeed measures where batches leave it (see :attr:`arrayfeed.Tuning.data_wait`):
    the share of the epoch, from its first request to its last batch, that the consumer (Keras,
    or tf.data's prefetch for a dataset of :func:`arrayfeed.from_arrays`) spent waiting for a
    batch to be read. Near 0, the input keeps up with training; near 1, training waits for data
    (MLPerf Storage's accelerator utilisation is one minus it).

    ``dataset``: what :func:`arrayfeed.from_arrays` or :func:`arrayfeed.batches` returned (also
    behind ``map``, ``prefetch`` and other tf.data transformations).

    >>> import numpy as np, arrayfeed as af
    >>> train = af.from_arrays(np.zeros((64, 3), np.float32), np.zeros(64), batch_size=16)
    >>> callback = af.DataWait(train)  # model.fit(train, callbacks=[callback])
    """

    def __init__(self, dataset: Any) -> None:
        super().__init__()
        from .batches import tuning

        tuning(dataset)  # (refuses what it cannot report on, now rather than at an epoch's end)
        self._tuning = functools.partial(tuning, dataset)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            wait = self._tuning().data_wait
            logs["data_wait"] = 0.0 if wait is None else float(wait)
