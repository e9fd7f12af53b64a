"""The FIM training transform (codeparrot/fim/transform.py) and plain-text encoding (codeparrot/fim/encoding.py):
rates, split points, the per-sequence layout and its inverse, what is kept as it is, UTF-8 safety, seeding, and
the literal-sentinel hazard."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.fim import FIM_TOKENS, fim_prompt_ids, fim_token_ids
from codeparrot.fim.encoding import PlainTextEncoder, plain_text_encoder
from codeparrot.fim.transform import FimTransform, fragments, untransform

from .helpers import old_style_tokenizer

# Non-ASCII code: 2-, 3- and 4-byte UTF-8 characters everywhere, so a split point inside one would show.
UNICODE_DOCS = ["naïve = 'café'  # ünïcödé\n" * 7, "print('✓ 完成 ✓')\nx = '→'\n" * 9, "s = '😀🎉🐍'\n" * 11,
                "# Ελληνικά και русский текст\n" * 5, "é"]
HAZARD = "s = '<fim_prefix>' + \"<fim_middle>\"\nt = '<|endoftext|>'  # <fim_suffix> <fim_pad>\n"


@pytest.fixture(scope="module")
def documents(stdlib_texts) -> list[str]:
    """3,000 distinct real documents: the stdlib files cut into 25-line pieces."""
    docs: list[str] = []
    for text in stdlib_texts:
        lines = text.splitlines(keepends=True)
        docs += ["".join(lines[i:i + 25]) for i in range(0, len(lines), 25)]
    docs = list(dict.fromkeys(d for d in docs if d.strip()))
    assert len(docs) >= 3000
    return docs[:3000]


@pytest.fixture(scope="module")
def fim(code_tokenizer):
    return FimTransform.for_tokenizer(code_tokenizer, 0.5, 0.5, seed=11)


@pytest.mark.parametrize("rate, spm_rate", [(0.5, 0.5), (0.2, 0.8), (0.9, 0.1)])
def test_transformed_fraction_is_the_rate(code_tokenizer, documents, rate, spm_rate):
    """Over 3,000 documents the rearranged fraction is within 3 points of fim_rate (±4.1 sigma at 0.5), the SPM
    fraction of those within 4 points of fim_spm_rate, and the two split points are uniform: their sorted
    positions average 1/3 and 2/3 of the document."""
    fim = FimTransform.for_tokenizer(code_tokenizer, rate, spm_rate, seed=0)
    splits = [fim.split(d, epoch=0) for d in documents]
    done = [s for s in splits if s is not None]
    assert abs(len(done) / len(documents) - rate) < 0.03
    assert abs(sum(s.spm for s in done) / len(done) - spm_rate) < 0.04
    lo = np.mean([len(s.prefix) / (len(s.prefix) + len(s.middle) + len(s.suffix)) for s in done])
    hi = np.mean([(len(s.prefix) + len(s.middle)) / (len(s.prefix) + len(s.middle) + len(s.suffix)) for s in done])
    assert abs(lo - 1 / 3) < 0.03 and abs(hi - 2 / 3) < 0.03
    assert all(s.prefix + s.middle + s.suffix == d for s, d in zip(splits, documents) if s is not None)


def packed(tokenizer, texts: list[str], L: int) -> np.ndarray:
    """`texts` tokenized as the data paths do, joined with EOS and cut into sequences [n, L]."""
    eos = tokenizer.eos_token_id
    stream = [t for ids in plain_text_encoder(tokenizer).batch(texts) for t in (*ids, eos)]
    n = len(stream) // L
    return np.array(stream[: n * L], dtype=np.uint16).reshape(n, L)


def test_every_rearranged_piece_maps_back_and_no_sentinel_splits_a_character(code_tokenizer, stdlib_texts):
    """Sequences cut from the EOS-joined stream, rearranged at rate 1: each stays [L] with its EOS ids where they
    were (up to its last piece); every piece but a sequence's cut last one decodes back to the original piece's
    text, in PSM and in SPM, with exactly the three sentinels, in order; each stretch between sentinels decodes
    on its own without a replacement character (a UTF-8 character cut in two would give one on each side)."""
    texts = [t[:1500] for t in stdlib_texts[:60]] + UNICODE_DOCS * 8 + [HAZARD]
    enc, ids, eos = plain_text_encoder(code_tokenizer), fim_token_ids(code_tokenizer), code_tokenizer.eos_token_id
    sequences = packed(code_tokenizer, texts, 256)
    seen = {"psm": 0, "spm": 0}
    for epoch in range(3):  # new split points every epoch
        fim = FimTransform.for_tokenizer(code_tokenizer, 1.0, 0.5, seed=epoch)
        out = fim.rearrange(code_tokenizer, sequences, epoch, eos)
        assert out.shape == sequences.shape and out.dtype == sequences.dtype
        for seq, new in zip(sequences, out):
            before, after = fragments(seq, eos), fragments(new, eos)
            for (a, b), (c, d) in list(zip(before, after))[:-1]:
                back, rearranged, spm = untransform(new[c:d].tolist(), ids, enc.decode)
                assert back == enc.decode(seq[a:b].tolist())
                seen["spm" if spm else "psm"] += rearranged
                assert [t for t in new[c:d] if t in ids.all()] == ([ids.prefix, ids.suffix, ids.middle]
                                                                   if rearranged else [])
                for piece in np.split(new[c:d], np.flatnonzero(np.isin(new[c:d], ids.all()))) if rearranged else ():
                    decoded = enc.decode([t for t in piece.tolist() if t not in ids.all()])
                    assert "\ufffd" not in decoded, decoded
    assert min(seen.values()) > 30
    kept = FimTransform.for_tokenizer(code_tokenizer, 1e-9, 0.5, seed=0).rearrange(code_tokenizer, sequences, 0, eos)
    np.testing.assert_array_equal(kept, sequences)  # a piece not drawn keeps its ids


def test_sequences_are_never_padded_and_never_hold_a_middle_sentinel_without_a_middle(code_tokenizer):
    """The pieces that are kept as they are although drawn (transform docstring), each made to happen: a piece
    whose rearranged ids would be shorter (an encoder that drops characters), a last piece whose <fim_middle>
    would land past L - 2, and a piece cut inside a UTF-8 character at the sequence's edge."""
    ids, eos = fim_token_ids(code_tokenizer), code_tokenizer.eos_token_id
    fim = FimTransform.for_tokenizer(code_tokenizer, 1.0, 0.0, seed=0)  # every piece drawn, PSM

    class Dropping(PlainTextEncoder):  # decodes like the real encoder, encodes every piece to nothing
        def batch(self, texts):
            return [[] for _ in texts]

    seq = packed(code_tokenizer, ["def f(x):\n    return x + 1\n"] * 20, 64)[:1]
    dropping = Dropping(code_tokenizer)
    np.testing.assert_array_equal(fim.rearrange(dropping, seq, 0, eos), seq)

    # a last piece of 3 tokens after one of 56: the first grows, the last one's <fim_middle> cannot fit
    head = packed(code_tokenizer, ["x" * 5000], 56)[0]
    seq = np.concatenate([head, [eos], head[:7]]).astype(np.uint16)[None]
    new = fim.rearrange(code_tokenizer, seq, 0, eos)[0]
    assert len(new) == 64 and new[0] == ids.prefix and ids.middle in new[:63]
    last = new[np.flatnonzero(new == eos)[-1] + 1:]
    assert not np.isin(last, ids.all()).any()  # kept: no sentinel without its middle
    assert ids.pad not in new

    # a sequence that starts inside a 4-byte character: its first piece is kept, the others are rearranged
    emoji = packed(code_tokenizer, ["s = '😀🎉🐍'\n" * 30], 128)[0]
    cut = next(k for k in range(1, 20) if "\ufffd" in plain_text_encoder(code_tokenizer).decode(emoji[k:k + 1]))
    whole = plain_text_encoder(code_tokenizer).batch(["print('a whole file of one line')\n"])[0]
    seq = np.concatenate([emoji[cut:cut + 40], [eos], whole, [eos]]).astype(np.uint16)[None]
    new = fim.rearrange(code_tokenizer, seq, 0, eos)[0]
    np.testing.assert_array_equal(new[:41], seq[0, :41])
    assert new[41] == ids.prefix


