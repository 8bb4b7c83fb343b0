"""No remote code, ever (issue 41, item 2): every transformers load in the package passes ``trust_remote_code=False``
explicitly, and a model directory that declares custom code (an ``auto_map`` in ``config.json`` or
``tokenizer_config.json``) is refused with one line before anything loads -- for the model under study, its
tokenizer, and a local judge -- never run, never silently swapped for transformers' own class, never a prompt."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from relaylens.errors import ModelError

PACKAGE = Path(__file__).resolve().parents[2] / "relaylens"
EVIL = "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('custom code ran')\n"


def _loads_without_the_flag() -> list[str]:
    """``file:line`` of every ``Auto*.from_pretrained(...)`` / ``Auto*.from_config(...)`` call in the package that
    does not pass ``trust_remote_code=False`` literally."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "from_pretrained" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id.startswith("Auto")):
                continue
            flag = [k for k in node.keywords if k.arg == "trust_remote_code"]
            if not (flag and isinstance(flag[0].value, ast.Constant) and flag[0].value.value is False):
                missing.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return missing


def test_every_transformers_load_passes_trust_remote_code_false():
    missing = _loads_without_the_flag()
    assert not missing, "from_pretrained without trust_remote_code=False: " + ", ".join(missing)


@pytest.fixture
def custom_dir(tmp_path):
    """A saved tiny Llama whose files declare custom code (the code would leave a RAN file if it ever ran)."""
    from relaylens.testing import tiny_model, tiny_tokenizer

    path = tmp_path / "needs-code"
    tiny_model("llama", seed=0).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    (path / "modeling_evil.py").write_text(EVIL)
    (path / "tokenization_evil.py").write_text(EVIL)
    return path


def _declare(path: Path, where: str) -> None:
    name, entry = (("config.json", {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}) if where == "config"
                   else ("tokenizer_config.json", {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}))
    doc = json.loads((path / name).read_text())
    doc["auto_map"] = entry
    (path / name).write_text(json.dumps(doc))


@pytest.mark.parametrize("where", ["config", "tokenizer"])
def test_a_model_directory_with_custom_code_is_refused_before_loading(custom_dir, where):
    from relaylens.model.loading import load_model, load_tokenizer

    _declare(custom_dir, where)
    for load in (load_model, load_tokenizer):
        with pytest.raises(ModelError) as err:
            load(str(custom_dir))
        message = str(err.value)
        assert "needs custom code" in message and "auto_map" in message and "Fix:" in message, message
        assert "\n" not in message
    assert not (custom_dir / "RAN").exists()


def test_a_local_judge_with_custom_code_is_refused(custom_dir):
    from relaylens.scoring.judge import HFBackend, JudgeBackendError

    _declare(custom_dir, "config")
    with pytest.raises(JudgeBackendError, match="needs custom code.*trust_remote_code=False"):
        HFBackend.from_pretrained(str(custom_dir))
    with pytest.raises(JudgeBackendError, match="trust_remote_code=True was passed"):
        HFBackend.from_pretrained(str(custom_dir), trust_remote_code=True)
    assert not (custom_dir / "RAN").exists()


def test_run_refuses_it_in_one_line_before_anything_is_written(custom_dir, tmp_path):
    from typer.testing import CliRunner

    from relaylens.cli import app

    _declare(custom_dir, "config")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", "ordering", "--model", str(custom_dir), "--limit", "1", "--out", str(out)],
                                env={"COLUMNS": "400", "HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "needs custom code" in errors[0], result.stderr
    assert not out.exists() and not (custom_dir / "RAN").exists()


def test_a_plain_model_directory_still_loads(tmp_path):
    from relaylens.model.loading import load_model
    from relaylens.testing import tiny_model, tiny_tokenizer

    path = tmp_path / "plain"
    tiny_model("llama", seed=0).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    model, tok = load_model(str(path))
    assert model.config.model_type == "llama" and tok is not None
