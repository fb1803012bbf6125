"""simpar command line: thin wrappers that parse flags, call one library function and print.

flags.py holds the shared flag groups, predict.py simulate/plan/compare, tools.py the other
commands, capacity.py what is printed about failures and cost, parser.py the parser and `main`."""

from simpar.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
