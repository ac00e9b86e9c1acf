"""Token counts: the real cl100k_base encoding from the installed package, and the fallback that never counts
fewer tokens than it on the suite's texts."""

from __future__ import annotations

import pytest

from kope_mcp.bench.retrieval_corpus import generate
from kope_mcp.experience.candidates import Candidate
from kope_mcp.experience.render import render_item
from kope_mcp.experience.tokens import (
    ENCODING,
    BpeTokenCounter,
    CalibratedCharCounter,
    token_counter,
)
from kope_mcp.memory.records import LessonRecord
from kope_mcp.tasks.registry import TaskRegistry


@pytest.fixture(scope="module")
def bpe() -> BpeTokenCounter:
    counter = token_counter()
    assert isinstance(counter, BpeTokenCounter), "the bundled cl100k_base file did not load"
    return counter


def suite_texts() -> list[str]:
    """What contexts are made of: the suite's kernels and specs, and memory lines of every kind."""
    tasks = TaskRegistry.default().list()
    texts = [t.baseline_source or "" for t in tasks] + [t.spec.summary for t in tasks]
    corpus = generate(600)
    lines = [render_item(Candidate(kind="lesson", item_id=x["lesson_id"], lesson=LessonRecord(**x)), None)
             for x in corpus.lessons]
    texts += ["\n".join(lines[i:i + 40]) for i in range(0, len(lines), 40)]
    return [t for t in texts if t]


def test_the_counter_is_cl100k_base_read_from_the_installed_package(bpe):
    assert bpe.encoding == ENCODING == "cl100k_base"
    assert bpe._bpe.encode_ordinary("hello world") == [15339, 1917]  # cl100k_base's published ids
    assert bpe.count("") == 0 and bpe.count("hello world") == 2


@pytest.mark.parametrize("limit", [0, 1, 5, 17, 200])
def test_truncation_keeps_a_prefix_that_fits(bpe, limit):
    text = "void kernel(const float *x, float *out, int64_t n) { ... } — naïve ✓ " * 20
    cut = bpe.truncate(text, limit)
    assert bpe.count(cut) <= limit
    assert cut == "" or text.startswith(cut.removesuffix("..."))


def test_the_fallback_never_counts_fewer_tokens_than_cl100k_on_the_suites_texts(bpe):
    fallback = CalibratedCharCounter()
    texts = suite_texts()
    ratios = [len(t) / bpe.count(t) for t in texts]
    assert all(fallback.count(t) >= bpe.count(t) for t in texts), min(ratios)
    # The old "4 characters per token" undercounted these texts.
    assert sum(len(t) for t in texts) / sum(bpe.count(t) for t in texts) < 4


@pytest.mark.parametrize("counter", [token_counter(), CalibratedCharCounter()], ids=["bpe", "fallback"])
@pytest.mark.parametrize("limit", [0, 1, 9, 300])
def test_the_tail_is_a_suffix_within_the_limit(counter, limit):
    text = "- [effective, step x2.10] softmax: OpenMP over rows; naïve ✓ (k-3f2a9c01, x86_64/avx2/2c)\n" * 12
    tail = counter.tail(text, limit)
    assert text.endswith(tail) and (limit == 0) == (tail == "")
    assert counter.count(tail) <= limit
