"""Every subcommand answers --help; errors exit 2 without a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from speclimits.cli import build_parser, main


def _subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


def test_help_lists_the_core_commands():
    assert {"simulate", "validate", "book"} <= set(_subcommands())


@pytest.mark.parametrize("command", _subcommands())
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"speclimits {command}" in out and len(out) > 200


def test_console_script_runs_and_errors_cleanly(tmp_path):
    exe = [sys.executable, "-m", "speclimits.cli"]
    ok = subprocess.run(exe + ["--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "simulate" in ok.stdout
    bad = subprocess.run(exe + ["validate", str(tmp_path / "missing")], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "is not a directory" in bad.stderr and "Traceback" not in bad.stderr
