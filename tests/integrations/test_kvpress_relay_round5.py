"""Issue 52, items 5 and 6: RelayPress keeps the padding mask of uneven budgets with the cache it belongs to (a deep
copy, or a second compressed context, answers exactly as the cache did right after its own compression), and
relocates interleaved-rotary models (Cohere, GLM) in their own layout (every kept key equals the model's own key at
its new position).

kvpress runs in its pinned environment (``make kvpress-env``, found through ``RELAYLENS_KVPRESS_PYTHON`` or
``.kvpress-env/``; skipped locally without it and FAILS under ``CI=true``): ``kvpress_relay_round5_script.py`` loads
tiny random models saved here and reports the figures.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.integrations.test_kvpress_relay import PRESS_MODULE, _kvpress_python, _need

HERE = Path(__file__).resolve().parent
PADDING = [("llama", "sdpa", "adakv"), ("llama", "sdpa", "pyramidkv"), ("llama", "eager", "pyramidkv"),
           ("qwen2", "sdpa", "adakv")]
# kvpress's SnapKV scores with split-half, full-width rotary queries: Knorm (no queries) on partial-rotary models
LAYOUT = [("cohere_interleaved", "snapkv"), ("cohere_interleaved", "adakv"), ("glm_partial_interleaved", "knorm"),
          ("glm_partial_interleaved", "adakv_knorm"), ("llama", "adakv"), ("phi_partial", "adakv_knorm")]


def run_script(folder: Path, press_module: Path = PRESS_MODULE) -> dict:
    """The models saved under ``folder`` and the script's figures (one kvpress subprocess)."""
    python = _kvpress_python()
    if python is None:
        _need("the pinned kvpress environment (make kvpress-env, or RELAYLENS_KVPRESS_PYTHON)")
    from relaylens.testing import peaked_model

    variants = {v for v, _, _ in PADDING} | {v for v, _ in LAYOUT}
    for variant in variants:
        overrides = {"layer_types": ["full_attention"] * 4} if variant == "qwen2" else {}
        peaked_model(variant, num_hidden_layers=4, sharpen=3.0, **overrides).save_pretrained(folder / variant)
    spec = {"padding": [dict(id=f"{v}-{a}-{p}", model=str(folder / v), attn=a, press=p) for v, a, p in PADDING],
            "layout": [dict(id=f"{v}-{p}", model=str(folder / v), press=p) for v, p in LAYOUT]}
    (folder / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    command = [python, str(HERE / "kvpress_relay_round5_script.py"), str(press_module), str(folder / "spec.json"),
               str(folder / "out.pt")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(folder / "out.pt", weights_only=False)


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    return run_script(tmp_path_factory.mktemp("kvpress-relay-round5"))


@pytest.mark.parametrize("case", [f"{v}-{a}-{p}" for v, a, p in PADDING])
def test_the_padding_mask_travels_with_its_cache(figures, case):
    """A deep copy of a compressed cache, and a cache compressed before another context, answer exactly as the cache
    did right after its own compression; without the mask the answer moves (the padding is real)."""
    f = figures["padding"][case]
    assert f["padded"], f"{case}: the budgets should be uneven (padding present)"
    assert f["no_mask"] > 1e-3, f
    for name in ("a_copy_after_b", "b_copy", "a_copy_of_copy", "a_itself", "b_itself"):
        assert f[name] <= 1e-5, (name, f)


@pytest.mark.parametrize("case", [f"{v}-{p}" for v, p in LAYOUT])
def test_relocated_keys_equal_the_models_own_keys_in_its_layout(figures, case):
    f = figures["layout"][case]
    expected = "interleaved" if case.startswith(("cohere", "glm")) else "split_half"
    assert f["layout"] == expected
    assert f["error"] <= 1e-5 * max(1.0, f["scale"]), f
