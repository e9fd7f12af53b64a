"""The Experiments tab's loss curves without a server: computed on demand with a tiny model (the path a user takes
by choosing a validation folder), and read from the metrics pushed with the checkpoints (the repository alone)."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from codeparrot.app.experiments import losses_plot
from codeparrot.app.losses import computed_losses, logged_losses
from codeparrot.app.workspace import Workspace
from codeparrot.errors import CodeParrotError

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PNG = b"\x89PNG\r\n\x1a\n"


def test_losses_computed_on_demand_with_a_tiny_model(app_repo, write_shards, memorized_code, tmp_path):
    valid = write_shards(tmp_path / "valid", [memorized_code] * 8, 1)
    ws = Workspace(app_repo["ref"], revision="exp", data_dir=tmp_path)
    calls = []
    points, measured_on = computed_losses(ws, "exp", "valid", 2, lambda f, what: calls.append((f, what)))
    assert [(p.step, p.tokens_seen) for p in points] == [(10, 640), (20, 1280)]  # tokens from trainer_state.json
    # step 20 is the model overfit on exactly this code: far lower loss than the random step 10
    assert points[1].loss < points[0].loss - 2  # (windows cut the code mid-way: not ~0, but far lower)
    match = re.fullmatch(r"(\d+) sequences x 64 tokens \(([\d,]+) predicted tokens\)", measured_on)
    assert match and int(match[2].replace(",", "")) == int(match[1]) * 63, measured_on
    fractions = [f for f, _ in calls]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and "exp: step 10 (1/2)" in calls[0][1]

    png, status = losses_plot(ws, ["exp"], str(valid), 2, lambda f, desc="": None)
    assert open(png, "rb").read(8) == PNG
    assert status.startswith("2 point(s)") and f"measured on {measured_on}" in status


def test_losses_from_pushed_metrics_need_no_run_folder(tiny_models, tmp_path):
    from codeparrot.repository.refs import open_repository

    repo = open_repository(str(tmp_path / "repo"), create=True)
    repo.commit_folder(tiny_models["random"], "main", "initial model")
    for step, loss in ((10, 6.0), (20, 4.5)):
        folder = tmp_path / f"s{step}"
        shutil.copytree(tiny_models["random"], folder)
        (folder / "metrics.json").write_text(json.dumps({
            "step": step, "tokens_seen": step * 64, "val_loss": loss, "perplexity": 1.0, "val_tokens": 630,
            "val_sequences": 10, "val_seq_length": 64}))
        repo.commit_folder(folder, "exp", f"step {step}")
    ws = Workspace(str(tmp_path / "repo"))  # no --runs-dir
    points, measured_on = logged_losses(ws, "exp")
    assert [(p.step, p.tokens_seen, p.loss) for p in points] == [(10, 640, 6.0), (20, 1280, 4.5)]
    assert measured_on == "10 sequences x 64 tokens (630 predicted tokens)"
    png, status = losses_plot(ws, ["exp", "main"], "", 2, lambda f, desc="": None)
    assert open(png, "rb").read(8) == PNG and status.startswith("2 point(s)")
    assert "not plotted: main (no validation losses pushed" in status
    with pytest.raises(CodeParrotError, match="no validation losses pushed with the checkpoints of 'main'"):
        logged_losses(ws, "main")