def test_draws_depend_on_seed_epoch_and_text_only(code_tokenizer, documents):
    ids = fim_token_ids(code_tokenizer)
    a = [FimTransform(0.5, 0.5, 3, ids).split(d, 0) for d in documents[:400]]
    assert a == [FimTransform(0.5, 0.5, 3, ids).split(d, 0) for d in documents[:400]]  # no state: repeatable
    assert a[::-1] == [FimTransform(0.5, 0.5, 3, ids).split(d, 0) for d in documents[:400][::-1]]  # any order
    for other in ([FimTransform(0.5, 0.5, 4, ids).split(d, 0) for d in documents[:400]],
                  [FimTransform(0.5, 0.5, 3, ids).split(d, 1) for d in documents[:400]]):
        assert sum(x != y for x, y in zip(a, other)) > 150  # another seed or epoch: other draws
    assert FimTransform(1.0, 0.5, 3, ids).split("", 0) is None  # nothing to split


def test_literal_special_strings_in_files_stay_text(code_tokenizer):
    """The hazard: the tokenizer's default encoding turns a literal `<fim_middle>` or `<|endoftext|>` in a file
    into the special id. The datasets' encoding keeps it text: the only special ids are the ones inserted."""
    default = code_tokenizer(HAZARD, add_special_tokens=False)["input_ids"]
    special = {code_tokenizer.eos_token_id, *fim_token_ids(code_tokenizer).all()}
    assert special & set(default)  # the hazard is real
    plain = plain_text_encoder(code_tokenizer).batch([HAZARD])[0]
    assert not special & set(plain)
    assert code_tokenizer.decode(plain) == HAZARD
    fim = FimTransform.for_tokenizer(code_tokenizer, 1.0, 0.0, seed=0)
    sequence = np.array([*plain, code_tokenizer.eos_token_id], dtype=np.uint16)[None]
    [new] = fim.rearrange(code_tokenizer, sequence, 0, code_tokenizer.eos_token_id)
    # the three inserted sentinels and nothing from the text (the EOS after it is pushed past L by them)
    assert sorted(t for t in new if t in special) == sorted(fim_token_ids(code_tokenizer).all()[:3])
    # and the tokenizer's own default encoding is left as it was (the encoder works on a copy of the backend)
    assert code_tokenizer(HAZARD, add_special_tokens=False)["input_ids"] == default


