"""From arrays on disk to batches: the pipeline, in rooms by stage.

Each room imports only the rooms below it (``tests/test_architecture.py`` checks it):

- :mod:`.api`: the entry points — the options every one takes, building a feed from them,
  :func:`~.api.batches.batches`, :func:`~.api.dataset.from_arrays` (tf.data), Keras callbacks,
  ``tf.distribute`` and resuming;
- :mod:`.loader`: loader processes — the read path beside the training process, groups back in
  shared memory;
- :mod:`.read`: reading an epoch — the feed, its reader threads, gathering rows, windows of a
  block shuffle, ``map_batch``;
- :mod:`.plan`: planning an epoch, pure NumPy — shards, shuffle modes, permutations, the index
  blocks of an epoch;
- :mod:`.tune`: how many threads and loaders read, from a model of the read path, and what
  this process may use of the machine.
"""
