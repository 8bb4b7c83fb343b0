"""Browser tier of test_token_view.py: token view: per-token attention against a manual per-head recomputation, storage,
and the HTML fragment."""

from __future__ import annotations

import pytest

from relaylens.reporting.token_view import example_view, view_html

pytestmark = pytest.mark.browser


# ------------------------------------------------------------------------------------------- headless Chromium


def _page(tmp_path, views):
    page = tmp_path / "view.html"
    page.write_text(f"<!doctype html><html><head><meta charset='utf-8'></head><body>{view_html(views)}</body></html>",
                    encoding="utf-8")
    return page


def shading(dom: str) -> list[str]:
    """The background colours of the shaded tokens, in document order (what the layer selector changes)."""
    import re

    return re.findall(r'background-color: (rgba\([^)]*\))', dom)


def test_token_view_switches_layers_in_chromium(tmp_path):
    from support.browser import chromium, console_errors, not_blank, run_chromium

    binary = chromium()
    page = _page(tmp_path, [example_view(tokens=400, layers=4)])
    doms, shots = {}, {}
    for option in (3, 6):  # bands come first: option 3 is layer 0, option 6 is layer 3
        dom = run_chromium(binary, page, tmp_path, "--dump-dom", fragment=f"tv-layer={option}")
        assert dom.returncode == 0 and not console_errors(dom.stderr), console_errors(dom.stderr) or dom.stderr[-2000:]
        assert f'data-layer="{option}"' in dom.stdout
        doms[option] = shading(dom.stdout)
        shot = tmp_path / f"view-{option}.png"
        rendered = run_chromium(binary, page, tmp_path, f"--screenshot={shot}", fragment=f"tv-layer={option}")
        assert rendered.returncode == 0 and shot.exists() and not console_errors(rendered.stderr)
        colours, non_white = not_blank(shot)
        assert colours > 20 and non_white > 0.02, (colours, non_white)
        shots[option] = shot.read_bytes()
    assert doms[3] and doms[6] and doms[3] != doms[6], "switching layers left the shading unchanged"
    assert shots[3] != shots[6]
