"""The value-driven next size: other models' shapes as a prior, expected value over sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malleparsl.controller import Controller
from malleparsl.errors import SpecError
from malleparsl.jpa import JobProfilingAdvisor, ProbeFirst
from malleparsl.jpa.explore import ShapePrior, choose_next_size
from malleparsl.model import JobSpec

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

rates = st.lists(st.floats(0.01, 1e6, allow_nan=False), min_size=1, max_size=80)


@FAST
@given(rates, st.integers(-3, 90), st.integers(-3, 90), st.integers(0, 90),
       st.floats(0.0, 0.5))
def test_next_size_stays_within_bounds_and_available_nodes(r, lo, hi, available, tol):
    expected = np.array([0.0, *r])
    k = choose_next_size(expected, lo=lo, hi=hi, available=available, gain_tol=tol)
    top = min(hi, available, expected.size - 1)
    if top < max(lo, 1):
        assert k is None
    else:
        assert k is not None and max(lo, 1) <= k <= top
        assert expected[k] >= (1 - tol) * max(expected[max(lo, 1) : top + 1])


def shape_curve(kind: int, n: np.ndarray, knee: int) -> np.ndarray:
    """Three shapes: a peak at ``knee``, a plateau from ``knee``, a dip at 2 then growth."""
    if kind == 0:
        return np.where(n <= knee, n, knee * np.maximum(1 - 0.03 * (n - knee), 0.05))
    if kind == 1:
        return np.minimum(n, knee) * 0.9 + 0.1
    return np.where(n == 2, 0.7, np.sqrt(n))


@FAST
@given(st.integers(0, 2), st.integers(2, 40), st.floats(0.5, 5e4), st.integers(8, 64),
       st.integers(1, 64))
def test_with_an_exact_prior_the_next_size_is_the_best_size(kind, knee, level, n_max, avail):
    """A population holding exactly this job's shape sends it to its best size at once."""
    n = np.arange(1, n_max + 1)
    true = shape_curve(kind, n, knee)
    prior = ShapePrior()
    assert prior.offer("same-shape", dict(zip(n.tolist(), (3.0 * true).tolist(), strict=True)))
    post = prior.posterior({1: level * true[0]}, n_max, exclude="this-model")
    assert post is not None and post.members == 1
    np.testing.assert_allclose(post.mean[1:], level * true, rtol=1e-9)
    k = choose_next_size(post.mean, lo=2, hi=n_max, available=avail, gain_tol=0.0)
    top = min(n_max, avail)
    if top < 2:
        assert k is None
    else:
        assert k == 2 + int(np.argmax(true[1:top]))


def test_shapes_that_disagree_with_the_measurements_lose_weight():
    n = np.arange(1, 33)
    peak = np.where(n <= 8, n, 8 * (1 - 0.04 * (n - 8)))
    linear = n * 1.0
    prior = ShapePrior()
    prior.offer("peaky", dict(zip(n.tolist(), peak.tolist(), strict=True)))
    prior.offer("linear", dict(zip(n.tolist(), linear.tolist(), strict=True)))
    # measured at 1 and 16 nodes on the peaked curve: the linear shape misses 16 by a factor 4
    post = prior.posterior({1: 50.0, 16: 50.0 * peak[15]}, 32)
    assert post is not None
    np.testing.assert_allclose(post.mean[1:], 50.0 * peak, rtol=1e-6)
    assert choose_next_size(post.mean, lo=17, hi=32, available=32) == 17  # nothing past 16 pays
    assert choose_next_size(post.mean, lo=1, hi=32, available=32) == 8


def test_no_posterior_without_shapes_reaching_past_the_job_or_without_readings():
    prior = ShapePrior()
    assert prior.posterior({1: 10.0}, 16) is None
    prior.offer("m", {1: 1.0, 4: 3.0})
    assert prior.posterior({4: 10.0}, 16) is None  # the shape says nothing beyond 4
    assert prior.posterior({}, 16) is None
    assert prior.posterior({1: 10.0}, 16, exclude="m") is None  # its own model is no population
    post = prior.posterior({1: 10.0}, 16)
    assert post is not None and post.support == 4 and post.mean[16] == pytest.approx(30.0)


def test_a_better_explored_shape_is_kept_and_bad_input_is_refused():
    prior = ShapePrior()
    assert not prior.offer("m", {1: 5.0})  # one point is no shape
    assert prior.offer("m", {1: 5.0, 2: 9.0, 4: 15.0})
    assert not prior.offer("m", {1: 5.0, 2: 8.0})  # fewer sizes: the old shape stays
    assert prior.shapes["m"].sizes == (1, 2, 4)
    assert not prior.offer("m", {1: 5.0, 2: 9.0, 4: 15.0})  # unchanged: no new version
    with pytest.raises(SpecError, match="tol"):
        ShapePrior(tol=0.0)
    with pytest.raises(SpecError, match="gain_tol"):
        choose_next_size(np.ones(4), lo=1, hi=3, available=3, gain_tol=1.0)
    with pytest.raises(SpecError, match="gain_tol"):
        JobProfilingAdvisor(gain_tol=-0.1)


def _after_one_probe(shape_prior: bool) -> int:
    """Nodes a new model gets after its one-node probe, when another model's peaked shape
    (best at 12 of 32 nodes) is known."""
    n = np.arange(1, 33)
    curve = np.where(n <= 12, 100.0 * n, 1200.0 * (1 - 0.03 * (n - 12)))
    jpa = JobProfilingAdvisor(warmup_obs=0, shape_prior=shape_prior)
    if jpa.shapes is not None:
        jpa.shapes.offer("other-model", dict(zip(n.tolist(), (curve / 7).tolist(), strict=True)))
    ctl = Controller(policy=ProbeFirst(advisor=jpa, inner="milp"), advisor=jpa)
    ctl.add_nodes([f"n{i:02d}" for i in range(32)], now_s=0)
    ctl.submit(JobSpec("a", model="new-model", min_nodes=1, max_nodes=32, rescale_up_s=1.0),
               now_s=0)
    ctl.replan(now_s=0)
    assert ctl.allocation.size("a") == 1  # the first probe: one node, the cheapest
    t = 10.0
    for _ in range(2):
        ctl.observe("a", n_nodes=1, samples_per_s=100.0, now_s=t)
        t += 300.0
    ctl.replan(now_s=t)
    return ctl.allocation.size("a")


def test_a_new_model_jumps_to_the_best_size_the_population_expects():
    assert _after_one_probe(shape_prior=True) == 12
    assert _after_one_probe(shape_prior=False) <= 4  # the ladder: x4 per reading


def test_the_shape_prior_is_off_by_default():
    """Measured on the zoo it did not beat the ladder (docs/jpa-log.md, "The 0:512 walk and the
    shape prior"), so it is opt-in."""
    assert JobProfilingAdvisor().shapes is None
    assert JobProfilingAdvisor(shape_prior=True).shapes is not None
