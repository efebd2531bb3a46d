"""Reading an epoch: groups of batches read from the sources, in order.

- :mod:`.feed`: the feed, a generator function over epochs of stacked batches;
- :mod:`.readers`: reader threads whose number may change, and one pass over an epoch;
- :mod:`.rows`: gathering a group's rows from every leaf (sorted, de-duplicated reads);
- :mod:`.blocks`: the windows of a block shuffle, read whole and shared by their groups;
- :mod:`.resident`: small chunked leaves held in memory;
- :mod:`.mapbatch`: ``map_batch``, checked against what its first call returned;
- :mod:`.waits`: how long a storage's reads wait (it sizes the groups);
- :mod:`.sparse`: sparse batches; :mod:`.structure`: the nesting of ``x``, ``y`` and weights.
"""
