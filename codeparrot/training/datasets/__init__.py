"""What the training loop reads: token sequences of fixed length, sharded over processes and DataLoader
workers, with an exact resumable position.

`record_streams.py` reads records from local shards or the Hub; `constant_length.py` tokenizes them into
EOS-joined fixed-length sequences; `pretokenized.py` tokenizes once and serves a memory-mapped token file;
`pretokenized_fim.py` is the memory-mapped path with fill-in-the-middle (the transform itself, shared by both
paths, is codeparrot/fim/transform.py); `resumable.py` is what both datasets share (splitting, shuffling,
state); `loader.py` builds the dataset a path names and the DataLoader.
"""
