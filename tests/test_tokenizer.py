"""Tokenizer: exact round trips, GPT-2 byte-level properties, compression on real code, save/load, the CLI."""

from __future__ import annotations

import gzip
import json
import subprocess

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.fim import FIM_TOKENS, fim_token_ids
from codeparrot.tokenizer import (
    EOS_TOKEN,
    STATS_FILE,
    bytes_per_token,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)

VOCAB = 4096


@pytest.fixture(scope="module")
def split(stdlib_texts):
    """Three quarters of the stdlib files to train on, the rest held out (never seen by the trainer)."""
    n = len(stdlib_texts) * 3 // 4
    return stdlib_texts[:n], stdlib_texts[n:]


@pytest.fixture(scope="module")
def tokenizer(split):
    return train_tokenizer(split[0], vocab_size=VOCAB, show_progress=False)


ROUND_TRIP_CASES = {
    "empty": "",
    "tabs": "def f():\n\tif x:\n\t\treturn 1\n",
    "trailing spaces": "x = 1   \ny = 2 \n\n   \n",
    "crlf": "import os\r\nprint(os.sep)\r\n\r\n",
    "lone cr": "a\rb\r",
    "non-ascii": "naïve = 'café'  # Größe, 東京, Ελληνικά, русский\n",
    "emoji": "msg = '🦜🐍 ok 👍🏽'  # zero-width joiner: 👩‍💻\n",
    "leading space": "  indented = True",
    "only whitespace": " \t \r\n \u00a0 \u3000",
    "eos inside text": f"a = 1\n{EOS_TOKEN}\nb = 2",
    "control chars": "\x00\x01\x1b[31mred\x1b[0m\x7f",
    "combining marks": "e\u0301 vs \u00e9; ﬁ ligature; \ufeffbom",
    "long run": "#" * 3000 + "\n" + " " * 500 + "x",
}


@pytest.mark.parametrize("name", sorted(ROUND_TRIP_CASES))
def test_decode_inverts_encode_exactly(tokenizer, name):
    text = ROUND_TRIP_CASES[name]
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert all(0 <= i < len(tokenizer) for i in ids)


def test_round_trip_on_real_stdlib_files(tokenizer, stdlib_texts):
    encoded = tokenizer(stdlib_texts)["input_ids"]
    bad = [i for i, (ids, text) in enumerate(zip(encoded, stdlib_texts)) if tokenizer.decode(ids) != text]
    assert not bad, f"{len(bad)} of {len(stdlib_texts)} files do not round-trip, first index {bad[0]}"


def test_gpt2_byte_level_properties(tokenizer):
    from tokenizers import pre_tokenizers

    assert len(tokenizer) == VOCAB
    # <|endoftext|> plays every role; the FIM sentinels are reserved inside the vocabulary size (ids 1-4, looked
    # up by string); encode adds nothing around the text.
    assert tokenizer.all_special_tokens == [EOS_TOKEN, *FIM_TOKENS]
    assert fim_token_ids(tokenizer).all() == (1, 2, 3, 4)
    assert tokenizer.decode(tokenizer.encode("<fim_prefix>a<fim_suffix>b<fim_middle>c"), skip_special_tokens=True) == "abc"
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    assert tokenizer.bos_token_id == tokenizer.eos_token_id == tokenizer.unk_token_id == tokenizer.pad_token_id == eos
    assert EOS_TOKEN not in tokenizer.convert_ids_to_tokens(tokenizer.encode("x = 1"))
    assert tokenizer.encode(EOS_TOKEN) == [eos]
    # The full 256-symbol byte alphabet, even for bytes the corpus never contained.
    vocab = tokenizer.get_vocab()
    assert all(symbol in vocab for symbol in pre_tokenizers.ByteLevel.alphabet())
    # No prefix space: a file's first word encodes differently from the same word after a space.
    assert tokenizer.encode("def")[0] != tokenizer.encode(" def")[0]
    # GPT-2's pre-tokenization: merges never cross the regex's word boundaries ("x" and "=" stay apart).
    tokens = tokenizer.convert_ids_to_tokens(tokenizer.encode("x=y"))
    assert "x=" not in tokens and "=y" not in tokens


def test_bytes_per_token_on_held_out_code(tokenizer, split):
    held_out = bytes_per_token(tokenizer, split[1])
    seen = bytes_per_token(tokenizer, split[0])
    assert held_out > 3.2, held_out  # a 4k vocabulary from 100 files; a 32k one on the stdlib gives about 3.7
    assert seen > held_out  # the merges fit the training files best
    # The definition: UTF-8 bytes over tokens, no special tokens added.
    text = split[1][0]
    assert bytes_per_token(tokenizer, [text]) == pytest.approx(len(text.encode()) / len(tokenizer.encode(text)))


