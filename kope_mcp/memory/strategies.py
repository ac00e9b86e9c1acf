"""Strategy canonicalisation: "OpenMP over rows" and "parallelize rows with omp" land on one Strategy node."""

from __future__ import annotations

import re

_SYNONYMS = {
    "omp": "openmp", "parallelize": "parallel", "parallelise": "parallel", "parallelized": "parallel",
    "parallelised": "parallel", "parallelization": "parallel", "parallelisation": "parallel", "threads": "parallel",
    "threading": "parallel", "multithreading": "parallel", "multithreaded": "parallel",
    "vectorize": "simd", "vectorise": "simd", "vectorized": "simd", "vectorised": "simd",
    "vectorization": "simd", "vectorisation": "simd", "vector": "simd", "intrinsics": "simd",
    "unrolling": "unroll", "unrolled": "unroll", "tiling": "block", "tile": "block", "tiles": "block",
    "tiled": "block", "blocking": "block", "blocked": "block", "interchange": "reorder", "reordering": "reorder",
    "swap": "reorder", "accumulators": "accumulator", "accumulation": "accumulator", "prefetching": "prefetch",
    "rows": "row", "columns": "column", "cols": "column", "loops": "loop", "caches": "cache",
}
_STOPWORDS = {"the", "a", "an", "of", "for", "over", "with", "by", "and", "to", "in", "on", "using", "use", "via",
              "into", "per", "each"}
_TOKEN = re.compile(r"[a-z0-9]+")
SAME_STRATEGY_JACCARD = 0.75
SAME_STRATEGY_COSINE = 0.9


def strategy_key(text: str) -> str:
    tokens = {_SYNONYMS.get(t, t) for t in _TOKEN.findall(text.lower())} - _STOPWORDS
    return " ".join(sorted(tokens))


def jaccard(a: str, b: str) -> float:
    sa, sb = set(a.split()), set(b.split())
    if not sa or not sb:
        return 0.0
    return len(sa & sb) / len(sa | sb)
