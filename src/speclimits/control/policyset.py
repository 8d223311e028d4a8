"""Greedy and sampled requests in one batch: one fitted policy per temperature, chosen per request.

The draft's confidence maps to acceptance through a curve that changes with the request's temperature, so the
project fits one policy per temperature (``data/control/twin/t07/README.md`` says why not a temperature
feature). In the engine a request is decided with the fit whose temperature is nearest its own (read when it
first drafts): its match probabilities, its λ and its rule state. What a batch shares (the round's pass, the
price refresh) is priced by the **first** fit. Write one with ``speclimits control combine --out set.json
greedy.json sampled.json`` (``PATH@T`` where a fit does not record its temperature); ``control bench`` and
``SPECLIMITS_CONTROL_POLICY`` take a set too. Worker-safe: no statistics stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speclimits.control.rules import FORMAT, PolicyFit
from speclimits.errors import SpeclimitsError

SET_FORMAT = "speclimits-policy-set/1"
#: below this a temperature is greedy (vLLM's own epsilon for its greedy sampling type)
GREEDY_EPS = 1e-5


def fit_temperature(fit: PolicyFit) -> float | None:
    """The temperature ``fit`` was fitted at: its ``data.sampling`` record (fits written since sampled traces),
    0 for a fit on greedy references, else None (an older fit on a sampled trace: give it as ``PATH@T``)."""
    rec = fit.data.get("sampling")
    if isinstance(rec, dict) and rec.get("temperature") is not None:
        return float(rec["temperature"])
    return 0.0 if fit.data.get("reference_kind") == "greedy" else None


@dataclass(frozen=True)
class PolicySet:
    """Policy fits by temperature (see the module docstring). ``sources``: where each fit was read from."""

    fits: tuple[PolicyFit, ...]
    temperatures: tuple[float, ...]
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.fits or len(self.fits) != len(self.temperatures):
            raise SpeclimitsError(f"policy set: {len(self.fits)} fits for {len(self.temperatures)} temperatures "
                                  "(one temperature per fit, at least one fit)")
        if len(set(self.temperatures)) != len(self.temperatures) or min(self.temperatures) < 0:
            raise SpeclimitsError(f"policy set: temperatures must be distinct and >= 0, got {list(self.temperatures)}")
        ks = sorted({f.k_max for f in self.fits})
        if len(ks) > 1:
            raise SpeclimitsError(f"policy set: the fits have K_max {ks}; the engine drafts one K_max (refit them "
                                  "with the same `speclimits control fit --k-max`)")
        acc = {f.acceptance is not None for f in self.fits}
        if len(acc) > 1:
            raise SpeclimitsError("policy set: some fits have an acceptance model and some not (a fit written "
                                  "before it): refit them with `speclimits control fit`")

    @property
    def k_max(self) -> int:
        return self.fits[0].k_max

    def part(self, temperature: float) -> int:
        """The index of the fit a request at ``temperature`` is decided with: the nearest temperature (on a tie
        the lower one)."""
        t = 0.0 if temperature < GREEDY_EPS else float(temperature)
        return min(range(len(self.fits)), key=lambda i: (abs(self.temperatures[i] - t), self.temperatures[i]))

    def describe(self) -> str:
        return ", ".join(f"T = {t:g}: {s or 'fit ' + str(i)}"
                         for i, (t, s) in enumerate(zip(self.temperatures, self.sources or [""] * len(self.fits))))

    def to_dict(self) -> dict[str, Any]:
        return {"format": SET_FORMAT,
                "policies": [{"temperature": t, "source": s, "policy": f.to_dict()}
                             for f, t, s in zip(self.fits, self.temperatures, self.sources or [""] * len(self.fits))]}

    @classmethod
    def from_dict(cls, d: dict[str, Any], origin: str = "policy set") -> "PolicySet":
        items = d.get("policies")
        if not isinstance(items, list) or not items:
            raise SpeclimitsError(f"{origin}: 'policies' must be a non-empty list of {{temperature, policy}}")
        fits, temps, sources = [], [], []
        for i, item in enumerate(items):
            where = f"{origin}: policies[{i}]"
            if not isinstance(item, dict) or not isinstance(item.get("policy"), dict):
                raise SpeclimitsError(f"{where}: must be an object with 'temperature' and 'policy'")
            try:
                temps.append(float(item["temperature"]))
            except (KeyError, TypeError, ValueError):
                raise SpeclimitsError(f"{where}: 'temperature' must be a number, got {item.get('temperature')!r}")
            fits.append(PolicyFit.from_dict(item["policy"], origin=f"{where}.policy"))
            sources.append(str(item.get("source") or ""))
        return cls(tuple(fits), tuple(temps), tuple(sources))


def policy_from_dict(d: dict[str, Any], origin: str = "policy JSON") -> PolicyFit | PolicySet:
    """A policy fit or a policy set, by the JSON's ``format``."""
    if isinstance(d, dict) and d.get("format") == SET_FORMAT:
        return PolicySet.from_dict(d, origin)
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        got = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise SpeclimitsError(f"{origin}: 'format' must be {FORMAT!r} (a fit) or {SET_FORMAT!r} (a set), got {got!r}")
    return PolicyFit.from_dict(d, origin)


def read_policy(path: str | Path) -> PolicyFit | PolicySet:
    """The policy JSON at ``path``: a fit (``speclimits control fit``) or a set (``speclimits control combine``)."""
    from speclimits.jsonutil import read_json

    d = read_json(path, "policy file", SpeclimitsError,
                  missing_hint=f"write one with `speclimits control fit TRACE --out {path}`")
    return policy_from_dict(d, origin=f"policy file {Path(path)}")


def fit_for(policy: PolicyFit | PolicySet, temperature: float) -> PolicyFit:
    """The fit that decides requests at ``temperature`` (the fit itself when not a set)."""
    return policy.fits[policy.part(temperature)] if isinstance(policy, PolicySet) else policy


def combine(specs: list[str]) -> PolicySet:
    """A set from ``PATH`` or ``PATH@T`` items (a fit's own temperature when no ``@T``), in the order given (the
    first prices what a batch shares)."""
    fits, temps, sources = [], [], []
    for spec in specs:
        path, at, t = spec.rpartition("@") if "@" in spec else ("", "", "")
        path = path if at else spec
        fit = read_policy(path)
        if isinstance(fit, PolicySet):
            raise SpeclimitsError(f"{path}: is a policy set already; combine the fits it was made of")
        if at:
            try:
                temp: float | None = float(t)
            except ValueError:
                raise SpeclimitsError(f"{spec}: the temperature after '@' must be a number, got {t!r}") from None
        else:
            temp = fit_temperature(fit)
            if temp is None:
                raise SpeclimitsError(f"{path}: the fit does not record its temperature (fitted on a sampled trace "
                                      f"before fits recorded it): give it as {path}@T")
        fits.append(fit)
        temps.append(temp)
        sources.append(str(path))
    return PolicySet(tuple(fits), tuple(temps), tuple(sources))


def write_set(policy_set: PolicySet, path: str | Path) -> Path:
    from speclimits.jsonutil import dumps  # a fit's curves may be DataFrames

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(dumps(policy_set.to_dict(), indent=1) + "\n")
    return p
