"""When the warm-up ends: once the loaders' read-ahead has drained or keeps pace.

The loader processes hold up to ``--prefetch`` batches each read before they are asked for,
filled during the start-up. On storage slower than the accelerators the steps eat into that
read-ahead by ``1 - r`` of a batch per step (``r``: batches read per batch asked for), so it
lasts ``read_ahead / (1 - r)`` steps: near the 90 % line ten times the read-ahead, far more
than a fixed warm-up of ``read_ahead`` steps. Timed steps that begin on it overstate AU and
the read rate, the more the fewer they are. The warm-up therefore runs at least
:attr:`DDPConfig.warmup_steps` steps and then goes on until one of:

* ``drained``: the last batch was not ready when the step asked for it (the loader finished
  it after the request): nothing read ahead is left, the timed steps see the storage's pace;
* ``steady``: the loaders finish batches at least as fast as the steps ask for them (within
  :data:`PACE_SLACK`), measured over the last ``read_ahead`` batches (every loader's share:
  the same loaders at both ends), none of them among the first ``2 x read_ahead`` (read in the
  start-up, or still settling from it: on a 95 MB/s throttle with 8 batches read ahead the
  loaders' pace settled after 12): the read-ahead is not being used up, e.g. compute-bound
  on fast storage;
* ``limit``: :func:`max_warmup` steps, said in the table and the JSON.

Times are ``time.monotonic()`` (system-wide: the loader processes' clock is the worker's).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DRAIN_FACTOR", "PACE_SLACK", "max_warmup", "warmup_end"]

#: the loaders keep pace when they finish the window's batches within this factor of the
#: time the steps took to ask for them (5 %: the read-ahead then moves AU by less than it)
PACE_SLACK = 1.05
#: the warm-up's bound: the minimum plus this many times the read-ahead (drains it while the
#: loaders read 90 % of what the steps ask for)
DRAIN_FACTOR = 10


def max_warmup(min_steps: int, read_ahead: int) -> int:
    """The most warm-up steps: ``min_steps`` where nothing is read ahead, else ``min_steps``
    plus :data:`DRAIN_FACTOR` times the read-ahead."""
    return min_steps + DRAIN_FACTOR * read_ahead if read_ahead > 0 else min_steps


def warmup_end(asked: Sequence[float], ready: Sequence[float | None], *, min_steps: int,
               max_steps: int, read_ahead: int) -> str | None:
    """Whether the warm-up ends after the ``len(asked)`` steps done: ``"drained"``,
    ``"steady"``, ``"limit"`` (see the module's docstring), or None to go on.

    ``asked[i]``: when step ``i`` asked for its batch; ``ready[i]``: when its loader finished
    that batch (None where the source does not say: the warm-up is then ``min_steps``)."""
    n = len(asked)
    if n < min_steps:
        return None
    if n >= max_steps:
        return "limit" if n > min_steps else "fixed"
    last = n - 1
    done = ready[last]
    if done is None:
        return "fixed"
    if last >= 1 and done >= asked[last]:  # step 0 always waits for the loaders to start
        return "drained"
    first = last - max(2, read_ahead)
    if first < max(1, 2 * read_ahead):  # read in the start-up or settling: no pace yet
        return None
    then = ready[first]
    if then is None:
        return "fixed"
    took = asked[last] - asked[first]
    if took > 0 and done - then <= PACE_SLACK * took:
        return "steady"
    return None
