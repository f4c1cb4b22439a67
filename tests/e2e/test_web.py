"""The web page at / in a real headless Chromium against live `sia serve` processes with small models.

Chromium is Debian's package (`scripts/install-chromium`, run by `make test`), driven by Playwright's Python
package; the tests skip, saying why, where either is missing or Chromium cannot start. With
SIA_SCREENSHOTS=<folder> the first test also writes the README's screenshots there (desktop and phone width).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import torch

from server.core.config import Settings
from server.launcher import free_port, serving
from server.runtime.keys import KeyRing
from server.store import Store
from sia.checkpoint import NATIVE_CHECKPOINT, save_checkpoint
from sia.model.native import SIAModel
from tests.conftest import sharpen, tiny_config
from tests.e2e.conftest import local_env

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = Path(os.environ.get("SIA_CHROMIUM", "/usr/bin/chromium"))
TIMEOUT_MS = 60_000  # a loaded machine decodes the tiny model slowly; nothing here waits on a fixed time

# the length of the reply being streamed, each time it changes, until its `done` event
RECORD_STREAM = """() => {
  window.__lengths = [];
  new MutationObserver(() => {
    const li = document.querySelector('#transcript li.bot:last-child');
    if (li && !li.dataset.done) window.__lengths.push(li.querySelector('.text').textContent.length);
  }).observe(document.getElementById('transcript'), {subtree: true, childList: true, characterData: true});
}"""


# press Stop the moment the first token of the next reply is on screen
STOP_AT_FIRST_TOKEN = """() => {
  const observer = new MutationObserver(() => {
    const li = document.querySelector('#transcript li.bot:last-child');
    if (li && li.dataset.tokens) { observer.disconnect(); document.getElementById('stop').click(); }
  });
  observer.observe(document.getElementById('transcript'), {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is missing: make install")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (Debian's chromium package: scripts/install-chromium, or set SIA_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        try:
            launched = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        except Exception as exc:
            pytest.skip(f"Chromium at {CHROMIUM} cannot start: {str(exc).splitlines()[0]}")
        yield launched
        launched.close()


@pytest.fixture
def paced_checkpoint(tmp_path: Path) -> Path:
    """An untrained model wide enough (8 layers of 512) that each token takes milliseconds: a reply is still being
    decoded while the browser shows its first tokens, as with the bundled model, however busy the machine."""
    torch.manual_seed(0)
    model = sharpen(SIAModel(tiny_config(n_layer=8, n_embd=512, n_head=8, block_size=256)).eval())
    return save_checkpoint(model, tmp_path / "checkpoint")


def open_page(browser: Browser, url: str, width: int = 1280, height: int = 900) -> tuple[Page, list[str]]:
    """A new tab (its own storage) on the page, and the script errors it will report."""
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    page = browser.new_context(viewport={"width": width, "height": height}).new_page()
    page.set_default_timeout(TIMEOUT_MS)
    failures: list[str] = []
    page.on("pageerror", lambda exc: failures.append(str(exc)))
    page.on("console", lambda m: failures.append(m.text) if m.type == "error" and "status of 4" not in m.text else None)
    page.goto(f"{url}/")
    return page, failures


def say(page: Page, message: str) -> None:
    """Type a message, send it with Enter, and wait for the streamed reply's `done` event."""
    done = page.locator("#transcript li.bot[data-done]").count()
    page.fill("#message", message)
    page.press("#message", "Enter")
    page.locator("#transcript li.bot[data-done]").nth(done).wait_for()


def api(url: str, method: str, path: str, key: str | None = None, **kwargs: Any) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.request(method, f"{url}{path}", headers=headers, timeout=60, **kwargs)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_streams_and_the_inspector_follows_the_identity(browser: Browser, tmp_path: Path) -> None:
    """The bundled native model (3 layers, byte-level, 1.8 MB): small and fast, and its replies read as words,
    token by token, each a few milliseconds apart, so a reply reaches the browser over several reads."""
    from playwright.sync_api import expect

    port = free_port()
    env = local_env(tmp_path, NATIVE_CHECKPOINT, port, MAX_TOKENS_CAP="64")
    with serving(env, tmp_path / "server.log", port=port) as url:
        served = httpx.get(f"{url}/", timeout=30)
        assert served.status_code == 200 and served.headers["content-type"].startswith("text/html")
        for script in re.findall(r'<script src="(/web/[a-z]+\.js)" defer>', served.text):  # the page's four scripts
            assert httpx.get(f"{url}{script}", timeout=30).status_code == 200, script
        assert len(re.findall(r"<script ", served.text)) == 4

        page, failures = open_page(browser, url)
        expect(page.locator("#access-mode")).to_have_text(re.compile("development mode"))
        expect(page.locator("#persona")).to_have_value("sia")
        page.fill("#user", "ana")
        page.click("#who button[type=submit]")
        expect(page.locator("#inspector-empty")).to_have_text(re.compile("No identity yet"))
        page.click(".sampling summary")
        page.fill("#max_tokens", "48")
        page.fill("#temperature", "1")
        page.fill("#seed", "1")
        page.fill("#repetition_penalty", "1.2")
        page.fill("#no_repeat_ngram", "3")
        page.fill("#max_sentences", "2")
        page.fill("#max_words", "12")
        page.fill("#wind_down", "8")
        page.fill("#frequency_penalty", "0.5")
        page.fill("#logit_bias", '{"101": 1.5}')
        page.select_option("#logit_bias_once", "true")
        page.select_option("#lowercase", "true")
        page.fill("#recall_temperature", "0.3")
        page.select_option("#exclaim", "false")
        page.fill("#address", ", my friend")

        with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/chat")) as sent:
            say(page, "Hello, I am Ana and I like green.")
        body = sent.value.post_data_json
        assert body["repetition_penalty"] == 1.2 and body["no_repeat_ngram"] == 3 and body["temperature"] == 1
        assert body["max_sentences"] == 2 and body["max_words"] == 12 and body["lowercase"] is True
        assert body["wind_down"] == 8
        assert body["frequency_penalty"] == 0.5 and body["logit_bias"] == {"101": 1.5} and "presence_penalty" not in body
        assert body["logit_bias_once"] is True and body["recall_temperature"] == 0.3 and body["exclaim"] is False
        assert body["address"] == ", my friend"
        page.fill("#recall_temperature", "")
        page.select_option("#exclaim", "")
        page.fill("#address", "")
        page.fill("#frequency_penalty", "")
        page.fill("#logit_bias", "")
        page.fill("#repetition_penalty", "")  # the rest of the page's requests leave them to the persona
        page.fill("#no_repeat_ngram", "")
        page.fill("#max_sentences", "")
        page.fill("#max_words", "")
        page.fill("#wind_down", "")
        page.select_option("#logit_bias_once", "")
        page.select_option("#lowercase", "")
        stored = api(url, "GET", "/admin/personas/sia/identities/ana/turns")["data"]
        assert page.locator("#transcript li.bot .text").last.text_content() == stored[-1]["reply"]
        assert stored[-1]["reply"] == stored[-1]["reply"].lower()  # the turn was asked for in lower case
        expect(page.locator("#transcript li.bot").last).to_have_attribute("data-tokens", str(stored[-1]["completion_tokens"]))
        expect(page.locator("#transcript li.bot .meta").last).to_have_text(re.compile(r"turn 0 · shock .* · version 2"))
        expect(page.locator("#turn-count")).to_have_text("1")
        expect(page.locator("#version")).to_have_text("2")
        expect(page.locator("#heatmap")).to_have_attribute("data-version", "2")
        expect(page.locator("#self-plot")).to_have_attribute("data-points", "2")
        expect(page.locator("#shock-plot")).to_have_attribute("data-bars", "1")
        expect(page.locator("#shock-plot rect")).to_have_count(1)
        detail = api(url, "GET", "/admin/personas/sia/identities/ana")
        assert page.locator("#self-norm").text_content() == f"{detail['self_norm']:.3f}"
        assert page.evaluate("[document.getElementById('heatmap').width, document.getElementById('heatmap').height]") == [
            len(detail["heads"][0]["eigenvalues"]),
            len(detail["heads"]),
        ]

        say(page, "What colour do I like?")
        expect(page.locator("#turn-count")).to_have_text("2")
        expect(page.locator("#heatmap")).to_have_attribute("data-version", "3")
        expect(page.locator("#self-plot")).to_have_attribute("data-points", "3")
        expect(page.locator("#self-plot polyline")).to_have_count(len(detail["self_state"]))
        expect(page.locator("#shock-plot rect")).to_have_count(2)
        expect(page.locator("#turns tbody tr")).to_have_count(2)
        expect(page.locator("#versions tbody tr")).to_have_count(3)

        page.get_by_role("button", name="Roll back to version 2").click()
        expect(page.locator("#status")).to_have_text(re.compile("now at version 4"))
        expect(page.locator("#version")).to_have_text("4")
        expect(page.locator("#versions tbody tr").first).to_contain_text("rollback:2")
        expect(page.locator("#heatmap")).to_have_attribute("data-version", "4")
        expect(page.locator("#self-plot")).to_have_attribute("data-points", "4")

        page.get_by_role("button", name="Diff version 3 with the current version").click()
        expect(page.locator("#diff")).to_contain_text("From version 3 to 4")

        page.click("#reset")
        expect(page.locator("#version")).to_have_text("5")
        expect(page.locator("#self-norm")).to_have_text("0.000")  # the persona's initial state: the zero state
        expect(page.locator("#turn-count")).to_have_text("2")  # the records stay
        expect(page.locator("#versions tbody tr").first).to_contain_text("reset")

        page.get_by_role("button", name="Roll back to version 3").click()  # a reset is undone like any change
        expect(page.locator("#version")).to_have_text("6")
        expect(page.locator("#self-norm")).to_have_text(
            f"{api(url, 'GET', '/admin/personas/sia/identities/ana?version=3')['self_norm']:.3f}"
        )
        expect(page.locator("#heatmap")).to_have_attribute("data-version", "6")

        page.fill("#cf-message", "What do you remember about me?")
        expect(page.locator("#cf-against")).to_have_value("reset")
        page.click("#cf-run")
        sides = page.locator("#cf-result .side")
        expect(sides).to_have_count(2)
        expect(sides.nth(0).locator("h4")).to_have_text("Current state (version 6)")
        expect(sides.nth(1).locator("h4")).to_have_text("Fresh state")
        sampled = {"max_tokens": 48, "temperature": 1, "seed": 1}
        body = {"message": "What do you remember about me?", "against": "reset", **sampled}
        expected = api(url, "POST", "/admin/personas/sia/identities/ana/counterfactual", json=body)
        assert sides.nth(0).locator(".reply").text_content() == expected["current"]["reply"]
        assert sides.nth(1).locator(".reply").text_content() == expected["other"]["reply"]
        expect(page.locator("#version")).to_have_text("6")  # a counterfactual writes nothing
        assert api(url, "GET", "/admin/personas/sia/identities/ana")["version"] == 6

        page.set_viewport_size({"width": 390, "height": 844})
        assert page.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways scrolling on a phone
        chat, inspector = (page.locator(f".{part}").bounding_box() for part in ("chat", "inspector"))
        assert chat and inspector and chat["x"] == inspector["x"] and inspector["y"] >= chat["y"] + chat["height"]  # stacked
        assert failures == []


def test_a_reply_grows_on_screen_and_stop_leaves_the_identity_as_it_was(
    browser: Browser, tmp_path: Path, paced_checkpoint: Path
) -> None:
    from playwright.sync_api import expect

    port = free_port()
    env = local_env(tmp_path, paced_checkpoint, port, MAX_TOKENS_CAP="64")
    with serving(env, tmp_path / "server.log", port=port) as url:
        page, failures = open_page(browser, url)
        expect(page.locator("#access-mode")).to_have_text(re.compile("development mode"))
        page.fill("#user", "ana")
        page.click("#who button[type=submit]")
        expect(page.locator("#inspector-empty")).to_have_text(re.compile("No identity yet"))
        page.click(".sampling summary")
        page.fill("#max_tokens", "64")
        page.fill("#temperature", "1")
        page.fill("#seed", "1")

        page.evaluate(RECORD_STREAM)
        say(page, "Hello, I am home.")  # no name given: the model's own opening, not a greeting by name
        lengths: list[int] = page.evaluate("window.__lengths")
        assert len({n for n in lengths if n > 0}) >= 3, lengths  # the reply grew on screen in steps, as tokens came
        assert lengths == sorted(lengths)
        stored = api(url, "GET", "/admin/personas/sia/identities/ana/turns")["data"]
        assert page.locator("#transcript li.bot .text").last.text_content() == stored[-1]["reply"]
        assert stored[-1]["reply"] == stored[-1]["reply"].lower()  # the turn was asked for in lower case
        expect(page.locator("#turn-count")).to_have_text("1")

        page.evaluate(STOP_AT_FIRST_TOKEN)
        page.fill("#message", "Tell me a long story about the sea.")
        page.press("#message", "Enter")
        expect(page.locator("#transcript li.bot .meta").last).to_have_text("stopped: the identity was not changed")
        assert page.locator("#transcript li.bot").last.get_attribute("data-done") is None
        detail = api(url, "GET", "/admin/personas/sia/identities/ana")
        assert (detail["version"], detail["turns"], detail["busy"]) == (2, 1, False)
        expect(page.locator("#turn-count")).to_have_text("1")
        expect(page.locator("#send")).to_be_enabled()
        expect(page.locator("#stop")).to_be_disabled()
        assert failures == []


def test_keys_are_asked_for_and_errors_read_as_sentences(browser: Browser, tmp_path: Path, checkpoint_dir: Path) -> None:
    from playwright.sync_api import expect

    port = free_port()
    env = local_env(tmp_path, checkpoint_dir, port, MAX_TOKENS_CAP="64", MAX_BODY_BYTES="4096", BUSY_TIMEOUT_S="0.5")
    with serving(env, tmp_path / "server.log", port=port) as url:
        store = Store(Settings(data_dir=tmp_path / "data"))
        try:
            ring = KeyRing(store)
            admin = ring.create("admin", name="ops")[1]
            ana = ring.create("user", user_id="ana", name="ana's page")[1]
        finally:
            store.close()
        while httpx.get(f"{url}/v1/models", timeout=30).status_code != 401:  # the server's key cache expires within 2 s
            pass
        assert httpx.get(f"{url}/", timeout=30).status_code == 200  # the page itself needs no key

        page, failures = open_page(browser, url)
        dialog = page.locator("#key-dialog")
        expect(dialog).to_be_visible()
        expect(page.locator("#status")).to_have_text("This service needs an API key.")
        page.fill("#key", "sia_not-a-key")
        page.click("#key-submit")
        expect(page.locator("#key-error")).to_have_text("That API key is not valid: it is unknown or was revoked.")
        expect(dialog).to_be_visible()

        page.fill("#key", ana)
        page.click("#key-submit")
        expect(dialog).to_be_hidden()
        expect(page.locator("#access-mode")).to_have_text(re.compile("user key"))
        expect(page.locator("#user")).to_have_value("")  # the key says who
        say(page, "Hi, it's Ana.")
        expect(page.locator("#turn-count")).to_have_text("1")
        expect(page.locator("#user")).to_have_value("ana")  # learnt from the identity the key reads
        expect(page.locator("#self-plot")).to_have_attribute("data-points", "2")
        expect(page.locator("#admin-tools")).to_be_hidden()
        expect(page.locator("#user-note")).to_be_visible()
        assert page.evaluate("sessionStorage.getItem('sia.key')") == ana
        assert page.evaluate("[localStorage.length, document.cookie]") == [0, ""]  # kept in this tab only

        page.fill("#user", "bob")
        page.click("#who button[type=submit]")
        expect(page.locator("#status")).to_have_text(re.compile("This key belongs to another user"))

        page.fill("#user", "ana")
        page.click("#who button[type=submit]")
        expect(page.locator("#summary")).to_be_visible()
        expect(page.locator("#turn-count")).to_have_text("1")
        page.fill("#message", "x" * 5000)
        page.press("#message", "Enter")
        expect(page.locator("#status")).to_have_text("The request is larger than the service accepts; send a shorter message.")
        expect(page.locator("#transcript li.bot.failed .meta")).to_have_text(re.compile("larger than the service accepts"))
        assert "{" not in page.locator("#status").text_content()  # a sentence, never the raw error body

        store = Store(Settings(data_dir=tmp_path / "data"))
        lease = store.acquire("sia", "ana")  # another process holds the identity, as a long turn would
        try:
            page.fill("#message", "Are you there?")
            page.press("#message", "Enter")
            expect(page.locator("#status")).to_have_text("The identity is busy with another turn; try again in 1 s.")
        finally:
            store.release(lease)
            store.close()
        say(page, "Now?")
        expect(page.locator("#turn-count")).to_have_text("2")

        other, other_failures = open_page(browser, url)  # a new tab knows no key
        expect(other.locator("#key-dialog")).to_be_visible()
        other.fill("#key", admin)
        other.click("#key-submit")
        expect(other.locator("#access-mode")).to_have_text("admin key")
        other.fill("#user", "ana")
        other.click("#who button[type=submit]")
        expect(other.locator("#turn-count")).to_have_text("2")
        expect(other.locator("#admin-tools")).to_be_visible()
        expect(other.locator("#transcript li.user")).to_have_text(["Hi, it's Ana.", "Now?"])
        assert failures == [] and other_failures == []
