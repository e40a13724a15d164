"""Run a generator in a background thread a few items ahead (reading while computing)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

__all__ = ["prefetch"]

T = TypeVar("T")


def prefetch(items: Iterator[T], depth: int = 2, name: str = "leopard-prefetch") -> Iterator[T]:
    """Yield ``items`` produced by a background thread at most ``depth`` ahead; an error of
    the producer is re-raised here. Closing the consumer early stops the producer."""
    q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(kind: str, item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put((kind, item), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put("item", item):
                    return
            put("end", None)
        except BaseException as exc:  # handed to the consumer, which re-raises it
            put("error", exc)

    t = threading.Thread(target=work, name=name, daemon=True)
    t.start()
    try:
        while True:
            kind, item = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stop.set()
        t.join(timeout=5)
