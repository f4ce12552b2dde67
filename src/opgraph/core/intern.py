"""One interner for the tables of a graph (types, attributes): equal entries share one id.

The builder, the rewriting passes and the readers of the file formats all
keep a list of distinct entries and a dict from entry (or its key) to its
index in that list; :class:`Interner` is that pair, written once.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class Interner(Generic[T]):
    """A table of distinct entries in order of first appearance; :meth:`id` gives an entry's index.

    ``items`` is the table (a list the caller may hand in and keep reading;
    where it already holds duplicates the first one keeps its id) and ``ids``
    maps each entry's key (``key(entry)``, the entry itself without ``key``)
    to its index.

    >>> types = Interner(["f32", "i64"])
    >>> types.id("i64"), types.id("f16"), types.id("f32"), types.items
    (1, 2, 0, ['f32', 'i64', 'f16'])
    >>> attrs = Interner(key=lambda a: tuple(sorted(a.items())))
    >>> attrs.id({"axis": 1}), attrs.id({"axis": 2}), attrs.id({"axis": 1})
    (0, 1, 0)
    """

    __slots__ = ("id", "ids", "items", "key")

    def __init__(self, items: list[T] | None = None, key: Callable[[T], Hashable] | None = None) -> None:
        self.items: list[T] = [] if items is None else items
        self.key = key
        self.ids: dict[Hashable, int] = {}
        for i, item in enumerate(self.items):
            self.ids.setdefault(item if key is None else key(item), i)  # type: ignore[arg-type]
        # Bound once here so that each call is one method call (the builder calls it per op).
        self.id: Callable[[T], int] = self._plain_id if key is None else self._keyed_id

    def _plain_id(self, item: T) -> int:
        i = self.ids.get(item)  # type: ignore[call-overload]
        if i is None:
            i = self.ids[item] = len(self.items)  # type: ignore[index]
            self.items.append(item)
        return i

    def _keyed_id(self, item: T) -> int:
        k = self.key(item)  # type: ignore[misc]
        i = self.ids.get(k)
        if i is None:
            i = self.ids[k] = len(self.items)
            self.items.append(item)
        return i

    def __len__(self) -> int:
        """How many entries the table holds.

        >>> len(Interner(["a", "b"]))
        2
        """
        return len(self.items)
