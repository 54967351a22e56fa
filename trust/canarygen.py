"""Spot-check prompts drawn from a secret seed, in the shape of real traffic
(DESIGN.md "Spot checks": the host has read this code).

Draw ``index`` of a model is a pure function of (secret, model, index, shape):
its seed is HMAC-SHA256(secret, model, index), so without the deployment's
secret (``BALLAST_CANARY_SECRET``) nobody can tell which of the space's
millions of prompts (families × templates × values × padding × system
prompts × turns) the pool holds. A draw carries its right answer (and the
other candidate answers the prompt names, which a right output does not
contain); whether the reference model gives it is for the calibration
(``trust.canarypool``). Pure: no database, no model.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import re
from dataclasses import dataclass, field

from .canaries import answer_appears
from .canaryvocab import (
    ANIMALS,
    ARITHMETIC,
    COMPLETION_FORMATS,
    OBJECTS,
    RECALL_ASK,
    WEEKDAYS,
)

MAX_MESSAGES = 15
"""Messages of a conversation at most (a longer real one is drawn with this many)."""
MAX_CHARS = 3000
"""Characters of prompt text at most (padding stops there: the reference model's
context is 2048 tokens, and calibration time grows with the prompt)."""
DRAWS_TRIED = 1000
"""Draws tried for one index before the tables are judged unusable (ValueError)."""
GREETINGS = ["Hello! How can I help you today?", "Hi there! What can I do for you?"]


@dataclass(frozen=True)
class Shape:
    """What a check copies from one real job (``trust.canarypool.shape_of``).

    ``endpoint`` ``chat`` or ``completion``; ``messages`` how many non-system
    messages (chat); ``system`` whether one system message leads; ``chars`` the
    prompt's characters (the padding's target, capped at ``MAX_CHARS``);
    ``max_tokens``, ``top_p``, ``stop`` (list or None), ``seed`` (int or None) as
    the job had them; ``zero`` the temperature 0 written as that job's type
    writes numbers (``0`` or ``0.0``); ``stream`` the job's.
    """

    endpoint: str = "chat"
    messages: int = 1
    system: bool = False
    chars: int = 0
    max_tokens: int = 256
    top_p: float | int = 1.0
    stop: list[str] | None = None
    seed: int | None = None
    zero: float | int = 0
    stream: bool = False


@dataclass
class Draw:
    """One drawn check: a job's ``messages`` or ``prompt``, ``params`` and
    ``stream``; ``expected`` the right answer, ``distractors`` other answers
    the prompt names; ``family`` which kind of question (for staff)."""

    family: str
    messages: list[dict] | None
    prompt: str | None
    params: dict
    stream: bool
    expected: str
    distractors: list[str] = field(default_factory=list)


def canary_seed(*, secret: bytes, model_id: str, index: int) -> int:
    """The seed of draw ``index`` of ``model_id``: HMAC-SHA256 under ``secret``."""
    message = f"ballast-canary\x00{model_id}\x00{index}".encode()
    return int.from_bytes(hmac.new(secret, message, hashlib.sha256).digest(), "big")


@dataclass
class _Question:
    """A question with its context (sentences before it), its right answer and
    distractors, and how an assistant would state the answer."""

    context: str
    question: str
    expected: str
    distractors: list[str]
    said: str


def _recall(rng: random.Random, vocab: dict) -> _Question:
    kind, labels, statements, questions = rng.choice(vocab["RECALL"])
    va, vb = _two_values(rng, kind, vocab)
    asked = rng.randrange(2)
    label = labels[asked]
    context = rng.choice(statements).format(a=labels[0], b=labels[1], va=va, vb=vb)
    question = rng.choice(questions).format(a=RECALL_ASK.get(label, label))
    value, other = (va, vb) if asked == 0 else (vb, va)
    return _Question(
        _articles(_cap(context)), question, value, [other], f"It is {value}."
    )


def _two_values(rng: random.Random, kind: str, vocab: dict) -> tuple[str, str]:
    def one() -> str:
        if kind == "number":
            return str(rng.randint(1000, 999999))
        if kind == "code":
            return f"{rng.choice(ANIMALS + OBJECTS)}{rng.randint(10, 9999)}"
        table = {
            "name": vocab["FIRST_NAMES"],
            "city": vocab["CITIES"],
            "color": vocab["COLORS"],
            "day": WEEKDAYS,
            "fruit": vocab["FRUITS"],
        }[kind]
        return rng.choice(table)

    a = one()
    b = one()
    while answer_appears(a, b) or answer_appears(b, a):
        b = one()
    return a, b


def _fact(rng: random.Random, vocab: dict) -> _Question:
    questions, pairs, statement = rng.choice(vocab["FACTS"])
    x, y = rng.choice(pairs)
    return _Question(
        "", rng.choice(questions).format(x=x), y, [], _cap(statement.format(x=x, y=y))
    )


def _arithmetic(rng: random.Random, vocab: dict) -> _Question:
    template, op = rng.choice(ARITHMETIC)
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    c = a + rng.randint(2, 12)
    result = {"+": a + b, "*": a * b, "-": c - a}[op]
    question = template.format(a=a, b=b, c=c)
    return _Question("", question, str(result), [], f"It is {result}.")


FAMILIES = (("recall", _recall, 5), ("fact", _fact, 3), ("arithmetic", _arithmetic, 2))


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _articles(text: str) -> str:
    """``a`` before a vowel written ``an``."""
    return re.sub(r"\b([Aa]) (?=[aeiouAEIOU])", r"\1n ", text)


def _question(rng: random.Random, vocab: dict, family: str | None = None) -> tuple:
    names = [name for name, _, _ in FAMILIES]
    weights = [weight for _, _, weight in FAMILIES]
    name = family or rng.choices(names, weights)[0]
    return name, dict((n, f) for n, f, _ in FAMILIES)[name](rng, vocab)


def canary_draw(
    *, secret: bytes, model_id: str, index: int, shape: Shape, vocab: dict
) -> Draw:
    """Draw ``index`` of ``model_id`` in ``shape`` (see the module doc).

    ``vocab``: ``trust.canaryvocab.vocab_load``'s tables. The conversation has
    ``shape.messages`` messages (at most ``MAX_MESSAGES``; an even count opens
    with an assistant's greeting) after a system prompt when ``shape.system``;
    earlier turns are other questions with their right answers (the told values
    of a recall question, and an acknowledgement); filler sentences pad the
    first user message towards ``shape.chars``. The right answer never appears
    in the prompt unless the question is a recall, whose other value (a
    distractor) is then there too. Params are the shape's, at temperature 0.
    Raises ValueError when ``DRAWS_TRIED`` draws all gave their answer away
    (tables of a deployment's file that cannot make a check).
    """
    rng = random.Random(canary_seed(secret=secret, model_id=model_id, index=index))
    for _ in range(DRAWS_TRIED):  # a draw whose answer its prompt gives away is drawn again
        draw = _conversation(rng, vocab, shape)
        text = draw.prompt or "\n".join(m["content"] for m in draw.messages)
        if answer_appears(draw.expected, text) == (draw.family == "recall") and all(
            answer_appears(d, text) for d in draw.distractors
        ):
            return draw
    raise ValueError(
        f"no draw of {DRAWS_TRIED} keeps its answer out of its prompt: "
        "check BALLAST_CANARY_VOCAB_FILE"
    )


def _conversation(rng: random.Random, vocab: dict, shape: Shape) -> Draw:
    family, main = _question(rng, vocab)
    system = rng.choice(vocab["SYSTEM_PROMPTS"]) if shape.system else None
    count = max(1, min(shape.messages, MAX_MESSAGES))
    earlier = []  # (user, assistant) pairs before the last question
    opening = main.context
    if main.context and count >= 3:
        earlier.append((main.context, rng.choice(vocab["ACKS"])))
        opening = ""
    while len(earlier) < (count - 1) // 2:
        _, other = _question(rng, vocab, rng.choice(["fact", "arithmetic"]))
        earlier.append((other.question, other.said))
    last = " ".join(p for p in [opening, main.question] if p)
    last = rng.choice(vocab["OPENERS"]) + last + rng.choice(vocab["CLOSERS"])
    turns = [text for pair in earlier for text in pair] + [last]
    roles = ["user", "assistant"] * len(earlier) + ["user"]
    if count % 2 == 0:
        turns.insert(0, rng.choice(GREETINGS))
        roles.insert(0, "assistant")
    _pad(rng, vocab, turns, roles, system, min(shape.chars, MAX_CHARS))
    params = {
        "max_tokens": shape.max_tokens,
        "temperature": shape.zero,
        "top_p": shape.top_p,
        "stop": shape.stop,
        "seed": shape.seed,
    }
    if shape.endpoint == "completion":
        prompt = _completion(rng, system, turns, roles)
        messages = None
    else:
        prompt = None
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": role, "content": text} for role, text in zip(roles, turns)
        ]
    return Draw(
        family=family,
        messages=messages,
        prompt=prompt,
        params=params,
        stream=shape.stream,
        expected=main.expected,
        distractors=main.distractors,
    )


def _pad(rng, vocab, turns: list[str], roles: list[str], system, target: int) -> None:
    """Put filler sentences before the first user message's text until the
    prompt's characters reach ``target`` (in place)."""
    first = roles.index("user")
    size = sum(len(t) for t in turns) + len(system or "")
    filler = []
    for sentence in rng.sample(vocab["FILLER"], len(vocab["FILLER"])):
        if size >= target:
            break
        filler.append(sentence)
        size += len(sentence) + 1
    if filler:
        turns[first] = " ".join(filler) + " " + turns[first]


def _completion(rng, system, turns: list[str], roles: list[str]) -> str:
    """The conversation as one raw prompt (the completions endpoint)."""
    history = "\n".join(
        f"{'User' if role == 'user' else 'Assistant'}: {text}"
        for role, text in zip(roles[:-1], turns[:-1])
    )
    context = "\n\n".join(p for p in [system, history] if p)
    fmt = rng.choice(COMPLETION_FORMATS)
    if "{context}" not in fmt and context:
        fmt = "{context}\n\n" + fmt
    return fmt.format(context=context, q=turns[-1]).lstrip()
