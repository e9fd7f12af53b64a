"""Stage 4, training: a model repository + clean (or pretokenized) data in, checkpoints on a branch out.

Takes in: a `TrainConfig` (`config.py`: YAML + dotted overrides), the initial model of a checkpoint repository,
training/validation data (`datasets/`: the ConstantLengthDataset over text shards, the memory-mapped
pretokenized dataset, the DataLoader whose position is what the loop consumed). Gives out: `step-N/`
checkpoints (`checkpointing.py`: model + optimizer + scheduler + RNG + data position, exact resume), each
pushed to the run's branch, metrics.jsonl / TensorBoard / W&B (`reporting.py`), validation loss
(`validation.py`), MFU (`mfu.py`). `train.py` is the loop; `loss.py` the fused LM-head cross-entropy;
`optim.py` AdamW and the warmup + cosine schedule.
"""
