"""The one error class for bad user input: the CLI prints it on one line and exits 2."""

import argparse
import dataclasses
import difflib
import math
import os
import re
import reprlib
import sys


class SpecError(ValueError):
    """Invalid user input. The message names the field, the value and the fix."""

    def __init__(self, field: str, value, fix: str):
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field}={shown(value)}: {fix}")


# what an error line shows of a value at most: a file's value may be a huge nested structure
MAX_SHOWN_CHARS = 120


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 2, 4, 4
_SHORT.maxstring = _SHORT.maxother = MAX_SHOWN_CHARS


def shown(value) -> str:
    """The value as an error line shows it: its repr, cut short; a flag's list of numbers as the
    user typed it (3,4 and not (3, 4))."""
    if isinstance(value, tuple) and value and all(is_number(v) for v in value):
        text = ",".join(map(str, value))
    else:
        text = _SHORT.repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS - 3] + "..."


def require(ok: bool, field: str, value, fix: str) -> None:
    """Raise SpecError(field, value, fix) unless ok."""
    if not ok:
        raise SpecError(field, value, fix)


def nearest(value, choices) -> str:
    """ "did you mean 'x'? " for a near miss of one of `choices` (a typo), else ""."""
    names = [str(c) for c in choices]
    # a name cut short ("h100") means the shortest name it begins, before the merely
    # similar ("h800"); one letter begins too many names to mean any
    text = str(value)
    close = sorted((c for c in names if len(text) > 1 and c.startswith(text)), key=len)[:1] or \
        difflib.get_close_matches(text, names, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def one_of(field: str, value, choices, what: str = "choose one of") -> None:
    """Require `value` in `choices`; the error suggests the nearest and lists them all
    (worked out only on a miss: a search checks each candidate's choices)."""
    if value not in choices:
        raise SpecError(field, value,
                        f"{nearest(value, choices)}{what} {', '.join(map(str, choices))}")


def reject_unknown(source: str, data: dict, known) -> None:
    """Refuse the first key of a file's mapping `data` (at `source`) that its schema does not
    have (keys sorted as text: a YAML key may be a number)."""
    unknown = sorted(set(data) - set(known), key=str)
    if unknown:
        key = unknown[0]
        raise SpecError(f"{source}.{key}", data[key], f"unknown key; {nearest(key, known)}known "
                        f"keys: {', '.join(sorted(known))}")


def positive_int(field: str, value) -> int:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
            field, value, "must be a positive integer")
    return value


def is_number(value) -> bool:
    """A finite number as a YAML or JSON file gives one (a bool is not one, nor .inf or .nan,
    which no field of a file means)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


# The magnitudes a number of a GPU or cluster file can mean in its own units (TFLOP/s, GB/s,
# microseconds, fractions): a rate of 1e-300 or a latency of 1e300 is a typo, and the step it
# priced came out as inf
SPEC_MAGNITUDE = (1e-12, 1e12)


def require_numbers(spec, prefix: str) -> None:
    """Every int or float field of dataclass `spec` holds a number, so that its range checks can
    compare (a string from a file would raise TypeError there, or pass unchecked), and a non-zero
    one within SPEC_MAGNITUDE."""
    low, high = SPEC_MAGNITUDE
    for f in dataclasses.fields(spec):
        if f.type in ("float", "int"):
            value = getattr(spec, f.name)
            require(is_number(value), f"{prefix}.{f.name}", value,
                    "must be a finite number" if isinstance(value, float) else "must be a number")
            require(value == 0 or low <= abs(value) <= high, f"{prefix}.{f.name}", value,
                    f"is beyond any real value: give one between {low:g} and {high:g} in the "
                    "field's units (or 0 where it allows 0)")


def positive_float(field: str, value) -> float:
    require(is_number(value) and value > 0, field, value, "must be a positive number")
    return float(value)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag on one line, naming the program, and exits 2. It takes
    no abbreviations: a prefix such as `--gpu` would otherwise be read as the one flag it
    begins (`--gpus`) on a command that has no `--gpu`, and fail on the wrong value."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """An unknown flag is answered with the chosen command's flag it was probably meant
        to be (argparse reports it from the top-level parser, which knows none of them)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            flag = extras[0].split("=")[0]
            hint = nearest(flag, _flags(self, parsed)) if flag.startswith("--") else ""
            self.error(f"unrecognized arguments: {' '.join(extras)}" + (f": {hint.strip()}"
                                                                       if hint else ""))
        return parsed

    def error(self, message):
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:  # argparse lists the choices; name the one a typo was probably meant to be
            hint = nearest(choice[1], re.findall(r"'?([\w.+-]+)'?", choice[2]))
            message = message.replace("(choose from", f"({hint}choose from") if hint else message
        sys.stderr.write(f"{self.prog.split()[0]}: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)

    def _get_value(self, action, arg_string):
        """Every float flag of every command takes finite numbers only: nan and inf
        answer with one line."""
        value = super()._get_value(action, arg_string)
        if isinstance(value, float) and not math.isfinite(value):
            self.error(
                f"argument {'/'.join(action.option_strings)}: invalid value {arg_string!r}: give a "
                "finite number")
        return value


def _actions(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> list:
    """The actions of `parser` and of each subcommand `parsed` chose under it."""
    actions = list(parser._actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(str(getattr(parsed, action.dest, "")))
            actions += _actions(chosen, parsed) if chosen is not None else []
    return actions


def _flags(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> list[str]:
    """The flags of `parser` and of each subcommand `parsed` chose under it."""
    return [o for a in _actions(parser, parsed) for o in a.option_strings]


def _positionals(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> set[str]:
    """The positional arguments of `parser` and of each subcommand `parsed` chose under it."""
    return {a.dest for a in _actions(parser, parsed)
            if not a.option_strings and not isinstance(a, argparse._SubParsersAction)}


# Fields that a flag of another name sets (simpar/cli/flags.py)
FIELD_FLAGS = {"compress_rank": "--powersgd-rank", "backup_frac": "--backup-workers"}


def as_flags(exc: SpecError, args: argparse.Namespace, positionals: frozenset[str] = frozenset()
             ) -> str:
    """The error as the command line says it: a field (or alternatives joined by /) that
    the command's flags set is named by its flag; a positional argument (`positionals`), a
    file's key or a product like dp*tp as it is. A plan's strategy.X (what execpar refuses to
    run, checked again when it loads a plan) is the flag that set X."""
    def flag(name: str) -> str | None:
        name = name.removeprefix("strategy.")
        return FIELD_FLAGS.get(name) or (f"--{name.replace('_', '-')}"
                                         if name in vars(args) and name not in positionals
                                         else None)

    flags = [flag(name) for name in exc.field.split("/")]
    if None in flags:
        return str(exc)
    return f"{'/'.join(f for f in flags if f)}={shown(exc.value)}: {exc.fix}"


def run_command(parser: argparse.ArgumentParser, argv, prefix: str, check=None) -> int:
    """Parse, `check(args)` (the checks every subcommand shares) and run a subcommand; a
    SpecError becomes one line on stderr and exit code 2."""
    args = parser.parse_args(argv)
    try:
        if check is not None:
            check(args)
        return args.func(args)
    except SpecError as exc:
        positionals = frozenset(_positionals(parser, args))
        sys.stderr.write(f"{prefix}: error: {as_flags(exc, args, positionals)}\n")
        return 2
    except BrokenPipeError:
        # the reader stopped reading (`simpar models | head`): what is left unprinted goes
        # nowhere, and Python's flush of stdout at exit must not raise again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command a closed pipe stopped
