"""Loader processes: the whole read path beside the training process, groups back in shared memory.

- :mod:`.policy`: where a feed is read (the ``processes`` argument and its default);
- :mod:`.processes`: the loader processes of this process, started as new interpreters;
- :mod:`.server`: a loader process, serving every feed of one training process;
- :mod:`.client`: a feed's epochs read by loaders (:class:`.client.RemoteFeed`);
- :mod:`.slots`: the shared-memory slots a loader writes groups into and the training process
  lends;
- :mod:`.wire`: the messages and the socket they travel on (descriptors beside them).
"""
