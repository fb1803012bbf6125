"""The one error class for bad user input: the CLI prints it on one line and exits 2."""

import argparse
import sys


class SpecError(ValueError):
    """Invalid user input. The message names the field, the value and the fix."""

    def __init__(self, field: str, value, fix: str):
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field}={value!r}: {fix}")


def require(ok: bool, field: str, value, fix: str) -> None:
    """Raise SpecError(field, value, fix) unless ok."""
    if not ok:
        raise SpecError(field, value, fix)


def positive_int(field: str, value) -> int:
    require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
            field, value, "must be a positive integer")
    return value


def positive_float(field: str, value) -> float:
    require(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0,
            field, value, "must be a positive number")
    return float(value)


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag on one line, naming the program, and exits 2."""

    def error(self, message):
        sys.stderr.write(f"{self.prog.split()[0]}: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


def run_command(parser: argparse.ArgumentParser, argv, prefix: str) -> int:
    """Parse and run a subcommand; a SpecError becomes one line on stderr and exit code 2."""
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SpecError as exc:
        sys.stderr.write(f"{prefix}: error: {exc}\n")
        return 2
