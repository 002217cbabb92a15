"""One generic name -> class registry used for converters and kernel backends."""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from nvfp4stack.usage import did_you_mean

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
            raise KeyError(f"unknown {self.kind} {name!r}; valid {self.kind}s: {self.listing()}"
                           f"{did_you_mean(name, self.spellings())}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def spellings(self) -> list[str]:
        """Every name ``get`` accepts: the registered names and their aliases."""
        return sorted([*self._items, *self._aliases])

    def listing(self) -> str:
        """The accepted names for a message: 'marlin, flashinfer_cutedsl (alias cutedsl), ...'."""
        aliases: dict[str, list[str]] = {}
        for alias, name in sorted(self._aliases.items()):
            aliases.setdefault(name, []).append(alias)
        return ", ".join(n + (f" (alias {', '.join(aliases[n])})" if n in aliases else "") for n in self.names())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.canonical(name) in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
