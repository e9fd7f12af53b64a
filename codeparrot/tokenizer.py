"""GPT-2-style byte-level BPE tokenizer, trained from scratch on code.

The recipe matches GPT-2's tokenizer (and CodeParrot's retrained one) except for the merges, which are
learned on the training corpus:
- pre-tokenization: GPT-2's regex split, every byte mapped to one of 256 printable symbols
  (`ByteLevel(add_prefix_space=False)`), so any text - tabs, CRLF, emoji, invalid-looking Unicode - is
  representable without an unknown token;
- the initial alphabet is all 256 byte symbols, seen in the corpus or not;
- decoding maps the symbols back to bytes (`ByteLevel` decoder): `decode(encode(text)) == text` exactly;
- `<|endoftext|>` (id 0) serves as BOS, EOS, UNK (never produced: every byte has a symbol) and PAD (for batched
  generation). No BOS/EOS is added by `encode`: the training dataset joins files with EOS itself.
- the four fill-in-the-middle sentinels `<fim_prefix>`, `<fim_middle>`, `<fim_suffix>`, `<fim_pad>` (ids 1-4,
  StarCoder's spelling; codeparrot/fim) are reserved as special tokens inside `vocab_size`: 32,768 stays 32,768.
  A tokenizer trained before they were reserved still loads; FIM asked of it is a one-line error.

The result is saved as `tokenizer.json` + `tokenizer_config.json`, which `AutoTokenizer.from_pretrained`
loads offline. `train_tokenizer_on_dataset(TokenizerTrainingConfig(...))` is the whole stage (what
scripts/train_tokenizer.py runs): stream the clean shards, train, measure bytes/token on held-out files, save,
optionally commit to a checkpoint repository.
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from codeparrot.atomic_io import atomic_dir, atomic_write_json, ensure_writable_dir
from codeparrot.config import REQUIRED, doc
from codeparrot.data.records import BadRecords, iter_texts, resolve_data_files, split_files_for
from codeparrot.errors import CodeParrotError, first_line
from codeparrot.fim.tokens import FIM_TOKENS
from codeparrot.repository.base import CheckpointRepository, is_hub_ref, main_state, strip_scheme
from codeparrot.repository.local import LocalGitRepository
from codeparrot.repository.refs import open_repository, resolve_model_dir

EOS_TOKEN = "<|endoftext|>"
MIN_VOCAB = 256 + 1 + len(FIM_TOKENS)  # the byte symbols, EOS and the FIM sentinels
# Written next to the tokenizer files by `save_tokenizer` (bytes/token, training time, corpus size).
STATS_FILE = "tokenizer_stats.json"


def _byte_level_bpe():
    """An untrained `tokenizers.Tokenizer` with GPT-2's byte-level pipeline around an empty BPE model."""

    tok = Tokenizer(models.BPE())
    # use_regex=True is GPT-2's split pattern ('s|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+);
    # no prefix space: a file's first token must not depend on a space that is not there.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def wrap_tokenizer(tok):
    """Wrap a trained `tokenizers.Tokenizer` as the `transformers` fast tokenizer the project uses."""

    if tok.token_to_id(EOS_TOKEN) is None:
        raise CodeParrotError(f"tokenizer has no {EOS_TOKEN} token")
    fim = [token for token in FIM_TOKENS if tok.token_to_id(token) is not None]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        extra_special_tokens=fim,  # skipped by decode(skip_special_tokens=True), saved in tokenizer_config.json
        # The cleanup pass would turn "a ." into "a." and break exact decoding.
        clean_up_tokenization_spaces=False,
    )


