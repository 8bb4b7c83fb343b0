"""S-like haystacks from an oracle-shaped fixture written here: determinism, evidence kept in order with its dates,
no filler mentioning the answer, the target reached within one session and never exceeded, both gold masks."""

from __future__ import annotations

import gzip
import json
import random
import re

import pytest
from typer.testing import CliRunner

from relaylens.cli import app
from relaylens.datasets import load_records
from relaylens.datasets.haystack import FILLER_PREFIX, build_haystacks, write_haystacks
from relaylens.datasets.prompting import layout_prompt, render_prompt
from relaylens.datasets.records import Record
from relaylens.errors import RecordError
from relaylens.testing import tiny_tokenizer

WORDS = ("garden kettle bicycle violin harbour lantern pepper meadow copper river window ladder compass saddle "
         "orchard pillow marble thunder velvet candle").split()
TARGET = 1500  # tiny_tokenizer tokens (about one per byte); the CLI test counts approximately
CLI_TARGET = 500
PLANTED = "marigold"  # q03's answer; one of q07's sessions mentions it


def _session(rng: random.Random, topic: str, has_answer: bool, extra: str = "") -> list[dict]:
    turns = []
    for k in range(rng.randint(2, 4)):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14)))
        turns.append({"role": "user" if k % 2 == 0 else "assistant", "content": f"About {topic}: {text}.",
                      **({"has_answer": has_answer and k == 0} if k % 2 == 0 else {})})
    if extra:
        turns[-1]["content"] += " " + extra
    return turns


def _oracle(n: int = 14, seed: int = 5) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for q in range(n):
        qid = f"q{q:02d}" + ("_abs" if q == 13 else "")
        k = 1 + q % 3
        ids = [f"answer_{q:02d}ab{j}" for j in range(k)]
        answer = PLANTED if q == 3 else (4 if q == 5 else f"Answer{q}")
        sessions = [_session(rng, f"topic{q}", q != 13, PLANTED.upper() + " seeds" if q == 7 and j == 0 else "")
                    for j in range(k)]
        dates = [f"2023/0{1 + q % 8}/{10 + 3 * j:02d} (Mon) 1{j}:00" for j in range(k)]
        rng.shuffle(order := list(range(k)))  # the oracle lists evidence unsorted
        out.append({"question_id": qid, "question_type": "multi-session", "question": f"What about topic{q}?",
                    "answer": answer, "question_date": f"2023/0{1 + q % 8}/28 (Fri) 09:00",
                    "haystack_session_ids": [ids[i] for i in order], "haystack_dates": [dates[i] for i in order],
                    "haystack_sessions": [sessions[i] for i in order], "answer_session_ids": list(ids)})
    big = out[0]  # one question whose evidence alone is too long for the target
    big["haystack_sessions"][0] = [{"role": "user", "content": "About it: " + " ".join(WORDS * 40), "has_answer": True}]
    return out


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def oracle():
    return _oracle()


@pytest.fixture(scope="module")
def built(oracle, tok):
    return build_haystacks(oracle, tokens=TARGET, seed=3, tokenizer=tok)


def count(tok, text: str) -> int:
    return len(tok(text, add_special_tokens=False)["input_ids"])


def history_tokens(tok, rec: dict) -> int:
    from relaylens.datasets.longmemeval import parse_record

    return count(tok, layout_prompt(parse_record(rec, "<t>", "t"), "completion").history_text)


def test_same_seed_same_bytes_other_seed_differs(oracle, tok, built, tmp_path):
    again = build_haystacks(oracle, tokens=TARGET, seed=3, tokenizer=tok)
    a, b = write_haystacks(built, tmp_path / "a.json"), write_haystacks(again, tmp_path / "b.json")
    assert a.read_bytes() == b.read_bytes()
    za, zb = write_haystacks(built, tmp_path / "a.json.gz"), write_haystacks(again, tmp_path / "b.json.gz")
    assert za.read_bytes() == zb.read_bytes() and gzip.decompress(za.read_bytes()) == a.read_bytes()
    other = build_haystacks(oracle, tokens=TARGET, seed=4, tokenizer=tok)
    assert write_haystacks(other, tmp_path / "c.json").read_bytes() != a.read_bytes()


