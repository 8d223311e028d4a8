"""``speclimits control fit`` on a user's short sweep: the default K_max is capped at the drafts the trace
prices, with one line saying so; an explicit K_max beyond them is refused in one line."""

from __future__ import annotations

import json

from speclimits.cli import main


def test_default_k_max_is_capped_at_what_a_short_sweep_prices(tmp_path, capsys):
    trace = tmp_path / "k0-3"
    assert main(["simulate", "--preset", "smoke", "--set", "k_values=[0,1,2,3]", "--out", str(trace), "--quiet"]) == 0
    capsys.readouterr()
    out = tmp_path / "policy.json"
    assert main(["control", "fit", str(trace), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "K_max 3, not the default 6: the cost model prices drafts of up to 3 tokens" in err
    assert json.loads(out.read_text())["k_max"] == 3
    assert main(["control", "fit", str(trace), "--out", str(out), "--k-max", "5"]) == 2
    assert "m = [5, 6]" in capsys.readouterr().err  # an explicit K_max the trace cannot price: one line