def _utf8_size(text: str, index: int) -> int:
    """The UTF-8 size of `text`, the `index`-th (1-based) of its texts; a one-line error for a text holding an
    unpaired surrogate, which no byte sequence encodes (the tokenizer's Rust side refuses it with a raw error)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise CodeParrotError(f"example {index} holds an unpaired surrogate at character {err.start} (not UTF-8 "
                              "text; codeparrot.data.records counts such records as invalid UTF-8)") from None


# How often training reports its reading progress where stderr is not a terminal (a log file).
PROGRESS_EVERY_S = 30.0


class _CountingIterator:
    """Yields the texts (at most `limit`) and counts the UTF-8 bytes it handed out, for MB/s. `report`: a line
    with counts and rates to stderr every `PROGRESS_EVERY_S` seconds and when the texts are all read."""

    def __init__(self, texts: Iterable[str], limit: int | None, report: bool = False):
        self.texts, self.limit, self.report = texts, limit, report
        self.n_texts = 0
        self.n_bytes = 0

    def _progress(self, seconds: float, done: bool) -> None:
        seconds = max(seconds, 1e-9)
        of = "all " if done else ""
        total = "" if done or self.limit is None else f"/{self.limit:,}"
        rates = f"{self.n_bytes / 1e6 / seconds:.2f} MB/s, {self.n_texts / seconds:,.0f} files/s"
        print(f"tokenizer: read {of}{self.n_texts:,}{total} files, {self.n_bytes / 1e6:,.1f} MB in {seconds:,.0f} s "
              f"({rates})" + ("; computing the merges" if done else ""), file=sys.stderr, flush=True)

    def __iter__(self) -> Iterator[str]:
        start = last = time.monotonic()
        # islice stops before pulling item limit+1, so a shared iterator can go on to a held-out split.
        for text in itertools.islice(self.texts, self.limit):
            if not isinstance(text, str):
                raise CodeParrotError(f"tokenizer training expects strings, got {type(text).__name__} "
                                      f"at example {self.n_texts + 1}")
            self.n_texts += 1
            self.n_bytes += _utf8_size(text, self.n_texts)
            if self.report and (now := time.monotonic()) - last >= PROGRESS_EVERY_S:
                last = now
                self._progress(now - start, done=False)
            yield text
        if self.report and self.n_texts:  # the merges that follow report nothing: say where the time goes
            self._progress(time.monotonic() - start, done=True)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 32768, length: int | None = None,
                    show_progress: bool = True):
    """Train a byte-level BPE with `vocab_size` entries (EOS + the 4 FIM sentinels + 256 bytes + merges) on `texts`.

    `length` (the number of texts, when known) both limits how many are read and sizes the progress bar.
    Returns a `transformers.PreTrainedTokenizerFast`; `tokenizer.train_stats` holds the corpus size and time.
    """

    if vocab_size < MIN_VOCAB:
        raise CodeParrotError(f"vocab_size must be at least {MIN_VOCAB} (256 bytes + {EOS_TOKEN} + "
                              f"{len(FIM_TOKENS)} FIM tokens), got {vocab_size}")
    tok = _byte_level_bpe()
    # The Rust trainer's bars (counts, no rates) print only blank lines where stderr is not a terminal (a log
    # file): there, our own lines with rates instead.
    terminal = sys.stderr.isatty()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, *FIM_TOKENS],  # ids 0-4
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 byte symbols
        show_progress=show_progress and terminal,
    )
    counted = _CountingIterator(texts, length, report=show_progress and not terminal)
    start = time.perf_counter()
    tok.train_from_iterator(counted, trainer=trainer, length=length)
    seconds = time.perf_counter() - start
    if counted.n_texts == 0:
        raise CodeParrotError("no texts to train the tokenizer on")
    tokenizer = wrap_tokenizer(tok)
    tokenizer.train_stats = {
        "vocab_size": len(tokenizer),
        "train_examples": counted.n_texts,
        "train_bytes": counted.n_bytes,
        "train_seconds": round(seconds, 3),
        "train_mb_per_s": round(counted.n_bytes / 1e6 / max(seconds, 1e-9), 3),
    }
    return tokenizer


def bytes_per_token(tokenizer, texts: Iterable[str], batch_size: int = 256) -> float:
    """UTF-8 bytes of `texts` per token (no special tokens added); higher means better compression."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)  # a transformers wrapper or a raw Tokenizer
    n_bytes = n_tokens = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal n_tokens
        for enc in backend.encode_batch(batch, add_special_tokens=False):
            n_tokens += len(enc.ids)
        batch.clear()

    for index, text in enumerate(texts, start=1):
        n_bytes += _utf8_size(text, index)
        batch.append(text)
        if len(batch) >= batch_size:
            flush()
    if batch:
        flush()
    if n_tokens == 0:
        raise CodeParrotError("bytes_per_token: no tokens (empty texts)")
    return n_bytes / n_tokens


