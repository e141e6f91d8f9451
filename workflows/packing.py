"""Pack a search's trials into fused arrays: many trials, one malleable job (HFTA).

:class:`PackedTrialRunner` is a drop-in :class:`~malleparsl.workflows.apprunner.AppTrialRunner`
for ASHA, successive halving, regularised evolution or fixed trials. Suggestions that may
share a model (same architecture, batch size and optimizer kind: :func:`pack_key`) and
arrive together (within ``linger_s``) become one array job
(:func:`malleparsl.apps.fused.train_array` through ``array_fn``); each suggestion still gets
its own future, resolved when its trial reaches the suggestion's budget.

* **Array size** (``pack="auto"``): :class:`ArraySizer` measures the fused throughput of the
  configuration at B = 1, 2, 4, ... in this process and keeps doubling while the total rate
  grows by at least ``min_gain``, within ``memory_cap_bytes`` (parameters, gradients,
  optimizer state and activations per trial, measured); ``pack=<int>`` fixes it.
* **Rungs**: with ``rungs`` (the scheduler's budgets) an array trains on through the rungs,
  stopping at each to evaluate and export every trial; the workflow reads each trial's rung
  result while the array trains on. A trial the scheduler pauses or stops leaves its array
  at the next step boundary (:func:`~malleparsl.apps.fused.request_drop`); a promoted trial
  stays, or, if it has left, is re-packed with others from its rung checkpoint.
* The allocator and the JPA see one job per array whose rate is the sum over its trials.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from malleparsl.errors import SpecError

from .apprunner import AppTrialRunner, batch_of
from .results import TrialRow
from .scheduler import Suggestion

log = logging.getLogger(__name__)

PER_TRIAL_KEYS = frozenset({"lr", "weight_decay", "momentum", "beta1", "beta2", "eps", "seed"})


def pack_key(config: Mapping[str, Any]) -> str:
    """Trials with equal keys can share an array: everything but per-trial hyperparameters."""
    return json.dumps({k: v for k, v in config.items() if k not in PER_TRIAL_KEYS},
                      sort_keys=True, default=str)


class ArraySizer:
    """Chooses B from the measured fused throughput of a configuration, capped by memory."""

    def __init__(self, *, build: Callable[[Mapping[str, Any]], Any], max_size: int = 16,
                 min_gain: float = 1.15, memory_cap_bytes: float = 2e9, steps: int = 8,
                 global_batch_of: Callable[[Mapping[str, Any]], int] | None = None) -> None:
        self.build, self.max_size, self.min_gain = build, max_size, min_gain
        self.memory_cap_bytes, self.steps = memory_cap_bytes, steps
        # the batch the arrays will train (AppTrialRunner's global_batch_of), else batch_size
        self.global_batch_of = global_batch_of
        self.measured: dict[str, dict[str, Any]] = {}

    def size_for(self, config: Mapping[str, Any]) -> int:
        key = pack_key(config)
        if key not in self.measured:
            self.measured[key] = self._measure(config)
        return self.measured[key]["size"]

    def _measure(self, config: Mapping[str, Any]) -> dict[str, Any]:
        from malleparsl.apps.bench_fused import fused_rate

        gb = (batch_of(self.global_batch_of, config) if self.global_batch_of is not None
              else int(config.get("batch_size", 64)))
        rates: dict[int, float] = {}
        b, size, mem = 1, 1, 0
        while b <= self.max_size:
            rates[b], mem = fused_rate(self.build, config, b, gb=gb, steps=self.steps)
            if b * mem > self.memory_cap_bytes:
                break
            if b > 1 and rates[b] < self.min_gain * rates[b // 2]:
                break
            size, b = b, b * 2
        doc = {"size": size, "rates": rates, "bytes_per_trial": mem,
               "speedup": round(rates[size] / rates[1], 3)}
        log.info("array size for %s: %s", pack_key(config), doc)
        return doc


@dataclass
class _Array:
    array_id: str
    stage: str
    directory: str
    stops: list[int]
    members: list[str]
    future: Any = None
    waiting: dict[tuple[str, int], tuple[cf.Future, int]] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)


class PackedTrialRunner(AppTrialRunner):
    """:class:`AppTrialRunner` that trains compatible suggestions together as trial arrays.

    Parameters (besides :class:`AppTrialRunner`'s)
    ----------
    array_fn
        ``fn(ctx, *, trials, stops)`` training a list of trials as one array (e.g.
        :func:`malleparsl.workflows.digits.train_digits_array`).
    steps_of
        Steps a configuration (with its budget under ``budget_unit``) trains in all.
    rungs
        The scheduler's rung budgets (``Budget.rungs``): arrays train through them.
    pack
        ``"auto"`` (an :class:`ArraySizer` over ``build``) or a fixed array size.
    build
        ``build(config) -> nn.Sequential`` for the sizer's measurement.
    """

    def __init__(self, *, array_fn: Callable[..., Any], steps_of: Callable[[Mapping[str, Any]], int],
                 rungs: Sequence[float] | None = None, pack: str | int = "auto",
                 build: Callable[[Mapping[str, Any]], Any] | None = None, max_array: int = 16,
                 linger_s: float = 0.5, sizer: ArraySizer | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if pack != "auto" and (isinstance(pack, bool) or not isinstance(pack, int) or pack < 1):
            raise SpecError(f"pack must be 'auto' or an array size >= 1, got {pack!r}")
        if pack == "auto" and sizer is None and build is None:
            raise SpecError("pack='auto' measures the model: give build=<config -> nn.Sequential>")
        self.array_fn, self.steps_of, self.pack = array_fn, steps_of, pack
        self.rungs = sorted(float(r) for r in rungs) if rungs else None
        self.sizer = sizer or (ArraySizer(build=build, max_size=max_array,
                                          global_batch_of=self.global_batch_of)
                               if pack == "auto" else None)
        self.linger_s = linger_s
        self._array_app: Any = None
        self._pending: dict[str, list[tuple[str, Suggestion, str | None, cf.Future, float]]] = {}
        self._live: dict[tuple[str, str], _Array] = {}
        self.arrays: list[dict[str, Any]] = []  # one record per array launched
        self._futures: list[Any] = []  # every array job's future (see drain)
        self.drops = self.repacks = 0
        self._ids = itertools.count()
        self._mutex = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="packer", daemon=True)
        self._thread.start()

    # -- the runner interface -------------------------------------------------------------
    def _submit(self, stage: str, s: Suggestion, job_id: str, ckpt_dir: str | None) -> cf.Future:
        if ckpt_dir is None:
            raise SpecError("packed trials need ckpt_root (trials move between arrays through "
                            "their checkpoints)")
        fut: cf.Future = cf.Future()
        stop = self.steps_of(self.config_for(s))
        with self._mutex:
            arr = self._live.get((stage, s.trial_id))
            if (arr is not None and s.trial_id not in arr.dropped and stop in arr.stops
                    and not arr.future.done()):
                arr.waiting[(s.trial_id, s.rung)] = (fut, stop)  # it trains on in its array
                return fut
            if arr is not None:
                self.repacks += 1
            self._pending.setdefault(pack_key(s.config), []).append(
                (stage, s, ckpt_dir, fut, time.monotonic()))
        return fut

    def trial_done(self, stage: str, s: Suggestion, row: TrialRow) -> None:
        super().trial_done(stage, s, row)
        if row.status in ("promoted",):
            return
        with self._mutex:
            arr = self._live.get((stage, s.trial_id))
            if arr is None or arr.future.done() or s.trial_id in arr.dropped:
                return
            if arr.stops and arr.stops[-1] <= self.steps_of(self.config_for(s)):
                return  # its last stop: it leaves anyway
            arr.dropped.add(s.trial_id)
            self.drops += 1
        from malleparsl.apps.fused import request_drop

        request_drop(arr.directory, [s.trial_id])

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait for every array job to return (True if all did). A trial's future resolves
        at its result file, while its array may still be saving its last checkpoint; shutting
        the executor down then would abort that job and log an error for nothing."""
        with self._mutex:
            futures = list(self._futures)
        _, pending = cf.wait(futures, timeout=timeout_s)
        return not pending

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        super().close()

    # -- packing and watching -------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self._flush()
                self._watch()
            except Exception:  # noqa: BLE001 - keep the packer alive; futures carry errors
                log.exception("packer loop")

    def _flush(self) -> None:
        now = time.monotonic()
        with self._mutex:
            ready = []
            for key, items in list(self._pending.items()):
                size = self.pack if isinstance(self.pack, int) else self.sizer.size_for(items[0][1].config)
                # one array per stage and rung (its trials start at one step)
                groups: dict[tuple[str, int], list] = {}
                for it in items:
                    groups.setdefault((it[0], it[1].rung), []).append(it)
                left = []
                for group in groups.values():
                    while len(group) >= size or (group and now - group[-1][4] >= self.linger_s):
                        ready.append(group[:size])
                        group = group[size:]
                    left += group
                if left:
                    self._pending[key] = left
                else:
                    del self._pending[key]
        for chunk in ready:
            self._launch(chunk)

    def _launch(self, chunk: list[tuple[str, Suggestion, str | None, cf.Future, float]]) -> None:
        stage, first = chunk[0][0], chunk[0][1]
        cfg = self.config_for(first)
        end = self.steps_of(cfg)
        budgets = [b for b in (self.rungs or []) if b >= first.budget] or [first.budget]
        stops = sorted({self.steps_of({**cfg, self.budget_unit: b}) for b in budgets} | {end})
        start = 0
        if first.rung > 0 and self.rungs and first.rung - 1 < len(self.rungs):
            start = self.steps_of({**cfg, self.budget_unit: self.rungs[first.rung - 1]})
        array_id = f"{stage}-a{next(self._ids):03d}"
        directory = os.path.join(self.ckpt_root, stage, "_arrays", array_id)
        os.makedirs(directory, exist_ok=True)
        trials = [{"trial_id": s.trial_id, "config": dict(s.config), "dir": d,
                   "seed": int(s.config.get("seed", 0)), "start_step": start or None}
                  for _, s, d, _, _ in chunk]
        arr = _Array(array_id, stage, directory, stops, [s.trial_id for _, s, _, _, _ in chunk])
        for _, s, _, fut, _ in chunk:
            arr.waiting[(s.trial_id, s.rung)] = (fut, end)
        if self.global_batch_of is not None:  # its trials share all but per-trial keys (pack_key)
            gb = batch_of(self.global_batch_of, cfg)
        else:
            gb = int(first.config.get("batch_size", 64))
        opts: dict[str, Any] = {"job_id": array_id, "ckpt_dir": directory,
                                "total_samples": float(len(chunk) * max(1, stops[-1] - start) * gb)}
        if self.global_batch_of is not None:  # the controller caps the array's size at it
            opts["global_batch"] = gb
        if self._array_app is None:
            from malleparsl.apps.decorator import malleable_app

            self._array_app = malleable_app(self.array_fn, min_nodes=self.min_nodes,
                                            max_nodes=self.max_nodes, executors=[self.executor],
                                            **self.options)
        with self._mutex:
            arr.future = self._array_app(trials=trials, stops=stops, malleable_options=opts)
            self._futures.append(arr.future)
            for s_id in arr.members:
                self._live[(stage, s_id)] = arr
            self.arrays.append({"array_id": array_id, "stage": stage, "trials": arr.members,
                                "rung": first.rung, "stops": stops})
        log.info("array %s: %d trials %s, stops %s", array_id, len(chunk), arr.members, stops)

    def _watch(self) -> None:
        from malleparsl.apps.fused import result_path

        with self._mutex:
            arrays = {id(a): a for a in self._live.values()}.values()
            for arr in arrays:
                for (tid, rung), (fut, stop) in list(arr.waiting.items()):
                    path = result_path(arr.directory, tid, stop)
                    if path.exists():
                        del arr.waiting[(tid, rung)]
                        doc = json.loads(path.read_text())
                        fut.set_result({k: doc[k] for k in ("accuracy", "loss", "steps", "samples")}
                                       | {"array": arr.array_id})
                if arr.future is not None and arr.future.done() and not arr.waiting:
                    for tid in arr.members:
                        if self._live.get((arr.stage, tid)) is arr:
                            del self._live[(arr.stage, tid)]
                elif arr.future is not None and arr.future.done():
                    exc = arr.future.exception()
                    for key, (fut, stop) in list(arr.waiting.items()):
                        if exc is not None:
                            del arr.waiting[key]
                            fut.set_exception(exc)
                        elif not result_path(arr.directory, key[0], stop).exists():
                            del arr.waiting[key]  # it left before this stop: pack it again
                            fut.set_exception(RuntimeError(
                                f"trial {key[0]} left array {arr.array_id} before step {stop}"))

    def packing_summary(self) -> dict[str, Any]:
        """Arrays launched, their sizes, drops, re-packs and the sizer's measurements."""
        sizes = [len(a["trials"]) for a in self.arrays]
        measured = dict(self.sizer.measured) if self.sizer is not None else {}
        return {"arrays": len(self.arrays), "array_sizes": sizes,
                "packed_trial_runs": sum(sizes), "drops": self.drops, "repacks": self.repacks,
                "measured": [{"size": m["size"], "speedup": m["speedup"],
                              "rates": {str(k): round(v, 1) for k, v in m["rates"].items()},
                              "bytes_per_trial": m["bytes_per_trial"]} for m in measured.values()]}
