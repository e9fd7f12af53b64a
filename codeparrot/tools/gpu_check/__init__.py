"""`scripts/gpu_check.py` (`make gpu-check`): what the recipe gets on this device, in stages of a few minutes.

Stages (each writes its results into `<output_dir>/gpu_check.json` as soon as it ends, and the Markdown table
`<output_dir>/gpu_check.md` is rebuilt from that file, so a lease that ends mid-way keeps what was measured):

    device      versions, the device, the MFU peak row used (and its convention)
    ceilings    bf16 GEMM TFLOP/s and device-memory copy GB/s: what any kernel here can reach
    attention   SDPA backends (flash / cuDNN / efficient / math) × dropout 0 / 0.1 × causal / masked, fwd+bwd
    loss        LM head + cross-entropy: Hugging Face (materialized logits) / fused eager / fused compiled:
                ms, peak memory, error against an fp32 reference
    train_step  codeparrot-small training steps (bf16, synthetic token ids): as shipped before / causal eager /
                compiled per block at micro-batch 12, 24, 48 / whole-model compile / dropout 0 / HF loss:
                tokens/s, MFU, peak memory, graph breaks, recompiles during the timed steps
    profile     a few steps of the default variant under torch.profiler, kernel time by class
    end_to_end  `accelerate launch scripts/train.py` for 30 steps with checkpoints, then `--resume auto` from
                step 20: the CLI's own tokens/s and MFU, and the resumed losses against the uninterrupted run

Everything but `end_to_end` uses synthetic token ids: no data, no tokenizer, no git, and it imports only torch,
transformers, accelerate and this project (`datasets` is never imported), which is what the lent GPU image has.
`end_to_end` trains a tokenizer on this Python's standard library and pretokenizes it (no download either).
`--smoke` runs every stage on the tiny preset with small shapes on whatever device there is (CPU in CI).
"""