def test_evidence_sessions_kept_in_order_with_their_dates_and_turns(oracle, built):
    by_id = {r["question_id"]: r for r in oracle}
    assert len(built.records) >= 10
    for rec in built.records:
        src = by_id[rec["question_id"]]
        own = sorted(zip(src["haystack_dates"], src["haystack_session_ids"], src["haystack_sessions"]))
        ev = [(d, s, t) for d, s, t in zip(rec["haystack_dates"], rec["haystack_session_ids"],
                                           rec["haystack_sessions"]) if s in src["answer_session_ids"]]
        assert ev == own  # same sessions, same dates, same turns (has_answer kept), in date order
        assert rec["answer_session_ids"] == src["answer_session_ids"] and rec["answer"] == src["answer"]
        assert rec["haystack_dates"] == sorted(rec["haystack_dates"])  # file order is prompt order
        fillers = [s for s in rec["haystack_session_ids"] if s not in src["answer_session_ids"]]
        assert fillers and all(s.startswith(FILLER_PREFIX) and "answer" not in s for s in fillers)
        first = rec["haystack_session_ids"].index(own[0][1])
        assert rec["haystack_session_ids"][first:first + len(own)] == [s for _, s, _ in own]  # one block
        assert all(d <= rec["question_date"] for d in rec["haystack_dates"])


def test_fillers_come_from_other_questions_without_labels(oracle, built):
    owner = {s: r["question_id"] for r in oracle for s in r["haystack_session_ids"]}
    for rec in built.records:
        for sid, turns in zip(rec["haystack_session_ids"], rec["haystack_sessions"]):
            if sid.startswith(FILLER_PREFIX):
                assert owner["answer_" + sid.removeprefix(FILLER_PREFIX)] != rec["question_id"]
                assert all(set(t) == {"role", "content"} for t in turns)


def test_no_filler_mentions_the_answer(oracle, built, tok):
    planted = "answer_07ab0"
    for rec in built.records:
        answer = str(rec["answer"]).lower()
        for sid, turns in zip(rec["haystack_session_ids"], rec["haystack_sessions"]):
            if sid.startswith(FILLER_PREFIX):
                text = " ".join(t["content"] for t in turns).lower()
                assert not re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", text), (rec["question_id"], sid)
    q03 = next(r for r in built.records if r["question_id"] == "q03")
    assert FILLER_PREFIX + planted.removeprefix("answer_") not in q03["haystack_session_ids"]
    # the planted session is drawn for other questions, and for q03 when its answer is something else
    drawn = {s for r in built.records for s in r["haystack_session_ids"]}
    assert FILLER_PREFIX + "07ab0" in drawn
    many = [build_haystacks(_oracle(), tokens=TARGET, seed=s, tokenizer=tok, question_ids=["q03"]).records[0]
            for s in range(6)]
    assert all(FILLER_PREFIX + "07ab0" not in r["haystack_session_ids"] for r in many)


def test_target_reached_within_one_session_and_never_exceeded(oracle, built, tok):
    costs = []
    for src in oracle:
        for sid, date, turns in zip(src["haystack_session_ids"], src["haystack_dates"], src["haystack_sessions"]):
            one = dict(src, haystack_session_ids=[sid], haystack_dates=[date], haystack_sessions=[turns],
                       answer_session_ids=[])
            none = dict(src, haystack_session_ids=[], haystack_dates=[], haystack_sessions=[], answer_session_ids=[])
            costs.append(history_tokens(tok, one) - history_tokens(tok, none))
    for rec in built.records:
        total = history_tokens(tok, rec)
        assert total == rec["relaylens_haystack"]["history_tokens"]
        assert TARGET - max(costs) < total <= TARGET, (rec["question_id"], total)