def test_training_is_deterministic(split):
    a = train_tokenizer(split[0][:20], vocab_size=600, show_progress=False)
    b = train_tokenizer(split[0][:20], vocab_size=600, show_progress=False)
    assert a.get_vocab() == b.get_vocab()
    assert a.train_stats["train_examples"] == 20
    assert a.train_stats["train_bytes"] == sum(len(t.encode()) for t in split[0][:20])


def test_training_bad_input():
    with pytest.raises(CodeParrotError, match="at least 261"):
        train_tokenizer(["x = 1"], vocab_size=100)
    with pytest.raises(CodeParrotError, match="no texts"):
        train_tokenizer([], vocab_size=300, show_progress=False)
    with pytest.raises(CodeParrotError, match="expects strings"):
        train_tokenizer(["ok", 3], vocab_size=300, show_progress=False)


def test_saved_tokenizer_loads_offline_with_autotokenizer(tokenizer, tmp_path, stdlib_texts):
    from transformers import AutoTokenizer

    save_tokenizer(tokenizer, tmp_path / "tok", stats={"valid_bytes_per_token": 3.5})
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    ours = load_tokenizer(str(tmp_path / "tok"))
    for tok in (loaded, ours):
        assert tok.encode(stdlib_texts[0]) == tokenizer.encode(stdlib_texts[0])
        assert tok.decode(tok.encode(ROUND_TRIP_CASES["crlf"])) == ROUND_TRIP_CASES["crlf"]
        assert tok.eos_token == EOS_TOKEN and tok.pad_token_id == tok.eos_token_id
        assert fim_token_ids(tok) == fim_token_ids(tokenizer) and tok.all_special_tokens == [EOS_TOKEN, *FIM_TOKENS]
    assert json.loads((tmp_path / "tok" / STATS_FILE).read_text())["valid_bytes_per_token"] == 3.5


