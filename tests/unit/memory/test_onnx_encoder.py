"""The embedding model on ONNX Runtime gives PyTorch's vectors; when it cannot, the embedder stays on PyTorch."""

import numpy as np
import pytest

from kope_mcp.bench.retrieval_corpus import generate
from kope_mcp.memory import onnx_encoder
from kope_mcp.memory.embedder import BackgroundEmbedder

pytestmark = pytest.mark.slow  # loads the real model (seconds)


@pytest.fixture(scope="module")
def embedders():
    onnx, torch_only = BackgroundEmbedder(threads=2), BackgroundEmbedder(threads=2, onnx=False)
    for embedder in (onnx, torch_only):
        embedder.start()
        assert embedder.wait(timeout=180), embedder.status
    return onnx, torch_only


def test_onnx_runtime_embeds_the_suite_s_lessons_as_pytorch_does_in_the_caller_s_order(embedders):
    onnx, torch_only = embedders
    assert onnx.runtime == "onnxruntime" and torch_only.runtime == "torch"
    texts = [lesson["text"] for lesson in generate(2000).lessons[:150]]
    texts[7] = "a much longer lesson than its neighbours, " * 12  # a batch with padding, out of length order
    fast, reference = np.array(onnx.embed(texts)), np.array(torch_only.embed(texts))
    assert fast.shape == reference.shape == (150, 384)
    assert (fast * reference).sum(axis=1).min() >= 0.9999
    assert np.allclose(np.linalg.norm(fast, axis=1), 1.0, atol=1e-5)
    (one,) = onnx.embed([texts[3]])
    assert float(np.dot(one, reference[3])) >= 0.9999


def test_an_export_that_fails_or_disagrees_leaves_the_embedder_on_pytorch(monkeypatch):
    def broken(*_args):
        raise onnx_encoder.OnnxUnavailable("torch.onnx.export failed: a test said so")

    monkeypatch.setattr(onnx_encoder, "_export", broken)
    embedder = BackgroundEmbedder(threads=1)
    embedder.start()
    assert embedder.wait(timeout=180) and embedder.runtime == "torch" and "(torch)" in embedder.status
    assert len(embedder.embed(["still answers"])[0]) == 384


def test_a_graph_whose_vectors_disagree_with_pytorch_is_refused(embedders, monkeypatch):
    _, torch_only = embedders
    real = onnx_encoder.OnnxSentenceEncoder.encode
    monkeypatch.setattr(onnx_encoder.OnnxSentenceEncoder, "encode",
                        lambda self, texts: np.roll(real(self, texts), 1, axis=1))  # a subtly wrong graph
    with pytest.raises(onnx_encoder.OnnxUnavailable, match="disagrees with PyTorch"):
        onnx_encoder.OnnxSentenceEncoder.from_sentence_transformer(torch_only._model, 1)
