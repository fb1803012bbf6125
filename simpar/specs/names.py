"""How a user's spelling of a name maps to simpar's: one rule for every catalog simpar looks a
name up in (stacks, pipeline schedules, precisions, GPUs, models, recompute modes).

Users copy names from the tools they run: torchtitan's `1F1B` and `Interleaved1F1B`,
torch's `bfloat16`, a datasheet's `H100-SXM`. A name matches whatever its case and whether
it writes `_` or a space for `-`, and failing that whether it separates its words at all
(`MosaicML` and `Mosaic ML`, `MegatronLM`) where that leaves one match; a catalog may add
aliases (other projects' names for the same thing), keyed in that normal form. A name that
matches nothing comes back as typed, so that the lookup's own check (errors.one_of) refuses it
with its did-you-mean and its list."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache


def normal_form(name) -> str:
    """`name` in the form names are compared in: lower case, `-` for `_` and spaces."""
    return "-".join(str(name).strip().lower().replace("_", " ").split())


def canonical(name, choices: Iterable[str], aliases: Mapping[str, str] | None = None) -> str:
    """The one of `choices` that `name` means (see the module's docstring), or `name` itself
    (also where it is no text: a file's number or null is for the lookup to refuse)."""
    if not isinstance(name, str) or name in choices:  # the search's hot path: exact names
        return name
    normal, compact = _index(tuple(choices), tuple((aliases or {}).items()))
    key = normal_form(name)
    if key in normal:
        return normal[key]
    # the same words run together or split apart: one match, else none
    meant = compact.get(key.replace("-", ""), ())
    return next(iter(meant)) if len(meant) == 1 else name


@lru_cache(maxsize=64)
def _index(choices: tuple, aliases: tuple) -> tuple[dict, dict]:
    """A catalog's names by normal form (its choices first, then its aliases), and the names its
    choices and aliases mean by their normal forms without word separators."""
    normal = {**{k: v for k, v in aliases}, **{normal_form(c): c for c in reversed(choices)}}
    compact: dict[str, set] = {}
    for spelled, meant in [*((c, c) for c in choices), *aliases]:
        compact.setdefault(normal_form(spelled).replace("-", ""), set()).add(meant)
    return normal, compact
