"""Headless Chromium for the tests that must see a page rendered, not only written.

A static page can be valid HTML and still show nothing (an SVG with a bad viewBox, a path drawn
off-canvas, a style that hides it), so the dashboard's tests load it in a real browser from
``file://`` and look at the pixels.  Chromium is an apt package, not a pip one: without it the
tests skip with the command that installs it; CI sets ``KIMI_REQUIRE_CHROMIUM=1`` so a runner
that lost it fails instead of passing on skips.

Each call starts a fresh browser with a fresh profile (``--user-data-dir`` in a temp dir): no
state between tests, nothing written to the user's profile, and the network features that
would call home are off, so a run never reaches outside the machine.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

INSTALL_HINT = "apt-get install chromium"
TIMEOUT_S = 180.0
"""Generous: a cold start on a busy 2-core machine takes seconds, and a hang must still end."""

_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
)


def find_chromium() -> str | None:
    """``$KIMI_CHROMIUM``, else ``chromium`` or ``chromium-browser`` on PATH, else None."""
    given = os.environ.get("KIMI_CHROMIUM")
    if given:
        return shutil.which(given) or (given if Path(given).is_file() else None)
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def require_chromium() -> str:
    """The browser's path; skip the test without one, or fail with ``KIMI_REQUIRE_CHROMIUM=1``."""
    found = find_chromium()
    if found:
        return found
    message = f"headless Chromium not found (KIMI_CHROMIUM or chromium on PATH): {INSTALL_HINT}"
    if os.environ.get("KIMI_REQUIRE_CHROMIUM", "") not in ("", "0"):
        pytest.fail(message + " (KIMI_REQUIRE_CHROMIUM is set)", pytrace=False)
    pytest.skip(message)


def _run(
    browser: str, args: list[str], page: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="kimi-chromium-") as profile:
        cmd = [browser, *_FLAGS, f"--user-data-dir={profile}", *args, page.resolve().as_uri()]
        result = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "HOME": profile},  # crash reports, caches: into the temp dir
        )
    return result


def screenshot(
    page: Path,
    png: Path,
    *,
    width: int = 1100,
    height: int = 1400,
    browser: str | None = None,
    timeout: float = TIMEOUT_S,
) -> Path:
    """Render ``page`` from ``file://`` at ``width`` x ``height`` CSS pixels (scale 1) into ``png``."""
    browser = browser or require_chromium()
    png.unlink(missing_ok=True)
    result = _run(
        browser, [f"--window-size={width},{height}", f"--screenshot={png.resolve()}"], page, timeout
    )
    if not png.is_file():
        raise AssertionError(
            f"chromium wrote no screenshot (exit {result.returncode}): {result.stderr[-2000:]}"
        )
    return png


def dump_dom(page: Path, *, browser: str | None = None, timeout: float = TIMEOUT_S) -> str:
    """The DOM after Chromium parsed and laid out ``page``, serialised (``--dump-dom``)."""
    browser = browser or require_chromium()
    result = _run(browser, ["--dump-dom"], page, timeout)
    if result.returncode != 0 or "<html" not in result.stdout:
        raise AssertionError(
            f"chromium --dump-dom failed ({result.returncode}): {result.stderr[-2000:]}"
        )
    return result.stdout


# ----------------------------------------------------------------------------- PNG decoding


@dataclass(frozen=True)
class Image:
    """A decoded 8-bit RGB(A) PNG: ``pixel(x, y)`` gives (r, g, b)."""

    width: int
    height: int
    channels: int
    rows: list[bytes]

    def pixel(self, x: int, y: int) -> tuple[int, int, int]:
        row, i = self.rows[y], x * self.channels
        return row[i], row[i + 1], row[i + 2]

    def matches(self, colour: str, tolerance: int = 8) -> list[tuple[int, int]]:
        """Every (x, y) whose RGB is within ``tolerance`` of ``#RRGGBB`` in each channel."""
        want = bytes.fromhex(colour.lstrip("#"))
        lo = [max(0, c - tolerance) for c in want]
        hi = [min(255, c + tolerance) for c in want]
        out = []
        ch = self.channels
        for y, row in enumerate(self.rows):
            for x in range(self.width):
                i = x * ch
                if (
                    lo[0] <= row[i] <= hi[0]
                    and lo[1] <= row[i + 1] <= hi[1]
                    and lo[2] <= row[i + 2] <= hi[2]
                ):
                    out.append((x, y))
        return out


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def read_png(path: Path) -> Image:
    """Decode a non-interlaced 8-bit RGB/RGBA PNG (what Chromium writes) with the stdlib only:
    the tests need no imaging library, and a decoder this small is easy to trust."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    pos, idat = 8, bytearray()
    width = height = depth = colour_type = interlace = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    if depth != 8 or colour_type not in (2, 6) or interlace:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour_type}")
    ch = 3 if colour_type == 2 else 4
    stride = width * ch
    raw = zlib.decompress(bytes(idat))
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 1:
            for i in range(ch, stride):
                line[i] = (line[i] + line[i - ch]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif kind == 3:
            for i in range(stride):
                left = line[i - ch] if i >= ch else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                left = line[i - ch] if i >= ch else 0
                upleft = prev[i - ch] if i >= ch else 0
                line[i] = (line[i] + _paeth(left, prev[i], upleft)) & 0xFF
        elif kind != 0:
            raise ValueError(f"bad PNG filter {kind} in row {y}")
        rows.append(bytes(line))
        prev = line
    return Image(width, height, ch, rows)
