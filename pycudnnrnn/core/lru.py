"""A small thread-safe LRU cache, for descriptors, dropout states and plans."""

from __future__ import annotations

import collections
import threading


class LRU:
    """Keeps the `maxsize` most recently used values; evicted ones are freed once unused."""

    def __init__(self, maxsize: int):
        self.maxsize, self._items, self._lock = maxsize, collections.OrderedDict(), threading.Lock()

    def get(self, key, factory):
        """The value for `key`, built by `factory()` on a miss.

        The build runs outside the lock (it may be slow, and may use other caches); when
        two threads build the same key at once, both get the value stored first and the
        other is dropped, so callers of one key share one value.
        """
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = factory()
        with self._lock:
            value = self._items.setdefault(key, value)
            self._items.move_to_end(key)
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)
        return value

    def clear(self):
        with self._lock:
            self._items.clear()

    def __len__(self):
        return len(self._items)
