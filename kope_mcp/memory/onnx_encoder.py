"""The embedding model's transformer run by ONNX Runtime: the same vectors as PyTorch (cosine 1.0 to 6 decimals on
the suite's lessons), about twice the items per second on these CPUs (fused attention, layer-norm and GELU
kernels, no autograd or Python per layer).

The graph is exported from the loaded PyTorch model in memory when the embedder starts (about two seconds, in
the background thread; nothing is downloaded or written to disk), then checked against PyTorch on probe texts:
an export that disagrees is never used. Mean pooling and normalisation (the model's own `Pooling` and
`Normalize` modules) are done here in numpy; the probe check covers them too.
"""

from __future__ import annotations

import io
import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

BATCH = 32
PROBES = [
    "OpenMP parallel for over rows: 3.1x on a 2-core EPYC",
    "error: 'restrict' undeclared (first use in this function)",
    "softmax",
    "loop interchange made the inner loop stride-1; the reduction order changed the last bits of the sum, within "
    "tolerance; then 4 accumulators hid the add latency",
]
MIN_PROBE_COSINE = 0.9999
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class OnnxUnavailable(Exception):
    """The export, the runtime or the probe check failed: the embedder keeps using PyTorch."""


class OnnxSentenceEncoder:
    """`encode(texts)` like SentenceTransformer's for a mean-pooled, normalised BERT-style model."""

    def __init__(self, session: Any, tokenizer: Any, max_length: int) -> None:
        self._session = session
        self._tokenizer = tokenizer
        self._max_length = max_length

    @classmethod
    def from_sentence_transformer(cls, model: Any, threads: int) -> OnnxSentenceEncoder:
        """Export ``model``'s transformer, load it in ONNX Runtime with ``threads`` threads, and check it."""
        try:
            import onnxruntime as ort
            import torch
        except ImportError as exc:
            raise OnnxUnavailable(f"{exc.name} is not installed") from exc
        modules = [type(m).__name__ for m in model]
        if modules[:2] != ["Transformer", "Pooling"] or _pooling_mode(model[1]) != "mean":
            raise OnnxUnavailable(f"not a mean-pooled transformer ({', '.join(modules)})")
        graph = _export(model[0].auto_model, model.tokenizer, torch)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Idle threads sleep instead of spinning: a server embeds in bursts and the kernels need the cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own untyped errors on a graph it cannot load
            raise OnnxUnavailable(f"onnxruntime cannot load the exported graph: {exc}") from exc
        encoder = cls(session, model.tokenizer, int(model.max_seq_length))
        reference = np.asarray(model.encode(PROBES, normalize_embeddings=True, show_progress_bar=False))
        cosine = float((encoder.encode(PROBES) * reference).sum(axis=1).min())
        if not cosine >= MIN_PROBE_COSINE:
            raise OnnxUnavailable(f"the exported graph disagrees with PyTorch (cosine {cosine:.5f} on a probe)")
        return encoder

    def encode(self, texts: list[str]) -> np.ndarray:
        """Normalised float32 vectors, one row per text, in order. Texts are batched by length (little padding)."""
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out: np.ndarray | None = None
        for start in range(0, len(texts), BATCH):
            chosen = order[start:start + BATCH]
            vectors = self._batch([texts[i] for i in chosen])
            if out is None:
                out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            out[chosen] = vectors
        return out if out is not None else np.zeros((0, 0), dtype=np.float32)

    def _batch(self, texts: list[str]) -> np.ndarray:
        tokens = self._tokenizer(texts, padding=True, truncation=True, max_length=self._max_length,
                                 return_tensors="np")
        feed = {name: tokens[name].astype(np.int64) for name in _INPUTS if name in tokens}
        hidden = self._session.run(None, feed)[0]
        mask = tokens["attention_mask"][..., None].astype(np.float32)
        pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)


def _pooling_mode(pooling: Any) -> str | None:
    """The Pooling module's mode: `pooling_mode` in sentence-transformers 5+, flags before."""
    mode = getattr(pooling, "pooling_mode", None)
    if isinstance(mode, str):
        return mode
    return "mean" if getattr(pooling, "pooling_mode_mean_tokens", False) is True else None


def _export(transformer: Any, tokenizer: Any, torch: Any) -> bytes:
    class Hidden(torch.nn.Module):  # type: ignore[misc,name-defined]
        """Keyword arguments in, the last hidden state out (the model's positional order varies by version)."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    sample = tokenizer(["a probe"], return_tensors="pt")
    if "token_type_ids" not in sample:
        raise OnnxUnavailable("the tokenizer gives no token_type_ids")
    buffer = io.BytesIO()
    dynamic = {name: {0: "batch", 1: "tokens"} for name in (*_INPUTS, "hidden")}
    try:
        import warnings

        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the exporter's notes on tracing, for developers
            torch.onnx.export(Hidden(transformer.eval()), tuple(sample[n] for n in _INPUTS), buffer,
                              input_names=list(_INPUTS), output_names=["hidden"], dynamic_axes=dynamic,
                              opset_version=17, dynamo=False)
    except (ImportError, RuntimeError, TypeError, ValueError, torch.onnx.OnnxExporterError) as exc:
        raise OnnxUnavailable(f"torch.onnx.export failed: {type(exc).__name__}: {exc}") from exc
    return buffer.getvalue()
