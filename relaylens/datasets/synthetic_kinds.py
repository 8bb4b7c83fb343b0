"""World state and question kinds of the synthetic generator: facts, queries, and one builder per question type.

Every generated turn lists the :class:`Fact` s its text states. A question is a :class:`Query` over facts, and the
reference answer is ``resolve(query, sessions, question_date)`` over the whole history -- never typed by hand.
Evidence sessions state the queried facts; filler sessions carry same-category distractors that resolve to nothing
(facts about other people, things considered but not done, past values), so no single filler session answers.

Example:
    >>> from datetime import datetime
    >>> d = datetime(2023, 5, 1)
    >>> facts = [(d, [Fact("user", "bought:mugs", 2)]), (d, [Fact("user", "bought:mugs", 3)])]
    >>> resolve(Query("sum", ("bought:mugs",)), facts, d)
    5
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, Sequence

from relaylens.datasets import synthetic_text as tx
from relaylens.datasets.synthetic_text import DraftTurn

KINDS = ("single-session-user", "single-session-assistant", "single-session-preference", "multi-session",
         "knowledge-update", "temporal-reasoning", "abstention")
ABSTENTION_BASES = ("single-session-user", "multi-session", "knowledge-update", "temporal-reasoning")


@dataclass(frozen=True)
class Fact:
    """One statement a turn makes. ``subject`` is ``"user"`` (the user's own life or what they were told) or
    ``"other"`` (someone else: a distractor)."""

    subject: str
    slot: str
    value: str | int


@dataclass(frozen=True)
class Query:
    """``op`` over the user's facts in ``slots``: ``lookup``, ``sum``, ``latest``, ``days_ago``, ``days_between``,
    ``first_of`` or ``absent`` (abstention: nothing answers it)."""

    op: str
    slots: tuple[str, ...]


def resolve(query: Query, sessions: Sequence[tuple[datetime, Iterable[Fact]]], question_date: datetime):
    """The answer ``query`` has given ``(session date, facts)`` pairs, or ``None`` when they do not determine it."""
    found = [[(date, f.value) for date, facts in sessions for f in facts if f.subject == "user" and f.slot == slot]
             for slot in query.slots]
    if query.op == "absent" or not all(found):
        return None
    hits = found[0]
    if query.op == "lookup":
        values = {v for _, v in hits}
        return values.pop() if len(values) == 1 else None
    if query.op == "sum":
        return sum(v for _, v in hits)
    if query.op == "latest":
        last = max(d for d, _ in hits)
        values = {v for d, v in hits if d == last}
        return values.pop() if len(values) == 1 else None
    if any(len(h) != 1 for h in found):
        return None
    if query.op == "days_ago":
        return (question_date.date() - hits[0][0].date()).days
    (da, va), (db, vb) = found[0][0], found[1][0]
    if query.op == "days_between":
        return abs((db.date() - da.date()).days)
    if query.op == "first_of":
        return None if da == db else (va if da < db else vb)
    raise ValueError(f"unknown query op {query.op!r}")


@dataclass
class Plan:
    """What a question kind contributes to one record (the generator adds filler, ids and dates)."""

    question_type: str
    question: str
    query: Query
    evidence: list[list[DraftTurn]]  # evidence sessions, chronological
    distractors: list[tuple[str, tuple[Fact, ...]]] = field(default_factory=list)  # user sentences for filler
    distractor_sessions: list[list[DraftTurn]] = field(default_factory=list)  # whole filler sessions
    banned: tuple[str, ...] = ()  # words that must occur nowhere (abstention near-miss)
    answer_format: str = "{value}"
    abstention_answer: str | None = None
    template: str = ""


def _others(rng, pool, exclude, k):
    return rng.sample([p for p in pool if p not in exclude], k)


def fact_session(rng, fact_turn: DraftTurn, reply: DraftTurn | None = None, banned=()) -> list[DraftTurn]:
    """An evidence session: 1-2 generic exchanges plus the fact exchange at a random position."""
    topic = rng.choice([t for t in tx.TOPICS if not tx.words_in(t, banned)])
    exchanges = []
    for k in range(rng.randint(1, 2)):
        pool = tx.USER_OPENERS if k == 0 else tx.USER_FOLLOWUPS
        ask = rng.choice([p for p in pool if not tx.words_in(p, banned)]).format(topic=topic)
        exchanges.append([DraftTurn("user", ask, has_answer=False),
                          tx.assistant_filler_turn(rng, topic, rng.randint(2, 4), banned)])
    if reply is None:
        reply = DraftTurn("assistant", rng.choice(tx.ACKS) + " " + " ".join(tx.advice_sentences(rng, topic, 1, banned)))
    exchanges.insert(rng.randint(0, len(exchanges)), [fact_turn, reply])
    return [t for ex in exchanges for t in ex]


def user_fact(sentence: str, *facts: Fact) -> DraftTurn:
    return DraftTurn("user", sentence, tuple(facts), has_answer=True)


def single_session_user(rng, abstain: bool) -> Plan:
    t = rng.randrange(5)
    rel2 = rng.choice(tx.RELATIVES)
    rels = _others(rng, tx.RELATIVES, {rel2}, 2)
    if t == 0:
        species, species2 = rng.sample(tx.SPECIES, 2)
        value, *others = rng.sample(tx.PET_NAMES, 3)
        slot = f"pet_name:{species}"
        sentence = f"I adopted a {species} a few weeks ago and we named it {value}."
        question = f"What is the name of my {species}?"
        dis = [(f"My neighbor's {species} is called {o}, and it is adorable.",
                (Fact("other", slot, o),)) for o in others]
        abs_q, banned, missing = f"What is the name of my {species2}?", (species2,), f"a {species2} (only a {species})"
    else:
        pool, slot, say, ask, other_say, abs_ask = {
            1: (tx.CITIES, "hometown", "I grew up in {v}, so I'm used to its weather.", "Which city did I grow up in?",
                "My {r} grew up in {v}.", "Which city did my {r} grow up in?"),
            2: (tx.INSTRUMENTS, "instrument", "I've started taking {v} lessons on Thursday evenings.",
                "Which instrument am I taking lessons for?", "My {r} plays the {v} in a community band.",
                "Which instrument does my {r} play?"),
            3: (tx.DRINKS, "coffee_order", "My usual coffee order these days is a {v}.",
                "What is my usual coffee order?",
                "My {r} always orders a {v}.", "What is my {r}'s usual coffee order?"),
            4: (tx.CAR_BRANDS, "car_brand", "I finally bought a used {v} last month.", "What brand of car did I buy?",
                "My {r} drives a {v}.", "What brand of car did my {r} buy?"),
        }[t]
        value, *others = rng.sample(pool, 3)
        sentence, question = say.format(v=value), ask
        dis = [(other_say.format(r=r, v=o), (Fact("other", slot, o),)) for r, o in zip(rels, others)]
        abs_q, banned, missing = abs_ask.format(r=rel2), (rel2,), f"your {rel2}"
    plan = Plan("single-session-user", question, Query("lookup", (slot,)),
                [fact_session(rng, user_fact(sentence, Fact("user", slot, value)), banned=banned)],
                dis, template=slot.split(":")[0])
    return _abstain(plan, abs_q, banned, missing) if abstain else plan


def single_session_assistant(rng, abstain: bool = False) -> Plan:
    cat, ctx_pool, ask, question = rng.choice((
        ("restaurant", tx.CITIES, "I'm visiting {c} next month. Could you recommend a few restaurants there?",
         "I asked you for restaurant recommendations for my trip to {c}. What was the {o} restaurant you suggested?"),
        ("trail", tx.CITIES, "I want to go hiking near {c}. Which trails would you suggest?",
         "You suggested some hiking trails near {c}. What was the {o} trail on your list?"),
        ("podcast", ("gardening", "astronomy", "personal finance", "architecture", "birdwatching", "ancient history",
                     "cooking", "psychology"), "Can you recommend some podcasts about {c}?",
         "What was the {o} podcast you recommended about {c}?"),
    ))
    k = rng.randrange(4)

    def items(n):
        if cat == "restaurant":
            return [f"The {a} {b}" for a, b in zip(rng.sample(tx.ADJECTIVES, n), rng.sample(tx.NOUNS, n))]
        if cat == "trail":
            return [f"{a} {b} Trail" for a, b in zip(rng.sample(tx.SURNAMES, n), rng.choices(tx.TRAIL_FEATURES, k=n))]
        return [f"The {a} {b} Show" for a, b in zip(rng.sample(tx.ADJECTIVES, n), rng.sample(tx.NOUNS, n))]

    def listing(ctx, names):
        lines = "\n".join(f"{i + 1}. {n}" for i, n in enumerate(names))
        reply = f"Of course! Here are a few {cat}s I'd suggest for {ctx}:\n{lines}\nEnjoy!"
        return DraftTurn("assistant", reply,
                         tuple(Fact("user", f"recommended:{cat}:{ctx}:{i}", n) for i, n in enumerate(names)))

    ctx, *other_ctx = rng.sample(ctx_pool, 3)
    names = items(4)
    answer_turn = listing(ctx, names)
    answer_turn.has_answer = True
    session = fact_session(rng, DraftTurn("user", ask.format(c=ctx), has_answer=False), answer_turn)
    distractor_sessions = []
    for oc in other_ctx:  # same category, other context, overlapping-looking names
        distractor_sessions.append([DraftTurn("user", ask.format(c=oc)), listing(oc, items(4))])
    return Plan("single-session-assistant", question.format(c=ctx, o=tx.ORDINALS[k]),
                Query("lookup", (f"recommended:{cat}:{ctx}:{k}",)), [session],
                distractor_sessions=distractor_sessions, template=cat)


def single_session_preference(rng, abstain: bool = False) -> Plan:
    cat, pool, say, question, rubric, other_say = rng.choice((
        ("cuisine", tx.CUISINES,
         "I spent all of Sunday cooking {v} dishes again; honestly, {v} food is what I crave most these days.",
         "Can you suggest something I could cook for dinner this weekend?",
         "The user would prefer a {value} recipe, since they love cooking {value} food.",
         "My {r} can't stand {v} food."),
        ("music", tx.MUSIC, "I had {v} playing all day while working; it's pretty much all I listen to lately.",
         "Can you suggest some music for my commute?",
         "The user would prefer {value} suggestions, since it is what they listen to most.",
         "My {r} only listens to {v}."),
        ("activity", ("birdwatching", "trail running", "sketching", "kayaking", "gardening", "baking bread", "cycling",
                      "yoga", "fishing", "rock climbing"),
         "Nothing relaxes me like {v}; I'd do it every weekend if I could.",
         "What should I do this Saturday to unwind?",
         "The user would prefer suggestions involving {value}, which they find relaxing.",
         "My {r} is obsessed with {v}."),
    ))
    value, *others = rng.sample(pool, 3)
    slot = f"preference:{cat}"
    rels = rng.sample(tx.RELATIVES, 2)
    dis = [(other_say.format(r=r, v=o), (Fact("other", slot, o),)) for r, o in zip(rels, others)]
    session = fact_session(rng, user_fact(say.format(v=value), Fact("user", slot, value)))
    return Plan("single-session-preference", question, Query("lookup", (slot,)), [session], dis,
                answer_format=rubric, template=cat)


def multi_session(rng, abstain: bool) -> Plan:
    n_sessions = rng.randint(2, 4)
    rel = rng.choice(tx.RELATIVES)
    if rng.random() < 0.6:
        things, things2 = rng.sample(tx.ITEMS, 2)
        slot = f"bought:{things}"
        say = ("I picked up {n} {t} at {s} today.", "I bought {n} more {t} from {s} this afternoon.",
               "Guess what, I found {n} {t} at {s} today and couldn't resist.")
        counts = [rng.randint(1, 6) for _ in range(n_sessions)]
        evidence = [fact_session(rng,
                                 user_fact(rng.choice(say).format(n=c, t=things, s=rng.choice(tx.SHOPS)),
                                           Fact("user", slot, c)))
                    for c in counts]
        m1, m2 = rng.randint(1, 6), rng.randint(1, 6)
        dis = [(f"I almost bought {m1} {things} at {rng.choice(tx.SHOPS)}, but I decided against it.",
                (Fact("user", f"considered:{things}", m1),)),
               (f"My {rel} bought {m2} {things} last weekend.", (Fact("other", slot, m2),))]
        question, abs_q, banned = (f"How many {things} have I bought in total?",
                                   f"How many {things2} have I bought in total?", (things2,))
    else:
        places = ("animal shelter", "food bank", "community garden", "public library", "soup kitchen")
        slot = "volunteered_hours"
        counts = [rng.randint(1, 6) for _ in range(n_sessions)]
        evidence = [fact_session(rng,
                                 user_fact(f"I volunteered for {c} hours at the {rng.choice(places)} today.",
                                           Fact("user", slot, c)))
                    for c in counts]
        m1, m2 = rng.randint(1, 6), rng.randint(1, 6)
        dis = [(f"I signed up to volunteer for {m1} hours at the {rng.choice(places)} but had to cancel.",
                (Fact("user", "volunteer_cancelled", m1),)),
               (f"My {rel} volunteered {m2} hours at the {rng.choice(places)}.", (Fact("other", slot, m2),))]
        question, abs_q, banned = ("How many hours have I volunteered in total?",
                                   "How many hours have I spent tutoring in total?", ("tutoring",))
        things2 = "tutoring"
    plan = Plan("multi-session", question, Query("sum", (slot,)), evidence, dis, template=slot.split(":")[0])
    return _abstain(plan, abs_q, banned, things2) if abstain else plan


def knowledge_update(rng, abstain: bool) -> Plan:
    rel2 = rng.choice(tx.RELATIVES)
    t = rng.randrange(3)
    if t == 0:
        old, new = [f"{s} {x}" for s, x in zip(rng.sample(tx.SURNAMES, 2), rng.sample(tx.COMPANY_SUFFIXES, 2))]
        slot, say_old, say_new = ("employer", "I've been working at {v} for about two years now.",
                                  "Big news: I just started a new job at {v}!")
        stale, question, abs_q = ("Back when I started at {v}, the commute was brutal.", "Where do I work now?",
                                  f"Where does my {rel2} work now?")
    elif t == 1:
        old, new = rng.sample(tx.CITIES, 2)
        slot, say_old, say_new = ("home_city", "I live in {v} and I love my neighborhood.",
                                  "I finally moved to {v} last week; the boxes are still everywhere.")
        stale, question, abs_q = ("I still miss the bakeries in {v}.", "Which city do I live in now?",
                                  f"Which city does my {rel2} live in now?")
    else:
        old, new = rng.sample(range(1, 8), 2)
        slot, say_old, say_new = ("gym_per_week", "I'm going to the gym {v} times a week at the moment.",
                                  "I've changed my routine and now go to the gym {v} times a week.")
        stale = "When I was going to the gym {v} times a week, I slept much better."
        question, abs_q = ("How many times a week do I go to the gym now?",
                           f"How many times a week does my {rel2} go to the gym?")
    banned = (rel2,) if abstain else ()
    evidence = [fact_session(rng, user_fact(say_old.format(v=old), Fact("user", slot, old)), banned=banned),
                fact_session(rng, user_fact(say_new.format(v=new), Fact("user", slot, new)), banned=banned)]
    dis = [(stale.format(v=old), (Fact("user", f"{slot}_past", old),)) for _ in range(2)]  # the stale value, repeated
    plan = Plan("knowledge-update", question, Query("latest", (slot,)), evidence, dis, template=slot)
    return _abstain(plan, abs_q, banned, f"your {rel2}") if abstain else plan


def temporal_reasoning(rng, abstain: bool) -> Plan:
    events = rng.sample(tx.EVENTS, 5)
    (e1, _), (e2, _), (o1, _), (o2, _), (absent, absent_key) = events
    rel = rng.choice(tx.RELATIVES)
    dis = [(f"My {rel} went to a {o1} recently and loved it.", (Fact("other", f"event:{o1}", o1),)),
           (f"I'm thinking about signing up for a {o2} someday.", (Fact("user", f"plan:{o2}", o2),))]
    say = ("I just got back from the {e}, what a day!", "Today I finally went to the {e}.",
           "I went to the {e} this morning and it was great.")
    t = 0 if abstain else rng.randrange(3)
    n = 1 if t == 0 else 2
    evidence = [fact_session(rng, user_fact(rng.choice(say).format(e=e), Fact("user", f"event:{e}", e)))
                for e in (e1, e2)[:n]]
    if t == 0:
        question, query = f"How many days ago did I go to the {e1}?", Query("days_ago", (f"event:{e1}",))
    elif t == 1:
        question, query = f"How many days passed between the {e1} and the {e2}?", Query("days_between",
                                                                                        (f"event:{e1}", f"event:{e2}"))
    else:
        a, b = rng.sample((e1, e2), 2)
        question, query = f"Which did I do first, the {a} or the {b}?", Query("first_of",
                                                                              (f"event:{e1}", f"event:{e2}"))
    plan = Plan("temporal-reasoning", question, query, evidence, dis, template=query.op)
    if abstain:
        return _abstain(plan, f"How many days ago did I go to the {absent}?", (absent, absent_key), f"a {absent}")
    return plan


def _abstain(plan: Plan, question: str, banned: tuple[str, ...], missing: str) -> Plan:
    plan.question, plan.query, plan.banned = question, Query("absent", plan.query.slots), banned
    plan.abstention_answer = f"The information provided is not enough. You did not mention {missing}."
    return plan


BUILDERS = {
    "single-session-user": single_session_user,
    "single-session-assistant": single_session_assistant,
    "single-session-preference": single_session_preference,
    "multi-session": multi_session,
    "knowledge-update": knowledge_update,
    "temporal-reasoning": temporal_reasoning,
}


def build_plan(kind: str, rng) -> Plan:
    """The plan of one record of ``kind`` (one of :data:`KINDS`; ``"abstention"`` picks a base type)."""
    if kind == "abstention":
        return BUILDERS[rng.choice(ABSTENTION_BASES)](rng, True)
    return BUILDERS[kind](rng, False)
