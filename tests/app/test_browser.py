"""Every tab rendered in headless Chromium (Debian's `chromium`), driven over the DevTools protocol on a pipe:
screenshots, DOM assertions, bad input shown in the page, and no request beyond loopback."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; "
                                                         "CI installs it)")
SHOTS = os.environ.get("CODEPARROT_APP_SCREENSHOTS")  # a folder: keep the screenshots there (README images)


class Browser:
    """A headless Chromium page over `--remote-debugging-pipe` (fd 3 in, fd 4 out, NUL-separated JSON)."""

    def __init__(self, profile: Path):
        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
             f"--user-data-dir={profile}", "--remote-debugging-pipe", "--window-size=1280,900", "about:blank"]
        # Chromium reads commands from fd 3 and writes replies to fd 4: bash puts the pipes there (dash cannot
        # redirect from fds above 9).
        self.proc = subprocess.Popen(["bash", "-c", f'exec "$@" 3<&{r_in} 4>&{w_out}', "bash", *args],
                                     pass_fds=(r_in, w_out), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(profile.parent / "chromium.log", "wb"))
        os.close(r_in), os.close(w_out)
        self.w, self.r = os.fdopen(w_in, "wb"), os.fdopen(r_out, "rb")
        self.next_id, self.buf, self.requests = 0, b"", []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Network"):
            self.call(f"{domain}.enable", session=True)

    def call(self, method: str, session: bool = False, **params):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self.w.write(json.dumps(msg).encode() + b"\0")
        self.w.flush()
        while True:
            reply = self._read()
            if reply.get("method") == "Network.requestWillBeSent":
                self.requests.append(reply["params"]["request"]["url"])
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def _read(self) -> dict:
        while b"\0" not in self.buf:
            chunk = os.read(self.r.fileno(), 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression, awaitPromise=True,
                           returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, timeout: float = 30.0):
        """Poll a JS expression until it is truthy; its value. An exception counts as not yet (a tab's elements
        appear some time after it is selected, later on a loaded machine); the last one is named on timeout."""
        deadline, last_error = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                value = self.js(expression)
            except RuntimeError as err:
                if "DevTools pipe" in str(err):
                    raise
                value, last_error = None, err
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for: {expression}"
                             + (f" (last error: {last_error})" if last_error else ""))

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", session=True, format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module")
def page(served, tmp_path_factory):
    browser = Browser(tmp_path_factory.mktemp("chromium-profile"))
    browser.call("Page.navigate", session=True, url=served[1])
    browser.wait("document.querySelectorAll('button[role=tab]').length >= 4")
    yield browser
    browser.close()


def _tab(page, name: str) -> None:
    page.js(f"[...document.querySelectorAll('button[role=tab]')].find(b => b.textContent.trim() == '{name}').click()")
    page.wait(f"[...document.querySelectorAll('button[role=tab]')].find(b => b.textContent.trim() == '{name}')"
              f".getAttribute('aria-selected') == 'true'")


def _shot(page, tmp_path: Path, name: str) -> None:
    folder = Path(SHOTS) if SHOTS else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    png = page.screenshot(folder / f"app-{name}.png")
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000


def _text(page, elem_id: str) -> str:
    return page.js(f"(document.getElementById('{elem_id}') || {{innerText: ''}}).innerText")


def _click(page, elem_id: str) -> None:
    """Click the element once Gradio has rendered it (a tab's children appear after the tab is selected, not
    always all at once: a click right after another element of the tab was found once met no button)."""
    page.wait(f"!!document.getElementById('{elem_id}')")
    page.js(f"document.getElementById('{elem_id}').click()")


def _set_textarea(page, elem_id: str, value: str) -> None:
    page.js(f"""(() => {{ const t = document.querySelector('#{elem_id} textarea');
        t.value = {json.dumps(value)}; t.dispatchEvent(new Event('input', {{bubbles: true}})); }})()""")


def _set_code(page, elem_id: str, value: str) -> None:
    """Replace a gr.Code editor's text through CodeMirror's own view (as typing would)."""
    page.wait(f"!!document.querySelector('#{elem_id} .cm-content')")
    page.js(f"""(() => {{ const el = document.querySelector('#{elem_id} .cm-content');
        const view = el.cmView ? el.cmView.view : el.cmTile.view;
        view.dispatch({{changes: {{from: 0, to: view.state.doc.length, insert: {json.dumps(value)}}}}}); }})()""")


def test_complete_tab(page, tmp_path):
    _tab(page, "Complete")
    assert "HumanEval" in page.js("document.body.innerText")
    _set_code(page, "complete-prompt", "def add(a, b):")
    _click(page, "complete-button")
    status = page.wait("(s => s.includes('ended by') || s.includes('error') ? s : '')"
                       "(document.getElementById('complete-status').innerText)")
    assert "ended by stop string" in status, status
    assert page.js("document.querySelector('#complete-output textarea').value") == "def add(a, b):\n    return a + b\n"
    _shot(page, tmp_path, "complete")
    _set_code(page, "complete-prompt", "   ")  # bad input: a one-line message in the page, no trace
    _click(page, "complete-button")
    status = page.wait("(s => s.startsWith('error') ? s : '')(document.getElementById('complete-status').innerText)")
    assert status.startswith("error: the prompt is empty") and "Traceback" not in page.js("document.body.innerText")


def test_infill_tab(page, tmp_path):
    _tab(page, "Infill")
    before, after = "def add(a, b):\n    ", "\n\ndef sub(a, b):\n    return a - b\n"
    _set_textarea(page, "infill-before", before)
    _set_textarea(page, "infill-after", after)
    _click(page, "infill-button")
    status = page.wait("(s => s.includes('ended by') || s.includes('error') ? s : '')"
                       "(document.getElementById('infill-status').innerText)")
    assert "ended by" in status, status
    whole = page.js("document.querySelector('#infill-output textarea').value")
    middle = page.js("document.querySelector('#infill-middle textarea').value")
    assert whole == before + middle + after  # the middle in place, the cursor's indentation kept
    _shot(page, tmp_path, "infill")


def test_highlight_tab(page, tmp_path, memorized_code):
    _tab(page, "Highlight")
    _set_code(page, "highlight-code", memorized_code.replace("a - b", "a ** b"))
    _click(page, "highlight-button")
    page.wait("(f => f && f.contentDocument && f.contentDocument.querySelectorAll('span.t').length)"
              "(document.querySelector('#highlight-page iframe'))")
    frame = ("document.querySelector('#highlight-page iframe').contentDocument")
    n_spans = page.js(f"{frame}.querySelectorAll('span.t').length")
    assert n_spans > 20 and f"{n_spans} tokens" in _text(page, "highlight-status")
    assert page.js(f"{frame}.querySelector('#code').textContent") == memorized_code.replace("a - b", "a ** b")
    assert page.js(f"[...{frame}.querySelectorAll('span.t')].every(s => /^['\"].*['\"] p=/.test(s.title))")
    assert "legend" in page.js(f"{frame}.body.innerHTML") and "line" in _text(page, "highlight-lines")
    page.js(f"{frame}.querySelector('#code').scrollIntoView()")
    _shot(page, tmp_path, "highlight")
    _set_code(page, "highlight-code", "")
    _click(page, "highlight-button")
    page.wait("document.getElementById('highlight-status').innerText.startsWith('error: the code is empty')")


def _upload_file(page, elem_id: str, path: Path) -> None:
    """Put `path` into a gr.File's <input type=file>, as choosing it in the file dialog would."""
    root = page.call("DOM.getDocument", session=True, depth=-1, pierce=True)["root"]["nodeId"]
    node = page.call("DOM.querySelector", session=True, nodeId=root, selector=f"#{elem_id} input[type=file]")["nodeId"]
    page.call("DOM.setFileInputFiles", session=True, nodeId=node, files=[str(path)])