def save_tokenizer(tokenizer, output_dir: str | os.PathLike, stats: dict | None = None) -> Path:
    """Save atomically into `output_dir` (tokenizer files + `tokenizer_stats.json`); returns the folder."""

    output_dir = Path(output_dir)
    with atomic_dir(output_dir) as tmp:
        tokenizer.save_pretrained(str(tmp))
        if stats is not None:
            atomic_write_json(tmp / STATS_FILE, stats)
    return output_dir


def load_tokenizer(path: str, revision: str | None = None):
    """Load a tokenizer from a folder, a local checkpoint repository or a Hub id (at `revision`).

    A missing folder, or one without `tokenizer.json`/`tokenizer_config.json`, is a `CodeParrotError`
    naming the path; so is a tokenizer without the `<|endoftext|>` token the project relies on.
    """

    folder = resolve_model_dir(str(path), revision)
    if not folder.is_dir():
        raise CodeParrotError(f"tokenizer folder not found: {folder}")
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        raise CodeParrotError(f"{folder} is not a tokenizer folder (no tokenizer.json or tokenizer_config.json)")

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except Exception as err:  # broken JSON, unknown class, missing vocab: one line naming the folder
        raise CodeParrotError(f"cannot load the tokenizer in {folder}: {first_line(err)}") from None
    if tokenizer.eos_token_id is None or tokenizer.convert_tokens_to_ids(EOS_TOKEN) != tokenizer.eos_token_id:
        raise CodeParrotError(f"tokenizer in {folder} does not use {EOS_TOKEN} as its EOS token")
    return tokenizer


@dataclass
class TokenizerTrainingConfig:
    """What `train_tokenizer_on_dataset` trains on and where it saves; scripts/train_tokenizer.py's flags."""

    dataset: list[str] = doc(REQUIRED, "training data: gzip/plain JSONL shards as written by preprocess.py - a "
                             "folder (e.g. clean/train, or clean with train/ and valid/ inside), a glob, or files",
                             metavar="PATH_OR_GLOB")
    output_dir: str = doc(REQUIRED, "folder for the tokenizer (written atomically; an existing tokenizer there is "
                                    "replaced)")
    vocab_size: int = doc(32768, "vocabulary size including the 256 byte symbols, <|endoftext|> and the 4 FIM "
                                 "tokens (default: 32768, CodeParrot's)")
    n_examples: int = doc(32768, "number of files to train on, taken in order from the start of the dataset "
                                 "(default: 32768, CodeParrot's)")
    text_column: str = doc("content", "JSON field holding the file's text")
    valid_dataset: list[str] | None = doc(None, "files to measure bytes/token on (a preprocess root stands for its "
                                                "valid/; default: the valid/ split next to the training shards, or "
                                                "without one the files that follow the training examples in the "
                                                "stream)", metavar="PATH_OR_GLOB")
    valid_examples: int = doc(2000, "at most this many validation files are measured")
    repo: str | None = doc(None, "optionally commit the tokenizer to this checkpoint repository's main branch (a "
                                 "local path or a Hub id user/name)")
    progress: bool = doc(True, "no progress bar or progress lines", flag="--quiet", inverted=True)

    def validate(self) -> None:
        if self.vocab_size < MIN_VOCAB:  # the same bound as train_tokenizer's, checked before any file is read
            raise CodeParrotError(f"--vocab-size must be at least {MIN_VOCAB} (256 bytes + {EOS_TOKEN} + "
                                  f"{len(FIM_TOKENS)} FIM tokens), got {self.vocab_size}")
        if self.n_examples < 1 or self.valid_examples < 1:
            raise CodeParrotError("--n-examples and --valid-examples must be positive")


