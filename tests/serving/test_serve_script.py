"""scripts/serve.py as a user runs it: it starts, answers, finishes the request in flight on SIGTERM and exits 0;
a bad model path or revision, an exposed host without a key and a busy port are one-line errors."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from ..script_cases import run_cases

pytestmark = pytest.mark.slow(25)  # two Python processes that import torch, transformers and FastAPI


def test_start_answer_sigterm_and_exit_cleanly(tiny_models, scripts_env, repo_root):
    proc = subprocess.Popen([sys.executable, "scripts/serve.py", "--model", str(tiny_models["random"]), "--device",
                             "cpu", "--port", "0", "--threads", "1", "--log-level", "warning"],
                            cwd=repo_root, env=scripts_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert " at http://127.0.0.1:" in first, first + proc.stderr.read()
        url = first.split(" at ", 1)[1].split()[0]
        body = json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 60}}).encode()
        answer = urllib.request.urlopen(urllib.request.Request(url + "/generate_stream", data=body, headers={
            "Content-Type": "application/json"}), timeout=60)
        assert answer.readline().startswith(b"data:")  # the stream is running: now SIGTERM
        proc.send_signal(signal.SIGTERM)
        rest = [json.loads(line[5:]) for line in answer.read().split(b"\n") if line.startswith(b"data:")]
        assert rest[-1]["details"]["generated_tokens"] == 60  # the request in flight was finished, not cut
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "stopped (SIGTERM): 1 request(s) answered, 0 cancelled, 0 failed" in err and "Traceback" not in err


def test_user_errors_are_one_line(tiny_models, scripts_env, repo_root, tmp_path):
    from codeparrot.repository.refs import open_repository

    repo = open_repository(str(tmp_path / "repo"), create=True)
    repo.commit_folder(tiny_models["memorized"], "main", "initial model")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    script = repo_root / "scripts" / "serve.py"
    base = ["--device", "cpu", "--log-level", "warning"]
    cases = [(script, ["--model", str(tmp_path / "missing"), *base]),
             (script, ["--model", str(tmp_path / "repo"), "--revision", "no-such-branch", *base]),
             (script, ["--model", str(tmp_path / "repo"), "--host", "0.0.0.0", *base]),
             (script, ["--model", str(tmp_path / "repo"), "--port", str(busy.getsockname()[1]), *base])]
    env = {k: v for k, v in scripts_env.items() if k != "CODEPARROT_API_KEY"}
    try:
        results = run_cases(sys.executable, env, cases)
    finally:
        busy.close()
    expected = ["not found", "no-such-branch", "--host 0.0.0.0 exposes the server", "cannot serve on 127.0.0.1"]
    for result, words in zip(results, expected):
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert words in lines[0], lines[0]

