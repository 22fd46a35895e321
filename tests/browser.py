"""Render a saved HTML report in headless Chromium and report what a reviewer would notice.

Driven over the DevTools protocol with a small client on aiohttp's websockets (aiohttp is
already a dependency), so the tests need only Debian's `chromium` binary
(`scripts/install_chromium.sh`), never a test tool's own browser download.

`render` records: console errors (console.error, uncaught exceptions and the browser's own
error log lines such as "Failed to load resource" or CSP refusals), every request to a
scheme other than file: or data:, and every failed load. The browser runs in its own
process group and is always killed with that group.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

__all__ = ["RenderResult", "chromium_path", "drawn", "render"]

VIEWPORT = (1280, 900)
_LOCAL_SCHEMES = ("file:", "data:")
_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")
# The env doc's flags: without the background-networking ones Chromium keeps dialling
# Google's hosts, which this closed network refuses.
_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-debugging-port=0",
    f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
)


@dataclass(frozen=True)
class RenderResult:
    console_errors: list[str]
    failed_or_external_requests: list[str]
    text: str
    screenshot: Path
    page_width: int  # the document's scroll width: above VIEWPORT[0], the page scrolls sideways
    checks: dict[str, Any] = field(default_factory=dict)  # each `checks` expression's value


def drawn(selector: str) -> str:
    """A `checks` expression: how many elements match `selector` and are drawn on the
    page (an interval's bar is a vertical line: a height, no width)."""
    return f"""[...document.querySelectorAll('{selector}')].filter(e => {{
        const box = e.getBoundingClientRect(); return box.width > 0 || box.height > 0;
    }}).length"""


def chromium_path() -> str:
    """The Chromium binary; skip the test without it, except under CI, which must have it."""
    found = (
        os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if found:
        return found
    message = "chromium is not installed (run scripts/install_chromium.sh)"
    if os.environ.get("CI"):
        pytest.fail(message + "; CI must install it")
    pytest.skip(message)


def render(
    html_path: Path,
    screenshot: Path,
    *,
    timeout: float = 30.0,
    checks: Mapping[str, str] | None = None,
) -> RenderResult:
    """Open `html_path` in a fresh headless Chromium; take a full-page PNG at `screenshot`.

    `checks` maps names to JavaScript expressions evaluated on the loaded page (what a
    reader would find in it: elements, their sizes); their values come back by name."""
    binary = chromium_path()
    with tempfile.TemporaryDirectory(prefix="autotune-chromium-") as profile:
        stderr_path = Path(profile) / "stderr.log"
        with stderr_path.open("wb") as stderr:
            proc = subprocess.Popen(
                [binary, *_FLAGS, f"--user-data-dir={profile}/data", "about:blank"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,  # its own process group, killed as one below
            )
        try:
            ws_url = _wait_for_devtools(proc, stderr_path, deadline=time.monotonic() + 20)
            return asyncio.run(
                asyncio.wait_for(
                    _render(ws_url, html_path.resolve(), screenshot, checks or {}), timeout
                )
            )
        except (TimeoutError, RuntimeError) as exc:
            log = stderr_path.read_text(errors="replace")[-2000:]
            message = f"rendering {html_path} failed: {exc!r}\nchromium stderr:\n{log}"
            raise RuntimeError(message) from exc
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Let the browser exit after Browser.close (it reaps its own children), then kill the group.

    The exit is awaited without reaping (WNOWAIT), so the group id stays ours until the
    group is killed and cannot have been handed to an unrelated process.
    """
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        status = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if status is not None:
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _wait_for_devtools(proc: subprocess.Popen[bytes], stderr_path: Path, deadline: float) -> str:
    """The browser's websocket URL, from the line Chromium prints on stderr when ready."""
    while time.monotonic() < deadline:
        match = _LISTENING.search(stderr_path.read_text(errors="replace"))
        if match:
            return match.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with code {proc.returncode} before listening")
        time.sleep(0.05)
    raise RuntimeError("chromium did not print its DevTools address within 20 s")


class _Recorder:
    """Collects the page's console errors and network activity from DevTools events."""

    def __init__(self) -> None:
        self.console_errors: list[str] = []
        self.bad_requests: list[str] = []
        self.urls: dict[str, str] = {}
        self.in_flight: set[str] = set()
        self.last_activity = time.monotonic()
        self.loaded = asyncio.Event()

    def on_event(self, method: str, params: dict[str, Any]) -> None:
        self.last_activity = time.monotonic()
        if method == "Network.requestWillBeSent":
            rid, url = params["requestId"], params["request"]["url"]
            self.urls[rid] = url
            self.in_flight.add(rid)
            if not url.startswith(_LOCAL_SCHEMES):
                self.bad_requests.append(f"external: {url}")
        elif method == "Network.loadingFinished":
            self.in_flight.discard(params["requestId"])
        elif method == "Network.loadingFailed":
            rid = params["requestId"]
            self.in_flight.discard(rid)
            reason = params.get("blockedReason") or params.get("errorText", "")
            self.bad_requests.append(f"failed: {self.urls.get(rid, '?')} ({reason})")
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            args = params.get("args", [])
            self.console_errors.append(" ".join(_remote_text(a) for a in args))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            exception = details.get("exception") or {}
            self.console_errors.append(exception.get("description") or details.get("text", ""))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            where = f" ({entry['url']})" if entry.get("url") else ""
            self.console_errors.append(f"{entry['text']}{where}")
        elif method == "Page.loadEventFired":
            self.loaded.set()


def _remote_text(obj: dict[str, Any]) -> str:
    if "value" in obj:
        return str(obj["value"])
    return str(obj.get("description", obj.get("type", "")))


class _Cdp:
    """Commands and events over one websocket, with flattened target sessions."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, recorder: _Recorder) -> None:
        self._ws = ws
        self._recorder = recorder
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}

    async def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        await self._ws.send_str(json.dumps(message))
        return await future

    async def read_loop(self) -> None:
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is None or future.done():
                    continue
                if "error" in data:
                    future.set_exception(RuntimeError(f"DevTools error: {data['error']}"))
                else:
                    future.set_result(data.get("result", {}))
            elif "method" in data:
                self._recorder.on_event(data["method"], data.get("params", {}))
        for future in self._pending.values():
            if not future.done():
                future.set_exception(RuntimeError("the DevTools connection closed"))


async def _render(
    ws_url: str, html_path: Path, screenshot: Path, checks: Mapping[str, str]
) -> RenderResult:
    recorder = _Recorder()
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(ws_url, max_msg_size=0) as ws,
    ):
        cdp = _Cdp(ws, recorder)
        reader = asyncio.create_task(cdp.read_loop())
        try:
            target = await cdp.send("Target.createTarget", {"url": "about:blank"})
            attached = await cdp.send(
                "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
            )
            session = attached["sessionId"]
            for domain in ("Page", "Network", "Runtime", "Log"):
                await cdp.send(f"{domain}.enable", session=session)
            width, height = VIEWPORT
            await cdp.send(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                session=session,
            )
            nav = await cdp.send("Page.navigate", {"url": html_path.as_uri()}, session=session)
            if nav.get("errorText"):
                raise RuntimeError(f"navigation failed: {nav['errorText']}")
            await recorder.loaded.wait()
            await _settle(recorder)
            text = await cdp.send(
                "Runtime.evaluate",
                {"expression": "document.body ? document.body.innerText : ''"},
                session=session,
            )
            scroll_width = await cdp.send(
                "Runtime.evaluate",
                {"expression": "document.documentElement.scrollWidth"},
                session=session,
            )
            values = {}
            for name, expression in checks.items():
                found = await cdp.send(
                    "Runtime.evaluate",
                    {"expression": expression, "returnByValue": True},
                    session=session,
                )
                if "exceptionDetails" in found:
                    raise RuntimeError(f"check {name!r} failed: {found['exceptionDetails']}")
                values[name] = found["result"].get("value")
            png = await _full_page_png(cdp, session)
            with contextlib.suppress(RuntimeError, TimeoutError):
                await asyncio.wait_for(cdp.send("Browser.close"), 2)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    screenshot.write_bytes(png)
    return RenderResult(
        console_errors=list(recorder.console_errors),
        failed_or_external_requests=list(recorder.bad_requests),
        text=str(text["result"].get("value", "")),
        screenshot=screenshot,
        page_width=int(scroll_width["result"].get("value", 0)),
        checks=values,
    )


async def _settle(recorder: _Recorder, quiet: float = 0.3, limit: float = 5.0) -> None:
    """After `load`, wait until no request is in flight and events have stopped for `quiet` s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        idle = time.monotonic() - recorder.last_activity
        if not recorder.in_flight and idle >= quiet:
            return
        await asyncio.sleep(0.05)


async def _full_page_png(cdp: _Cdp, session: str) -> bytes:
    """The whole document, not just the viewport: a reviewer reads the full report."""
    metrics = await cdp.send("Page.getLayoutMetrics", session=session)
    size = metrics["cssContentSize"]
    height = min(max(int(size["height"]), 1), 16_000)
    shot = await cdp.send(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": VIEWPORT[0], "height": height, "scale": 1},
        },
        session=session,
    )
    return base64.b64decode(shot["data"])
