"""simpar: plan and simulate distributed deep-learning training.

As a library: `simpar.simulate`, `simpar.compare` and `simpar.plan` take the command
line's flags as keyword arguments and return what the commands print (simpar/api.py)."""

from simpar.api import compare, plan, simulate

__version__ = "0.1.0"
__all__ = ["compare", "plan", "simulate"]
