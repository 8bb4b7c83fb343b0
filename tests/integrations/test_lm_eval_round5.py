"""The lm-eval model type and the learned-geometry check of the integrations, issue 52: no remote code (item 3),
learned geometries checked as ``relaylens run`` checks them and their hash recorded (item 8), the framing regime
(item 9), prompt-reading selectors refused when the model is built (item 14), the plugin entry point (item 21)."""

from __future__ import annotations

import importlib.metadata
import json
import tomllib
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

import torch  # noqa: E402

from relaylens.errors import ModelError, RelaylensError  # noqa: E402
from relaylens.integrations.lm_eval import RelaylensLM  # noqa: E402 - registers the model type
from relaylens.model.loading import model_fingerprint  # noqa: E402
from relaylens.testing import tiny_model, tiny_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EVIL = "import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('custom code ran')\n"
STORY = ("user: My dog is called Biscuit and she is a Vizsla. assistant: That is a lovely name for a Vizsla! "
         "The quick brown fox jumps over the lazy dog 0123456789. ")


@pytest.fixture
def no_load(monkeypatch):
    """Fails the test if HFLM (the harness's loading) is ever reached."""
    from lm_eval.models.huggingface import HFLM

    def refuse(*args, **kwargs):
        raise AssertionError("the model started loading")

    monkeypatch.setattr(HFLM, "__init__", refuse)


def _saved(tmp_path, name: str = "model") -> Path:
    path = tmp_path / name
    tiny_model("llama").save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


