"""An in-memory stand-in for the rendezvous store, for driver tests that end rank tasks by hand."""

from __future__ import annotations


class DictStore:
    """``set`` / ``get`` / ``check`` as the driver calls them on a torch ``TCPStore``."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str | bytes) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key: str) -> bytes:
        return self.data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)
