"""simpar as a library: `simulate`, `compare` and `plan` take the command line's flags
as keyword arguments (dashes as underscores: `seq_len=4096` for `--seq-len 4096`) and
return what the command prints.

    import simpar best = simpar.compare(model="llama3-70b", gpu="h100-sxm", gpus=1024, seq_len=8192,
    global_batch=1024) print(best.result.ranked[0].strategy, best.result.ranked[0].step_time_s)

The options go through the command's own parser and checks, so a value means the same here as on the
command line, and a bad one raises `SpecError` (its message is the line the command would print)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any, NoReturn

from simpar.cli.checks import check_numbers
from simpar.cli.parser import build_parser
from simpar.cli.predict import Compared, Planned, Simulated, compared, planned, simulated
from simpar.errors import OneLineParser, SpecError, nearest

__all__ = ["Compared", "Planned", "Simulated", "compare", "plan", "simulate"]


def simulate(**options: Any) -> Simulated:
    """`simpar simulate`: one strategy's step time, breakdown and memory (e.g. model,
    gpu, gpus, seq_len, global_batch, tp, pp, schedule, stack, engine)."""
    return simulated(_parse("simulate", options))


def compare(**options: Any) -> Compared:
    """`simpar compare` for one GPU count: every strategy that fits, ranked (`result.ranked`)."""
    return compared(_parse("compare", options))


def plan(**options: Any) -> Planned:
    """`simpar plan`: price a strategy and write it to `out` as a plan for execpar."""
    return planned(_parse("plan", options))


class _RaisingParser(OneLineParser):
    """A bad option raises SpecError instead of ending the program."""

    def error(self, message: str) -> NoReturn:
        raise SpecError("options", self.prog, message)


def _parse(command: str, options: dict[str, Any]) -> argparse.Namespace:
    parser = build_parser(_RaisingParser)
    sub = _subparser(parser, command)
    args = parser.parse_args([command, *_argv(sub, options)])
    check_numbers(args)
    return args


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[command]


def _argv(sub: argparse.ArgumentParser, options: dict[str, Any]) -> list[str]:
    """The flags that say what `options` say: True switches a flag on, False off (or
    leaves it out), None leaves it out, a list or tuple becomes a comma-separated list."""
    actions = {a.dest: a for a in sub._actions if a.option_strings and a.dest != "help"}
    argv: list[str] = []
    for name, value in options.items():
        if name not in actions:
            raise SpecError(
                name, value,
                f"{nearest(name, actions)}not an option of `simpar {sub.prog.split()[-1]}`; "
                f"options: {', '.join(sorted(actions))}")
        action = actions[name]
        if value is None:
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(action.option_strings[0 if value else 1])
        elif action.nargs == 0:  # store_true
            argv += [action.option_strings[0]] if value else []
        else:
            text = (
                ",".join(map(str, value))
                if isinstance(value, Iterable) and not isinstance(value, str)
                else str(value)
            )
            argv += [action.option_strings[0], text]
    return argv
