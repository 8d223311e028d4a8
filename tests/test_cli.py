"""Every subcommand answers --help; errors exit 2 without a traceback."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys

import pytest

from speclimits.cli import build_parser, main


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    return next(a for a in build_parser()._actions if a.dest == "command").choices


def test_help_lists_the_core_commands():
    assert {"simulate", "validate", "book"} <= set(_subparsers())


@pytest.mark.parametrize("command", sorted(_subparsers()))
def test_every_subcommand_has_help(command, capsys):
    """``--help`` exits 0 and documents every argument the subcommand accepts (no option left
    out of the text), and the example in its epilog, if any, parses with today's options."""
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: speclimits {command}")
    sub = _subparsers()[command]
    shown = [a for a in sub._actions if a.help is not argparse.SUPPRESS]
    assert shown, command
    for action in shown:
        names = action.option_strings or [action.metavar or action.dest]
        assert any(n in out for n in names if isinstance(n, str)), f"{command}: {names} not in --help"
        if action.option_strings and action.help:
            assert action.help.split("%(")[0].split()[0] in out, f"{command}: help of {names} not shown"
    examples = [line.split("example:", 1)[1].strip() for line in (sub.epilog or "").splitlines() if "example:" in line]
    for example in examples:
        argv = shlex.split(example)
        assert argv[0] == "speclimits" and argv[1] == command, example
        args = build_parser().parse_args(argv[1:])
        assert args.command == command and callable(args.func), example


def test_console_script_runs_and_errors_cleanly(tmp_path):
    exe = [sys.executable, "-m", "speclimits.cli"]
    ok = subprocess.run(exe + ["--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "simulate" in ok.stdout
    bad = subprocess.run(exe + ["validate", str(tmp_path / "missing")], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "is not a directory" in bad.stderr and "Traceback" not in bad.stderr
