"""The words spot-check prompts are built from (``trust.canarygen``; DESIGN.md
"Spot checks").

These tables are public, like all of this repository: they give the *space* the
generator draws from (millions of prompts), never a prompt or its answer, which
exist only in the coordinator's database (``jobs.models.CanaryPrompt``). A
deployment adds words of its own, which no host can read, with
``BALLAST_CANARY_VOCAB_FILE`` (``vocab_load``).
"""

from __future__ import annotations

import json
from pathlib import Path

# ordinary system prompts, as renters write them
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a helpful assistant. Answer briefly.",
    "You are a concise assistant. Keep answers short.",
    "You are a friendly assistant who answers questions clearly.",
    "You are an AI assistant. Be accurate and to the point.",
    "You are a patient tutor helping a student.",
    "You are a support agent for an online store. Be polite and brief.",
    "You are a personal assistant that keeps track of what the user tells you.",
    "Answer the user's questions. If you are unsure, say so.",
    "You are a knowledgeable assistant. Reply in plain English.",
    "Be brief. One sentence is enough.",
    "You are a helpful, honest and harmless assistant.",
    "You are a quiz helper. Give the answer first.",
    "You help people with everyday questions.",
    "You are a note-taking assistant. Remember the details the user gives you.",
    "You are an assistant for a small business. Answer clearly.",
]

OPENERS = [
    "", "", "", "Hi! ", "Hello! ", "Quick question: ", "Hey! ", "Please help. ",
    "I have a question. ", "Can you help me? ", "Sorry to bother you. ", "OK. ",
]
CLOSERS = [
    "", "", "", " Thanks!", " Thank you.", " Please answer briefly.", " Thanks in advance.",
    " Just the answer, please.", " Keep it short.", " :)",
]
ACKS = [
    "Got it.", "Noted!", "Okay, I'll remember that.", "Thanks for letting me know.",
    "Understood. How can I help?", "Sure, noted.", "All right.", "Great, got it!",
]
# sentences that pad a prompt to the length real prompts have
FILLER = [
    "The weather has been a bit unpredictable this week.",
    "Our office moved to a new floor on Monday.",
    "My neighbour lent me a ladder yesterday.",
    "The new timetable starts next month.",
    "The train was twenty minutes late this morning.",
    "Our team finished the project early.",
    "The shop on the corner is closed for repairs.",
    "I spent the afternoon at the library.",
    "My sister is visiting this weekend.",
    "The report is due on Friday.",
    "The garden needs watering every day now.",
    "Our landlord finally fixed the heating.",
    "I missed the bus again.",
    "We are planning a small party.",
    "The internet was slow all evening.",
    "I started a new book last night.",
    "The kids have a school trip soon.",
    "I have been busy with work lately.",
    "My phone battery keeps running out.",
    "We painted the kitchen last weekend.",
    "The meeting ran longer than planned.",
    "I am trying to get more organised.",
    "The car needs a service soon.",
    "Everyone at work has a cold.",
    "I keep forgetting small details, so I write them down.",
    "We signed up for a cooking class.",
    "The parcel arrived a day early.",
    "I am sorting out some paperwork today.",
]
FIRST_NAMES = [
    "Anna", "Ben", "Carla", "David", "Elena", "Felix", "Grace", "Hugo", "Iris",
    "Jack", "Karen", "Leo", "Maria", "Nina", "Oscar", "Paula", "Quentin", "Rosa",
    "Sam", "Tara", "Umar", "Vera", "Walter", "Yara", "Zoe", "Adam", "Bella",
    "Chris", "Diana", "Ethan", "Fiona", "George", "Hannah", "Ivan", "Julia",
    "Kevin", "Laura", "Mark", "Nora", "Olga", "Peter", "Rachel", "Simon", "Tina",
    "Victor", "Wendy", "Max", "Lucy", "Tom", "Emma", "Oliver", "Sophie", "Daniel",
    "Chloe", "Martin", "Alice", "Henry", "Clara", "Frank", "Mia", "Noah", "Ella",
]
CITIES = [
    "Paris", "London", "Berlin", "Madrid", "Rome", "Vienna", "Lisbon", "Dublin",
    "Oslo", "Prague", "Warsaw", "Athens", "Tokyo", "Seoul", "Sydney", "Toronto",
    "Chicago", "Boston", "Denver", "Seattle", "Miami", "Cairo", "Nairobi", "Lima",
    "Bogota", "Mumbai", "Delhi", "Bangkok", "Manila", "Jakarta", "Istanbul",
    "Munich", "Hamburg", "Milan", "Naples", "Lyon", "Zurich", "Geneva", "Brussels",
]
COLORS = [
    "red", "blue", "green", "yellow", "purple", "orange", "pink", "brown",
    "black", "white", "grey", "teal", "navy", "gold", "silver",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August",
    "September", "October", "November", "December",
]
ANIMALS = ["dog", "cat", "rabbit", "hamster", "parrot", "turtle", "horse", "goldfish"]
FRUITS = ["banana", "cherry", "mango", "pear", "plum", "peach", "lemon", "kiwi", "melon"]
OBJECTS = ["chair", "table", "lamp", "pencil", "bottle", "shoe", "window", "spoon", "clock"]