def _valid_files(cfg: TokenizerTrainingConfig) -> list[Path] | None:
    if cfg.valid_dataset:
        return resolve_data_files(cfg.valid_dataset, split="valid")
    if len(cfg.dataset) == 1:
        try:  # a preprocess root's valid/ split; a small corpus may have none (then held-out files are used)
            return split_files_for(cfg.dataset[0], "valid")
        except CodeParrotError:
            return None
    return None


def _check_no_initial_model(repo: CheckpointRepository, ref: str, out: Path) -> str | None:
    """Refuse to commit a tokenizer to a repository whose main holds the initial model: a commit replaces the
    branch's whole tree, so main would keep the tokenizer alone (the weights gone, a new initialization refused).
    Returns main's head (None: no main yet), the parent a Hub commit of the tokenizer must have."""
    head, initialized = main_state(repo)
    if initialized:
        raise CodeParrotError(f"{ref} already has an initial model on main: committing the tokenizer there would "
                              f"replace the model (to pair a new tokenizer with a new model: initialize_model.py "
                              f"--force --tokenizer {out} --repo {ref})")
    return head


def _commit_tokenizer(repo: CheckpointRepository, ref: str, out: Path, message: str) -> str:
    """Commit the tokenizer folder `out` to main, never over an initial model: checked under a local repository's
    writer lock, and on the Hub (no lock) committed only on top of the head just checked, so a model initialized
    meanwhile makes the commit fail, and the check again then says so."""
    if isinstance(repo, LocalGitRepository):
        with repo.locked():
            _check_no_initial_model(repo, ref, out)
            return repo.commit_folder(out, "main", message)
    parent = _check_no_initial_model(repo, ref, out)
    try:
        return repo.commit_folder(out, "main", message, parent=parent)
    except CodeParrotError:
        _check_no_initial_model(repo, ref, out)  # an initial model got in: that refusal, not the Hub's error
        raise


def _no_texts_reason(bad: BadRecords) -> str:
    """Why files gave no text: the bad-record counts with the first file:line of each, as preprocess says it."""
    return "; ".join(bad.summary_lines()) or "the files hold no lines"


