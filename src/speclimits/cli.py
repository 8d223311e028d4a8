"""The ``speclimits`` command line.

Each subcommand lives beside the code it runs: a module in :data:`COMMANDS` defines
``register(subparsers)``, which adds its parser and sets ``func(args) -> int``. Errors that
speclimits raises on purpose (:class:`~speclimits.errors.SpeclimitsError`) print one message
and exit with code 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from speclimits import __version__
from speclimits.errors import SpeclimitsError

#: Modules that contribute subcommands, in the order ``--help`` lists them.
COMMANDS = (
    "speclimits.simulate.cli",
    "speclimits.trace.cli",
    "speclimits.tracing.cli",
    "speclimits.stats.cli",
    "speclimits.oracle.cli",
    "speclimits.linguistic.cli",
    "speclimits.book.cli",
    "speclimits.models.cli",
    "speclimits.control.cli",
    "speclimits.bench.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speclimits",
        description=(
            "Measure and bound speculative decoding on Mixture-of-Experts models. "
            "Typical flow: `speclimits simulate` (or `speclimits trace` on vLLM) -> "
            "`speclimits validate` -> `speclimits fit` -> `speclimits oracle` -> `speclimits book`."
        ),
    )
    parser.add_argument("--version", action="version", version=f"speclimits {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SpeclimitsError as exc:
        print(f"speclimits {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"speclimits {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