# recall: two labelled values of one kind are told, one is asked back. Each row:
# kind of value, (label, label), statement with {a}/{va} and {b}/{vb}, questions
# about {a} (a phrase of the label); the answer is the asked label's value.
RECALL = [
    ("number", ("order number", "account number"),
     ["My {a} is {va} and my {b} is {vb}.", "For reference: {a} {va}, {b} {vb}."],
     ["What is my {a}?", "Can you tell me my {a} again?", "Which number is my {a}?"]),
    ("number", ("room number", "locker number"),
     ["My {a} is {va}, and my {b} is {vb}.", "I was given {a} {va} and {b} {vb}."],
     ["What is my {a}?", "Remind me, what was my {a}?"]),
    ("number", ("booking reference", "customer number"),
     ["The {a} is {va}; the {b} is {vb}.", "Please note the {a} {va} and the {b} {vb}."],
     ["What is the {a}?", "Which one is the {a}?"]),
    ("name", ("sister", "brother"),
     ["My {a} is called {va} and my {b} is called {vb}.", "My {a}'s name is {va}; my {b}'s name is {vb}."],
     ["What is my {a}'s name?", "What is my {a} called?", "Who is my {a}?"]),
    ("name", ("manager", "colleague"),
     ["My {a} is {va} and my {b} is {vb}.", "At work, my {a} is {va} and my {b} is {vb}."],
     ["Who is my {a}?", "What is my {a}'s name?"]),
    ("name", ("dog", "cat"),
     ["My {a} is named {va} and my {b} is named {vb}.", "We have a {a} called {va} and a {b} called {vb}."],
     ["What is my {a}'s name?", "What did I say my {a} is called?"]),
    ("city", ("live", "work"),
     ["I {a} in {va} but I {b} in {vb}.", "These days I {a} in {va} and {b} in {vb}."],
     ["Which city do I {a} in?", "Where do I {a}?"]),
    ("city", ("was born", "studied"),
     ["I {a} in {va} and {b} in {vb}.", "Fun fact: I {a} in {va}, and I {b} in {vb}."],
     ["Where {a}?", "In which city {a}?"]),
    ("color", ("car", "bike"),
     ["My {a} is {va} and my {b} is {vb}.", "I have a {va} {a} and a {vb} {b}."],
     ["What color is my {a}?", "Which color is my {a}?"]),
    ("day", ("dentist appointment", "team meeting"),
     ["My {a} is on {va} and my {b} is on {vb}.", "This week: {a} on {va}, {b} on {vb}."],
     ["When is my {a}?", "Which day is my {a}?"]),
    ("code", ("wifi password", "door code"),
     ["The {a} is {va} and the {b} is {vb}.", "Here they are: {a} {va}, {b} {vb}."],
     ["What is the {a}?", "Can you repeat the {a}?"]),
    ("fruit", ("breakfast", "lunch"),
     ["I had a {va} for {a} and a {vb} for {b}.", "For {a} I ate a {va}; for {b}, a {vb}."],
     ["Which fruit did I have for {a}?", "What fruit did I eat for {a}?"]),
]
# phrases the questions above use for a label where the label itself reads badly
RECALL_ASK = {"was born": "was I born", "studied": "did I study"}

