"""A link shared by concurrent transfers (processor sharing, the max-min fair share of
one bottleneck).

Each transfer brings the seconds it would take alone; while n transfers are active each advances at
1/n of the link, so two gradient buckets on one NIC take twice as long as one. With `shared=False`
every transfer runs at full speed (no contention)."""

from __future__ import annotations

import itertools
import math


class Channel:
    def __init__(self, env, shared: bool = True):
        self.env, self.shared = env, shared
        self.active: dict = {}  # completion event -> seconds of work left (at full speed)
        self.last = env.now
        self._token = itertools.count()
        self._current = None

    def transfer(self, seconds: float):
        """An event that fires when a transfer of `seconds` (alone) has finished."""
        done = self.env.event()
        if seconds <= 0:
            done.succeed()
            return done
        if not self.shared:
            self.env.process(self._alone(seconds, done))
            return done
        self._advance()
        self.active[done] = seconds
        self._reschedule()
        return done

    def backlog_s(self) -> float:
        """Seconds until the link would be idle if nothing else arrived."""
        self._advance()
        return sum(self.active.values())

    def _alone(self, seconds, done):
        yield self.env.timeout(seconds)
        done.succeed()

    def _advance(self):
        n = len(self.active)
        if n:
            step = (self.env.now - self.last) / n
            for k in self.active:
                self.active[k] -= step
        self.last = self.env.now

    def _reschedule(self):
        if not self.active:
            return
        token = next(self._token)
        self._current = token
        delay = min(self.active.values()) * len(self.active)
        self.env.process(self._wake(max(delay, 0.0), token))

    def _wake(self, delay, token):
        yield self.env.timeout(delay)
        if token != self._current:
            return  # superseded by a later arrival or completion
        self._advance()
        # Done: what is left would take less than the clock can still resolve at this
        # time. Late in a long simulation a float's step is far above 1e-12 s, and a
        # transfer left a few of them short would be woken again and again without the
        # clock moving (the hang an absolute tolerance gave).
        resolution = max(1e-12, 4 * math.ulp(self.env.now))
        n = len(self.active)
        for k in [k for k, left in self.active.items() if left * n <= resolution]:
            del self.active[k]
            k.succeed()
        self._reschedule()
