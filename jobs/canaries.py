"""Canary prompts for spot checks, and how an answer is judged (DESIGN.md "Spot checks").

A canary looks like any renter's question. The candidates below join a model's
set only after ``canary_calibrate`` shows the reference model answers them right
at temperature 0, so an honest host passes; a host that fakes its output does not.
"""

from __future__ import annotations

import re
import unicodedata

# (prompt, expected answer): ordinary questions with one short right answer.
CANDIDATES: list[tuple[str, str]] = [
    ("What is 2+2?", "4"),
    ("What is 3+5?", "8"),
    ("What is 10 minus 3?", "7"),
    ("What is 6 times 7?", "42"),
    ("What is 9+10?", "19"),
    ("What is 5+5?", "10"),
    ("What is 12 divided by 4?", "3"),
    ("What is 100 minus 1?", "99"),
    ("How many days are in a week?", "7"),
    ("How many legs does a spider have?", "8"),
    ("How many hours are in a day?", "24"),
    ("How many minutes are in an hour?", "60"),
    ("How many months are in a year?", "12"),
    ("How many sides does a triangle have?", "3"),
    ("How many sides does a square have?", "4"),
    ("How many legs does a dog have?", "4"),
    ("How many wheels does a bicycle have?", "2"),
    ("What color is the sky on a clear day?", "blue"),
    ("What color is grass?", "green"),
    ("What color is snow?", "white"),
    ("What color are bananas when they are ripe?", "yellow"),
    ("What is the opposite of hot?", "cold"),
    ("What is the opposite of up?", "down"),
    ("What is the opposite of day?", "night"),
    ("What day comes after Monday?", "Tuesday"),
    ("What day comes after Friday?", "Saturday"),
    ("What month comes after January?", "February"),
    ("What is the first letter of the English alphabet?", "A"),
    ("What do bees make?", "honey"),
    ("What is frozen water called?", "ice"),
    ("What animal says meow?", "cat"),
    ("What animal barks?", "dog"),
    ("What planet do we live on?", "Earth"),
    ("What is the largest ocean on Earth?", "Pacific"),
    ("What gas do humans need to breathe?", "oxygen"),
    ("What is the chemical symbol for water?", "H2O"),
    ("What is the boiling point of water in Celsius?", "100"),
    ("Which star is at the center of our solar system?", "Sun"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the capital of Spain?", "Madrid"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("What language is spoken in Brazil?", "Portuguese"),
    ("What is the square root of 9?", "3"),
    ("What is 1+1?", "2"),
    ("What is 7+3?", "10"),
    ("What is 8 times 8?", "64"),
]


def normalize(text: str) -> str:
    """Lower-case, NFKC-normalized text with runs of white space folded to one space."""
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def answer_appears(expected: str, output: str) -> bool:
    """True when ``expected`` appears in ``output`` as a whole word or number.

    Case and white space do not matter; "4" is found in "The answer is 4." but not
    in "24" (temperature 0 is not bit-exact across GPUs, so never string equality).
    """
    needle = re.escape(normalize(expected))
    return (
        re.search(rf"(?<![a-z0-9]){needle}(?![a-z0-9])", normalize(output)) is not None
    )