# ------------------------------------------------------------------------------------------- item 3: remote code
@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
def test_a_directory_with_an_auto_map_is_refused_before_anything_loads(tmp_path, no_load, where):
    path = _saved(tmp_path)
    (path / "modeling_evil.py").write_text(EVIL)
    doc = json.loads((path / where).read_text())
    doc["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (path / where).write_text(json.dumps(doc))
    with pytest.raises(ModelError, match="needs custom code to load.*auto_map") as err:
        RelaylensLM(pretrained=str(path), device="cpu")
    assert "\n" not in str(err.value) and "Fix:" in str(err.value) and not (path / "RAN").exists()


def test_a_tokenizer_directory_with_an_auto_map_is_refused(tmp_path, no_load):
    model, tokenizer = _saved(tmp_path, "model"), _saved(tmp_path, "tokenizer")
    doc = json.loads((tokenizer / "tokenizer_config.json").read_text())
    doc["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(doc))
    with pytest.raises(ModelError, match="auto_map"):
        RelaylensLM(pretrained=str(model), tokenizer=str(tokenizer), device="cpu")


@pytest.mark.parametrize("flag", [True, "True", "true", 1])
def test_trust_remote_code_in_model_args_is_refused(tmp_path, no_load, flag):
    with pytest.raises(ModelError, match="trust_remote_code=.* was passed in --model_args") as err:
        RelaylensLM(pretrained=str(_saved(tmp_path)), device="cpu", trust_remote_code=flag)
    assert "\n" not in str(err.value)


def test_trust_remote_code_through_simple_evaluate_is_refused(tmp_path, no_load):
    """The string lm-eval parses from ``--model_args`` (the command line's own path)."""
    with pytest.raises(ModelError, match="never runs code"):
        lm_eval.api.registry.get_model("relaylens").create_from_arg_string(
            f"pretrained={_saved(tmp_path)},trust_remote_code=True,device=cpu")


# -------------------------------------------------------------------------------- item 14: prompt-reading selectors
@pytest.mark.parametrize("selector", ["bm25", "finch", "BM25"])
def test_a_selector_that_reads_the_prompt_is_refused_when_the_model_type_is_built(no_load, selector):
    with pytest.raises(RelaylensError, match="reads a rendered relaylens prompt") as err:
        RelaylensLM(pretrained="never-loaded", selector=selector)
    assert "\n" not in str(err.value) and "selector=snapkv" in str(err.value)


# --------------------------------------------------------------------------------------- item 9: framing regime
def test_framing_tokens_keep_each_contexts_first_tokens_outside_the_budget():
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    common = dict(pretrained=model, tokenizer=tokenizer, device="cpu", selector_window=4, budget=0.1,
                  question_tokens=4)
    protected, evicted = RelaylensLM(**common, framing_tokens=12), RelaylensLM(**common)
    context = tokenizer(STORY * 3)["input_ids"]
    _, selection, _ = protected._compress(context)
    assert selection.info["protected"] == 12
    head = selection.positions[..., :12]  # [layer, kv_head, 12]: each head's first slots are the framing
    assert bool((head == torch.arange(12)).all())
    _, plain, _ = evicted._compress(context)
    assert "protected" not in plain.info
    assert protected.get_model_info()["relaylens_framing"].startswith("protected (each context's first 12 tokens")
    assert evicted.get_model_info()["relaylens_framing"].startswith("evicted")
    with pytest.raises(RelaylensError, match="framing_tokens must be"):
        RelaylensLM(pretrained="never-loaded", framing_tokens=-1)


# ------------------------------------------------------------------------------------- item 8: learned geometries
def _learned_dir(tmp_path, model, **fit) -> Path:
    """A learned_geometry.json as `relaylens run learned_geometry` writes it (format 2), for ``model``."""
    settings = {"selector": "snapkv", "budget": 0.5, "selector_options": {"window": 4}, "protect_instructions": False,
                "prompt_mode": "completion", "granularity": "turn", "window_mode": "condition"} | fit
    doc = {"format": 2, "analysis": "learned_geometry", "sharing": "global",
           "parameters": {"b": 1.0, "s": 0.9, "alpha": 1.0}, "num_layers": 2, "num_kv_heads": 2,
           "model": {"spec": "tiny", "weights_hash": model_fingerprint(model)}, "selector": settings["selector"],
           "budget": settings["budget"], "prompt_mode": "completion", "fit": settings, "seed": 0,
           "train_records": ["a"], "test_records": ["b"]}
    out = tmp_path / f"learned-{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    (out / "learned_geometry.json").write_text(json.dumps(doc))
    return out


def test_lm_eval_checks_a_learned_geometry_and_records_its_hash(tmp_path):
    from relaylens.conditions.family import Learned

    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    good = _learned_dir(tmp_path, model)
    common = dict(pretrained=model, tokenizer=tokenizer, device="cpu", selector_window=4, question_tokens=4)
    lm = RelaylensLM(**common, budget=0.5, condition=f"learned:{good}")
    assert lm.get_model_info()["relaylens_learned_sha256"] == Learned.from_run_dir(good).sha256
    assert lm.loglikelihood([_instance(STORY * 2, " Biscuit")])[0][0] < 0
    assert RelaylensLM(**common, budget=0.5).get_model_info()["relaylens_learned_sha256"] is None
    with pytest.raises(RelaylensError, match=r"fitted under other settings: budget \(learned with 0.5"):
        RelaylensLM(**common, budget=0.1, condition=f"learned:{good}")
    with pytest.raises(RelaylensError, match="selector .learned with 'snapkv', lm_eval --model relaylens 'h2o'"):
        RelaylensLM(pretrained=model, tokenizer=tokenizer, device="cpu", question_tokens=4, budget=0.5, selector="h2o",
                    condition=f"learned:{good}")
    with pytest.raises(RelaylensError, match="protect_instructions"):
        RelaylensLM(**common, budget=0.5, framing_tokens=4, condition=f"learned:{good}")
    other = _learned_dir(tmp_path, tiny_model("llama", seed=1))
    with pytest.raises(RelaylensError, match="was learned on model tiny .weights_hash"):
        RelaylensLM(**common, budget=0.5, condition=f"learned:{other}")


def test_relay_generate_and_relay_inputs_check_a_learned_geometry(tmp_path):
    from relaylens.integrations.hf_generate import relay_generate, relay_inputs, select_history

    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    good = _learned_dir(tmp_path, model)
    kwargs = dict(selector_options={"window": 4}, max_new_tokens=2, do_sample=False)
    assert isinstance(relay_generate(model, tokenizer, STORY * 2, "Name?", "snapkv", 0.5, f"learned:{good}",
                                     **kwargs), str)
    with pytest.raises(RelaylensError, match="fitted under other settings: selector"):
        relay_generate(model, tokenizer, STORY * 2, "Name?", "streaming", 0.5, f"learned:{good}", max_new_tokens=2)
    with pytest.raises(RelaylensError, match="fitted under other settings: budget"):
        relay_generate(model, tokenizer, STORY * 2, "Name?", "snapkv", 0.25, f"learned:{good}", **kwargs)
    prefill, selection = select_history(model, torch.arange(3, 43), "streaming", 0.5)
    with pytest.raises(RelaylensError, match="relay_inputs 'streaming'"):
        with relay_inputs(model, prefill, selection, f"learned:{good}", torch.tensor([50, 51])):
            pass
    other = _learned_dir(tmp_path, tiny_model("llama", seed=1))
    prefill, selection = select_history(model, torch.arange(3, 43), "snapkv", 0.5, selector_options={"window": 4})
    with pytest.raises(RelaylensError, match="was learned on model"):
        with relay_inputs(model, prefill, selection, f"learned:{other}", torch.tensor([50, 51])):
            pass


def _instance(context: str, continuation: str):
    from lm_eval.api.instance import Instance

    return Instance(request_type="loglikelihood", doc={}, arguments=(context, continuation), idx=0)


# ------------------------------------------------------------------------------------ item 21: the plugin paths
ENTRY = "relaylens.integrations.lm_eval:RelaylensLM"


def test_the_model_plugin_entry_point_is_declared_and_loads_the_model_type():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["lm_eval.models"]
    assert declared == {"relaylens": ENTRY}
    installed = [e for e in importlib.metadata.entry_points(group="lm_eval.models") if e.name == "relaylens"]
    assert [e.value for e in installed] == [ENTRY], "reinstall relaylens (pip install -e .) to refresh its metadata"
    assert installed[0].load() is RelaylensLM  # what lm-eval >= 0.4.14 loads for --model relaylens


def test_each_lm_eval_version_finds_the_model_type_by_its_own_path():
    from packaging.version import Version

    version = Version(importlib.metadata.version("lm-eval"))
    scripts = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts.get("relaylens-lm-eval") == "relaylens.integrations.lm_eval:main"  # every version's path
    assert lm_eval.api.registry.get_model("relaylens") is RelaylensLM  # registered by the import (0.4.13's path)
    if version >= Version("0.4.14"):  # the plugin group: lm-eval's own loader finds the entry point
        from lm_eval.api import registry

        loader = getattr(registry, "load_plugins", None) or getattr(registry, "_load_plugins", None)
        assert loader is not None, f"lm-eval {version}: no plugin loader found; check its plugin API"
    else:  # 0.4.13 has no model plugin group: the script / `python -m` path is the way in
        assert not hasattr(lm_eval.api.registry, "load_plugins")
