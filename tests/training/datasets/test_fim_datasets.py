"""Fill-in-the-middle in both data paths: the same rearranged sequences from JSONL shards and from the memory map,
each sequence rearranged on its own (context-level: every <fim_middle> has its prefix and suffix in view), files
transformed the same whatever the number of readers, literal special-token strings kept as text, and positions
that refuse other FIM rates. (Exact resume with FIM on: test_loader, test_constant_length and test_pretokenized
run their resume cases with FIM too.)"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.fim import fim_token_ids
from codeparrot.fim.encoding import plain_text_encoder
from codeparrot.fim.transform import fragments, untransform
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
    """{text: ids} of every complete document (EOS on both sides) of a left-to-right stream."""
    ends = np.flatnonzero(stream == tokenizer.eos_token_id)
    enc = plain_text_encoder(tokenizer)
    return {enc.decode(stream[a + 1:b].tolist()): tuple(stream[a + 1:b].tolist()) for a, b in zip(ends[:-1], ends[1:])}


def whole_fragments(tokenizer, sequences) -> dict[str, tuple[int, ...]]:
    """{original text: ids} of every file that lies whole inside one sequence (EOS on both sides), rearranged
    or not."""
    ids, enc, eos = fim_token_ids(tokenizer), plain_text_encoder(tokenizer), tokenizer.eos_token_id
    out = {}
    for seq in sequences:
        seq = seq.numpy()
        for a, b in fragments(seq, eos):
            if a > 0 and b < len(seq):
                out[untransform(seq[a:b].tolist(), ids, enc.decode)[0]] = tuple(seq[a:b].tolist())
    return out


def test_both_paths_give_the_same_fim_sequences_each_rearranged_on_its_own(data, tokenizer):
    """With the stream in order (no shuffling), FIM from JSONL shards and FIM from the memory map are token for
    token the same: one transform, a function of (seed, epoch, the sequence). Against the same sequences without
    FIM: every sequence keeps its length and its EOS positions up to its last piece, every rearranged piece has
    all three sentinels in order inside the sequence (none without the others: the old per-file transform put a
    long file's middle in later sequences than its sentinels) and maps back to the piece's text; the file with
    literal sentinels is rearranged around them, not by them; nothing is padded."""
    shards, tokens = data
    kw = dict(shuffle=False, seed=5, fim_spm_rate=0.5)
    streamed = list(build_dataset(str(shards), tokenizer, L, fim_rate=0.5, **kw))
    memmap = list(build_dataset(str(tokens), tokenizer, L, fim_rate=0.5, **kw))
    plain = list(build_dataset(str(tokens), tokenizer, L, fim_rate=0.0, **kw))
    assert len(streamed) == len(memmap) == len(plain) > 100
    assert all(torch.equal(a, b) for a, b in zip(streamed, memmap))
    ids, enc, eos = fim_token_ids(tokenizer), plain_text_encoder(tokenizer), tokenizer.eos_token_id
    counts = {"pieces": 0, "rearranged": 0, "spm": 0}
    for fim_seq, seq in zip(memmap, plain):
        fim_seq, seq = fim_seq.numpy(), seq.numpy()
        assert fim_seq.shape == (L,) and ids.pad not in fim_seq
        before, after = fragments(seq, eos), fragments(fim_seq, eos)
        for i, (a, b) in enumerate(after):
            piece = fim_seq[a:b].tolist()
            sentinels = [t for t in piece if t in ids.all()]
            assert sentinels in ([], [ids.prefix, ids.suffix, ids.middle])  # all three in view, in order
            if i + 1 < len(after) or b < L:  # not cut at the sequence's end
                text, rearranged, spm = untransform(piece, ids, enc.decode)
                assert before[i] == (before[i][0], before[i][0] + len(piece) - 3 * rearranged) or rearranged
                assert text == enc.decode(seq[before[i][0]:before[i][1]].tolist())
                counts["pieces"] += 1
                counts["rearranged"] += rearranged
                counts["spm"] += spm
    assert 0.3 < counts["rearranged"] / counts["pieces"] < 0.7 and 0 < counts["spm"] < counts["rearranged"]
    hazard = [s.numpy() for s in memmap if HAZARD in enc.decode(s.numpy().tolist())]
    assert not any(np.isin(s, ids.all()).any() for s in hazard)  # kept: the literal strings stayed text


@pytest.mark.parametrize("path", ["shards", "tokens"])
def test_files_are_transformed_alike_on_any_number_of_readers(data, tokenizer, path):
    """One reader, or three ranks: a file that lies whole inside a sequence in both is the same ids (its draws
    depend on its text, not on who reads it)."""
    folder = data[0] if path == "shards" else data[1]
    kw = dict(shuffle=True, seed=2, fim_rate=0.5, shuffle_buffer=3, sequence_shuffle_buffer=0)
    one = whole_fragments(tokenizer, build_dataset(str(folder), tokenizer, 16 * L, **kw))
    three = {}
    for rank in range(3):
        three.update(whole_fragments(tokenizer, build_dataset(str(folder), tokenizer, 16 * L, rank=rank,
                                                              world_size=3, **kw)))
    common = set(one) & set(three)
    assert len(common) >= 5 and all(one[t] == three[t] for t in common)
    ids = fim_token_ids(tokenizer)
    assert 0 < sum(one[t][0] == ids.prefix for t in one) < len(one)


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
        # a position of the earlier per-file transform: its buffers hold files rearranged before packing
        old = ds.state_dict()
        del old["fim_level"]
        resumed = make(0.5)
        resumed.load_state_dict(old)
        with pytest.raises(CodeParrotError, match="saved with document-level FIM"):
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
