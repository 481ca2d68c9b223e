"""One bounded memo for the hot path's "computed once, kept a while" values.

Each use is a speed trick (docs/performance.md lists them with their figures); they share this helper
so a reader sees at once that a dict is a memo, how big it may grow, and that it never holds more than
``max_entries``. Full, it is emptied and refilled on demand: no eviction order to maintain on a hit, and
what is hot comes back on the next call. A memo never keeps a failure (an exception is not stored) and
never keeps ``None``. What may sit in one (secret plaintext, tokens) is decided where it is used.
"""

from __future__ import annotations

from typing import Callable, Generic, Hashable, NamedTuple, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
A = TypeVar("A", bound=Hashable)


class BoundedMemo(Generic[K, V]):
    """key → value, at most ``max_entries`` of them. ``get`` is the dict's own (a hit is one C call)."""

    __slots__ = ("_data", "max_entries", "get")

    def __init__(self, max_entries: int) -> None:
        self._data: dict[K, V] = {}
        self.max_entries = max_entries
        self.get: Callable[[K], V | None] = self._data.get

    def put(self, key: K, value: V) -> V:
        if len(self._data) >= self.max_entries:
            self._data.clear()
        self._data[key] = value
        return value

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        found = self._data.get(key)
        if found is None:
            found = self.put(key, make())
        return found

    def clear(self) -> None:
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:  # never the contents: a memo may hold derived secret text
        return f"<BoundedMemo {len(self._data)}/{self.max_entries}>"


class MemoInfo(NamedTuple):
    currsize: int
    maxsize: int


def memoized(max_entries: int) -> Callable[[Callable[[A], V]], Callable[[A], V]]:
    """A one-argument pure function memoized in a :class:`BoundedMemo`; the wrapper keeps
    ``functools.lru_cache``'s ``cache_clear()`` and ``cache_info().currsize`` for tests."""
    def wrap(fn: Callable[[A], V]) -> Callable[[A], V]:
        memo: BoundedMemo[A, V] = BoundedMemo(max_entries)
        get, put = memo.get, memo.put

        def memo_fn(arg: A) -> V:
            found = get(arg)
            return found if found is not None else put(arg, fn(arg))

        memo_fn.__name__ = memo_fn.__qualname__ = fn.__name__
        memo_fn.__doc__ = fn.__doc__
        memo_fn.__wrapped__ = fn  # type: ignore[attr-defined]
        memo_fn.memo = memo  # type: ignore[attr-defined]
        memo_fn.cache_clear = memo.clear  # type: ignore[attr-defined]
        memo_fn.cache_info = lambda: MemoInfo(len(memo), max_entries)  # type: ignore[attr-defined]
        return memo_fn
    return wrap