@pytest.mark.parametrize("name, data, message", [
    ("latin.py", "x = 'café'\n".encode("latin-1"), "not UTF-8 text"),
    ("bin.py", b"\x7fELF\x00\x01", "binary file"),
    ("big.py", b"x = 1\n" * 1000, "over the upload limit"),
])
def test_bad_uploads_are_one_line_messages_in_the_page(page, tmp_path, name, data, message):
    _tab(page, "Highlight")
    _set_code(page, "highlight-code", "")
    bad = tmp_path / name
    bad.write_bytes(data)
    _upload_file(page, "highlight-upload", bad)
    page.wait(f"document.getElementById('highlight-upload').innerText.includes({json.dumps(name)})")
    _click(page, "highlight-button")
    status = page.wait(f"(s => s.includes({json.dumps(message)}) ? s : '')"
                       "(document.getElementById('highlight-status').innerText)")
    assert status.startswith("error: ") and "\n" not in status.strip(), status
    assert "Traceback" not in page.js("document.body.innerText")
    page.js("document.querySelector('#highlight-upload button[aria-label=\"Clear\"]')?.click()")

def test_experiments_tab(page, tmp_path):
    _tab(page, "Experiments")
    table = page.wait("(t => t.includes('exp') ? t : '')(document.getElementById('experiments-branches').innerText)")
    assert table.index("main") < table.index("exp")
    page.wait("document.getElementById('experiments-checkpoints').innerText.includes('initial model')")
    _click(page, "losses-button")
    page.wait("(i => i && i.complete && i.naturalWidth > 100)(document.querySelector('#losses-plot img'))")
    _click(page, "promote-button")  # not confirmed: refused, said in the page
    page.wait("document.getElementById('experiments-status').innerText.startsWith('error: not promoted')")
    page.js("document.getElementById('losses-plot').scrollIntoView()")
    _shot(page, tmp_path, "experiments")


