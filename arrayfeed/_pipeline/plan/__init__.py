"""Planning an epoch: which rows form each batch of each epoch on this worker.

Pure NumPy: no I/O, no TensorFlow, no global random state.

- :mod:`.shard`: which worker this is, and its contiguous range of rows;
- :mod:`.plan`: the batches of every epoch of one worker (:class:`~.plan.Plan`);
- :mod:`.shuffles`: the shuffle modes, each a class the rest asks;
- :mod:`.permutation`: stateless permutations keyed by seed, epoch and shard;
- :mod:`.indexblocks`: an epoch's row indices, computed a block at a time ahead of the reads.
"""
