"""Helpers the FIM tests share (tests/fim, tests/inference, tests/app, tests/humaneval import them): a tokenizer
trained the way they were before the FIM tokens were reserved, and a tiny GPT-2 that memorized token rows."""

from __future__ import annotations

from pathlib import Path


def old_style_tokenizer(texts: list[str], vocab_size: int = 400):
    """A byte-level BPE trained exactly as before the FIM sentinels were reserved: `<|endoftext|>` is its only
    special token (what a checkpoint made before FIM ships)."""
    from tokenizers import pre_tokenizers, trainers

    from codeparrot.tokenizer import EOS_TOKEN, _byte_level_bpe, wrap_tokenizer

    tok = _byte_level_bpe()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap_tokenizer(tok)


def memorizing_model(tokenizer, rows: list[list[int]], folder: Path, n_positions: int = 128, steps: int = 200):
    """Save into `folder` a 2-layer GPT-2 (64 wide) overfit on `rows` (each a full sequence from position 0,
    padded in one batch; padding not trained on) with `tokenizer`; returns the folder."""
    import torch

    from codeparrot.repository.model import ModelConfig, build_model, to_gpt2_config

    cfg = ModelConfig(n_layer=2, n_embd=64, n_head=2, n_positions=n_positions, resid_pdrop=0.0, embd_pdrop=0.0,
                      attn_pdrop=0.0)
    model = build_model(to_gpt2_config(cfg, tokenizer), seed=0)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.eos_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, :len(row)], labels[r, :len(row)], mask[r, :len(row)] = torch.tensor(row), torch.tensor(row), 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        model.train()
        for _ in range(steps):
            loss = model(ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    assert loss.item() < 0.05, f"tiny model failed to memorize (loss {loss.item():.3f})"
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
