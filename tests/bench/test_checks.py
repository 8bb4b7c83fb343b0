"""``relaylens model check`` on a tiny Qwen2 with Qwen2.5's geometry (untied output layer, theta 1e6, 2 kv heads,
q/k/v biases), as loaded and with the paper's static YaRN override: every check passes, the far-end checks reach
position 131,000, and a relocation that ignores the YaRN amplitude fails them (no download: random weights)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from relaylens.cli import app
from relaylens.testing import tiny_model, tiny_tokenizer

YARN = ["--rope-scaling", "yarn:4:32768", "--max-position", "131072"]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen2")
    model = tiny_model("qwen2")
    assert not model.config.tie_word_embeddings and model.config.num_key_value_heads == 2
    assert model.config.rope_parameters["rope_theta"] == 1e6 and model.model.layers[0].self_attn.k_proj.bias is not None
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _check(path, *extra):
    return CliRunner().invoke(app, ["model", "check", str(path), "--history-tokens", "150", *extra])


def _values(stdout: str) -> dict[str, float]:
    out = {}
    for line in stdout.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3 and parts[0] in ("PASS", "FAIL"):
            out[parts[2]] = float(parts[1])
    return out


@pytest.mark.parametrize("extra", [[], YARN], ids=["as-loaded", "yarn-131072"])
def test_model_check_passes_on_tiny_qwen2(qwen_dir, extra):
    result = _check(qwen_dir, *extra)
    assert result.exit_code == 0, result.output
    assert "FAIL" not in result.stdout and result.stdout.count("PASS") == 6
    assert ("'rope_type': 'yarn'" in result.stdout) == bool(extra)
    values = _values(result.stdout)
    far = [name for name in values if name.startswith("relocated keys up to position 131,000")]
    assert len(far) == 2 and all("(threshold 1e-05)" in name for name in far), far
    assert all(values[name] <= 1e-5 for name in far)


def test_model_check_catches_a_relocation_without_the_yarn_amplitude(qwen_dir, monkeypatch):
    """R_a(p') R_a(p)^T without dividing by a^2: invisible for default RoPE (a = 1), a^2 = 1.30 too large under YaRN."""
    from relaylens.geometry.rotary import RotaryFactors

    def phases_without_amplitude(self, size, layer=None):
        cos, sin = self.tables(size, layer)
        return cos, sin, cos.clone(), (-sin).contiguous()

    def complex_without_amplitude(self, size, layer=None):
        cos, sin = self.tables(size, layer)
        return torch.complex(cos, sin), torch.complex(cos, -sin)

    monkeypatch.setattr(RotaryFactors, "phase_tables", phases_without_amplitude)
    monkeypatch.setattr(RotaryFactors, "complex_tables", complex_without_amplitude)
    control = _check(qwen_dir)
    assert control.exit_code == 0, control.output  # default RoPE: the amplitude is 1
    broken = _check(qwen_dir, *YARN)
    assert broken.exit_code == 2 and "Traceback" not in broken.output
    failed = [line for line in broken.stdout.splitlines() if line.startswith("FAIL")]
    assert any("up to position 131,000 vs direct rotation" in line for line in failed), broken.stdout
    assert any("model's own keys at p + 1000" in line for line in failed)
