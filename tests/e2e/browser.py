"""A headless Chromium driven over W3C WebDriver (Debian's `chromium` and
`chromium-driver`, installed by scripts/setup-browser.sh; nothing is
downloaded at run time). Plain HTTP to chromedriver: no client library."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from arbiter.sandbox import process
from arbiter.sandbox.components import repo_root


def driver_path() -> str:
    """chromedriver's path, installing the browser first if it is missing."""
    found = shutil.which("chromedriver")
    if found and shutil.which("chromium"):
        return found
    result = subprocess.run([str(repo_root() / "scripts" / "setup-browser.sh")],
                            capture_output=True, text=True, timeout=900, check=True)
    return result.stdout.strip().splitlines()[-1]


class Browser:
    """One chromedriver process and one headless browser session."""

    def __init__(self) -> None:
        self.port = process.free_port()
        self.driver = subprocess.Popen(
            [driver_path(), f"--port={self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                self.quit()
                raise RuntimeError("chromedriver did not start")
            time.sleep(0.1)
        options = {"binary": shutil.which("chromium") or "/usr/bin/chromium",
                   "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                            "--disable-dev-shm-usage", "--window-size=1400,900"]}
        session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "acceptInsecureCerts": True,
            "goog:chromeOptions": options}}})
        self.session = f"/session/{session['sessionId']}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"WebDriver {method} {path}: {error.read()[:500]!r}") from error

    def open(self, url: str) -> None:
        self._call("POST", f"{self.session}/url", {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        """The value of `script` (a function body) run in the page."""
        return self._call("POST", f"{self.session}/execute/sync",
                          {"script": script, "args": list(args)})

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self._call("GET", f"{self.session}/screenshot")))

    def resize(self, width: int, height: int) -> None:
        """The window's size (a screenshot's)."""
        self._call("POST", f"{self.session}/window/rect", {"width": width, "height": height})

    def quit(self) -> None:
        if hasattr(self, "session"):
            with contextlib.suppress(OSError, RuntimeError):
                self._call("DELETE", self.session)
        self.driver.terminate()
        try:
            self.driver.wait(10)
        except subprocess.TimeoutExpired:
            self.driver.kill()
            self.driver.wait()
