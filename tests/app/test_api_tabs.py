"""The other tabs' endpoints through the HTTP API: /highlight (code and uploads), /experiments, /checkpoints,
/losses, /compare, /promote (only when confirmed), /data, and their bad inputs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gradio_client import handle_file

from .conftest import SIGNATURE


def test_highlight_one_coloured_span_per_token(client, served, memorized_code):
    page, lines, status = client.predict(memorized_code, None, "exp", "latest", api_name="/highlight")
    _, tok, _ = served[0].model("exp", "latest")
    n_tokens = len(tok(memorized_code, add_special_tokens=False)["input_ids"])
    spans = re.findall(r'<span class="t b(\d+)" data-loss="([\d.]+)" title="', page)
    assert len(spans) == n_tokens  # ASCII code: one span per token
    assert f"{n_tokens} tokens" in status
    assert lines["headers"][0] == "line" and len(lines["data"]) == 4  # 4 non-blank lines, ranked
    assert "Most surprising lines" in page and "legend" in page


def test_highlight_upload(client, tmp_path, memorized_code):
    f = tmp_path / "mod.py"
    f.write_text(memorized_code)
    page, _, status = client.predict("", handle_file(str(f)), "main", "latest", api_name="/highlight")
    assert "<h1>mod.py</h1>" in page and "main@" in status


def test_experiments_checkpoints_losses(client, app_repo):
    rows, status = client.predict(api_name="/experiments")
    assert [r[0] for r in rows["data"]] == ["main", "exp"]  # main first
    assert rows["data"][1][1] == 20 and "2 branch" in status
    rows, _ = client.predict("exp", api_name="/checkpoints")
    assert [r[1] for r in rows["data"]] == [20, 10, ""]  # newest first, down to main's initial model
    png, status = client.predict(["exp"], "", 4, api_name="/losses")
    assert _png(png)[:8] == b"\x89PNG\r\n\x1a\n" and status.startswith("2 point(s)")
    png, status = client.predict(["main", "exp"], "", 4, api_name="/losses")  # main: no run logged it
    assert png and "not plotted: main (no logged metrics" in status


def test_compare_two_checkpoints(client, served):
    commits = [c.commit_id for c in served[0].repository().list_commits("exp")]
    a, b, status = client.predict(SIGNATURE, "exp", commits[0], "exp", commits[1], 0.0, 24, 0, api_name="/compare")
    assert a == SIGNATURE + "\n    return a + b\n" and b != a and b.startswith(SIGNATURE)
    assert status.count("exp@") == 2


def test_promote_needs_confirmation_and_moves_main(client, served):
    repo = served[0].repository()
    before = repo.resolve_revision("main")
    status, _ = client.predict("exp", "latest", False, api_name="/promote")
    assert status.startswith("error: not promoted") and repo.resolve_revision("main") == before
    status, rows = client.predict("exp", "latest", True, api_name="/promote")
    after = repo.resolve_revision("main")
    assert after != before and after[:12] in status and "promoted exp@" in status
    assert f"main held {before[:12]} (" in status  # what main held before
    # main now holds the memorized checkpoint's files
    assert repo.list_commits("main")[0].message.startswith("promote ")
    assert rows["data"][0][0] == "main" and rows["data"][0][1] == 20


def test_data_tab(client):
    png, rows, status = client.predict(api_name="/data")
    table = {r[0]: r[1] for r in rows["data"]}
    assert table["exact duplicates"] == 7 and table["filter: config or test"] == 11
    assert table["files in 4 near-duplicate clusters"] == 9 and "71 kept" in status
    assert _png(png)[:4] == b"\x89PNG"


def _png(image) -> bytes:
    """The bytes of an image output (a served file's path: the server runs in this process)."""
    return Path(image["path"] if isinstance(image, dict) else image).read_bytes()


def _upload(tmp_path, name, data: bytes):
    f = tmp_path / name
    f.write_bytes(data)
    return handle_file(str(f))


@pytest.mark.parametrize("name, data, message", [
    ("bin.py", b"\x7fELF\x00\x01", "binary file"),
    ("latin.py", "x = 'café'\n".encode("latin-1"), "not UTF-8 text (invalid byte at offset 8, line 1)"),
    ("big.py", b"x = 1\n" * 1000, "over the upload limit of 4,000 bytes"),
    ("empty.py", b"\n\n", "is empty"),
])
def test_highlight_bad_upload(client, tmp_path, name, data, message):
    page, _, status = client.predict("", _upload(tmp_path, name, data), "exp", "latest", api_name="/highlight")
    assert page == "" and status.startswith("error: ") and message in status and "\n" not in status


def test_highlight_empty_code_and_bad_revision(client):
    status = client.predict("  \n", None, "exp", "latest", api_name="/highlight")[2]
    assert status.startswith("error: the code is empty")
    status = client.predict("x = 1\n", None, "nope", "latest", api_name="/highlight")[2]
    assert status.startswith("error: ") and "nope" in status


def test_bad_experiment_inputs(client):
    assert "not found" in client.predict("nope", api_name="/checkpoints")[1]
    assert client.predict([], "", 4, api_name="/losses")[1] == "error: choose at least one branch to plot"
    status = client.predict(["main"], "", 4, api_name="/losses")[1]
    assert status.startswith("error: no logged metrics for branch 'main'")
    status = client.predict(["exp"], "/no/such/folder", 4, api_name="/losses")[1]
    assert status == ("error: validation folder '/no/such/folder' is not a folder inside the app's data folder "
                      "(--data-dir); give a path relative to it, e.g. valid")
    assert client.predict("exp", "deadbeef", True, api_name="/promote")[0].startswith("error: ")