# facts: (question templates with {x}, [(x, answer), ...], how an assistant states it)
FACTS = [
    (["What is the capital of {x}?", "Which city is the capital of {x}?", "What's {x}'s capital city?"],
     [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Germany", "Berlin"),
      ("Spain", "Madrid"), ("England", "London"), ("Russia", "Moscow"), ("China", "Beijing"),
      ("Egypt", "Cairo"), ("Greece", "Athens"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"),
      ("Austria", "Vienna"), ("Norway", "Oslo"), ("Canada", "Ottawa"), ("Australia", "Canberra"),
      ("Thailand", "Bangkok"), ("Sweden", "Stockholm"), ("Poland", "Warsaw"), ("Peru", "Lima")],
     "The capital of {x} is {y}."),
    (["What is the opposite of {x}?", "What's the opposite of the word '{x}'?", "Give me the opposite of {x}."],
     [("hot", "cold"), ("up", "down"), ("day", "night"), ("big", "small"), ("fast", "slow"),
      ("open", "closed"), ("happy", "sad"), ("light", "dark"), ("wet", "dry"), ("old", "young"),
      ("full", "empty"), ("early", "late"), ("hard", "soft"), ("left", "right"), ("win", "lose"),
      ("inside", "outside"), ("rich", "poor"), ("true", "false"), ("north", "south")],
     "The opposite of {x} is {y}."),
    (["What color is {x}?", "What colour is {x} usually?", "Which color is {x}?"],
     [("grass", "green"), ("snow", "white"), ("the sky on a clear day", "blue"),
      ("a ripe banana", "yellow"), ("coal", "black"), ("a ripe tomato", "red"),
      ("milk", "white"), ("a carrot", "orange"), ("chocolate", "brown")],
     "{x} is {y}."),
    (["What day comes after {x}?", "Which day follows {x}?", "If today is {x}, what day is tomorrow?"],
     [(WEEKDAYS[i], WEEKDAYS[(i + 1) % 7]) for i in range(7)],
     "After {x} comes {y}."),
    (["What month comes after {x}?", "Which month follows {x}?"],
     [(MONTHS[i], MONTHS[(i + 1) % 12]) for i in range(12)],
     "After {x} comes {y}."),
    (["How many {x}?", "Do you know how many {x}?", "Tell me how many {x}."],
     [("days are in a week", "7"), ("hours are in a day", "24"), ("minutes are in an hour", "60"),
      ("months are in a year", "12"), ("legs does a spider have", "8"), ("sides does a triangle have", "3"),
      ("sides does a square have", "4"), ("wheels does a bicycle have", "2"), ("legs does a dog have", "4"),
      ("seconds are in a minute", "60"), ("days are in a leap year", "366")],
     "There are {y}."),
    (["What animal {x}?", "Which animal {x}?"],
     [("says meow", "cat"), ("barks", "dog"), ("says moo", "cow"), ("says oink", "pig"),
      ("makes honey", "bee"), ("has a trunk", "elephant"), ("quacks", "duck")],
     "That is the {y}."),
    (["What is the plural of {x}?", "How do you write the plural of '{x}'?"],
     [("mouse", "mice"), ("child", "children"), ("foot", "feet"), ("tooth", "teeth"),
      ("goose", "geese"), ("man", "men"), ("woman", "women"), ("person", "people")],
     "The plural of {x} is {y}."),
]
# arithmetic on small numbers: (template, operation), a and b drawn from 1..12
ARITHMETIC = [
    ("What is {a} plus {b}?", "+"), ("What is {a} + {b}?", "+"), ("What's {a}+{b}?", "+"),
    ("How much is {a} plus {b}?", "+"), ("What is {a} times {b}?", "*"),
    ("What is {a} multiplied by {b}?", "*"), ("What is {c} minus {a}?", "-"),
]
# a raw completion prompt (the completions endpoint) around a question
COMPLETION_FORMATS = [
    "Question: {q}\nAnswer:", "Q: {q}\nA:", "{q}\n", "User: {q}\nAssistant:",
    "{context}\n\nQuestion: {q}\nAnswer:",
]

TABLES = (
    "SYSTEM_PROMPTS", "OPENERS", "CLOSERS", "ACKS", "FILLER", "FIRST_NAMES",
    "CITIES", "COLORS", "FRUITS",
)


def vocab_load(path: str) -> dict:
    """The built-in tables, each extended by a deployment's file at ``path``
    (none when empty).

    The file is JSON: an object whose keys are names of ``TABLES`` (lists of
    strings), ``FACTS`` (rows of [questions with ``{x}``, [[x, answer], ...],
    a statement with ``{x}`` and ``{y}``]) and ``RECALL`` (rows shaped as above).
    Raises ValueError naming what is wrong (an unknown key, a bad row).
    """
    vocab = {name: list(globals()[name]) for name in TABLES}
    vocab["FACTS"] = list(FACTS)
    vocab["RECALL"] = list(RECALL)
    if not path:
        return vocab
    try:
        extra = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"BALLAST_CANARY_VOCAB_FILE {path}: {exc}") from None
    if not isinstance(extra, dict):
        raise ValueError(f"BALLAST_CANARY_VOCAB_FILE {path}: not a JSON object")
    for key, rows in extra.items():
        if key not in vocab or not isinstance(rows, list):
            raise ValueError(
                f"BALLAST_CANARY_VOCAB_FILE {path}: {key!r} is not a list of "
                f"one of {sorted(vocab)}"
            )
        if key in TABLES and not all(isinstance(r, str) for r in rows):
            raise ValueError(f"BALLAST_CANARY_VOCAB_FILE {path}: {key} holds strings")
        if key == "FACTS" and not all(_fact_row(r) for r in rows):
            raise ValueError(f"BALLAST_CANARY_VOCAB_FILE {path}: a bad FACTS row")
        if key == "RECALL" and not all(_recall_row(r) for r in rows):
            raise ValueError(f"BALLAST_CANARY_VOCAB_FILE {path}: a bad RECALL row")
        vocab[key] += [tuple(r) if key in ("FACTS", "RECALL") else r for r in rows]
    return vocab


def _fact_row(row) -> bool:
    return (
        isinstance(row, list)
        and len(row) == 3
        and row[0]
        and all(isinstance(q, str) and "{x}" in q for q in row[0])
        and row[1]
        and all(len(p) == 2 and all(isinstance(s, str) and s for s in p) for p in row[1])
        and isinstance(row[2], str)
    )


def _recall_row(row) -> bool:
    return (
        isinstance(row, list)
        and len(row) == 4
        and row[0] in RECALL_KINDS
        and len(row[1]) == 2
        and all(isinstance(s, str) and "{va}" in s and "{vb}" in s for s in row[2])
        and all(isinstance(q, str) and "{a}" in q for q in row[3])
    )


RECALL_KINDS = ("number", "name", "city", "color", "day", "code", "fruit")
