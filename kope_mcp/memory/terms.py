"""The words of a text as the lesson index counts them, and a question cut to what a full-text search can afford.

Kùzu's full-text index (0.11) scores every document that holds any word of the question: its cost grows with the
number of documents each word is in. At a million lessons a question with a word that is in 420k of them took
430 ms, one with rarer words 27 ms (``top := k`` does not help: every posting is scored before the top is kept).
A word in hundreds of thousands of lessons says almost nothing about which lesson is meant (BM25's idf for a word
in 42% of the documents is ~0.9 against ~11 for one in ten), so :func:`affordable_words` leaves the most common
words out once the question's postings pass a budget: the ranking of the lessons that matter barely moves, and
the search costs what the budget allows whatever the memory's size. Below the budget nothing changes: at ten
thousand lessons a question would need dozens of words for it to apply.

The words are split and stemmed as the index does it (digits and punctuation are separators, lower case, the
Snowball English stemmer), so a count here is the length of the index's posting list for that word.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

# The separators of Kùzu's FTS tokenizer (extension/fts: digits and ASCII punctuation, then whitespace).
_SEPARATORS = re.compile(r"[0-9!@#$%^&*()_+={}\[\]:;<>,.?~\\/|'\"`\-\s]+")


@lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    return _stemmer().stemWord(word)


@lru_cache(maxsize=1)
def _stemmer():  # type: ignore[no-untyped-def]
    import snowballstemmer

    return snowballstemmer.stemmer("english")


def words(text: str) -> list[str]:
    """The text's words in order, lower case, unstemmed (what a question is rebuilt from)."""
    return [w for w in _SEPARATORS.split(text.lower()) if w]


def stems(text: str) -> set[str]:
    """The distinct stems of ``text``: the posting lists a document with this text is in."""
    return {stem(w) for w in words(text)}


def affordable_words(question: str, df: dict[str, int], budget: int) -> tuple[str, list[str]]:
    """``question`` without its most common words until the postings of what is left fit ``budget``; and the
    stems left out. ``df``: documents per stem (a stem not in it is in none). Never a word that is in no document
    is dropped (it costs nothing); if even the rarest word is over the budget, the question becomes empty."""
    kept = words(question)
    cost = {s: df.get(s, 0) for s in {stem(w) for w in kept}}
    dropped: list[str] = []
    for s in sorted(cost, key=lambda s: (-cost[s], s)):
        if sum(cost[k] for k in cost if k not in dropped) <= budget:
            break
        dropped.append(s)
    if not dropped:
        return question, []
    return " ".join(w for w in kept if stem(w) not in dropped), dropped


def count_stems(texts: Iterable[str]) -> dict[str, int]:
    """Documents per stem over ``texts`` (each text one document)."""
    out: dict[str, int] = {}
    for text in texts:
        for s in stems(text):
            out[s] = out.get(s, 0) + 1
    return out
