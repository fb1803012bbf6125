"""simpar: plan and simulate distributed deep-learning training."""

__version__ = "0.1.0"
