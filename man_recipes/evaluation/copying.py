"""How much of a summary comes from its article: of all the summaries' words (and bigrams), the
share that occur in their own article, pooled over the documents (lowercase, whitespace tokens,
the ``<s>``/``</s>`` sentence tags of CNN/DM references dropped). A summarizer that copies, and a
reference, score high; a language model that writes generic text scores near what another
article of the set contains (the chance level: each summary against the next document's article)."""

TAGS = frozenset(("<s>", "</s>"))


def tokens(line):
    return [w for w in line.lower().split() if w not in TAGS]


def ngrams(words, n):
    return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]


def share_in_articles(summaries, articles, n, shift=0):
    """Of the summaries' n-grams (counted with repeats), the share found among the n-grams of their
    article (``shift=1``: of the next document's article, the chance level); None when no summary
    has an n-gram."""
    if len(summaries) != len(articles):
        raise ValueError(f"{len(summaries)} summaries for {len(articles)} articles")
    found = total = 0
    for i, summary in enumerate(summaries):
        grams = ngrams(tokens(summary), n)
        have = set(ngrams(tokens(articles[(i + shift) % len(articles)]), n))
        found += sum(g in have for g in grams)
        total += len(grams)
    return round(found / total, 3) if total else None


def copying(summaries, articles):
    """{words, bigrams, bigrams_chance}: shares of the summaries found in their articles."""
    return {"words": share_in_articles(summaries, articles, 1), "bigrams": share_in_articles(summaries, articles, 2),
            "bigrams_chance": share_in_articles(summaries, articles, 2, shift=1)}