def test_both_gold_masks_reach_the_rendered_prompt(built, tok, tmp_path):
    path = write_haystacks(built, tmp_path / "h.json")
    records = load_records(path)  # the LongMemEval reader reads the output as is
    assert [r.record_id for r in records] == [r["question_id"] for r in built.records]
    for rec, raw in zip(records, built.records):
        assert isinstance(rec, Record) and rec.meta["relaylens_haystack"]["seed"] == 3
        prompt = render_prompt(rec, tok, mode="completion")
        turn_mask, session_mask = prompt.evidence_mask("turn"), prompt.evidence_mask("session")
        gold_turns = [s for s in prompt.turns if s.is_evidence]
        assert len(gold_turns) == sum(t.get("has_answer", False) for s in raw["haystack_sessions"] for t in s)
        expected = turn_mask.clone().zero_()
        for span in gold_turns:
            assert span.session_id in raw["answer_session_ids"]
            expected[span.start:span.end] = True
        assert turn_mask.equal(expected)
        gold_sessions = {s.session_id for s in prompt.sessions if s.is_evidence}
        assert gold_sessions == set(raw["answer_session_ids"])
        assert session_mask.sum() > turn_mask.sum() >= (0 if rec.is_abstention else 1)
        assert not session_mask[turn_mask.logical_not()].all()  # fillers are outside the session mask
        assert (turn_mask & ~session_mask).sum() == 0


def test_depth_is_seeded_spread_and_recorded(built, tok):
    meta = [r["relaylens_haystack"] for r in built.records]
    assert all(0 <= m["target_depth"] <= 1 and 0 <= m["evidence_depth"] < m["evidence_end_depth"] <= 1 for m in meta)
    assert len({m["target_depth"] for m in meta}) == len(meta)
    assert min(m["evidence_depth"] for m in meta) < 0.2 and max(m["evidence_end_depth"] for m in meta) > 0.8
    for rec, m in zip(built.records, meta):  # the recorded depth is where the block starts, in history tokens
        text = layout_prompt(load_records_from(rec), "completion").history_text
        first = text.index("### Session " + str(1 + rec["haystack_session_ids"].index(
            next(s for s in rec["haystack_session_ids"] if s in rec["answer_session_ids"])))) - 1
        assert abs(count(tok, text[:first]) / m["history_tokens"] - m["evidence_depth"]) < 0.01


def load_records_from(rec: dict):
    from relaylens.datasets.longmemeval import parse_record

    return parse_record(rec, "<t>", "t")


def test_questions_that_do_not_fit_are_counted_or_refused_by_name(oracle, built, tok):
    assert [q for q, _ in built.left_out] == ["q00"] and built.left_out[0][1] > 0.9 * TARGET
    assert len(built.records) == len(oracle) - 1 and "1 left out" in built.summary()
    with pytest.raises(RecordError, match=r"question 'q00'.*alone take \d+ tokens.*Fix: ask for at least"):
        build_haystacks(oracle, tokens=TARGET, seed=3, tokenizer=tok, question_ids=["q00"])
    with pytest.raises(RecordError, match="'nope' is not in"):
        build_haystacks(oracle, tokens=TARGET, seed=3, tokenizer=tok, question_ids=["nope"])
    with pytest.raises(ValueError, match="positive integer"):
        build_haystacks(oracle, tokens=0)


def test_numeric_answers_and_the_approximate_counter(oracle):
    rec = build_haystacks(oracle, tokens=TARGET, seed=1, question_ids=["q05"]).records[0]
    assert rec["answer"] == 4 and rec["relaylens_haystack"]["history_tokens"] <= TARGET