def test_plain_text_encoder_survives_pickling_and_matches_transformers(code_tokenizer):
    texts = [HAZARD, *UNICODE_DOCS]
    enc = PlainTextEncoder(code_tokenizer)
    again = pickle.loads(pickle.dumps(enc))  # the backend flag does not pickle: it must be rebuilt
    expected = code_tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert enc.batch(texts) == again.batch(texts) == expected
    assert [enc.decode(x) for x in expected] == texts


def test_fim_prompt_ids_layout(code_tokenizer):
    ids = fim_token_ids(code_tokenizer)
    prompt = fim_prompt_ids(code_tokenizer, "def f(x):\n", "\n    return y\n")
    enc = plain_text_encoder(code_tokenizer)
    assert prompt == [code_tokenizer.eos_token_id, ids.prefix, *enc.batch(["def f(x):\n"])[0], ids.suffix,
                      *enc.batch(["\n    return y\n"])[0], ids.middle]


def test_rates_and_tokenizers_without_the_tokens_are_one_line_errors(code_tokenizer, stdlib_texts):
    assert FimTransform.for_tokenizer(code_tokenizer, 0.0, 0.5, seed=0) is None  # off: nothing to do
    for rate, spm in ((1.5, 0.5), (-0.1, 0.5), (0.5, 2.0)):
        with pytest.raises(CodeParrotError, match=r"must be in \[0, 1\]"):
            FimTransform.for_tokenizer(code_tokenizer, rate, spm, seed=0)
    old = old_style_tokenizer(stdlib_texts[:10], vocab_size=300)
    assert old.eos_token_id == 0 and all(t not in old.get_vocab() for t in FIM_TOKENS)
    FimTransform.for_tokenizer(old, 0.0, 0.5, seed=0)  # FIM off: an old tokenizer is fine
    for call in (lambda: FimTransform.for_tokenizer(old, 0.5, 0.5, seed=0),
                 lambda: fim_prompt_ids(old, "a", "b", "--suffix (infilling)")):
        with pytest.raises(CodeParrotError) as err:
            call()
        assert "\n" not in str(err.value) and "lacks <fim_prefix>" in str(err.value)
