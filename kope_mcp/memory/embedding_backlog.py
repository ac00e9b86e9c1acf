"""The embedding backlog: every stored item gets its vector in the background (one single-thread worker per
core, a writer that stores vectors by COPYs), while questions keep being answered; stored vectors are loaded
into the vector file at start when it does not hold them (vectors.py)."""

from __future__ import annotations

import logging
import queue
import threading

from kope_mcp.memory.embedder import MODEL_NAME, BackgroundEmbedder
from kope_mcp.memory.store import KuzuExperienceStore
from kope_mcp.memory.vectors import VectorIndex

log = logging.getLogger(__name__)

# Texts per model call in the background: large enough to amortise the write, small enough that a worker checks
# for questions (which go first) several times a second.
EMBED_BATCH = 32
WRITE_ROWS = 1024  # embeddings per COPY into the store
WRITE_IDLE_S = 0.3  # a pending COPY waits no longer than this for more batches
EmbeddingRow = tuple[str, str, str, list[float]]  # id, kind, model, vector
Job = tuple[str, list[tuple[str, str]]]  # a text and the (kind, id) of every item that has it
WrittenQueue = queue.Queue[tuple[int, list[EmbeddingRow]] | None]  # (items done, rows) from the workers



class EmbeddingBacklog:
    def __init__(self, store: KuzuExperienceStore, embedder: BackgroundEmbedder, vectors: VectorIndex) -> None:
        self.store = store
        self.embedder = embedder
        self.vectors = vectors
        self._stopping = threading.Event()
        self._backlog_queued = threading.Event()
        # One entry per text to embed, with every item that has that text: a team's memory repeats itself (the
        # generated one of tools/bench_retrieval.py has 60k distinct texts among a million lessons), and a batch
        # of 32 distinct texts costs the model what a batch of 32 copies of one text does.
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._in_flight = 0  # texts taken off the queue whose vectors are not in the search index yet
        self._in_flight_lock = threading.Lock()
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        if self.embedder.enabled and self._worker is None:
            self._worker = threading.Thread(target=self._embed_loop, name="kope-embed-worker", daemon=True)
            self._worker.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=10)
            self._worker = None

    def load_vectors(self) -> None:
        """Stored embeddings into the vector file when it does not hold them all (never on the handshake path);
        else read it once, so the first question does not wait for the disk."""
        if self.vectors.loaded.is_set():
            self.vectors.warm()
            return
        self.vectors.clear()
        for page in self.store.embedding_pages():
            self.vectors.add_many(page)
        self.vectors.loaded.set()

    @property
    def semantic_ready(self) -> bool:
        return self.embedder.available and self.vectors.loaded.is_set()

    @property
    def semantic_status(self) -> str:
        if self.embedder.available and not self.vectors.loaded.is_set():
            return "loading stored embeddings"
        with self._in_flight_lock:
            waiting = self.backlog + self._in_flight
        if self.embedder.available and waiting:
            # While a backlog runs (a million texts take the better part of an hour), say what semantic search
            # can find: only what is embedded; the rest is found by the graph's filters and BM25.
            return (f"{self.embedder.status}; covers the {len(self.vectors):,} items embedded so far, "
                    f"{waiting:,} texts wait for their embedding")
        return self.embedder.status

    def queue_backlog(self) -> int:
        """Queue every stored item that has no vector yet (at start, and after an import wrote many); returns
        how many. Items already queued may be queued twice: the second write is a no-op MERGE."""
        if not self.embedder.available:
            return 0  # the worker queues the backlog itself once the model has loaded
        if len(self.vectors) >= self.store.embeddable_count():
            return 0  # every item has its vector (items are never deleted): no scan of a million ids at start
        items = self.store.unembedded(self.vectors.ids())
        by_text: dict[str, list[tuple[str, str]]] = {}
        for kind, item_id, text in items:
            by_text.setdefault(text, []).append((kind, item_id))
        # Shortest first: a batch pads every text to its longest, so texts of like length embed together (sorted,
        # 10-20% more texts per second on the suite's lessons than in the order they were stored).
        for job in sorted(by_text.items(), key=lambda job: len(job[0])):
            self._queue.put(job)
        return len(items)

    @property
    def backlog(self) -> int:
        """Texts waiting for their embedding (each for one item or more)."""
        return self._queue.qsize()

    def _embed_loop(self) -> None:
        self.load_vectors()
        while not self.embedder.wait(timeout=0.2):
            if self._stopping.is_set():
                return  # shutting down before the model finished loading
        if not self.embedder.available:
            return
        self.queue_backlog()
        self._backlog_queued.set()
        # One worker per core embeds batches while the writer stores the previous ones: the write (~15-25 ms
        # for 32 rows) is not on the model's path. An item is done (drain) once its vector is stored.
        written: WrittenQueue = queue.Queue(maxsize=4)
        writer = threading.Thread(target=self._write_loop, args=(written,), name="kope-embed-writer", daemon=True)
        writer.start()
        workers = [threading.Thread(target=self._embed_batches, args=(written,), name=f"kope-embed-{n}",
                                    daemon=True) for n in range(1, self.embedder.workers)]
        for worker in workers:
            worker.start()
        try:
            self._embed_batches(written)
        finally:
            for worker in workers:
                worker.join(timeout=30)
            written.put(None)
            writer.join(timeout=30)

    def _embed_batches(self, written: WrittenQueue) -> None:
        """Take batches off the queue until the stop mark (left in the queue for the other workers)."""
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.put(None)
                return
            batch = [item]
            while len(batch) < EMBED_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            with self._in_flight_lock:
                self._in_flight += len(batch)
            texts = list(dict.fromkeys(text for text, _ in batch))
            vectors = dict(zip(texts, self.embedder.embed_batch(texts) or [], strict=False))
            written.put((len(batch), [(item_id, kind, MODEL_NAME, vectors[text])
                                      for text, items in batch if text in vectors for kind, item_id in items]))

    def _write_loop(self, written: WrittenQueue) -> None:
        """Vectors go into the search index at once and into the store by COPYs of up to WRITE_ROWS rows: a
        COPY costs ~1.4 ms a row at 32 rows and ~0.26 ms at 1,024, and on two cores every millisecond spent
        there is taken from the model."""
        count: int = 0
        rows: list[EmbeddingRow] = []
        while True:
            idle = False
            try:
                job = written.get(timeout=WRITE_IDLE_S if rows else None)
            except queue.Empty:
                job, idle = None, True  # no batch for a while: the backlog is done or trickling
            if job is not None:
                count, rows = count + job[0], rows + job[1]
                self.vectors.add_many([(item_id, kind, vector) for item_id, kind, _, vector in job[1]])
                with self._in_flight_lock:
                    self._in_flight -= job[0]
            stopping = job is None and not idle
            if rows and (stopping or idle or len(rows) >= WRITE_ROWS):
                self._store_vectors(count, rows)
                count, rows = 0, []
            if stopping:
                return

    def _store_vectors(self, count: int, rows: list[EmbeddingRow]) -> None:
        try:
            self.store.add_embeddings(rows)
        except RuntimeError as exc:  # Kùzu's errors: these items stay unembedded, re-queued at the next start
            log.warning("could not store %d embeddings: %s", len(rows), exc)
        finally:
            for _ in range(count):
                self._queue.task_done()

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until stored vectors are loaded and queued embeddings written (tests and benchmarks)."""
        if not self.embedder.wait(timeout) or self._worker is None:
            return
        self.vectors.loaded.wait(timeout)
        self._backlog_queued.wait(timeout)
        done = threading.Event()
        def join_then_signal() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=join_then_signal, daemon=True).start()
        done.wait(timeout)

    def enqueue(self, kind: str, item_id: str, text: str) -> None:
        if self.embedder.enabled:
            self._queue.put((text, [(kind, item_id)]))
