"""Each script that writes a file checks, before its work, that the file can be written: a regular file where its
folder should be (root cannot write there either) is a one-line error naming the flag, raised before the model,
the repository or the input is even looked at (they do not exist here: an error about them would mean the output
was checked only after)."""

from __future__ import annotations

import pytest

from codeparrot.errors import CodeParrotError


@pytest.fixture
def afile(tmp_path):
    path = tmp_path / "afile"
    path.write_text("")
    return path


def _refused(flag: str, path) -> str:
    return rf"^cannot write {flag} {path}: {path.parent} is a file, not a directory"


CASES = {
    "generate": lambda t, out: ["--model", str(t / "no-model"), "--prompt", "x", "--output", str(out)],
    "human_eval": lambda t, out: ["--model", str(t / "no-model"), "--output", str(out)],
    "highlight": lambda t, out: ["--model", str(t / "no-model"), str(t / "no-file.py"), "--output", str(out)],
    "checkpoints": lambda t, out: ["plot", str(t / "no-repo"), "--branch", "b", "--output", str(out)],
    "plot": lambda t, out: ["filters", str(t / "no-stats.json"), "--output", str(out)],
    "bench": lambda t, out: ["--areas", "sandbox", "--quick", "--output", str(out)],
}


@pytest.mark.parametrize("script", sorted(CASES))
def test_an_output_that_cannot_be_written_is_refused_first(script, afile, tmp_path, load_script):
    out = afile / "out.json"
    with pytest.raises(CodeParrotError, match=_refused("--output", out)):
        load_script(script).main(CASES[script](tmp_path, out))


def test_human_eval_checks_the_samples_file_and_runs_nothing(afile, tmp_path, load_script):
    """--canonical executes the problems' solutions: a results file that cannot be written is refused before the
    sandbox runs (no executions log), and so is a samples file a model run would write."""
    with pytest.raises(CodeParrotError, match=_refused("--output", afile / "h.json")):
        load_script("human_eval").main(["--canonical", "--allow-code-execution", "--output", str(afile / "h.json")])
    samples = afile / "s.jsonl"
    with pytest.raises(CodeParrotError, match=_refused("--samples-file", samples)):
        load_script("human_eval").main(["--model", str(tmp_path / "no-model"), "--output", str(tmp_path / "h.json"),
                                        "--samples-file", str(samples)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_plot_training_checks_its_output_folder(afile, tmp_path, load_script):
    with pytest.raises(CodeParrotError, match=rf"^output directory {afile} is a file, not a directory$"):
        load_script("plot").main(["training", str(tmp_path / "no-metrics.jsonl"), "--output-dir", str(afile)])
