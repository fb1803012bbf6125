"""Discrete-event simulation of a training step (simpy): pipeline schedules, overlap,
contention, traces."""
