"""Backlog batches in bfloat16 give float32's vectors; a question agrees with float32; threads embed at once."""

import threading

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
    assert fast.runtime == "torch, bfloat16"
    texts = [lesson["text"] for lesson in generate(2000).lessons[:200]]
    batched, reference = np.array(fast.embed_batch(texts)), np.array(exact.embed_batch(texts))
    assert batched.shape == reference.shape == (200, 384)
    assert (batched * reference).sum(axis=1).min() >= 0.999
    assert np.allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-3)


def test_a_question_s_vector_agrees_with_float32_s_as_the_stored_ones_do(embedders):
    fast, exact = embedders
    questions = ["which loop order makes the inner loop stride-1?", "restrict", "gemv on avx512: what worked?"]
    quick, reference = np.array(fast.embed(questions)), np.array(exact.embed(questions))
    assert (quick * reference).sum(axis=1).min() >= 0.999


def test_vectors_equal_sentence_transformers_encode(embedders):
    # Each thread tokenizes with its own copy of the tokenizer; the vectors must stay encode()'s, the ones stored
    # by earlier versions.
    _, exact = embedders
    texts = [lesson["text"] for lesson in generate(2000).lessons[:64]] + ["  padded question  ", "softmax"]
    reference = exact._model.encode(texts, normalize_embeddings=True, show_progress_bar=False)
    assert np.abs(np.array(exact.embed_batch(texts)) - reference).max() < 1e-5
    assert np.abs(np.array(exact.embed(texts[-2:])) - reference[-2:]).max() < 1e-5


def test_two_threads_embedding_at_once_get_the_vectors_one_gets_alone(embedders):
    _, exact = embedders
    texts = [lesson["text"] for lesson in generate(2000).lessons[:96]]
    alone = exact.embed_batch(texts)
    results: dict[int, list[list[float]] | None] = {}
    threads = [threading.Thread(target=lambda n=n: results.__setitem__(n, exact.embed_batch(texts)))
               for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(np.abs(np.array(results[n]) - np.array(alone)).max() < 1e-5 for n in range(2))
