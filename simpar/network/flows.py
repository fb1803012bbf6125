"""Max-min fair sharing of link bandwidth among concurrent flows (progressive filling).

Each flow carries `size` bytes over links with shares w (ECMP splits); all flows of a phase start
together, every unfrozen flow's rate rises at the same pace until some link is full, the flows on it
freeze, and so on. A phase lasts until its slowest flow is done: max(size / rate)."""

from __future__ import annotations

import numpy as np


def max_min_rates(f_idx: np.ndarray, l_idx: np.ndarray, w: np.ndarray, n: int,
                  capacity: np.ndarray) -> np.ndarray:
    """Rate (bytes/s) of each of n flows; incidence arrays say flow f_idx[j] puts share
    w[j] on link l_idx[j]."""
    links, l_local = np.unique(l_idx, return_inverse=True)
    cap = capacity[links].astype(np.float64).copy()
    rate = np.zeros(n)
    frozen = np.ones(n, dtype=bool)
    frozen[f_idx] = False  # flows with no links (a rank to itself) take no time
    rate[frozen] = np.inf
    while not frozen.all():
        active = ~frozen[f_idx]
        load = np.bincount(l_local[active], weights=w[active], minlength=len(links))
        used = load > 0
        share = np.full(len(links), np.inf)
        share[used] = cap[used] / load[used]
        inc = share.min()
        rate[~frozen] += inc
        cap -= inc * load
        full = used & (share <= inc * (1 + 1e-9))
        frozen[f_idx[active & full[l_local]]] = True
    return rate


def phase_time(sizes: np.ndarray, rates: np.ndarray) -> float:
    """Seconds until the slowest flow of a phase has moved its bytes (rates do not
    depend on sizes)."""
    if len(sizes) == 0:
        return 0.0
    return float(np.max(np.where(np.isinf(rates), 0.0, sizes / rates)))
