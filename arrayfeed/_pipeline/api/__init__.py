"""The entry points: what a training script calls.

- :mod:`.options`: the public knobs, defined once (:class:`~.options.FeedArgs`);
- :mod:`.build`: every check of the arguments, and the feed they make;
- :mod:`.batches`: :func:`~.batches.batches`, NumPy batches for any loop (no TensorFlow);
- :mod:`.dataset`: :func:`~.dataset.from_arrays`, the tf.data glue;
- :mod:`.keras`: the Keras callbacks; :mod:`.distribute`: ``tf.distribute`` strategies;
- :mod:`.resume`: the feeds behind a dataset, for resuming;
- :mod:`.state`: the states to checkpoint, and the plan that resumes from one.
"""
