"""A small least-recently-used cache for records that never change once written (a kernel's source, a session's
task and hardware), so the compile path does not read them back from the graph each time."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class RecentCache(Generic[K, V]):
    """At most ``max_items`` values and ``max_size`` in ``size`` units (bytes of source, say); the least recently
    used go first. Safe to share between threads."""

    def __init__(self, max_items: int, max_size: int | None = None, size: Callable[[V], int] | None = None) -> None:
        self.max_items = max_items
        self.max_size = max_size
        self._size_of = size or (lambda _: 0)
        self._values: OrderedDict[K, V] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._values.get(key)
            if value is not None:
                self._values.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        size = self._size_of(value)
        if self.max_size is not None and size > self.max_size:
            return  # larger than the whole cache: never worth evicting everything for
        with self._lock:
            old = self._values.pop(key, None)
            if old is not None:
                self._size -= self._size_of(old)
            self._values[key] = value
            self._size += size
            while len(self._values) > self.max_items or (self.max_size is not None and self._size > self.max_size):
                _, evicted = self._values.popitem(last=False)
                self._size -= self._size_of(evicted)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()
            self._size = 0
