"""Predictions held to the numbers pinned in tests/data/pinned_predictions.json, so a change
meant to restructure the code (not the model) fails when it moves any output. Regenerate the
file with tests/data/make_pinned_predictions.py only for a change of the model itself."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
PINNED = json.loads((DATA / "pinned_predictions.json").read_text())
_spec = importlib.util.spec_from_file_location("make_pinned", DATA / "make_pinned_predictions.py")
make_pinned = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_pinned)
REL = 1e-9  # summing the same parts in another order may move the last bits, nothing more


def differences(got, want, path: str = "") -> list[str]:
    """Where two JSON documents differ: numbers beyond REL, any other value, keys or lengths."""
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return [f"{path}: keys {sorted(set(got) ^ set(want))}"]
        return [d for k in want for d in differences(got[k], want[k], f"{path}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{path}: {len(got)} items, pinned {len(want)}"]
        return [
            d for i, (g, w) in enumerate(zip(got, want, strict=True))
            for d in differences(g, w, f"{path}[{i}]")
        ]
    numbers = (int, float)
    if isinstance(want, numbers) and isinstance(got, numbers) and not isinstance(want, bool):
        return [] if math.isclose(got, want, rel_tol=REL,
                                  abs_tol=1e-12) else [f"{path}: {got!r}, pinned {want!r}"]
    return [] if got == want else [f"{path}: {got!r}, pinned {want!r}"]


def test_every_case_of_the_generator_is_pinned():
    assert {name: case["args"] for name, case in PINNED.items()} == make_pinned.CASES


def test_differences_names_a_moved_number_and_nothing_else():
    want = {"a": [1.0, {"b": 2.0, "c": "x"}], "d": True}
    assert differences(want, want) == []
    moved = {"a": [1.0, {"b": 2.0 * (1 + 1e-6), "c": "x"}], "d": True}
    assert differences(moved, want) == [".a[1].b: 2.000002, pinned 2.0"]
    assert differences({"a": [1.0], "d": True}, want) == [".a: 1 items, pinned 2"]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_prediction_matches_the_pinned_output(name):
    got = make_pinned.run_case(PINNED[name]["args"])
    assert differences(got, PINNED[name]["output"]) == []
