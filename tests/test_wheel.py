"""The wheel, kept installable: built from the checkout, installed into a fresh environment outside the repository,
it runs an analysis there.

1. The sources a wheel is built from (``pyproject.toml``, ``README.md``, ``relaylens/``) are copied to a temporary
   folder and built there with ``pip wheel --no-deps --no-build-isolation`` (the checkout gets no ``build/``).
2. The wheel holds every package module (``relaylens/analyses/`` included), the bundled data and templates, no
   symbolic link and no top-level package but ``relaylens``.
3. A fresh virtual environment (``python -m venv --without-pip``) reaches the main environment's dependencies through
   one ``.pth`` line naming its site-packages. Only that path is added, its own ``.pth`` files are not run, so the
   checkout's editable install stays invisible. The wheel goes in with ``pip --python NEW install --no-deps``.
4. ``relaylens run coordinate_ablation --limit 1`` runs from that environment's console script, on a tiny random model
   saved to a folder, the bundled sample and two new tokens, in a working directory outside the repository with no
   ``PYTHONPATH``; ``relaylens`` must import from the new environment, and the run must write its tables.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _run(command, cwd, timeout=900, **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "RELAYLENS_SMOKE")}
    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**clean, "OMP_NUM_THREADS": "1", **env})
    assert done.returncode == 0, (f"{command[:3]}...: exit {done.returncode}\n{done.stdout[-2000:]}\n"
                                  f"{done.stderr[-4000:]}")
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("wheel-source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "relaylens", source / "relaylens", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
          "--disable-pip-version-check", "-w", out, source], cwd=source)
    (built,) = out.glob("relaylens-*.whl")
    return built


def test_wheel_holds_the_package_and_nothing_else(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        links = [i.filename for i in archive.infolist() if (i.external_attr >> 16) & 0o170000 == 0o120000]
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"relaylens"} and not links, (top, links)
    shipped = {n for n in names if n.endswith(".py")}
    expected = {p.relative_to(ROOT).as_posix() for p in (ROOT / "relaylens").rglob("*.py")
                if "__pycache__" not in p.parts}
    assert expected <= shipped, sorted(expected - shipped)[:10]
    assert "relaylens/analyses/coordinate_ablation.py" in shipped and "relaylens/analyses/__init__.py" in shipped
    assert any(n.startswith("relaylens/data/") and n.endswith(".json") for n in names)
    assert any(n.startswith("relaylens/reporting/templates/") for n in names)


def test_installed_wheel_runs_an_analysis_outside_the_repository(wheel, tmp_path):
    from relaylens.testing import tiny_model, tiny_tokenizer

    env_dir = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", env_dir], cwd=tmp_path)
    python = env_dir / "bin" / "python"
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        cwd=tmp_path).stdout.strip())
    dependencies = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()}
    (purelib / "main-environment.pth").write_text("\n".join(sorted(dependencies)) + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "--quiet",
          "--disable-pip-version-check", wheel], cwd=tmp_path)

    where = _run([python, "-c", "import relaylens, relaylens.analyses; print(relaylens.__file__); "
                  "print(relaylens.analyses.__path__[0])"], cwd=tmp_path).stdout.split()
    assert all(Path(p).resolve().is_relative_to(env_dir.resolve()) for p in where), where

    model = tmp_path / "tiny-llama"
    tiny_model("llama").save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    work = tmp_path / "elsewhere"
    work.mkdir()
    out = work / "run"
    _run([env_dir / "bin" / "relaylens", "run", "coordinate_ablation", "--limit", "1", "--model", model,
          "--data", "sample", "--max-new-tokens", "2", "--out", out], cwd=work, timeout=1200, COLUMNS="200")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["analysis"] == "coordinate_ablation"
    assert manifest["source"]["commit"] is None  # the installed package, not the checkout
    assert list(out.rglob("*.parquet")), sorted(p.name for p in out.rglob("*"))[:20]
