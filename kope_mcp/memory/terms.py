"""The words of a text as the lesson index counts them, and a question cut to what a full-text search can afford.

A full-text index scores every document that holds any word of the question: its cost grows with the number of
documents each word is in. At a million lessons, in Kùzu's index (0.11), a question with a word that is in 420k
of them took 430 ms, one with rarer words 27 ms (``top := k`` did not help: every posting is scored before the
top is kept); SQLite's FTS5 (read_index.py) answered questions of 150k-250k postings in 140-220 ms, those held to 25k
postings in p50 <1 / p95 36 ms.
A word in hundreds of thousands of lessons says almost nothing about which lesson is meant (BM25's idf for a word
in 42% of the documents is ~0.9 against ~11 for one in ten), so :func:`affordable_words` leaves the most common
words out once the question's postings pass a budget: the ranking of the lessons that matter barely moves, and
the search costs what the budget allows whatever the memory's size. Below the budget nothing changes: at ten
thousand lessons a question would need dozens of words for it to apply.

The words are split and stemmed as Kùzu's index did it before lessons moved to the read index's FTS5 table
(digits and punctuation are separators, lower case, English stop words left out, the Snowball English stemmer),
so a count here is the length of the index's posting list for that word, and a lesson is found by the same words.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

# The separators of Kùzu's FTS tokenizer (extension/fts: digits and ASCII punctuation, then whitespace).
_SEPARATORS = re.compile(r"[0-9!@#$%^&*()_+={}\[\]:;<>,.?~\\/|'\"`\-\s]+")


# The stop words Kùzu's full-text index leaves out of a document (its default English list, read back from the
# index itself: the words whose one-word document the index could not find).
_STOP_WORDS = """
a able about above according accordingly across actually after afterwards again against all allow allows almost
alone along already also although always am among amongst an and another any anybody anyhow anyone anything
anyway anyways anywhere apart appear appreciate appropriate are around as aside asking associated at available
away awfully b be became because become becomes becoming been before beforehand behind being believe below
beside besides best better between beyond both brief but by c came can cannot cant causes certain certainly
changes clearly co com come comes concerning consequently consider considering contain containing contains
corresponding could course currently d definitely described despite did different do does doing done down
downwards during e each edu eg eight either else elsewhere enough entirely especially et etc even every
everybody everyone everything everywhere ex exactly example except f far few fifth first five followed following
follows for former formerly forth four from further furthermore g get gets getting given gives go goes going
gone got gotten greetings h had happens hardly has have having he hello help here herself hi him himself his
hopefully how howbeit however i ie if ignored immediate in inasmuch inc indeed indicate indicated indicates
inner insofar instead into inward is it its itself j just k keep keeps kept know known knows l last lately later
latter latterly least less lest let like liked likely little look looking looks ltd m mainly many may maybe me
mean meanwhile merely might more moreover most mostly much must my myself n name namely nd near nearly necessary
need needs neither never nevertheless new next nine no nobody non none noone nor normally not nothing novel
nowhere o obviously of off often oh ok okay old on once one ones only onto or other others otherwise ought our
out outside over overall p particular particularly per perhaps placed please plus possible presumably probably
provides q que quite qv r rather rd re really reasonably regarding regardless regards relatively respectively
right s said same saw say saying says second secondly see seeing seem seemed seeming seems seen self sensible
sent serious seriously seven several shall she should since six so some somebody somehow someone something
sometime sometimes somewhat somewhere soon sorry specified specify specifying still sub such sup sure t take
taken tell tends th than thank thanks thanx that thats the their theirs them themselves then thence there
thereafter thereby therefore therein theres thereupon these they think third this thorough thoroughly those
three through throughout thru thus to together too took toward towards tried tries truly try trying twice two u
un under unfortunately unless unlikely until unto up us use used useful uses using usually uucp v value various
very via viz vs w want wants was way we welcome well went were what whatever when whence whenever where
whereafter whereas whereby wherein whereupon wherever whether which while whither who whoever whole whom whose
why will willing wish with within without wonder would x y yes yet you your yours yourself yourselves z zero
"""
STOPWORDS = frozenset(_STOP_WORDS.split())


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


def index_terms(text: str) -> list[str]:
    """The stems of ``text`` in order, repeats kept, stop words left out: what the lesson index holds for it."""
    return [stem(w) for w in words(text) if w not in STOPWORDS]


def stems(text: str) -> set[str]:
    """The distinct stems of ``text``: the posting lists a document with this text is in."""
    return set(index_terms(text))


def affordable_words(question: str, df: dict[str, int], budget: int) -> tuple[str, list[str]]:
    """``question`` without its most common words until the postings of what is left fit ``budget``; and the
    stems left out. ``df``: documents per stem (a stem not in it is in none). Never a word that is in no document
    is dropped (it costs nothing); if even the rarest word is over the budget, the question becomes empty."""
    kept = [w for w in words(question) if w not in STOPWORDS]
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
