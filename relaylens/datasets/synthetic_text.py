"""Word pools and filler-chat text for the synthetic LongMemEval generator (:mod:`relaylens.datasets.synthetic`).

Pools are large enough that "find the only city" fails: every answer category also supplies same-category
distractors. Filler sessions are generic assistant chats (advice on an everyday topic) built from sentence
templates; :func:`filler_session` never emits a sentence that contains a banned word (abstention near-misses).

Example:
    >>> import random
    >>> turns = filler_session(random.Random(0), n_exchanges=1, n_sentences=3)
    >>> [t.role for t in turns]
    ['user', 'assistant']
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FIRST_NAMES = (
    "Alice", "Bruno", "Chloe", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Imani", "Jonas", "Keiko", "Liam",
    "Maya", "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Samir", "Tessa", "Umar", "Vera", "Wes", "Ximena",
    "Yusuf", "Zoe", "Anika", "Boris", "Carmen", "Dylan", "Esther", "Felix", "Gemma", "Hector", "Ines", "Jasper",
    "Kira", "Lorenzo", "Mira", "Nadia", "Oscar", "Priya", "Rafael", "Sienna", "Tobias", "Ulla", "Viktor", "Wren",
)
PET_NAMES = (
    "Biscuit", "Pepper", "Mango", "Noodle", "Waffles", "Juniper", "Pickles", "Clover", "Ziggy", "Marble", "Tofu",
    "Hazel", "Comet", "Sprout", "Pumpkin", "Olive", "Rocket", "Maple", "Bean", "Pebble", "Fig", "Socks", "Nugget",
    "Echo", "Basil", "Cricket", "Dumpling", "Kiwi", "Luna", "Miso", "Nacho", "Poppy", "Rusty", "Sushi", "Toffee",
)
SPECIES = ("dog", "cat", "hamster", "parrot", "rabbit", "turtle", "ferret", "goldfish", "gecko", "canary")
CITIES = (
    "Lisbon", "Porto", "Seville", "Valencia", "Lyon", "Marseille", "Bologna", "Turin", "Krakow", "Gdansk", "Vienna",
    "Graz", "Zurich", "Geneva", "Munich", "Leipzig", "Hamburg", "Utrecht", "Antwerp", "Ghent", "Copenhagen",
    "Bergen", "Tallinn", "Riga", "Vilnius", "Dublin", "Galway", "Edinburgh", "Bristol", "Montreal", "Quebec City",
    "Denver", "Austin", "Portland", "Seattle", "Chicago", "Boston", "Kyoto", "Osaka", "Busan", "Hanoi",
    "Melbourne", "Adelaide", "Wellington", "Cape Town", "Nairobi", "Marrakesh", "Istanbul", "Tbilisi", "Oaxaca",
)
CUISINES = ("Thai", "Ethiopian", "Korean", "Peruvian", "Lebanese", "Georgian", "Sichuan", "Mexican", "Greek",
            "Vietnamese", "Moroccan", "Indian", "Japanese", "Turkish", "Italian")
MUSIC = ("jazz", "bluegrass", "synth-pop", "bossa nova", "classical piano", "reggae", "punk rock", "folk",
         "soul", "techno", "opera", "afrobeat")
INSTRUMENTS = ("cello", "violin", "ukulele", "trumpet", "saxophone", "banjo", "harp", "clarinet", "drums",
               "flute", "accordion", "mandolin")
DRINKS = ("oat milk latte", "flat white", "cortado", "cold brew", "chai latte", "double espresso",
          "matcha latte", "iced americano", "mocha", "macchiato", "cappuccino", "decaf latte", "lungo",
          "hazelnut latte", "vanilla cold foam brew", "caramel macchiato", "red eye", "affogato")
CAR_BRANDS = ("Subaru", "Volvo", "Mazda", "Kia", "Skoda", "Peugeot", "Honda", "Toyota", "Hyundai", "Renault",
              "Fiat", "Nissan")
ADJECTIVES = ("Copper", "Golden", "Silver", "Crooked", "Quiet", "Hidden", "Rusty", "Velvet", "Lucky", "Little",
              "Wandering", "Blue", "Green", "Red", "Salty", "Sleepy", "Brave", "Clever", "Hungry", "Painted")
NOUNS = ("Kettle", "Lantern", "Fox", "Anchor", "Spoon", "Orchard", "Harbor", "Oak", "Pigeon", "Table", "Barrel",
         "Compass", "Garden", "Pantry", "Bridge", "Window", "Ladder", "Mill", "Whistle", "Olive Tree")
SURNAMES = ("Harlow", "Brennan", "Castell", "Delacroix", "Everly", "Fenwick", "Galloway", "Holloway", "Ingram",
            "Jarrett", "Kessler", "Lindqvist", "Marlowe", "Northcott", "Okafor", "Pemberton", "Quill", "Rasmussen",
            "Sterling", "Thornbury", "Vance", "Whitlock", "Yardley", "Zeller")
COMPANY_SUFFIXES = ("Analytics", "Logistics", "Robotics", "Design Studio", "Biotech", "Consulting", "Foods",
                    "Energy", "Media", "Software", "Architects", "Labs")
TRAIL_FEATURES = ("Creek", "Ridge", "Falls", "Meadow", "Canyon", "Lake", "Pine", "Summit")
ITEMS = ("houseplants", "board games", "vinyl records", "succulents", "paperbacks", "scented candles",
         "coffee mugs", "jigsaw puzzles", "yoga mats", "picture frames", "notebooks", "tea towels", "throw pillows",
         "bird feeders", "cookbooks", "watercolor sets")
SHOPS = ("the weekend market", "a thrift store", "the mall", "a garden center", "a pop-up fair", "an online sale")
EVENTS = (
    ("pottery workshop", "pottery"), ("jazz concert", "jazz"), ("charity 5k run", "charity"),
    ("wine tasting", "wine"), ("book club meeting", "book club"), ("sushi-making class", "sushi-making"),
    ("museum tour", "museum"), ("salsa lesson", "salsa"), ("farmers market volunteer shift", "volunteer"),
    ("stand-up comedy show", "comedy"), ("photography walk", "photography"), ("chess tournament", "chess"),
    ("kayaking trip", "kayaking"), ("bread-baking course", "bread-baking"), ("film festival screening", "festival"),
    ("rock climbing session", "climbing"), ("poetry reading", "poetry"), ("board game night", "game night"),
    ("first aid course", "first aid"), ("orchestra rehearsal", "orchestra"), ("trivia night", "trivia"),
    ("calligraphy class", "calligraphy"), ("beach cleanup", "cleanup"), ("job fair", "job fair"),
)
RELATIVES = ("sister", "brother", "cousin", "aunt", "uncle", "grandmother", "daughter", "son", "wife", "husband")
ORDINALS = ("first", "second", "third", "fourth")

TOPICS = (
    "improving my sleep schedule", "learning Spanish", "keeping a monthly budget", "training for a 10k",
    "repotting indoor plants", "writing a cover letter", "organizing a small closet", "meal prepping for the week",
    "getting started with journaling", "reducing screen time", "learning to cook rice properly",
    "planning a weekend road trip", "keeping a sourdough starter alive", "preparing for a job interview",
    "decluttering a home office", "staying focused while studying", "improving my posture at my desk",
    "choosing a laptop for college", "starting a vegetable garden", "learning basic photography",
    "saving money on groceries", "writing better emails", "running a productive meeting", "learning to swim",
    "keeping houseguests comfortable", "setting up a home network", "making friends in a new city",
    "preparing for a long flight", "taking care of leather shoes", "reading more books", "learning chess openings",
    "improving my handwriting", "baking a birthday cake", "drinking more water", "cleaning a cast iron pan",
    "choosing running shoes", "understanding compound interest", "managing a group project", "painting a room",
    "caring for a bike chain",
)
USER_OPENERS = (
    "Can you give me some advice on {topic}?", "I've been struggling with {topic}. Any tips?",
    "What's a good way to get started with {topic}?", "I'd like to get better at {topic}. Where should I begin?",
    "Do you have any suggestions for {topic}?", "I need some help with {topic}, if you have a minute.",
    "What are the basics of {topic}?", "Could you walk me through {topic}?",
)
USER_FOLLOWUPS = (
    "Thanks, that's helpful. What mistakes should I avoid?", "How long does it usually take to see progress?",
    "Do you have any tips for staying motivated?", "Could you turn that into a short plan for this week?",
    "What would you do first if you were me?", "Is there anything I should buy before starting?",
    "That makes sense. Anything else I should keep in mind?", "How do I know if it's working?",
)
ASSISTANT_OPENERS = ("Sure, here are a few ideas.", "Great question.", "Happy to help with that.",
                     "Of course.", "That's a common goal, and a very doable one.", "Good thinking.")
ADVICE = (
    "A good first step with {topic} is to decide what success would look like for you in a month.",
    "Many people find that {topic} gets easier once it becomes part of a fixed weekly routine.",
    "Try keeping a short log while you work on {topic}; patterns often show up after a week or two.",
    "Start small: ten focused minutes a day beats one exhausting session a week.",
    "It helps to remove friction, so prepare whatever you need the evening before.",
    "If something does not work after a fair try, change one variable at a time and compare.",
    "Pairing a new habit with an existing one, like your morning coffee, makes it easier to remember.",
    "Be patient with yourself, because early progress is usually slow and uneven.",
    "Write down the two or three steps that matter most and ignore the rest for now.",
    "A friend who shares the goal can keep you accountable and make it more fun.",
    "Set a reminder on your phone, but keep the reminder specific about what to do.",
    "Reviewing your progress every Sunday gives you a natural point to adjust the plan.",
    "Avoid buying lots of equipment up front; borrow or start with what you already have.",
    "Breaking the task into short stages makes it far less intimidating.",
    "Celebrate small milestones, since they keep motivation up over the long run.",
    "Reading one good beginner guide on {topic} is usually worth more than ten random videos.",
    "Most setbacks with {topic} come from doing too much too soon rather than too little.",
    "If you miss a day, simply continue the next day instead of trying to make up for it.",
    "Notice which time of day you have the most energy and schedule the hard part then.",
    "Keep a simple checklist, and tick items off as you go so you can see your progress.",
    "Ask someone experienced for feedback once a month; a fresh eye catches a lot.",
    "Comfort matters more than you might think, so set up your space before you begin.",
    "Consistency is the main ingredient; intensity can come later.",
    "It is fine to adapt general advice to your own schedule and constraints.",
    "Take a photo or a note at the start so you can compare after a few weeks.",
    "When you feel stuck, go back to the simplest version of the task and rebuild from there.",
)
ASSISTANT_CLOSERS = ("Let me know how it goes!", "I hope this helps.", "Good luck, you've got this.",
                     "Feel free to ask if you want more detail on any of these.", "Have fun with it!")
ACKS = (
    "That sounds lovely, thanks for sharing.", "Oh, that's great to hear!", "How exciting!",
    "Thanks for letting me know.", "That sounds like a lot of fun.", "Good for you!",
)


def words_in(text: str, banned: tuple[str, ...]) -> bool:
    """True when any banned word or phrase occurs in ``text`` as a whole word (case-insensitive)."""
    return any(re.search(rf"(?<![A-Za-z]){re.escape(w)}(?![A-Za-z])", text, re.I) for w in banned)


@dataclass
class DraftTurn:
    """A generated turn: its content, the facts it states and its ``has_answer`` label (``None``: key omitted)."""

    role: str
    content: str
    facts: tuple = ()
    has_answer: bool | None = None
    sentences: list[str] = field(default_factory=list)  # assistant filler turns: editable sentence list
    topic: str = ""  # assistant filler turns: the advice topic (more sentences stay on topic)

    def render(self) -> dict:
        turn = {"role": self.role, "content": self.content}
        if self.has_answer is not None:
            turn["has_answer"] = self.has_answer
        return turn


def _pick(rng, pool, banned):
    choices = [p for p in pool if not words_in(p, banned)]
    return rng.choice(choices)


def advice_sentences(rng, topic: str, n: int, banned: tuple[str, ...] = ()) -> list[str]:
    """``n`` advice sentences about ``topic`` (repeats allowed once the pool is used up)."""
    pool = [a.format(topic=topic) for a in ADVICE if not words_in(a.format(topic=topic), banned)]
    out = []
    while len(out) < n:
        batch = pool[:]
        rng.shuffle(batch)
        out.extend(batch[: n - len(out)])
    return out


def assistant_filler_turn(rng, topic: str, n_sentences: int, banned: tuple[str, ...] = ()) -> DraftTurn:
    sentences = [_pick(rng, ASSISTANT_OPENERS, banned)] + advice_sentences(rng, topic, max(n_sentences - 1, 0), banned)
    turn = DraftTurn("assistant", "", sentences=sentences, topic=topic)
    sync_sentences(turn)
    return turn


def sync_sentences(turn: DraftTurn) -> None:
    """Re-join an editable assistant turn after its sentence list changed."""
    turn.content = " ".join(turn.sentences)


def filler_session(rng, n_exchanges: int = 2, n_sentences: int = 5, banned: tuple[str, ...] = (),
                   distractors: tuple[tuple[str, tuple], ...] = ()) -> list[DraftTurn]:
    """A generic advice chat; each ``(sentence, facts)`` distractor is prepended to a user turn."""
    topics = [t for t in TOPICS if not words_in(t, banned)]
    topic = rng.choice(topics)
    turns: list[DraftTurn] = []
    pending = list(distractors)
    followups = rng.sample([f for f in USER_FOLLOWUPS if not words_in(f, banned)], max(n_exchanges - 1, 0))
    for k in range(n_exchanges):
        ask = (_pick(rng, USER_OPENERS, banned) if k == 0 else followups[k - 1]).format(topic=topic)
        facts: tuple = ()
        if pending:
            sentence, facts = pending.pop(0)
            ask = f"{sentence} Anyway, {ask if ask.startswith(('I ', 'I' + chr(39))) else ask[0].lower() + ask[1:]}"
        turns.append(DraftTurn("user", ask, facts))
        turns.append(assistant_filler_turn(rng, topic, n_sentences, banned))
    for sentence, facts in pending:  # more distractors than exchanges: extra short user remarks
        turns.append(DraftTurn("user", sentence, facts))
        turns.append(DraftTurn("assistant", _pick(rng, ACKS, banned)))
    return turns
