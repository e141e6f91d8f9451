"""How long will an idle node stay idle? An estimate from the fragment lengths seen so far.

BFTrainer plans as if the next event were always ``Tfwd`` = 10 s away. Idle gaps on a real
machine are heavy-tailed (Summit: median 8 min, mean 20 min, a few last days), and a node that
has already been idle a while is likely to stay idle longer (the expected remaining life grows
with age for such distributions). :class:`FragmentHorizon` keeps a log-binned histogram of the
lengths of the fragments that have ended (O(1) per record, so it can learn over a whole
two-week trace) and estimates, for a node idle for ``a`` seconds, its expected remaining time
``E[L - a | L > a]``. Where the source announced an end (a batch scheduler's plan), that wins.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from malleparsl.controller import HorizonEstimator
from malleparsl.errors import SpecError
from malleparsl.model import NodeId


class FragmentHorizon(HorizonEstimator):
    """Expected remaining idle time from the empirical distribution of finished fragments.

    Parameters
    ----------
    prior_s
        Remaining time assumed before ``min_samples`` fragments have been seen.
    min_samples
        Fragments to see before trusting the histogram.
    min_remaining_s
        Floor of every estimate (a node is never expected to vanish instantly).
    quantile
        ``None`` estimates the mean remaining time; a number in (0, 1) that quantile of it
        (0.5: the median). Gaps are heavy-tailed, so the mean is dominated by rare long gaps
        while a plan that grows a job onto k nodes lasts until the *first* of them leaves.

    >>> h = FragmentHorizon(min_samples=1)
    >>> for length in (100, 200, 300, 400):
    ...     h.record(length)
    >>> ends = h.estimate(1000.0, {"a": 1000.0, "b": 850.0}, {})
    >>> 200 < ends["a"] - 1000 < 300, ends["b"] > 1000
    (True, True)
    """

    _EDGES = np.logspace(0, 7.5, 301)  # 1 s .. ~370 days, 2.9 % per bin

    def __init__(
        self,
        *,
        prior_s: float = 600.0,
        min_samples: int = 20,
        min_remaining_s: float = 10.0,
        quantile: float | None = None,
    ) -> None:
        if quantile is not None and not 0 < quantile < 1:
            raise SpecError(f"quantile must be in (0, 1) or None (the mean), got {quantile!r}")
        self.quantile = quantile
        if not (prior_s > 0 and min_remaining_s > 0 and min_samples >= 1):
            raise SpecError(
                f"need prior_s > 0, min_remaining_s > 0, min_samples >= 1; got {prior_s!r}, "
                f"{min_remaining_s!r}, {min_samples!r}"
            )
        self.prior_s = float(prior_s)
        self.min_samples = int(min_samples)
        self.min_remaining_s = float(min_remaining_s)
        nb = len(self._EDGES) + 1
        self._count = np.zeros(nb)
        self._sum = np.zeros(nb)
        self._n = 0
        self._suffix: tuple[np.ndarray, np.ndarray] | None = None

    def record(self, length_s: float) -> None:
        """A fragment of ``length_s`` seconds ended (the node was taken back)."""
        if length_s <= 0:
            return
        b = int(np.searchsorted(self._EDGES, length_s, side="right"))
        self._count[b] += 1
        self._sum[b] += length_s
        self._n += 1
        self._suffix = None

    def record_many(self, lengths_s: np.ndarray) -> None:
        """Many ended fragments at once (a facility's history before the replay starts)."""
        x = np.asarray(lengths_s, dtype=float)
        x = x[x > 0]
        if not len(x):
            return
        b = np.searchsorted(self._EDGES, x, side="right")
        self._count += np.bincount(b, minlength=len(self._count))
        self._sum += np.bincount(b, weights=x, minlength=len(self._sum))
        self._n += len(x)
        self._suffix = None

    @property
    def samples(self) -> int:
        return self._n

    def remaining(self, ages_s: np.ndarray) -> np.ndarray:
        """Expected remaining idle seconds for nodes idle for ``ages_s`` seconds."""
        ages = np.asarray(ages_s, dtype=float)
        if self._n < self.min_samples:
            return np.maximum(self.prior_s, self.min_remaining_s) + 0 * ages
        if self._suffix is None:
            c = np.cumsum(self._count[::-1])[::-1]
            s = np.cumsum(self._sum[::-1])[::-1]
            self._suffix = (c, s)
        c, s = self._suffix
        # fragments in bins above the one holding the age: all are longer than the age
        b = np.searchsorted(self._EDGES, np.maximum(ages, 0.0), side="right") + 1
        b = np.minimum(b, len(c) - 1)
        cnt, tot = c[b], s[b]
        if self.quantile is None:
            with np.errstate(invalid="ignore", divide="ignore"):
                rem = np.where(cnt > 0, tot / np.maximum(cnt, 1) - ages, ages)
        else:
            # first bin m >= b holding the q-quantile of the survivors' lengths
            i = np.searchsorted(-c, -(1.0 - self.quantile) * cnt, side="left")
            m = np.clip(i - 1, 0, len(c) - 1)
            mean_in_bin = self._sum[m] / np.maximum(self._count[m], 1)  # the bin's own mean
            rem = np.where(cnt > 0, mean_in_bin - ages, ages)
        # older than anything seen: heavy tails say it lasts about as long again
        return np.maximum(rem, self.min_remaining_s)

    def estimate(
        self, now_s: float, since_s: Mapping[NodeId, float], known_end_s: Mapping[NodeId, float]
    ) -> dict[NodeId, float]:
        todo = [n for n in since_s if n not in known_end_s]
        out = dict(known_end_s)
        if todo:
            ages = now_s - np.fromiter((since_s[n] for n in todo), float, len(todo))
            ends = now_s + self.remaining(ages)
            out.update(zip(todo, ends.tolist()))
        return out
