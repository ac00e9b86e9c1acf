"""Backlog batches in bfloat16 give float32's vectors; questions stay in float32."""

import numpy as np
import pytest

from kope_mcp.bench.retrieval_corpus import generate
from kope_mcp.memory.embedder import BackgroundEmbedder

pytestmark = pytest.mark.slow  # loads the real model (seconds)


@pytest.fixture(scope="module")
def embedders():
    fast, exact = BackgroundEmbedder(threads=2), BackgroundEmbedder(threads=2, bf16=False)
    for embedder in (fast, exact):
        embedder.start()
        assert embedder.wait(timeout=180), embedder.status
    return fast, exact


def test_bfloat16_batches_embed_the_suite_s_lessons_as_float32_does(embedders):
    fast, exact = embedders
    assert exact.runtime == "torch"
    if fast.runtime == "torch":
        pytest.skip("this CPU has no native bfloat16: batches stay in float32")
    assert fast.runtime == "torch, bfloat16 batches"
    texts = [lesson["text"] for lesson in generate(2000).lessons[:200]]
    batched, reference = np.array(fast.embed(texts)), np.array(exact.embed(texts))
    assert batched.shape == reference.shape == (200, 384)
    assert (batched * reference).sum(axis=1).min() >= 0.999
    assert np.allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-3)


def test_a_question_is_embedded_in_float32_whatever_the_batches_use(embedders):
    fast, exact = embedders
    question = ["which loop order makes the inner loop stride-1?"]
    assert fast.embed(question) == exact.embed(question)