def train_tokenizer_on_dataset(cfg: TokenizerTrainingConfig) -> dict:
    """Train on the first `n_examples` files of `dataset`, measure bytes/token on held-out files, save into
    `output_dir` (with `tokenizer_stats.json`, whose contents are returned), commit to `repo` when given.
    Bad records are counted and skipped; progress goes to stderr, the summary to stdout."""
    cfg.validate()
    out = Path(cfg.output_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "tokenizer.json").is_file())):
        raise CodeParrotError(f"{out} exists and is not a tokenizer folder; refusing to replace it")
    train_files = resolve_data_files(cfg.dataset, split="train")  # a preprocess root stands for its train/
    local = None if not cfg.repo or is_hub_ref(cfg.repo) else Path(strip_scheme(cfg.repo)).expanduser()
    if cfg.repo and (local is None or (local.exists() and not (local.is_dir() and not any(local.iterdir())))):
        # checked before the minutes of training (a Hub repository is created now: a missing write permission
        # shows here, not after training); a new local one (missing, an empty folder) is made at the commit
        _check_no_initial_model(open_repository(cfg.repo, create=local is None), cfg.repo, out)
    valid_files = _valid_files(cfg)
    ensure_writable_dir(out.parent)  # where save_tokenizer writes: checked before the minutes of training
    skipped = BadRecords()  # bad records are counted and skipped, not fatal, in a long run
    stream = iter_texts(train_files, cfg.text_column, skipped)
    first = next(stream, None)
    if first is None:
        raise CodeParrotError(f"no texts to train the tokenizer on in {len(train_files)} file(s) of "
                              f"{' '.join(cfg.dataset)}: {_no_texts_reason(skipped)}")
    print(f"training a {cfg.vocab_size}-token byte-level BPE on up to {cfg.n_examples} files from "
          f"{len(train_files)} shard(s)", file=sys.stderr)
    tokenizer = train_tokenizer(itertools.chain([first], stream), vocab_size=cfg.vocab_size, length=cfg.n_examples,
                                show_progress=cfg.progress)
    stats = dict(tokenizer.train_stats, requested_vocab_size=cfg.vocab_size)
    if stats["train_examples"] < cfg.n_examples:
        print(f"note: the dataset has only {stats['train_examples']} usable files (asked for {cfg.n_examples})",
              file=sys.stderr)
    if stats["vocab_size"] < cfg.vocab_size:  # BPE ran out of pairs to merge; the model will get this vocabulary
        print(f"note: the training files hold only enough merges for {stats['vocab_size']} tokens (asked for "
              f"{cfg.vocab_size}); train on more files (--n-examples) for the full vocabulary", file=sys.stderr)
    valid_skipped = BadRecords()  # apart, to say why a validation set held nothing; added to `skipped` after
    if valid_files:
        valid_texts = list(itertools.islice(iter_texts(valid_files, cfg.text_column, valid_skipped),
                                            cfg.valid_examples))
        valid_source = f"valid split ({len(valid_files)} shard(s))"
    else:  # the files after the training examples: unseen by the trainer
        valid_texts = list(itertools.islice(stream, cfg.valid_examples))
        valid_source = "held-out files after the training examples"
    # Training is the expensive part: without held-out text the tokenizer is still saved, bytes/token marked
    # as not measured, rather than thrown away.
    bpt = bytes_per_token(tokenizer, valid_texts) if valid_texts else None
    if bpt is None and valid_files:
        given = "--valid-dataset" if cfg.valid_dataset else "the valid/ split"
        print(f"warning: {given} ({len(valid_files)} file(s)) held no texts to measure bytes/token on "
              f"({_no_texts_reason(valid_skipped)}); saving the tokenizer without it", file=sys.stderr)
    elif bpt is None:
        print("warning: no validation files to measure bytes/token on (no valid/ split and no files beyond "
              "--n-examples); saving the tokenizer without it (pass --valid-dataset to measure)", file=sys.stderr)
    skipped.merge(valid_skipped)  # one count of skipped records, training and validation
    stats.update(valid_examples=len(valid_texts), valid_source=valid_source,
                 valid_bytes_per_token=None if bpt is None else round(bpt, 4), skipped_records=dict(skipped.counts),
                 text_column=cfg.text_column)
    if skipped.total:
        print("skipped records: " + "; ".join(skipped.summary_lines()), file=sys.stderr)
    save_tokenizer(tokenizer, out, stats)
    print(f"trained on {stats['train_examples']} files ({stats['train_bytes'] / 1e6:.1f} MB) in "
          f"{stats['train_seconds']:.1f} s ({stats['train_mb_per_s']:.2f} MB/s); vocab {len(tokenizer)}")
    if bpt is not None:
        print(f"bytes/token on {len(valid_texts)} {valid_source}: {bpt:.3f}")
    print(f"saved to {out}")
    if cfg.repo:
        repo = open_repository(cfg.repo, create=True)
        measured = "" if bpt is None else f", {bpt:.2f} bytes/token"
        # checked again: a model may have been initialized meanwhile
        commit = _commit_tokenizer(repo, cfg.repo, out, f"tokenizer (vocab {len(tokenizer)}{measured})")
        print(f"committed to {cfg.repo} main: {commit[:12]}")
    return stats
