"""TopologySpec: the structure of a cluster's fabric (the `topology:` block of a cluster file)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from simpar.errors import SPEC_MAGNITUDE, SpecError, is_number, require

KINDS = ("fat-tree", "torus", "dragonfly", "local")
# The fabric graph is built element by element: a count beyond this is a typo, not a machine
MAX_COUNT = 1_000_000
# Whole-number parameters and their least sensible value (a switch needs a port up and one down)
_COUNTS = {"leaf_radix": 2, "spine_radix": 2, "routers_per_group": 1, "gpus_per_router": 1,
           "global_links_per_router": 1}


@dataclass(frozen=True)
class TopologySpec:
    kind: str
    params: tuple  # sorted (key, value) pairs of the kind's parameters

    def get(self, key, default=None):
        return dict(self.params).get(key, default)


# Parameters each kind accepts, with defaults (None = required).
_PARAMS: dict[str, dict[str, object]] = {
    "fat-tree": {
        "nics_per_node": 0, "switch_latency_us": 0.6, "leaf_radix": 64, "spine_radix": 64,
        "leaf_oversubscription": 1.0, "spine_oversubscription": 1.0, "rail_optimized": True,
        "tiers": 3
    },
    "torus": {"dims": None, "link_bw_gbps": None, "link_latency_us": 1.0},
    "dragonfly": {
        "routers_per_group": None, "gpus_per_router": None, "global_links_per_router": None,
        "local_bw_gbps": None, "global_bw_gbps": None, "link_latency_us": 1.0
    },
    "local": {},
}


def topology_from_dict(data: dict, source: str) -> TopologySpec:
    require(isinstance(data, dict), source, data, "must be a mapping with a `kind`")
    require(
        data.get("kind") in KINDS, f"{source}.kind", data.get("kind"),
        f"choose one of {', '.join(KINDS)}")
    kind: str = data["kind"]
    allowed = _PARAMS[kind]
    params: dict[str, Any] = {}
    for key, value in data.items():
        if key == "kind":
            continue
        if key not in allowed:
            raise SpecError(f"{source}.{key}", value,
                            f"unknown key for a {kind}; known: {', '.join(allowed)}")
        params[key] = value
    for key, default in allowed.items():
        if key not in params:
            require(default is not None, f"{source}.{key}", None, f"is required for a {kind}")
            params[key] = default
    least, most = SPEC_MAGNITUDE
    for key, value in params.items():
        if key.endswith(("_bw_gbps", "_oversubscription")):
            require(is_number(value) and least <= value <= most, f"{source}.{key}", value,
                    f"must be a positive number (between {least:g} and {most:g})")
        if key.endswith("_latency_us"):  # 1e300 answered a collective of 6e298 ms
            require(is_number(value) and (value == 0 or least <= value <= most),
                    f"{source}.{key}", value,
                    f"must be 0 or between {least:g} and {most:g} microseconds")
        if key in _COUNTS:  # switch ports, routers and links come whole
            low = _COUNTS[key]
            require(is_number(value) and value == int(value) and low <= value <= MAX_COUNT,
                    f"{source}.{key}", value, f"give a whole number from {low} to {MAX_COUNT:,}")
            params[key] = int(value)
    if kind == "fat-tree":
        require(params["tiers"] in (2, 3) and isinstance(params["tiers"], int), f"{source}.tiers",
                params["tiers"], "give 2 (leaves and spines) or 3 (and a core)")
        require(isinstance(params["rail_optimized"], bool), f"{source}.rail_optimized",
                params["rail_optimized"], "give true or false")
        nics = params["nics_per_node"]
        require(is_number(nics) and nics >= 0 and int(nics) == nics, f"{source}.nics_per_node",
                nics, "give a whole number of NICs per node (0: one per GPU)")
    if kind == "dragonfly":
        # a group's routers are wired all to all, beside their global links: a group of 10^6
        # routers filled memory building its graph
        r = params["routers_per_group"]
        links = r * (r + params["global_links_per_router"])
        require(links <= MAX_COUNT, f"{source}.routers_per_group", r,
                f"a group of {r:,} routers wires {links:,} links, beyond {MAX_COUNT:,}: real "
                "dragonfly groups hold 16-64 routers")
    if kind == "torus":
        dims = params["dims"]
        require(
            isinstance(dims, list) and len(dims) in (2, 3) and
            all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims)
            and math.prod(dims) <= MAX_COUNT, f"{source}.dims", dims,
            f"give 2 or 3 positive integers, e.g. [4, 4, 4], of at most {MAX_COUNT:,} nodes")
        params["dims"] = tuple(dims)
    return TopologySpec(kind, tuple(sorted(params.items())))
