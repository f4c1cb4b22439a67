"""The README's pictures and its example conversation, taken with the bundled model.

Starts ``sia serve`` (the bundled SmolLM2 checkpoint, a fresh SQLite database in a temporary directory), talks to
persona ``sia`` as user ``ana`` through the web page in headless Chromium (Debian's package:
``scripts/install-chromium``), greedy, then saves the page at desktop width and the inspector at a phone's width,
and the conversation as JSON, with the last two questions asked again by a user the persona never met.
Run: ``.venv/bin/python scripts/web-pictures.py [--out docs/images]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

CHROMIUM = Path(os.environ.get("SIA_CHROMIUM", "/usr/bin/chromium"))
MESSAGES = [
    "Hi! I'm Ana. My favourite colour is green, I have a cat and I love painting.",
    "What is the capital of France?",
    "Can you give me a tip for sleeping better?",
    "What is my favourite colour?",
    "And which pet do I have?",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sia serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"sia serve was not ready after {timeout_s} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stranger: list[dict[str, str]] = []
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as data:
        cache = Path("sia-data") / "models"  # the dequantised weights of an earlier start, where there are any
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIA_")}
        env.update(SIA_DATA_DIR=data, SIA_PORT=str(port), SIA_LOG_JSON="false")
        if cache.is_dir():
            (Path(data) / "models").symlink_to(cache.resolve())
        sia = Path(sys.executable).parent / "sia"
        proc = subprocess.Popen([str(sia), "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(url, proc)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(300_000)
                page.goto(f"{url}/")
                page.fill("#user", "ana")
                page.click("#who button[type=submit]")
                page.click(".sampling summary")
                page.fill("#temperature", "0")
                conversation: list[dict[str, str]] = []
                for message in MESSAGES:
                    done = page.locator("#transcript li.bot[data-done]").count()
                    page.fill("#message", message)
                    page.press("#message", "Enter")
                    page.locator("#transcript li.bot[data-done]").nth(done).wait_for()
                    reply = page.locator("#transcript li.bot .text").last.text_content() or ""
                    conversation.append({"user": message, "sia": reply})
                page.click(".sampling summary")
                page.screenshot(path=str(args.out / "web-desktop.png"), full_page=True)
                page.set_viewport_size({"width": 390, "height": 844})
                page.evaluate("document.getElementById('inspector-title').scrollIntoView()")
                page.screenshot(path=str(args.out / "web-phone.png"))
                browser.close()
            for message in MESSAGES[-2:]:  # the same questions from a user the persona never met
                body = json.dumps({"user": "ben", "message": message, "temperature": 0}).encode()
                request = urllib.request.Request(
                    f"{url}/v1/personas/sia/chat", data=body, headers={"content-type": "application/json"}
                )
                with urllib.request.urlopen(request, timeout=300) as response:
                    stranger.append({"user": message, "sia": json.loads(response.read())["reply"]})
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    record = {"ana": conversation, "stranger": stranger}
    (args.out / "conversation.json").write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    for who, turns in record.items():
        for turn in turns:
            sys.stdout.write(f"{who}> {turn['user']}\n{turn['sia']}\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
