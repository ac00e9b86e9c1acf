"""What a sandboxed worker hands back, shared by the worker (a program the sandbox runs) and the service that
reads it: a base module, so that neither side imports the other."""

from __future__ import annotations

# reference_worker.py: raw arrays, then a JSON manifest, its length (little-endian u64) and this, in a memory file.
REFERENCE_MAGIC = b"KOPEREF1"
