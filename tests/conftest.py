"""Shared test helpers."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def benchmark():
    """Load a script of benchmarks/ as a module: benchmark("published_accuracy")."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        # registered before it runs: its dataclasses look their module up by name
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod

    return load
