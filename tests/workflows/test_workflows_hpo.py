"""ASHA / successive halving: pure ask/tell decision logic, driven by simulated results."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malleparsl.errors import SpecError
from malleparsl.workflows.hpo import ASHA, successive_halving
from malleparsl.workflows.scheduler import Budget, Decision
from malleparsl.workflows.space import Choice, IntRange, LogUniform, SearchSpace

SPACE = SearchSpace({"q": IntRange(0, 1000)})


def score(cfg):
    return {"accuracy": cfg["q"] / 1000}


def drive_in_order(s):
    """Run every suggestion to completion immediately (one worker)."""
    log = []
    while not s.done:
        sug = s.ask()
        assert sug is not None, "a one-worker loop must always get work until done"
        log.append((sug, s.tell(sug, score(sug.config))))
    return log


def test_budget_rungs_grow_by_eta_and_end_at_max():
    assert Budget(unit="samples", min_budget=100, max_budget=2000, eta=4).rungs == (
        100.0, 400.0, 1600.0, 2000.0)
    assert Budget(min_budget=5, max_budget=5).rungs == (5.0,)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"unit": "steps"}, "unit='epochs'"),
        ({"min_budget": 0}, "> 0"),
        ({"min_budget": 10, "max_budget": 1}, "swap"),
        ({"eta": 1}, "eta"),
    ],
)
def test_budget_rejects_bad_values_with_a_fix(kwargs, fragment):
    with pytest.raises(SpecError, match=fragment):
        Budget(**kwargs)


@pytest.mark.parametrize("sync", [True, False])
def test_nine_trials_eta3_halve_to_three_then_one_and_best_reaches_top(sync):
    s = ASHA(space=SPACE, n_trials=9, budget=Budget(min_budget=1, max_budget=9, eta=3), seed=3,
             synchronous=sync)
    log = drive_in_order(s)
    per_rung = [sum(1 for sug, _ in log if sug.rung == k) for k in range(3)]
    if sync:
        assert per_rung == [9, 3, 1]
    else:  # asynchronous promotion may promote early leaders that are later overtaken
        assert per_rung[0] == 9 and 3 <= per_rung[1] <= 5 and 1 <= per_rung[2] <= per_rung[1]
    best_q = max(r.config["q"] for r in s.trials.values())
    assert s.best().config["q"] == best_q and s.best().top_rung == 2
    assert [sug.budget for sug, _ in log if sug.rung == 2] == [9.0]


def test_asha_promotes_before_rung_is_complete():
    s = ASHA(space=SPACE, n_trials=9, budget=Budget(min_budget=1, max_budget=9, eta=3), seed=0)
    first = [s.ask() for _ in range(3)]
    for sug in first:
        s.tell(sug, score(sug.config))
    nxt = s.ask()
    assert nxt.rung == 1, "3 results at rung 0 with eta=3 allow one promotion at once"
    assert nxt.trial_id == max(first, key=lambda x: x.config["q"]).trial_id


def test_synchronous_halving_waits_for_the_whole_rung():
    s = successive_halving(space=SPACE, n_trials=6,
                           budget=Budget(min_budget=1, max_budget=4, eta=2), seed=0)
    sugs = [s.ask() for _ in range(6)]
    assert s.ask() is None  # all handed out, nothing told
    for sug in sugs[:5]:
        s.tell(sug, score(sug.config))
        assert s.ask() is None, "no promotion until rung 0 is complete"
    s.tell(sugs[5], score(sugs[5].config))
    promoted = []
    while (p := s.ask()) is not None:
        promoted.append(p)
    assert len(promoted) == 3 and {p.rung for p in promoted} == {1}
    top3 = sorted(sugs, key=lambda x: -x.config["q"])[:3]
    assert {p.trial_id for p in promoted} == {t.trial_id for t in top3}


def test_decision_continue_for_promotable_pause_otherwise_stop_at_top():
    s = ASHA(space=SPACE, n_trials=3, budget=Budget(min_budget=1, max_budget=3, eta=3), seed=0)
    a, b, c = s.ask(), s.ask(), s.ask()
    vals = {a.trial_id: 0.1, b.trial_id: 0.2, c.trial_id: 0.9}
    assert s.tell(a, vals[a.trial_id]) is Decision.PAUSE
    assert s.tell(b, vals[b.trial_id]) is Decision.PAUSE
    assert s.tell(c, vals[c.trial_id]) is Decision.CONTINUE
    top = s.ask()
    assert (top.trial_id, top.rung) == (c.trial_id, 1)
    assert s.tell(top, 0.95) is Decision.STOP
    assert s.done and s.final_status()[a.trial_id] == "stopped"


def test_min_mode_ranks_smaller_first():
    s = ASHA(space=SPACE, n_trials=9, metric="loss", mode="min",
             budget=Budget(min_budget=1, max_budget=9, eta=3), seed=1)
    while not s.done:
        sug = s.ask()
        s.tell(sug, {"loss": sug.config["q"]})
    assert s.best().config["q"] == min(r.config["q"] for r in s.trials.values())


def test_failed_trials_do_not_block_the_search():
    s = ASHA(space=SPACE, n_trials=6, budget=Budget(min_budget=1, max_budget=4, eta=2), seed=2)
    n = 0
    while not s.done:
        sug = s.ask()
        n += 1
        if n % 3 == 0:
            s.fail(sug)
        else:
            s.tell(sug, score(sug.config))
    assert any(r.status == "failed" for r in s.trials.values())
    assert s.best() is not None


def test_missing_metric_error_names_the_keys_and_the_fix():
    s = ASHA(space=SPACE, n_trials=1, seed=0)
    sug = s.ask()
    with pytest.raises(SpecError, match=r"no metric 'accuracy'.*metric=<one of \['acc'\]>"):
        s.tell(sug, {"acc": 0.5})


def test_telling_twice_is_rejected():
    s = ASHA(space=SPACE, n_trials=2, seed=0)
    sug = s.ask()
    s.tell(sug, 0.5)
    with pytest.raises(SpecError, match="exactly once"):
        s.tell(sug, 0.5)


def test_nan_results_rank_last_instead_of_crashing():
    s = ASHA(space=SPACE, n_trials=3, budget=Budget(min_budget=1, max_budget=3, eta=3), seed=0)
    a, b, c = s.ask(), s.ask(), s.ask()
    s.tell(a, float("nan"))
    s.tell(b, 0.3)
    s.tell(c, 0.2)
    assert s.ask().trial_id == b.trial_id


def test_space_sampling_is_seeded_and_in_bounds():
    space = SearchSpace({"lr": LogUniform(1e-4, 1e-1), "bs": Choice([16, 32]),
                         "depth": IntRange(1, 3), "fixed": 7})
    a = [space.sample(random.Random(5)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    rng = random.Random(1)
    for _ in range(200):
        cfg = space.sample(rng)
        assert space.contains(cfg) and cfg["fixed"] == 7


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 30), workers=st.integers(1, 8),
       eta=st.sampled_from([2, 3, 4]), sync=st.booleans())
def test_any_completion_order_terminates_with_every_suggestion_told(seed, n, workers, eta, sync):
    """Random completion order, random concurrency: the search always ends, nothing is lost,
    and the best configuration seen at rung 0 reaches the top rung."""
    rng = random.Random(seed)
    s = ASHA(space=SPACE, n_trials=n, budget=Budget(min_budget=1, max_budget=eta**2, eta=eta),
             synchronous=sync, seed=seed)
    running, handed, told = [], 0, 0
    for _ in range(10_000):
        if s.done:
            break
        while len(running) < workers and (sug := s.ask()) is not None:
            running.append(sug)
            handed += 1
        assert running, "not done, nothing running and nothing to ask: a deadlock"
        sug = running.pop(rng.randrange(len(running)))
        s.tell(sug, score(sug.config))
        told += 1
    assert s.done and handed == told and not s.pending
    assert sum(1 for r in s.trials.values() if 0 in r.results) == n
    best0 = max(s.trials.values(), key=lambda r: r.results[0])
    assert best0.top_rung == len(s.rung_budgets) - 1
