"""What the training loop reads: token sequences of fixed length, sharded over processes and DataLoader
workers, with an exact resumable position.

`record_streams.py` reads records from local shards or the Hub; `constant_length.py` tokenizes them into
EOS-joined fixed-length sequences; `pretokenize.py` tokenizes once and `pretokenized.py` serves the
memory-mapped token file; both datasets rearrange sequences for fill-in-the-middle with the one transform in
codeparrot/fim/transform.py; `resumable.py` is what both datasets share (splitting, shuffling, state);
`loader.py` builds the dataset a path names and the DataLoader.
"""