def test_cli_builds_from_an_oracle_file(oracle, tmp_path):
    src = tmp_path / "oracle.json"
    src.write_text(json.dumps(oracle))
    out = tmp_path / "hay.json.gz"
    args = ["data", "haystack", "--tokens", str(CLI_TARGET), "--seed", "2", "--oracle", str(src), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "13 of 14 questions built" in result.output and len(json.loads(gzip.decompress(out.read_bytes()))) == 13
    first = out.read_bytes()
    assert CliRunner().invoke(app, args).exit_code == 0 and out.read_bytes() == first
    bad = CliRunner().invoke(app, args[:-4] + ["--question-id", "q00", "--oracle", str(src), "--out", str(out)])
    assert bad.exit_code == 2 and "q00" in bad.output


def test_a_second_length_on_the_same_questions(oracle, tmp_path):
    """--questions-from: the questions of a built file, in its order, at another target; each must fit."""
    src = tmp_path / "oracle.json"
    src.write_text(json.dumps(oracle))
    short = tmp_path / "short.json.gz"
    args = ["data", "haystack", "--seed", "2", "--oracle", str(src)]
    assert CliRunner().invoke(app, [*args, "--tokens", str(CLI_TARGET), "--out", str(short)]).exit_code == 0
    kept = [r["question_id"] for r in json.loads(gzip.decompress(short.read_bytes()))]
    subset = tmp_path / "subset.json"
    subset.write_text(json.dumps([{"question_id": q} for q in kept[::-2]]))  # another order, half the questions
    longer = tmp_path / "long.json"
    result = CliRunner().invoke(app, [*args, "--tokens", str(2 * CLI_TARGET), "--questions-from", str(subset),
                                      "--out", str(longer)])
    assert result.exit_code == 0, result.output
    built = json.loads(longer.read_text())
    assert [r["question_id"] for r in built] == kept[::-2]
    assert all(r["relaylens_haystack"]["target_tokens"] == 2 * CLI_TARGET for r in built)
    everything = tmp_path / "all.json"
    everything.write_text(json.dumps(oracle))  # q00 does not fit: refused by name, nothing written
    bad = CliRunner().invoke(app, [*args, "--tokens", str(CLI_TARGET), "--questions-from", str(everything),
                                   "--out", str(tmp_path / "none.json")])
    assert bad.exit_code == 2 and "q00" in bad.output and not (tmp_path / "none.json").exists()
    nameless = tmp_path / "nameless.json"
    nameless.write_text(json.dumps([{"question": "?"}]))
    bad = CliRunner().invoke(app, [*args, "--tokens", str(CLI_TARGET), "--questions-from", str(nameless),
                                   "--out", str(tmp_path / "none.json")])
    assert bad.exit_code == 2 and "record 0 has no question_id" in bad.output
    with pytest.raises(RecordError, match="'q01' is asked for twice"):
        build_haystacks(oracle, tokens=CLI_TARGET, seed=2, question_ids=["q01", "q02", "q01"])


def test_an_estimate_that_overshoots_is_corrected_by_the_exact_count(oracle):
    """A counter whose counts grow faster than the text (session costs then under-estimate the whole history) still
    never exceeds the target: the finished history is counted once and fillers are dropped until it fits."""

    def superlinear(text: str) -> int:
        return len(text) // 4 + len(text) ** 2 // 40_000

    from relaylens.datasets.longmemeval import parse_record

    build = build_haystacks(oracle, tokens=2000, seed=0, tokenizer=superlinear)
    assert len(build.records) >= 5
    for rec in build.records:
        total = superlinear(layout_prompt(parse_record(rec, "<t>", "t"), "completion").history_text)
        assert total == rec["relaylens_haystack"]["history_tokens"] <= 2000


def test_a_question_whose_answer_nearly_every_session_mentions_is_left_out_not_built_short(tok):
    oracle = _oracle()
    oracle[4]["answer"] = "About"  # every fixture turn starts "About topicN:": no answer-free filler remains
    build = build_haystacks(oracle, tokens=TARGET, seed=3, tokenizer=tok)
    assert [q for q, _ in build.underfilled] == ["q04"] and build.underfilled[0][1] < TARGET
    assert "q04" not in {r["question_id"] for r in build.records} and "1 left out (too few" in build.summary()
    with pytest.raises(RecordError, match=r"question 'q04': only \d+ of 1500 .*'About' unmentioned"):
        build_haystacks(oracle, tokens=TARGET, seed=3, tokenizer=tok, question_ids=["q04"])
