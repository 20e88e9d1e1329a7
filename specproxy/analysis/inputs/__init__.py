"""The record input of every analysis command: runs read as a stream, one lean record at a time.

- ``sources``: a run's files (a file, its rotations, compressed or not, or a directory) and their lines, in order.
- ``scan``: a line decoded lean (:class:`Item`: the record, its chunk timeline still as bytes) and chunk timelines
  parsed in numpy batches (:class:`ChunkBatch`), handed to the accumulators that asked for them.
- ``runs``: runs checked and labelled (a record without a label takes its run's name) as a stream of items.
- ``synth``: synthetic record files of any size, written as the sink writes them (benchmarks, scale tests).

The IO of the analysis lives here and in ``export``; everything it feeds is pure.
"""
