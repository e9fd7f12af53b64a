"""What a request may read and who may connect: validation folders only under --data-dir (symlinks resolved,
nothing said about paths outside), bounded batches per checkpoint, a login or loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from codeparrot.app.access import (
    MAX_EVAL_STEPS,
    bounded_steps,
    check_exposure,
    confined_folder,
    is_loopback,
    parse_credentials,
)
from codeparrot.errors import CodeParrotError

REFUSED = "is not a folder inside the app's data folder"


@pytest.fixture
def tree(tmp_path):
    """data/ (the app's --data-dir) with valid/ and a symlink out; secrets/ beside it with credentials."""
    data, secrets = tmp_path / "data", tmp_path / "secrets"
    (data / "valid").mkdir(parents=True)
    (data / "valid" / "a.jsonl").write_text(json.dumps({"content": "x = 1\n"}) + "\n")
    secrets.mkdir()
    (secrets / "keys.jsonl").write_text(json.dumps({"aws_secret_access_key": "AKIA...", "user": "root"}) + "\n")
    os.symlink(secrets, data / "escape")
    (data / "mixed").mkdir()
    os.symlink(secrets / "keys.jsonl", data / "mixed" / "b.jsonl")
    return data, secrets


def test_only_folders_under_the_data_dir(tree):
    data, secrets = tree
    assert confined_folder(data, "valid") == (data / "valid").resolve()
    assert confined_folder(data, str(data / "valid")) == (data / "valid").resolve()
    messages = []
    for outside in (str(secrets), "../secrets", "escape", "mixed", "/no/such/folder", "valid/../../secrets", "."*3):
        with pytest.raises(CodeParrotError, match=REFUSED) as err:
            confined_folder(data, outside)
        messages.append(str(err.value).replace(repr(outside), "PATH"))
        assert "aws_secret" not in str(err.value) and "keys.jsonl" not in str(err.value)
    assert len(set(messages)) == 1  # an existing and a missing path outside are refused alike
    with pytest.raises(CodeParrotError, match="needs the app started with --data-dir"):
        confined_folder(None, "valid")


@pytest.mark.parametrize("steps", [-1, 0, 2.5, MAX_EVAL_STEPS + 1, float("inf"), float("nan"), None, "x"])
def test_steps_are_bounded(steps):
    with pytest.raises(CodeParrotError, match=f"from 1 to {MAX_EVAL_STEPS}"):
        bounded_steps(steps)
    assert bounded_steps(4.0) == 4 and bounded_steps(MAX_EVAL_STEPS) == MAX_EVAL_STEPS


def test_logins_and_exposure(tmp_path):
    assert all(map(is_loopback, ["127.0.0.1", "127.8.0.1", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.2", "example.org"]))
    logins = tmp_path / "logins"
    logins.write_text("# who may log in\nada:s3cret:with:colons\n\nbob:pw\n")
    assert parse_credentials("eve:pw", str(logins)) == [("eve", "pw"), ("ada", "s3cret:with:colons"), ("bob", "pw")]
    assert parse_credentials(None, None) is None
    with pytest.raises(CodeParrotError, match="expected USER:PASS") as err:
        parse_credentials("hunter2", None)
    assert "hunter2" not in str(err.value)  # a password is never echoed
    check_exposure("127.0.0.1", None, False)
    check_exposure("0.0.0.0", [("ada", "pw")], False)
    check_exposure("0.0.0.0", None, True)
    with pytest.raises(CodeParrotError, match="give --auth USER:PASS or --auth-file FILE"):
        check_exposure("0.0.0.0", None, False)


def test_the_script_refuses_a_public_bind_without_a_login(repo_root, scripts_env, tmp_path):
    done = subprocess.run([sys.executable, "scripts/app.py", "--model", str(tmp_path), "--host", "0.0.0.0"],
                          cwd=repo_root, env=scripts_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --host 0.0.0.0 exposes the app"), done.stderr


@pytest.mark.slow
def test_with_a_login_no_api_call_runs_without_it(app_repo):
    """/promote rewrites `main`: with --auth, a plain API call (no session cookie) is refused before any handler
    runs, and the repository does not move; the same call with the login goes through."""
    import socket
    import urllib.error
    import urllib.request

    from gradio_client import Client

    from codeparrot.app.server import start
    from codeparrot.app.workspace import Workspace
    from codeparrot.repository.refs import open_repository

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = open_repository(app_repo["ref"])
    before = repo.resolve_revision("main")
    demo, url = start(Workspace(app_repo["ref"], revision="exp"), "127.0.0.1", port, auth=[("ada", "s3cret")])
    try:
        body = json.dumps({"data": ["exp", "latest", True]}).encode()
        for path, data in (("config", None), ("gradio_api/info", None), ("gradio_api/call/promote", body)):
            request = urllib.request.Request(url.rstrip("/") + "/" + path, data=data,
                                             headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=30)
            assert refused.value.code in (401, 403), path
        with pytest.raises(Exception):  # noqa: B017 - gradio_client's own error type for a refused login
            Client(url, verbose=False, download_files=False)
        assert repo.resolve_revision("main") == before
        client = Client(url, auth=("ada", "s3cret"), verbose=False, download_files=False)
        status, _ = client.predict("exp", "latest", False, api_name="/promote")  # unconfirmed: nothing moves
        assert status.startswith("error: not promoted") and repo.resolve_revision("main") == before
    finally:
        demo.close()
