"""Regularised evolution: seed population, tournament + mutation, aging, valid architectures."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from malleparsl.errors import SpecError
from malleparsl.workflows.nas import ArchSpace, RegularizedEvolution, build_model


def fitness(arch):
    # Prefers MLPs whose widths sum to 200: a landscape mutation can climb.
    if arch["kind"] != "mlp":
        return -1000.0
    return -abs(sum(arch["layers"]) - 200)


def test_first_population_is_random_then_children_come_from_the_population():
    ev = RegularizedEvolution(n_trials=20, population_size=5, sample_size=2, seed=0)
    seen = []
    while not ev.done:
        s = ev.ask()
        if len(seen) < 5:
            assert s.parent is None
        else:
            assert s.parent in {t for t in ev.trials if ev.trials[t].results}
        seen.append(s)
        ev.tell(s, {"accuracy": fitness(s.config["arch"])})
    assert len(seen) == 20 and len(ev.population) == 5
    # aging: the population is exactly the five most recently told trials
    assert list(ev.population) == [s.trial_id for s in seen[-5:]]


def test_waits_for_the_seed_population_before_mutating():
    ev = RegularizedEvolution(n_trials=10, population_size=3, sample_size=2, seed=0)
    first = [ev.ask() for _ in range(3)]
    assert ev.ask() is None, "no parent has a result yet"
    ev.tell(first[0], 0.5)
    child = ev.ask()
    assert child.parent == first[0].trial_id


def test_evolution_climbs_a_landscape_better_than_its_random_start():
    ev = RegularizedEvolution(space=ArchSpace(kinds=("mlp",)), n_trials=120,
                              population_size=10, sample_size=4, seed=7)
    order = []
    while not ev.done:
        s = ev.ask()
        f = fitness(s.config["arch"])
        order.append(f)
        ev.tell(s, f)
    assert sum(order[-10:]) / 10 > sum(order[:10]) / 10
    assert ev.best().results[0] >= max(order[:10])


def test_base_hyperparameters_are_merged_into_every_config():
    ev = RegularizedEvolution(n_trials=2, population_size=2, sample_size=1, base={"lr": 0.01})
    assert ev.ask().config["lr"] == 0.01


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [({"sample_size": 5, "population_size": 2}, "lower sample_size"),
     ({"n_trials": 0}, "n_trials"),
     ({"space": None, "population_size": 0}, "population_size")],
)
def test_bad_settings_are_explained(kwargs, fragment):
    with pytest.raises(SpecError, match=fragment):
        RegularizedEvolution(**kwargs)


def test_arch_space_rejects_unknown_kinds():
    with pytest.raises(SpecError, match="kinds"):
        ArchSpace(kinds=("rnn",))


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 100_000), steps=st.integers(1, 15))
def test_mutations_stay_inside_the_space(seed, steps):
    space = ArchSpace()
    rng = random.Random(seed)
    arch = space.sample(rng)
    for _ in range(steps):
        child = space.mutate(arch, rng)
        assert child != arch, "a mutation must change something"
        assert child["kind"] == arch["kind"]
        if child["kind"] == "mlp":
            assert 1 <= len(child["layers"]) <= space.max_layers
            assert set(child["layers"]) <= set(space.widths)
        else:
            assert 1 <= len(child["channels"]) <= space.max_convs
            assert child["kernel"] in space.kernels and child["fc"] in space.widths
        assert child["activation"] in space.activations
        arch = child


def test_built_models_map_digits_batches_to_ten_logits():
    import torch

    rng = random.Random(0)
    space = ArchSpace()
    x = torch.randn(5, 64)
    kinds = set()
    for _ in range(12):
        arch = space.sample(rng)
        kinds.add(arch["kind"])
        assert build_model(arch)(x).shape == (5, 10)
    assert kinds == {"mlp", "cnn"}
    with pytest.raises(SpecError, match="activation"):
        build_model({"kind": "mlp", "layers": [4], "activation": "swish"})
