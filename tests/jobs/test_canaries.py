"""How a spot check's answer is judged (DESIGN.md "Spot checks": the expected
answer appears, never string equality)."""

from jobs.canaries import answer_appears


def test_answers_appear_as_whole_words_in_any_case():
    assert answer_appears("4", "The answer is 4.")
    assert answer_appears("tokyo", "TOKYO,\n  of course")
    assert not answer_appears("4", "It is 24.")
    assert not answer_appears("cold", "It is colder")
