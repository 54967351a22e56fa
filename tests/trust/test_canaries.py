"""How a spot check's answer is judged (DESIGN.md "Spot checks": the expected
answer appears, never string equality), and the prompts it is asked with: drawn
from a secret, never the same twice, in a space too large to list."""

from trust.canaries import answer_appears, answer_right
from trust.canarygen import Shape, canary_draw
from trust.canaryvocab import vocab_load

VOCAB = vocab_load("")


def test_answers_appear_as_whole_words_in_any_case():
    assert answer_appears("4", "The answer is 4.")
    assert answer_appears("tokyo", "TOKYO,\n  of course")
    assert not answer_appears("4", "It is 24.")
    assert not answer_appears("cold", "It is colder")


def test_an_answer_naming_every_told_value_is_not_right():
    assert answer_right("48213", ["77120"], "Your order number is 48213.")
    assert not answer_right(
        "48213", ["77120"], "Order number 48213, account number 77120."
    )
    assert not answer_right("48213", ["77120"], "I cannot tell.")


def _text(draw) -> str:
    return draw.prompt or "\n".join(m["content"] for m in draw.messages)


def test_a_draw_is_a_function_of_the_secret_and_its_index():
    shape = Shape(messages=3, system=True, chars=300)
    one = canary_draw(secret=b"a", model_id="m", index=7, shape=shape, vocab=VOCAB)
    again = canary_draw(secret=b"a", model_id="m", index=7, shape=shape, vocab=VOCAB)
    assert one == again
    others = {
        _text(canary_draw(secret=b"b", model_id="m", index=i, shape=shape, vocab=VOCAB))
        for i in range(7, 27)
    }
    assert _text(one) not in others, "another secret draws other prompts"


def test_draws_hardly_repeat_and_never_give_their_answer_away():
    shapes = [
        Shape(),
        Shape(messages=2),
        Shape(messages=3, system=True),
        Shape(messages=5, chars=600),
        Shape(endpoint="completion", messages=3, system=True),
    ]
    texts = []
    for index in range(3000):
        draw = canary_draw(
            secret=b"s", model_id="m", index=index, shape=shapes[index % 5], vocab=VOCAB
        )
        text = _text(draw)
        texts.append(text)
        if draw.family == "recall":  # told in the prompt, beside a distractor
            assert answer_appears(draw.expected, text) and draw.distractors
            assert all(answer_appears(d, text) for d in draw.distractors)
        else:
            assert not answer_appears(draw.expected, text), (draw.expected, text)
        if draw.messages is not None:
            assert len(draw.messages) == shapes[index % 5].messages + (
                shapes[index % 5].system
            )
            assert draw.messages[-1]["role"] == "user"
    assert len(set(texts)) >= 0.99 * len(texts)


def test_a_deployment_adds_its_own_words(tmp_path):
    path = tmp_path / "vocab.json"
    path.write_text(
        '{"FACTS": [[["Which river runs through {x}?"], [["Quuxville", "Zorb"]], '
        '"The {y} runs through {x}."]], "SYSTEM_PROMPTS": ["You are Quux."]}'
    )
    vocab = vocab_load(str(path))
    assert vocab["FACTS"][-1][1] == [["Quuxville", "Zorb"]]
    assert "You are Quux." in vocab["SYSTEM_PROMPTS"]
    path.write_text('{"NOPE": []}')
    try:
        vocab_load(str(path))
    except ValueError as exc:
        assert "NOPE" in str(exc)
    else:
        raise AssertionError("an unknown table is refused")
