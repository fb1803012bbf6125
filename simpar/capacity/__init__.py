"""Capacity planning: time, money, failures and goodput of a training run."""
