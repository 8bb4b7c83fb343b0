"""The lm-evaluation-harness model type ``relaylens`` on a local task (a small JSONL file, nothing from the hub) and a
tiny model saved to a temporary directory.

With ``condition=original`` and ``budget=1.0`` it reproduces the harness's plain ``hf`` model on the same requests:
loglikelihoods within float tolerance, the same greedy flags, identical generations. Under ``relay`` at a real budget
it runs the same tasks through the command line. Bad input is refused in one line before any model work.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

lm_eval = pytest.importorskip("lm_eval")

import torch  # noqa: E402

from relaylens.errors import PositionError, RelaylensError, RopeError  # noqa: E402
from relaylens.integrations.lm_eval import RelaylensLM  # noqa: E402 - registers the model type
from relaylens.testing import tiny_model, tiny_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STORY = ("user: My dog is called Biscuit and she is a Vizsla. assistant: That is a lovely name for a Vizsla! "
         "The quick brown fox jumps over the lazy dog 0123456789. ")
DOCS = [
    {"context": STORY * 2, "question": "What is the name of my dog?", "choices": [" Biscuit", " Rex", " Vizsla"],
     "label": 0, "answer": "Biscuit"},
    {"context": "### Session 1:\nSession Date: 2023/05/20 (Sat) 02:21\n" + STORY, "question": "When was the session?",
     "choices": [" 2023/05/20", " 2023/05/30"], "label": 0, "answer": "2023/05/20"},
    {"context": STORY + "Current Date: 2023/05/30 (Tue) 23:40\n" + STORY, "question": "What jumps over the dog?",
     "choices": [" the fox", " the dog", " Biscuit"], "label": 0, "answer": "the fox"},
]
HF_ARGS = "dtype=float32,device=cpu"
RELAY_ARGS = "selector=snapkv,selector_window=4,question_tokens=4"
TASKS = ["relaylens_mc", "relaylens_gen"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """``(model dir, task dir)``: a tiny Llama with the tiny tokenizer, and two tasks over one local JSONL file."""
    root = tmp_path_factory.mktemp("lm_eval")
    model_dir, task_dir = root / "model", root / "tasks"
    tiny_model("llama").save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    task_dir.mkdir()
    data = task_dir / "docs.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
              'doc_to_text: "{{context}}\\nQuestion: {{question}}\\nAnswer:"\n')
    (task_dir / "mc.yaml").write_text(f"task: relaylens_mc\n{common}output_type: multiple_choice\n"
                                      "doc_to_choice: choices\ndoc_to_target: label\nmetric_list:\n  - metric: acc\n")
    (task_dir / "gen.yaml").write_text(f"task: relaylens_gen\n{common}output_type: generate_until\n"
                                       "doc_to_target: answer\ngeneration_kwargs:\n  until: [\"\\n\"]\n"
                                       "  max_gen_toks: 8\n"
                                       "  do_sample: false\nmetric_list:\n  - metric: exact_match\n")
    return model_dir, task_dir


def evaluate(setup, model: str, model_args: str) -> dict:
    """``{task: [responses per doc, in doc order]}`` from ``lm_eval.simple_evaluate``."""
    from lm_eval.tasks import TaskManager

    model_dir, task_dir = setup
    results = lm_eval.simple_evaluate(model=model, model_args=f"pretrained={model_dir},{model_args}", tasks=TASKS,
                                      task_manager=TaskManager(include_path=str(task_dir)), log_samples=True,
                                      batch_size=1)
    return {task: [s["resps"] for s in sorted(results["samples"][task], key=lambda s: s["doc_id"])] for task in TASKS}


@pytest.fixture(scope="module")
def plain_hf(setup):
    return evaluate(setup, "hf", HF_ARGS)


def test_original_at_full_budget_reproduces_the_plain_hf_model(setup, plain_hf):
    ours = evaluate(setup, "relaylens", f"{HF_ARGS},{RELAY_ARGS},budget=1.0,condition=original")
    differences, greedy_equal = [], []
    for hf_doc, our_doc in zip(plain_hf["relaylens_mc"], ours["relaylens_mc"]):
        for (hf_ll, hf_greedy), (our_ll, our_greedy) in zip((r[0] for r in hf_doc), (r[0] for r in our_doc)):
            differences.append(abs(hf_ll - our_ll))
            greedy_equal.append(hf_greedy == our_greedy)
    print(f"loglikelihood: {len(differences)} requests, max |difference| {max(differences):.3g}; "
          f"generate_until: {ours['relaylens_gen']}")
    assert len(differences) == sum(len(d["choices"]) for d in DOCS) and all(greedy_equal)
    assert max(differences) <= 1e-4
    assert ours["relaylens_gen"] == plain_hf["relaylens_gen"]
    assert all(r[0][0] for r in ours["relaylens_gen"])  # something was generated


def test_relay_at_half_budget_runs_from_the_command_line(setup, plain_hf, tmp_path):
    """``python -m relaylens.integrations.lm_eval`` is lm-eval's own CLI with ``--model relaylens`` registered."""
    model_dir, task_dir = setup
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "relaylens.integrations.lm_eval", "run", "--model", "relaylens", "--model_args",
               f"pretrained={model_dir},dtype=float32,{RELAY_ARGS},budget=0.5,condition=relay", "--tasks",
               ",".join(TASKS), "--include_path", str(task_dir), "--output_path", str(tmp_path / "out"),
               "--log_samples", "--batch_size", "1", "--device", "cpu"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (results,) = (tmp_path / "out").rglob("results_*.json")
    config = json.loads(results.read_text())["config"]
    assert config["model"] == "relaylens" and config["relaylens_condition"] == "relay"
    assert config["relaylens_budget"] == "0.5" and config["relaylens_uncompressed"] == 0
    samples = {task: [json.loads(line) for line in next((tmp_path / "out").rglob(f"samples_{task}_*.jsonl")).open()]
               for task in TASKS}
    relay = sorted(samples["relaylens_mc"], key=lambda s: s["doc_id"])
    lls = [r[0][0] for doc in relay for r in doc["resps"]]
    hf_lls = [r[0][0] for doc in plain_hf["relaylens_mc"] for r in doc]
    assert all(math.isfinite(float(x)) for x in lls)
    assert max(abs(float(a) - b) for a, b in zip(lls, hf_lls)) > 1e-3  # compressed and relocated: it reads differently
    assert len(samples["relaylens_gen"]) == len(DOCS)


