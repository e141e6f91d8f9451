"""The error for an unknown name: the closest valid name first, then all of them."""

from __future__ import annotations

from malleparsl.errors import UnknownNameError, unknown_name


def test_unknown_name_suggests_the_closest_and_spells_the_plural():
    err = unknown_name("policy", "milpp", ["milp", "hold", "equal-share"])
    assert isinstance(err, UnknownNameError)
    # before: "unknown policy 'milpp'; valid policys are: ..."
    assert str(err).strip("'\"") == (
        "unknown policy 'milpp' (did you mean 'milp'?); valid policies are: equal-share, hold, milp"
    )
    assert "did you mean" not in str(unknown_name("trace", "xyz", ["summit", "theta"]))
    assert "valid traces are" in str(unknown_name("trace", "xyz", ["summit", "theta"]))
    assert "valid node layouts are" in str(unknown_name("node layout", "x", ["a"]))