def test_a_tokenizer_from_before_fim_loads_and_fim_on_it_is_one_line(tmp_path):
    """A tokenizer trained with <|endoftext|> only (every tokenizer before the FIM tokens were reserved)."""
    from tokenizers import pre_tokenizers, trainers

    from codeparrot.tokenizer import _byte_level_bpe, wrap_tokenizer

    old = _byte_level_bpe()
    old.train_from_iterator(["def f(x):\n    return x\n"] * 20, trainer=trainers.BpeTrainer(
        vocab_size=300, special_tokens=[EOS_TOKEN], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    save_tokenizer(wrap_tokenizer(old), tmp_path / "old")
    loaded = load_tokenizer(str(tmp_path / "old"))
    assert loaded.all_special_tokens == [EOS_TOKEN]
    with pytest.raises(CodeParrotError) as error:
        fim_token_ids(loaded, "--suffix")
    assert "\n" not in str(error.value) and str(error.value).startswith("--suffix needs the FIM tokens")
    assert "lacks <fim_prefix>, <fim_middle>, <fim_suffix>, <fim_pad>" in str(error.value)


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(CodeParrotError, match="not found"):
        load_tokenizer(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CodeParrotError, match="not a tokenizer folder"):
        load_tokenizer(str(tmp_path / "empty"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    (broken / "tokenizer_config.json").write_text("{}")
    with pytest.raises(CodeParrotError, match="cannot load the tokenizer"):
        load_tokenizer(str(broken))


def test_cli_trains_on_preprocess_shards_and_commits(tmp_path, stdlib_texts, python, scripts_env, repo_root,
                                                    write_shards):
    write_shards(tmp_path / "clean" / "train", stdlib_texts[:40], 2)
    write_shards(tmp_path / "clean" / "valid", stdlib_texts[40:50], 1)
    with gzip.open(tmp_path / "clean" / "train" / "file-000000000009.json.gz", "at") as f:
        f.write("{broken json\n")  # counted and skipped, not fatal
    out, repo = tmp_path / "tok", tmp_path / "repo"
    proc = subprocess.run(
        [python, str(repo_root / "scripts" / "train_tokenizer.py"), "--dataset", str(tmp_path / "clean"),
         "--output-dir", str(out), "--vocab-size", "700", "--n-examples", "30", "--repo", str(repo), "--quiet"],
        capture_output=True, text=True, env=scripts_env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((out / STATS_FILE).read_text())
    assert stats["train_examples"] == 30 and stats["vocab_size"] == 700
    assert stats["valid_examples"] == 10 and stats["valid_source"].startswith("valid split")
    tok = load_tokenizer(str(out))
    assert stats["valid_bytes_per_token"] == pytest.approx(bytes_per_token(tok, stdlib_texts[40:50]), abs=1e-3)
    assert f"{stats['valid_bytes_per_token']:.3f}" in proc.stdout
    # The tokenizer was committed to the repository's main branch and loads from there.
    from_repo = load_tokenizer(str(repo), revision="main")
    assert from_repo.get_vocab() == tok.get_vocab()


def test_cli_saves_the_tokenizer_when_nothing_is_held_out(tmp_path, stdlib_texts, python, scripts_env, repo_root,
                                                          write_shards):
    """A small corpus may have no valid/ split and no files beyond --n-examples: training is not thrown away."""
    write_shards(tmp_path / "clean" / "train", stdlib_texts[:12], 1)
    (tmp_path / "clean" / "valid").mkdir()  # preprocess kept no valid file
    out = tmp_path / "tok"
    proc = subprocess.run(
        [python, str(repo_root / "scripts" / "train_tokenizer.py"), "--dataset", str(tmp_path / "clean"),
         "--output-dir", str(out), "--vocab-size", "400", "--quiet"],
        capture_output=True, text=True, env=scripts_env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "no validation files" in proc.stderr
    stats = json.loads((out / STATS_FILE).read_text())
    assert stats["train_examples"] == 12 and stats["valid_bytes_per_token"] is None
    assert load_tokenizer(str(out)).decode(load_tokenizer(str(out))("x = 1\n")["input_ids"]) == "x = 1\n"


def test_cli_missing_dataset_is_one_line_error(tmp_path, python, scripts_env, repo_root):
    proc = subprocess.run(
        [python, str(repo_root / "scripts" / "train_tokenizer.py"), "--dataset", str(tmp_path / "nope"),
         "--output-dir", str(tmp_path / "tok")], capture_output=True, text=True, env=scripts_env, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0 and "nope" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "tok").exists()


def test_committing_a_tokenizer_never_replaces_an_initialized_model(tmp_path, stdlib_texts, write_shards):
    """A commit replaces main's whole tree: a tokenizer trained (again) with --repo pointing at a repository that
    already holds the initial model used to leave main with the tokenizer alone, the model's weights gone and a
    second initialization refused. It is refused before training, and the repository's main keeps its model."""
    from codeparrot.repository.refs import open_repository
    from codeparrot.tokenizer import TokenizerTrainingConfig, train_tokenizer_on_dataset

    repo_path, model = tmp_path / "repo", tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_text("weights")
    repo = open_repository(str(repo_path), create=True)
    head = repo.commit_folder(model, "main", "initial model")
    write_shards(tmp_path / "clean" / "train", stdlib_texts[:3], 1)
    cfg = TokenizerTrainingConfig(dataset=[str(tmp_path / "clean")], output_dir=str(tmp_path / "tok"),
                                  vocab_size=300, repo=str(repo_path), progress=False)
    with pytest.raises(CodeParrotError) as err:
        train_tokenizer_on_dataset(cfg)
    assert str(err.value).startswith(f"{repo_path} already has an initial model on main: committing the tokenizer")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "tok").exists()  # refused before training, not after
    assert repo.resolve_revision("main") == head
    (tmp_path / "empty").mkdir()  # a new repository, as initialize_model.py takes it: committed to, not refused
    train_tokenizer_on_dataset(TokenizerTrainingConfig(**{**vars(cfg), "repo": str(tmp_path / "empty")}))
    assert [c.message for c in open_repository(str(tmp_path / "empty")).list_commits("main")] == [
        "tokenizer (vocab 300)"]


def test_training_reports_progress_with_rates_into_a_log(stdlib_texts, capsys, monkeypatch):
    """stderr that is not a terminal (a log file, nohup): the trainer's own bars print nothing there, so a long run
    used to say nothing between "training ..." and its summary. Lines with counts and rates go there instead."""
    import codeparrot.tokenizer as tokenizer_module

    monkeypatch.setattr(tokenizer_module, "PROGRESS_EVERY_S", 0.0, raising=False)  # a line per file, not per 30 s
    train_tokenizer(stdlib_texts[:3], vocab_size=300, length=3)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("tokenizer: read 1/3 files, ") and "MB/s" in lines[0] and "files/s" in lines[0]
    assert lines[-1].startswith("tokenizer: read all 3 files, ") and lines[-1].endswith("computing the merges")
    train_tokenizer(stdlib_texts[:3], vocab_size=300, show_progress=False)
    assert capsys.readouterr().err == ""  # --quiet


def test_a_text_with_a_lone_surrogate_is_a_one_line_error(tokenizer):
    """A str can hold an unpaired surrogate ("\\ud800" escaped in JSON read by another reader than ours); it is not
    UTF-8 text. Training used to fail with a raw UnicodeEncodeError from the Rust side, bytes/token with a TypeError."""
    with pytest.raises(CodeParrotError, match=r"^example 2 holds an unpaired surrogate at character 1 \(not UTF-8 "):
        train_tokenizer(["ok", "x\ud800y"], vocab_size=300, show_progress=False)
    with pytest.raises(CodeParrotError, match=r"^example 1 holds an unpaired surrogate at character 0 "):
        bytes_per_token(tokenizer, ["\udce9"])


def test_a_corpus_too_small_for_the_vocabulary_is_said(tmp_path, stdlib_texts, write_shards, capsys):
    """BPE stops when no pair is left to merge: asked for 32,768 tokens, a small corpus gives fewer, and the model
    initialized from it gets that smaller vocabulary. The run says so instead of printing the size in passing."""
    from codeparrot.tokenizer import TokenizerTrainingConfig, train_tokenizer_on_dataset

    write_shards(tmp_path / "clean" / "train", ["x = 1\n", "y = 2\n"], 1)
    stats = train_tokenizer_on_dataset(TokenizerTrainingConfig(dataset=[str(tmp_path / "clean")], vocab_size=400,
                                                               output_dir=str(tmp_path / "tok"), progress=False))
    assert stats["vocab_size"] < 400 and stats["requested_vocab_size"] == 400
    assert (f"note: the training files hold only enough merges for {stats['vocab_size']} tokens (asked for 400)"
            in capsys.readouterr().err)


@pytest.mark.parametrize("content, reason", [
    ('[1, 2]\n["a"]\n', "not a JSON object: 2 (first at {path}:1 (list))"),
    ("", "empty file: 1 (first at {path}:1)"),
    ("\0\0\n\0\n", "NUL bytes: 2 (first at {path}:1)"),
], ids=["json-arrays", "empty-file", "nul-lines"])
def test_no_texts_to_train_on_says_why_with_the_counts(tmp_path, content, reason):
    """Files with no usable record used to give only "no texts to train the tokenizer on"; preprocess says why for
    the same input (the bad-record counts with the first file:line), and so does the tokenizer now."""
    from codeparrot.tokenizer import TokenizerTrainingConfig, train_tokenizer_on_dataset

    path = tmp_path / "data.jsonl"
    path.write_text(content)
    cfg = TokenizerTrainingConfig(dataset=[str(path)], output_dir=str(tmp_path / "tok"), vocab_size=300,
                                  progress=False)
    with pytest.raises(CodeParrotError) as err:
        train_tokenizer_on_dataset(cfg)
    assert str(err.value) == f"no texts to train the tokenizer on in 1 file(s) of {path}: {reason.format(path=path)}"
    assert not (tmp_path / "tok").exists()


def test_an_unwritable_output_is_refused_before_training(tmp_path, stdlib_texts, write_shards, monkeypatch):
    """The output folder's place used to be checked only when saving, after the minutes of training."""
    import codeparrot.tokenizer as tokenizer_module

    def no_training(*args, **kwargs):
        raise AssertionError("trained before checking the output")

    monkeypatch.setattr(tokenizer_module, "train_tokenizer", no_training)
    write_shards(tmp_path / "clean" / "train", stdlib_texts[:2], 1)
    (tmp_path / "a-file").write_text("not a folder")
    cfg = tokenizer_module.TokenizerTrainingConfig(dataset=[str(tmp_path / "clean")], vocab_size=300,
                                                   output_dir=str(tmp_path / "a-file" / "tok"), progress=False)
    with pytest.raises(CodeParrotError, match=f"^output directory {tmp_path / 'a-file'} is a file, not a directory$"):
        tokenizer_module.train_tokenizer_on_dataset(cfg)


def test_a_validation_set_without_texts_says_so_with_its_counts(tmp_path, stdlib_texts, write_shards, capsys):
    """--valid-dataset given but holding no usable record used to be told to "pass --valid-dataset to measure"."""
    from codeparrot.tokenizer import TokenizerTrainingConfig, train_tokenizer_on_dataset

    write_shards(tmp_path / "clean" / "train", stdlib_texts[:3], 1)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    stats = train_tokenizer_on_dataset(TokenizerTrainingConfig(
        dataset=[str(tmp_path / "clean")], valid_dataset=[str(empty)], vocab_size=300,
        output_dir=str(tmp_path / "tok"), progress=False))
    err = capsys.readouterr().err
    assert (f"warning: --valid-dataset (1 file(s)) held no texts to measure bytes/token on (empty file: 1 (first at "
            f"{empty}:1)); saving the tokenizer without it\n") in err
    assert "pass --valid-dataset" not in err
    assert stats["valid_bytes_per_token"] is None and stats["skipped_records"] == {"empty file": 1}
