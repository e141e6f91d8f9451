"""How a rescale and a preemption are paid: one definition for the accounting and the policies.

The rule lives here once, for the accountings and the policies' models. Only the BFTrainer
replay (:mod:`~malleparsl.sim.bftrainer`) charges with one of these objects and hands the same
object to the policy (``policy.costs``; a conflicting explicit option is an error). The default
engine (:mod:`~malleparsl.sim.engine`) charges ``PAUSE`` in time (the job trains nothing while
it restarts at its new size) but does not touch ``policy.costs``: the count model (``milp`` and
its variants) plans with ``OLD_RATE`` on purpose there, because its myopic objective (``Tfwd``
= 10 s) never repays a start's pause — ``milp`` with ``costs="pause"`` under the default
accounting trained 0 samples on ImageNet 24 h 0:64, 0:128, 0:512 and ``poisson`` 0:128 seeds
0-1 — while ``hold`` plans with ``PAUSE``. Two rules are in use:

- ``OLD_RATE`` (BFTrainer's objective and its replayer's accounting): a rescale costs
  ``pause x rate at the OLD size``, so a start from 0 nodes is free; a preemption costs
  ``rescale_down_s x`` the rate before it, once per job that lost nodes.
- ``PAUSE`` (what a machine does): the job trains nothing while it restarts at its NEW size,
  so a rescale costs ``pause x rate at the new size`` and a start pays its pause too.

>>> import numpy as np
>>> rates = np.array([0.0, 10.0, 20.0, 30.0, 40.0])  # rate at 0..4 nodes
>>> OLD_RATE.rescale(np.array([0, 2, 4]), 2, rates, 5.0, 2.0).tolist()  # from 2 nodes
[40.0, 0.0, 100.0]
>>> PAUSE.rescale(np.array([0, 2, 4]), 0, rates, 5.0, 2.0).tolist()  # a start pays
[0.0, 100.0, 200.0]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from malleparsl.errors import SpecError

__all__ = ["OLD_RATE", "PAUSE", "RescaleCosts", "costs_named"]


@dataclass(frozen=True)
class RescaleCosts:
    """A rule for what rescales and preemptions cost, in samples."""

    name: str
    at_new_size: bool  # the pause is paid at the rate after the change (else: before it)

    def rescale(
        self, sizes: np.ndarray, c: int, rates: np.ndarray, up_s: float, down_s: float
    ) -> np.ndarray:
        """Cost of moving from ``c`` nodes to each of ``sizes`` (``rates[n]``: rate at n)."""
        sizes = np.asarray(sizes, dtype=np.int64)
        paid = rates[sizes] if self.at_new_size else np.full(sizes.shape, float(rates[c]))
        pause = np.where(sizes > c, up_s, np.where(sizes < c, down_s, 0.0))
        return pause * paid

    def preemption(self, rate_before: float, down_s: float) -> float:
        """Cost charged once to a job that lost nodes to the trace (its pause to restart)."""
        return down_s * rate_before


OLD_RATE = RescaleCosts("old-rate", at_new_size=False)
PAUSE = RescaleCosts("pause", at_new_size=True)
_BY_NAME = {c.name: c for c in (OLD_RATE, PAUSE)}


def costs_named(name: str | RescaleCosts) -> RescaleCosts:
    """The rule called ``name`` (a rule passes through); unknown names list the valid ones."""
    if isinstance(name, RescaleCosts):
        return name
    try:
        return _BY_NAME[name]
    except KeyError:
        raise SpecError(
            f"costs must be one of {', '.join(sorted(_BY_NAME))}, got {name!r}"
        ) from None