def test_data_tab(page, tmp_path):
    _tab(page, "Data")
    page.wait("(i => i && i.complete && i.naturalWidth > 100)(document.querySelector('#data-chart img'))")
    assert "exact duplicates" in _text(page, "data-table") and "71 kept" in _text(page, "data-status")
    _shot(page, tmp_path, "data")


def test_browser_fetched_nothing_beyond_loopback(page, served):
    assert page.requests, "the page made no requests at all"
    outside = [u for u in page.requests if not u.startswith((served[1].rstrip("/"), "data:", "blob:", "about:"))]
    assert not outside, outside[:10]


def _set_field(page, elem_id: str, value) -> None:
    """Type into a gr.Textbox / gr.Number (its <textarea> or <input>) as a user would, once it is there (a tab's
    fields appear some time after the tab is selected, later on a loaded machine)."""
    page.wait(f"(() => {{ const t = document.querySelector('#{elem_id} textarea, #{elem_id} input');"
              f" if (!t) return false; t.value = {json.dumps(str(value))};"
              " t.dispatchEvent(new Event('input', {bubbles: true}));"
              " t.dispatchEvent(new Event('change', {bubbles: true})); return true; })()")


def _plot_refused(page, dataset: str, steps, expected: str, marker: str) -> str:
    """Plot with these inputs; the status line that says `expected` and `marker` (this request's own value)."""
    _tab(page, "Experiments")
    _set_field(page, "losses-dataset", dataset)
    _set_field(page, "losses-steps", steps)
    _click(page, "losses-button")
    status = page.wait(f"(s => s.includes({json.dumps(expected)}) && s.includes({json.dumps(marker)}) ? s : '')"
                       "(document.getElementById('experiments-status').innerText)")
    assert status.startswith("error: ") and "\n" not in status.strip(), status
    return status


@pytest.fixture
def secrets_beside(app_repo):
    """A folder outside the app's --data-dir holding credentials as JSONL, and a symlink to it inside."""
    secrets = app_repo["root"] / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "keys.jsonl").write_text(json.dumps({"aws_secret_access_key": "x", "db_password": "y"}) + "\n")
    link = app_repo["clean"] / "linked"
    if not link.exists():
        os.symlink(secrets, link)
    yield secrets
    link.unlink()


@pytest.mark.parametrize("kind", ["absolute", "relative", "symlink", "missing"])
def test_a_validation_folder_outside_the_data_dir_is_refused(page, secrets_beside, kind):
    dataset = {"absolute": str(secrets_beside), "relative": "../secrets", "symlink": "linked",
               "missing": str(secrets_beside / "nope")}[kind]
    _plot_refused(page, dataset, 4, "is not a folder inside the app's data folder (--data-dir)", repr(dataset))
    body = page.js("document.body.innerText")
    assert "aws_secret_access_key" not in body and "db_password" not in body and "keys.jsonl" not in body
    _set_field(page, "losses-dataset", "")


@pytest.mark.parametrize("steps", [-1, 100000])
def test_unbounded_batches_per_checkpoint_are_refused(page, app_repo, steps):
    (app_repo["clean"] / "valid").mkdir(exist_ok=True)  # inside --data-dir: only the bound refuses it
    _plot_refused(page, "valid", steps, "batches per checkpoint must be a whole number from 1 to", f"got {steps}")
    _set_field(page, "losses-dataset", "")
    _set_field(page, "losses-steps", 4)


def test_with_a_login_nothing_is_served_before_it(app_repo, tmp_path):
    from codeparrot.app.server import start
    from codeparrot.app.workspace import Workspace
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo, url = start(Workspace(app_repo["ref"]), "127.0.0.1", port, auth=[("ada", "s3cret")])
    browser = Browser(tmp_path / "profile")
    try:
        browser.call("Page.navigate", session=True, url=url)
        browser.wait("!!document.querySelector('input[type=password]')")
        assert browser.js("document.querySelectorAll('button[role=tab]').length") == 0  # the login form only
        for user, password in (("ada", "wrong"), ("ada", "s3cret")):
            browser.js(f"""(() => {{
                const set = (el, v) => {{ el.value = v; el.dispatchEvent(new Event('input', {{bubbles: true}})); }};
                set(document.querySelector('input[type=text], input:not([type=password])'), {json.dumps(user)});
                set(document.querySelector('input[type=password]'), {json.dumps(password)});
                [...document.querySelectorAll('button')].find(b => /login/i.test(b.textContent)).click(); }})()""")
            if password == "wrong":
                browser.wait("/incorrect|invalid|error/i.test(document.body.innerText)")
                assert browser.js("document.querySelectorAll('button[role=tab]').length") == 0
        browser.wait("document.querySelectorAll('button[role=tab]').length >= 4")
    finally:
        browser.close()
        demo.close()
