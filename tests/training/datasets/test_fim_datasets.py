"""Fill-in-the-middle in both data paths: the same transformed stream from JSONL shards and from the memory map,
documents transformed the same whatever the number of readers, literal special-token strings kept as text, and
positions that refuse other FIM rates. (Exact resume with FIM on: test_loader, test_constant_length and
test_pretokenized run their resume cases with FIM too.)"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.fim import fim_token_ids
from codeparrot.fim.encoding import plain_text_encoder
from codeparrot.fim.transform import untransform
from codeparrot.training.datasets.constant_length import ConstantLengthDataset
from codeparrot.training.datasets.loader import build_dataset
from codeparrot.training.datasets.pretokenize import pretokenize
from codeparrot.training.datasets.pretokenized import INDEX_NAME, TOKENS_NAME, PretokenizedDataset

L = 64
HAZARD = "s = '<fim_prefix>' + \"<fim_middle>\"\nt = '<|endoftext|>'  # <fim_suffix> <fim_pad>\n"
UNICODE = "naïve = 'café'  # ✓ 完成 😀\n" * 6


@pytest.fixture(scope="module")
def docs(texts) -> list[str]:
    return [t[:900] for t in texts] + [HAZARD, UNICODE]


@pytest.fixture(scope="module")
def data(tmp_path_factory, docs, tokenizer, write_shards):
    """(JSONL shards, pretokenized folder) of the same documents in the same order."""
    root = tmp_path_factory.mktemp("fim-data")
    shards = write_shards(root / "clean" / "train", docs, 3)
    pretokenize(shards, tokenizer, root / "tokens", num_workers=1, progress=False)
    return shards, root / "tokens"


def flat(seqs) -> np.ndarray:
    return torch.cat(list(seqs)).numpy()


def documents(tokenizer, stream: np.ndarray) -> dict[str, tuple[int, ...]]:
    """{original text: its ids} for every complete document (EOS on both sides) of a stream, rearranged or not."""
    eos = tokenizer.eos_token_id
    ends = np.flatnonzero(stream == eos)
    ids, enc = fim_token_ids(tokenizer), plain_text_encoder(tokenizer)
    out = {}
    for a, b in zip(ends[:-1], ends[1:]):
        doc = stream[a + 1:b].tolist()
        out[untransform(doc, ids, enc.decode)[0]] = tuple(doc)
    return out


def test_both_paths_give_the_same_fim_stream(data, tokenizer, docs):
    """With the stream in order (no shuffling), FIM from JSONL shards and FIM from the memory map are token for
    token the same: one transform, a function of (seed, epoch, text). Every document maps back to its text, and
    the file with literal sentinels is rearranged around them, not by them."""
    shards, tokens = data
    kw = dict(shuffle=False, seed=5, fim_rate=0.5, fim_spm_rate=0.5)
    streamed = flat(build_dataset(str(shards), tokenizer, L, **kw))
    memmap = flat(build_dataset(str(tokens), tokenizer, L, **kw))
    np.testing.assert_array_equal(streamed, memmap)
    found = documents(tokenizer, np.concatenate([[tokenizer.eos_token_id], streamed]))
    assert set(found) <= set(docs) and len(found) >= len(docs) - 2  # the last document may be cut
    ids = fim_token_ids(tokenizer)
    rearranged = [d for d in found.values() if d[0] == ids.prefix]
    assert 0.25 < len(rearranged) / len(found) < 0.75
    assert all(d.count(ids.prefix) == d.count(ids.middle) == d.count(ids.suffix) == (d[0] == ids.prefix)
               for d in found.values())  # no sentinel came from a file's text
    assert ids.pad not in streamed  # nothing is padded


@pytest.mark.parametrize("path", ["shards", "tokens"])
def test_documents_are_transformed_alike_on_any_number_of_readers(data, tokenizer, path):
    """One reader, or three ranks with two DataLoader-style readers' worth of splitting: each document that
    appears whole in both is the same ids (the draws do not depend on who reads it)."""
    folder = data[0] if path == "shards" else data[1]
    kw = dict(shuffle=True, seed=2, fim_rate=0.5, shuffle_buffer=3, sequence_shuffle_buffer=0)
    one = documents(tokenizer, flat(build_dataset(str(folder), tokenizer, L, **kw)))
    three = {}
    for rank in range(3):
        three.update(documents(tokenizer, flat(build_dataset(str(folder), tokenizer, L, rank=rank, world_size=3,
                                                              **kw))))
    common = set(one) & set(three)
    assert len(common) >= len(one) - 6 and all(one[t] == three[t] for t in common)
    ids = fim_token_ids(tokenizer)
    assert 0 < sum(one[t][0] == ids.prefix for t in common) < len(common)


def test_literal_special_strings_stay_text_without_fim_too(data, tokenizer):
    """FIM off: the hazardous file is plain text in both paths (before this change its `<|endoftext|>` became an
    EOS and cut it in two); a file without such strings is tokenized exactly as before."""
    shards, tokens = data
    eos = tokenizer.eos_token_id
    for folder in (shards, tokens):
        stream = np.concatenate([[eos], flat(build_dataset(str(folder), tokenizer, L, shuffle=False))])
        found = documents(tokenizer, stream)
        assert HAZARD in found and found[HAZARD] == tuple(tokenizer(HAZARD, split_special_tokens=True)["input_ids"])
        assert not set(found[HAZARD]) & {eos, *fim_token_ids(tokenizer).all()}
        plain = [t for t in found if t not in (HAZARD, UNICODE)][0]
        assert found[plain] == tuple(tokenizer(plain, add_special_tokens=False)["input_ids"])


def test_the_shuffle_buffer_spreads_a_files_sequences_and_keeps_them_all(data, tokenizer):
    """Memory map with FIM: a file longer than a sequence fills consecutive sequences; the sequence shuffle buffer
    (as in the JSONL path) serves the same sequences in another order, a finite pass draining it to the end."""
    kw = dict(infinite=False, seed=4, shuffle=True, tokenizer=tokenizer, fim_rate=0.5)
    packed = [s.numpy().tobytes() for s in PretokenizedDataset(data[1], L, **kw)]
    shuffled = [s.numpy().tobytes() for s in PretokenizedDataset(data[1], L, sequence_shuffle_buffer=16, **kw)]
    assert sorted(packed) == sorted(shuffled) and packed != shuffled
    moved = np.mean([abs(packed.index(s) - i) for i, s in enumerate(shuffled)])
    assert moved > 4  # neighbours in the packed stream end up apart


def test_a_position_needs_the_same_fim_rates(data, tokenizer):
    shards, tokens = data
    for folder in (shards, tokens):
        def make(rate, spm=0.5):
            return build_dataset(str(folder), tokenizer, L, infinite=True, seed=1, fim_rate=rate, fim_spm_rate=spm)

        for saved, now, message in ((0.5, 0.0, "saved with data.fim_rate 0.5, fim_spm_rate 0.5; this run has "
                                               "data.fim_rate 0"),
                                    (0.0, 0.5, "saved with data.fim_rate 0; this run has data.fim_rate 0.5"),
                                    (0.5, 0.3, "this run has data.fim_rate 0.3")):
            ds = make(saved)
            next(iter(ds))
            resumed = make(now)
            resumed.load_state_dict(ds.state_dict())
            with pytest.raises(CodeParrotError, match=message):
                next(iter(resumed))
        ds = make(0.5, 0.5)
        next(iter(ds))
        resumed = make(0.5, 0.9)
        resumed.load_state_dict(ds.state_dict())
        with pytest.raises(CodeParrotError, match="fim_spm_rate 0.9"):
            next(iter(resumed))


def test_fim_refuses_data_pretokenized_the_old_way(data, tokenizer, tmp_path):
    """A folder pretokenized before literal special-token strings were kept as text may hold sentinel ids that
    came from a file: FIM on it is a one-line error (without FIM it still trains, as it did)."""
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(data[1] / TOKENS_NAME, old / TOKENS_NAME)
    index = json.loads((data[1] / INDEX_NAME).read_text())
    del index["literal_special_tokens"]
    (old / INDEX_NAME).write_text(json.dumps(index))
    assert len(list(PretokenizedDataset(old, L, shuffle=False))) > 0
    with pytest.raises(CodeParrotError, match="re-run scripts/pretokenize.py to train with FIM") as err:
        build_dataset(str(old), tokenizer, L, fim_rate=0.5)
    assert "\n" not in str(err.value)
    with pytest.raises(CodeParrotError, match="needs the tokenizer"):
        PretokenizedDataset(data[1], L, fim_rate=0.5)
    with pytest.raises(CodeParrotError, match=r"fim_rate must be in \[0, 1\]"):
        ConstantLengthDataset(tokenizer, data[0], seq_length=L, fim_rate=2.0)
