"""LongMemEval's own judge template: the five prompts (the benchmark's text), routing by type and abstention by id,
the yes-substring verdict and its quirk, one user message / 10 tokens / greedy through both backends, cache
separation from memory_judge_v1, and refusals (unknown template; records without LongMemEval types) before any
backend call."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest

from relaylens.datasets import load_records
from relaylens.datasets.longmemeval import QUESTION_TYPES as READER_TYPES
from relaylens.datasets.records import Record
from relaylens.errors import RelaylensError
from relaylens.experiments.config import RunConfig, check_config
from relaylens.experiments.judges import check_judge_records, make_judge
from relaylens.experiments.rejudge import rejudge_run
from relaylens.results.manifest import manifest_diff
from relaylens.scoring import judge as memory
from relaylens.scoring import longmemeval_judge as lme
from relaylens.scoring import transport

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class Recorder:
    """A fake judge backend: records every (system, user) it receives and answers ``reply`` (a string, or a callable
    of the user message)."""

    def __init__(self, reply="Yes.", model_id: str = "fake-judge"):
        self.reply, self.model_id, self.calls = reply, model_id, []
        self.settings = {"backend": "fake", "max_new_tokens": 10}

    def complete(self, system: str, user: str) -> str:
        self.calls.append((system, user))
        return self.reply(user) if callable(self.reply) else self.reply


def rec(rid: str, qtype: str, answer: str = "Biscuit", raw=None, source: str = "longmemeval",
        abstention: bool | None = None) -> Record:
    return Record(record_id=rid, question=f"What about {rid}?", answers=(answer,), question_type=qtype,
                  question_date="2023/05/30 (Tue) 23:40", sessions=(), evidence_session_ids=(),
                  is_abstention="_abs" in rid if abstention is None else abstention, source=source, raw_answer=raw)


# ------------------------------------------------------------------------------------------------ the prompts

# sha256 (first 16 hex digits) of each template, checked word for word against get_anscheck_prompt of the benchmark's
# src/evaluation/evaluate_qa.py (xiaowu0162/LongMemEval, commit b11ff72) with its positional {} named
PROMPT_DIGESTS = {"default": "3e4884e50ba56289", "temporal-reasoning": "41b9228e72383f57",
                  "knowledge-update": "5e8f6aa484d44484", "single-session-preference": "748a5b8e09a2ea55",
                  "abstention": "5c05eb2ce11f92bd"}


def test_the_five_prompts_are_the_benchmarks_text():
    assert set(lme.PROMPTS) == {"default", "temporal-reasoning", "knowledge-update", "single-session-preference",
                                "abstention"}
    assert set(lme.PROMPT_OF_TYPE) == set(READER_TYPES) == set(lme.QUESTION_TYPES)
    record = rec("q1", "multi-session")
    assert lme.build_prompt(record, "It is Biscuit.") == (
        "I will give you a question, a correct answer, and a response from a model. Please answer yes if the response "
        "contains the correct answer. Otherwise, answer no. If the response is equivalent to the correct answer or "
        "contains all the intermediate steps to get the correct answer, you should also answer yes. If the response "
        "only contains a subset of the information required by the answer, answer no. \n\nQuestion: What about q1?"
        "\n\nCorrect Answer: Biscuit\n\nModel Response: It is Biscuit.\n\nIs the model response correct? Answer yes "
        "or no only.")
    # the benchmark's own spacing: a space before the first blank line in two shapes only
    assert "answer no. \n\nQuestion: {question}" in lme.PROMPTS["default"]
    assert "is still correct. \n\nQuestion: {question}" in lme.PROMPTS["temporal-reasoning"]
    assert "is the required answer.\n\nQuestion: {question}" in lme.PROMPTS["knowledge-update"]
    preference = lme.PROMPTS["single-session-preference"]
    assert "information correctly.\n\nQuestion: {question}\n\nRubric: {answer}" in preference
    assert "asked information is not.\n\nQuestion: {question}\n\nExplanation: {answer}" in lme.PROMPTS["abstention"]
    assert lme.PROMPTS["abstention"].endswith("Does the model correctly identify the question as unanswerable? "
                                              "Answer yes or no only.")
    for kind in ("default", "temporal-reasoning", "knowledge-update", "single-session-preference"):
        assert lme.PROMPTS[kind].endswith("\n\nModel Response: {response}\n\nIs the model response correct? Answer "
                                          "yes or no only.")
    digests = {k: hashlib.sha256(v.encode()).hexdigest()[:16] for k, v in lme.PROMPTS.items()}
    assert digests == PROMPT_DIGESTS, "a prompt changed: LongMemEval numbers are comparable only under its exact text"


@pytest.mark.parametrize(("rid", "qtype", "abstention", "kind"), [
    ("q1", "single-session-user", None, "default"),
    ("q2", "single-session-assistant", None, "default"),
    ("q3", "multi-session", None, "default"),
    ("q4", "temporal-reasoning", None, "temporal-reasoning"),
    ("q5", "knowledge-update", None, "knowledge-update"),
    ("q6", "single-session-preference", None, "single-session-preference"),
    ("q7_abs", "temporal-reasoning", None, "abstention"),
    ("gpt4_q8_abs", "multi-session", None, "abstention"),
    ("q9_abs", "knowledge-update", False, "abstention"),  # the id decides, not the flag ...
    ("q10", "multi-session", True, "default"),  # ... nor the type: a flagged record without _abs keeps its type's
])
def test_prompt_routing_per_type_and_abstention_by_id(rid, qtype, abstention, kind):
    backend = Recorder()
    judge = lme.LongMemEvalJudge(backend)
    record = rec(rid, qtype, answer="You did not mention it." if "_abs" in rid else "Biscuit", abstention=abstention)
    verdict = judge.judge(record, "The answer is Biscuit.")
    assert backend.calls == [("", lme.PROMPTS[kind].format(question=record.question, answer=record.answers[0],
                                                           response="The answer is Biscuit."))]
    assert lme.prompt_kind(record) == kind
    assert verdict.scores() == {"judge_lme": 1.0, "judge_lme_failed": 0.0}


def test_reference_is_the_files_answer_as_the_script_formats_it():
    assert lme.reference_text(rec("q1", "temporal-reasoning", answer="3", raw=3)) == "3"
    assert lme.reference_text(rec("q1", "temporal-reasoning", answer="4", raw=4.0)) == "4.0"  # str(4.0), as upstream
    assert lme.reference_text({"question": "Q?", "answers": ["Rex", "T. Rex"],
                               "question_type": "multi-session"}) == "Rex"
    mapping = {"question_id": "x_abs", "question": "Q?", "references": ["none"], "question_type": "multi-session"}
    assert lme.prompt_kind(mapping) == "abstention"


@pytest.mark.parametrize(("reply", "verdict"), [
    ("Yes.", True), ("yes", True), ("YES", True), (" Yes, the response is correct", True),
    ("no", False), ("No.", False), ("", False), ("The response is correct.", False),
    # the benchmark's quirk, kept: a substring test, so these count as yes
    ("eyes", True), ("No, not yes.", True), ("noyes", True),
])
def test_verdict_is_yes_in_the_lowercased_reply(reply, verdict):
    assert lme.parse_verdict(reply) is verdict
    result = lme.LongMemEvalJudge(Recorder(reply)).judge(rec("q1", "multi-session"), "Biscuit")
    assert result.correct is verdict and not result.failed  # every reply is a verdict


# ------------------------------------------------------------------------------------------------ backends

def test_one_user_message_ten_tokens_temperature_zero_over_http(monkeypatch):
    sent = []

    def post(url, body, headers, timeout, deadline_at, max_reply_bytes):
        sent.append(json.loads(body))
        return json.dumps({"choices": [{"message": {"content": "Yes"}}]}).encode()

    monkeypatch.setattr(transport, "post", post)
    backend = memory.OpenAIBackend("http://127.0.0.1:9/v1", "judge-model", max_tokens=lme.MAX_NEW_TOKENS)
    verdict = lme.LongMemEvalJudge(backend).judge(rec("q1", "knowledge-update"), "Biscuit")
    prompt = lme.build_prompt(rec("q1", "knowledge-update"), "Biscuit")
    assert verdict.correct is True
    assert sent == [{"model": "judge-model", "temperature": 0, "max_tokens": 10,
                     "messages": [{"role": "user", "content": prompt}]}]
    memory.Judge(backend).judge({"question": "Q?", "answers": ["A"]}, "A")  # memory_judge_v1 keeps its system prompt
    assert [m["role"] for m in sent[1]["messages"]] == ["system", "user"]


def test_one_user_message_greedy_through_the_local_backend():
    torch = pytest.importorskip("torch")

    class Tokenizer:  # one token per character; records the messages the chat template receives
        pad_token_id, eos_token_id, chat_template, all_special_tokens = 0, 0, "fake", []

        def __init__(self):
            self.messages = []

        def apply_chat_template(self, messages, **kwargs):
            self.messages.append(messages)
            text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
            if kwargs.get("tokenize") is False:
                return text
            ids = torch.tensor([[ord(c) for c in text]])
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)} if kwargs.get("return_dict") else ids

        def __call__(self, text, **kwargs):
            return {"input_ids": [ord(c) for c in text], "offset_mapping": [(i, i + 1) for i in range(len(text))]}

        def decode(self, ids, skip_special_tokens=True):
            return "Yes."

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.generated = []

        def generate(self, input_ids, **kwargs):
            self.generated.append(kwargs | {"text": "".join(map(chr, input_ids[0].tolist()))})
            return torch.cat([input_ids, torch.tensor([[7]])], dim=1)

    tokenizer, model = Tokenizer(), Model()
    backend = memory.HFBackend(model, tokenizer, model_id="fake-local", max_tokens=lme.MAX_NEW_TOKENS)
    verdict = lme.LongMemEvalJudge(backend).judge(rec("q1_abs", "multi-session"), "I don't know.")
    assert verdict.correct is True
    assert len(tokenizer.messages) == 1 and [m["role"] for m in tokenizer.messages[0]] == ["user"]  # no system turn
    prompt = lme.build_prompt(rec("q1_abs", "multi-session"), "I don't know.")
    assert model.generated[0]["text"] == f"<user>{prompt}<assistant>"  # the prompt, alone in one user turn
    assert model.generated[0]["max_new_tokens"] == 10 and model.generated[0]["do_sample"] is False


def test_a_backend_failure_is_a_failed_verdict_never_cached(tmp_path):
    class Down(Recorder):
        def complete(self, system, user):
            raise memory.JudgeBackendError("connection refused")

    path = tmp_path / "cache.jsonl"
    judge = lme.LongMemEvalJudge(Down(), cache_path=path, on_backend_error="record")
    verdict = judge.judge(rec("q", "multi-session"), "x")
    assert verdict.failed and verdict.error.startswith("backend error")
    scores = verdict.scores()
    assert math.isnan(scores["judge_lme"]) and scores["judge_lme_failed"] == 1.0
    assert not path.exists() or path.read_text() == ""
    with pytest.raises(memory.JudgeBackendError):
        lme.LongMemEvalJudge(Down()).judge(rec("q", "multi-session"), "x")


# ------------------------------------------------------------------------------------------------ cache

def test_the_two_templates_never_share_a_cached_verdict(tmp_path):
    path = tmp_path / "judge_cache.jsonl"  # one file on purpose: the keys alone keep them apart
    record = rec("q1", "multi-session")
    first = memory.Judge(Recorder('{"correct": true}'), cache_path=path).judge(record, "Biscuit")
    official = Recorder("No")
    verdict = lme.LongMemEvalJudge(official, cache_path=path).judge(record, "Biscuit")
    assert first.correct is True and verdict.correct is False and len(official.calls) == 1
    assert first.key != verdict.key
    # fresh judges over the same file: each template finds its own verdict, and no call is made
    again_memory, again_official = Recorder("unused"), Recorder("unused")
    assert memory.Judge(again_memory, cache_path=path).judge(record, "Biscuit").correct is True
    cached = lme.LongMemEvalJudge(again_official, cache_path=path).judge(record, "Biscuit")
    assert cached.cached and cached.correct is False and not again_memory.calls and not again_official.calls
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(line["template"] for line in lines) == ["longmemeval", "memory_judge_v1"]
    prompt = lme.build_prompt(record, "Biscuit")
    assert lme.cache_key(prompt, "m") != lme.cache_key(prompt, "m", {"max_tokens": 11}) != lme.cache_key(prompt, "n")


def test_an_empty_reply_is_a_cached_no():
    backend = Recorder("")
    judge = lme.LongMemEvalJudge(backend)
    assert judge.judge(rec("q", "multi-session"), "x").correct is False
    assert judge.judge(rec("q", "multi-session"), "x").cached and len(backend.calls) == 1


# ------------------------------------------------------------------------------------------------ refusals

def test_an_unknown_template_is_refused_before_any_call(tmp_path):
    backend = Recorder()
    with pytest.raises(RelaylensError, match="unknown judge template 'lme'.*Fix: --judge-template memory_judge_v1"):
        lme.check_template("lme")
    with pytest.raises(RelaylensError, match="unknown judge template 'gpt4'"):
        check_config(RunConfig(judge_template="gpt4"))
    with pytest.raises(RelaylensError, match="unknown judge template"):
        make_judge(RunConfig(judge_url="http://127.0.0.1:9/v1", judge_model="m", judge_template="official"), tmp_path)
    with pytest.raises(RelaylensError, match="unknown judge template"):
        rejudge_run(tmp_path / "no_run", backend, "x", template="official")
    assert not backend.calls and not list(tmp_path.iterdir())


def test_the_command_line_refuses_an_unknown_template_before_loading_a_judge(tmp_path):
    from typer.testing import CliRunner

    from relaylens.cli import app

    result = CliRunner().invoke(app, ["judge", str(tmp_path), "--judge-model", "no-such-model", "--judge-template",
                                      "official"], env={"COLUMNS": "200", "HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 2 and "unknown judge template 'official'" in result.output
    result = CliRunner().invoke(app, ["judge", str(tmp_path), "--judge-model", "no-such-model", "--name", "lme_x"],
                                env={"COLUMNS": "200", "HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 2 and "reserved for --judge-template longmemeval" in result.output


@pytest.mark.parametrize("record", [
    rec("longbook_choice_eng_0", "longbook_choice_eng", source="infinitebench"),
    rec("hb_summ_3", "summarization", source="hellobench"),
    rec("conv1_q0", "long-mt-bench+", source="longmtbench"),
    rec("q1_abs", "abstention"),  # LongMemEval has no such type: abstention keeps its base type
], ids=["infinitebench", "summarization", "longmtbench", "type-abstention"])
def test_records_without_longmemeval_types_are_refused_before_any_call(record, tmp_path):
    backend = Recorder()
    with pytest.raises(RelaylensError) as err:
        lme.LongMemEvalJudge(backend).judge(record, "an answer")
    message = str(err.value)
    assert repr(record.record_id) in message and record.source in message and repr(record.question_type) in message
    assert "Fix: judge this dataset with --judge-template memory_judge_v1" in message
    with pytest.raises(RelaylensError, match=record.record_id):
        make_judge(RunConfig(judge_url="http://127.0.0.1:9/v1", judge_model="m", judge_template="longmemeval"),
                   tmp_path, records=[rec("ok", "multi-session"), record])
    assert not backend.calls and not list(tmp_path.iterdir())


def test_a_whole_dataset_is_checked_and_the_first_refused_record_named(tmp_path):
    infinite = load_records(FIXTURES / "longbook_choice_eng.jsonl")
    with pytest.raises(RelaylensError, match=rf"record '{infinite[0].record_id}' \(infinitebench\).*"
                                             rf"and so have {len(infinite) - 1} more record"):
        lme.check_records(infinite)
    lme.check_records(load_records(FIXTURES / "longmemeval_small.json"))  # LongMemEval itself passes
    from relaylens.experiments.specs import load_analysis

    spec = load_analysis("main_table").spec
    config = RunConfig(data=str(FIXTURES / "longbook_choice_eng.jsonl"), judge_model="no-such-model",
                       judge_template="longmemeval")
    with pytest.raises(RelaylensError, match="judge template longmemeval: record"):
        check_judge_records(spec, config)  # `relaylens run`: before the model loads
    check_judge_records(spec, RunConfig(data=config.data, judge_model="m"))  # memory_judge_v1: nothing to check
    check_judge_records(spec, RunConfig(data=config.data, judge_template="longmemeval"))  # no judge: nothing to check
    from typer.testing import CliRunner

    from relaylens.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "main_table", "--data", config.data, "--judge-model", "no-such-model",
                                      "--judge-template", "longmemeval", "--out", str(out)],
                                env={"COLUMNS": "200", "HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 2 and "judge template longmemeval: record 'longbook_choice_eng_0'" in result.output
    assert not out.exists()  # refused before the model loads and before the run directory is made


# ------------------------------------------------------------------------------------------------ wiring

def test_a_run_judge_is_built_per_template(tmp_path):
    url = "http://127.0.0.1:9/v1"
    official = make_judge(RunConfig(judge_url=url, judge_model="m", judge_template="longmemeval"), tmp_path)
    assert isinstance(official, lme.LongMemEvalJudge) and official.metric == "judge_lme"
    assert official.backend.max_tokens == 10 and official.cache.path == tmp_path / "judge_cache_lme.jsonl"
    default = make_judge(RunConfig(judge_url=url, judge_model="m"), tmp_path)  # unchanged: 32 tokens, same model id
    assert default.memory.backend.max_tokens == 32 and default.memory.backend.model_id == "m"
    with pytest.raises(RelaylensError, match="stub judges summaries by checklist only"):
        make_judge(RunConfig(judge_model="stub", judge_template="longmemeval"), tmp_path)


def test_judge_names_keep_the_two_templates_apart():
    assert lme.pass_name("longmemeval", "q15") == "lme_q15" and lme.pass_name("longmemeval", "lme_q15") == "lme_q15"
    assert lme.pass_name("memory_judge_v1", "q15") == "q15"
    for name in ("lme", "lme_q15"):
        with pytest.raises(RelaylensError, match="reserved for --judge-template longmemeval"):
            lme.pass_name("memory_judge_v1", name)


def test_the_template_is_in_the_manifest_and_older_runs_resume():
    old = {"config": {"run": {"judge_model": None}}}  # a manifest written before the template was recorded
    assert manifest_diff(old, {"config": {"run": {"judge_model": None, "judge_template": "memory_judge_v1"}}}) == []
    assert manifest_diff(old, {"config": {"run": {"judge_model": None, "judge_template": "longmemeval"}}}) == [
        "config.run.judge_template"]
    assert "judge_template" in vars(RunConfig())
