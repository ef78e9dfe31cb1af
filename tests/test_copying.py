"""The share of a summary found in its article, against counts made by hand."""

import pytest

from man_recipes.evaluation.copying import copying, share_in_articles

ARTICLES = ["the cat sat on the mat .", "dogs bark at night"]
SUMMARIES = ["<s> The cat sat . </s> <s> a dog barks </s>", "dogs bark dogs bark"]


def test_pooled_shares_by_hand():
    # words: the cat sat . (4 of 4) a dog barks (0 of 3) | dogs bark dogs bark (4 of 4): 8 of 11
    # bigrams: the-cat cat-sat found, sat-. .-a a-dog dog-barks not (2 of 6) | dogs-bark twice, bark-dogs not (2 of 3)
    assert share_in_articles(SUMMARIES, ARTICLES, 1) == round(8 / 11, 3)
    assert share_in_articles(SUMMARIES, ARTICLES, 2) == round(4 / 9, 3)
    # chance: each summary against the next article (the last against the first)
    # bigrams of summary 1 in article 2: none; of summary 2 in article 1: none
    assert copying(SUMMARIES, ARTICLES) == {"words": round(8 / 11, 3), "bigrams": round(4 / 9, 3),
                                             "bigrams_chance": 0.0}


def test_degenerate_inputs():
    assert share_in_articles(["one", ""], ["one two", "x"], 2) is None  # no summary has a bigram
    assert share_in_articles(["", ""], ["a", "b"], 1) is None
    with pytest.raises(ValueError, match="2 summaries for 1 articles"):
        share_in_articles(["a", "b"], ["a"], 1)