def _instance(context: str, continuation: str):
    from lm_eval.api.instance import Instance

    return Instance(request_type="loglikelihood", doc={}, arguments=(context, continuation), idx=0)


class CountingForward:
    def __init__(self, model):
        self.calls = 0
        model.register_forward_pre_hook(lambda *_: setattr(self, "calls", self.calls + 1))


def test_a_request_past_the_rotary_range_is_refused_before_any_model_work():
    lm = RelaylensLM(pretrained=tiny_model("llama", max_position_embeddings=64), tokenizer=tiny_tokenizer(),
                     device="cpu", selector="snapkv", selector_window=4, budget=0.5, question_tokens=4)
    counter = CountingForward(lm.model)
    with pytest.raises(PositionError) as err:
        lm.loglikelihood([_instance("a short one", " yes"), _instance(STORY * 3, " Biscuit")])
    message = str(err.value)
    assert "\n" not in message and "1 loglikelihood request(s)" in message and "Fix:" in message
    assert counter.calls == 0
    generate = [_instance(STORY, "")]
    generate[0].request_type = "generate_until"
    generate[0].arguments = (STORY * 3, {"until": ["\n"], "max_gen_toks": 4})
    with pytest.raises(PositionError, match="generate_until request"):
        lm.generate_until(generate)
    assert counter.calls == 0


def test_bad_model_args_and_models_are_refused_in_one_line():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=384)).eval()
    with pytest.raises(RopeError, match="GPT2LMHeadModel cannot be relocated"):
        RelaylensLM(pretrained=gpt2, tokenizer=tiny_tokenizer(), device="cpu")
    with pytest.raises(RelaylensError, match="needs probes, not generate"):
        RelaylensLM(pretrained="never-loaded", condition="RandomMean")
    with pytest.raises(RelaylensError, match="question_tokens"):
        RelaylensLM(pretrained="never-loaded", question_tokens=0)
    lm = RelaylensLM(pretrained=tiny_model("llama"), tokenizer=tiny_tokenizer(), device="cpu")
    with pytest.raises(NotImplementedError, match="loglikelihood_rolling"):
        lm.loglikelihood_rolling([])


def test_a_context_too_short_for_the_selector_is_refused_or_kept_whole():
    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    strict = RelaylensLM(pretrained=model, tokenizer=tokenizer, device="cpu", selector_window=32, budget=0.1)
    with pytest.raises(RelaylensError, match="too_short=keep"):
        strict.loglikelihood([_instance(STORY, " Biscuit")])
    kept = RelaylensLM(pretrained=model, tokenizer=tokenizer, device="cpu", selector_window=32, budget=0.1,
                       too_short="keep")
    plain = lm_eval.api.registry.get_model("hf")(pretrained=model, tokenizer=tokenizer, device="cpu")
    ours = kept.loglikelihood([_instance(STORY, " Biscuit")])
    reference = plain.loglikelihood([_instance(STORY, " Biscuit")])
    assert abs(ours[0][0] - reference[0][0]) <= 1e-4 and kept.uncompressed == 1


def test_an_embedded_model_name_loads_through_relaylens(monkeypatch):
    import relaylens.model.loading

    calls = []
    monkeypatch.setattr(relaylens.model.loading, "load_model",
                        lambda spec, dtype=None: calls.append(spec) or (tiny_model("llama"), tiny_tokenizer()))
    lm = RelaylensLM(pretrained="smollm2-135m-instruct", device="cpu")
    assert calls == ["smollm2-135m-instruct"] and isinstance(lm.model, torch.nn.Module)


def test_generate_until_with_a_batch_decodes_each_context_as_alone():
    """``batch_size=2`` left-pads contexts in the harness; each row is decoded without its padding."""
    from lm_eval.api.instance import Instance

    model, tokenizer = tiny_model("llama"), tiny_tokenizer()
    requests = [Instance(request_type="generate_until", doc={}, idx=i,
                         arguments=(context, {"until": ["\n"], "max_gen_toks": 6, "do_sample": False}))
                for i, context in enumerate([STORY, STORY * 2 + "Question: name?\nAnswer:", STORY + "Answer:"])]
    outputs = [RelaylensLM(pretrained=model, tokenizer=tokenizer, device="cpu", selector_window=4, budget=0.5,
                           question_tokens=4, batch_size=size).generate_until(requests) for size in (1, 2)]
    assert outputs[0] == outputs[1] and len(outputs[0]) == 3
