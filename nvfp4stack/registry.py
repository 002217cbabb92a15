"""One generic name -> class registry used for converters and kernel backends."""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named collection of plugin classes: ``@REG.register("name")`` then ``REG.get("name")``."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(
                    f"{self.kind} {name!r} is registered twice "
                    f"({self._items[name]!r} and {obj!r}); give one of them another name"
                )
            self._items[name] = obj
            try:
                obj.name = name  # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                pass
            return obj

        return deco

    def alias(self, alias: str, name: str) -> None:
        """Accept ``alias`` wherever ``name`` is accepted (e.g. 'cutedsl' for 'flashinfer_cutedsl')."""
        self._aliases[alias] = name

    def canonical(self, name: str) -> str:
        return self._aliases.get(name, name)

    def get(self, name: str) -> T:
        try:
            return self._items[self.canonical(name)]
        except KeyError:
            aliases = "".join(f", {a} (= {n})" for a, n in sorted(self._aliases.items()))
            raise KeyError(
                f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(self.names())}{aliases}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.canonical(name) in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
