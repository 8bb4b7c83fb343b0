"""Headless Chromium helpers for the report and view render tests (not a test module: no tests here)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    reason = ("headless Chromium not found (looked for chromium, chromium-browser, google-chrome). Install it with: "
              "apt-get update && apt-get install -y chromium")
    if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
        pytest.fail(f"CI=true requires Chromium for the report render test; {reason}", pytrace=False)
    pytest.skip(reason)


def run_chromium(binary: str, page: Path, tmp: Path, *mode: str, fragment: str = "",
                 query: str = "") -> subprocess.CompletedProcess:
    args = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run", "--disable-extensions", "--mute-audio",
            f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0", "--window-size=1200,2000",
            *mode, page.resolve().as_uri() + (f"?{query}" if query else "") + (f"#{fragment}" if fragment else "")]
    return subprocess.run(args, capture_output=True, text=True, timeout=90)


def console_errors(log: str) -> list[str]:
    """Console output of the page (our page logs nothing) and uncaught exceptions, from Chromium's stderr."""
    return [line for line in log.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def not_blank(png: Path) -> tuple[int, float]:
    from PIL import Image

    image = np.asarray(Image.open(png).convert("RGB"))
    colours = len(np.unique(image.reshape(-1, 3), axis=0))
    non_white = float((image.min(axis=-1) < 245).mean())
    return colours, non_white
