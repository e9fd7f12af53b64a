"""`scripts/gpu_check.py` (`make gpu-check`): what the recipe gets on this device, everything in one call.

A lent GPU call lasts about 9 minutes, so one call (`--minutes 8`, the default) runs the stages most important
first; a stage that does not fit in what is left of the budget is recorded as "skipped: time budget spent" (never
estimated) and keeps an earlier call's figures (run.py says how the budget is shared). Each stage writes its
results into `<output_dir>/gpu_check.json` as soon as it ends, and the Markdown tables `<output_dir>/gpu_check.md`
are rebuilt from that file, so a call cut short keeps what was measured:

    device      versions, the device, the MFU peak row used (and its convention)
    headline    `accelerate launch scripts/train.py`, codeparrot-small at the recipe's global batch 192 × 1,024
                tokens on one GPU: micro-batch 12 × 16 accumulation, and `--batch.micro_batch_size auto`:
                the CLI's own tokens/s, MFU, peak memory and the micro-batch it trained with (headline.py)
    profile     the default training step under torch.profiler: kernel time by class and the top 15 kernels
                with their share of device time; its unprofiled tokens/s (kernel_profile.py)
    model_1_5b  the 1.5B preset (48 layers): the largest micro-batch that fits (real steps, out of memory caught,
                activation checkpointing only if nothing fits), then its tokens/s, MFU, memory (large_model.py)
    jax         the same GPT-2 step in plain JAX in a child process (jax_step.py; JAX is no dependency: skipped
                with a note where it is missing): its tokens/s and this project's ÷ JAX's (jax_stage.py)
    ceilings    bf16 GEMM TFLOP/s and device-memory copy GB/s: what any kernel here can reach
    attention   SDPA backends (flash / cuDNN / efficient / math) × dropout 0 / 0.1 × causal / masked, fwd+bwd
    loss        LM head + cross-entropy: Hugging Face (materialized logits) / fused eager / fused compiled:
                ms, peak memory, error against an fp32 reference
    train_step  codeparrot-small training steps (bf16, synthetic token ids): as shipped before / causal eager /
                compiled per block at micro-batch 12, 24, 48 / whole-model compile / dropout 0 / HF loss:
                tokens/s, MFU, peak memory, graph breaks, recompiles during the timed steps
    end_to_end  `accelerate launch scripts/train.py` for 30 steps with checkpoints, then `--resume auto` from
                step 20: the CLI's own tokens/s and MFU, and the resumed losses against the uninterrupted run

Everything but the CLI stages (`headline`, `end_to_end`) uses synthetic token ids: no data, no tokenizer, no git,
and it imports only torch, transformers, accelerate and this project (`datasets` is never imported), which is
what the lent GPU image has. The CLI stages train a tokenizer on this Python's standard library and pretokenize
it (no download either), once per call. `--smoke` runs every stage on the tiny preset with small shapes and few
steps (end_to_end: 4, resumed from step 2) on whatever device there is (CPU in CI).
"""
