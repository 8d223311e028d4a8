"""A memory-bound twin of an MoE target: wider experts, the same function.

For a SwiGLU expert ``y = W_down · (silu(W_gate · x) ⊙ (W_up · x))`` with ``I`` intermediate units,
append ``W - I`` rows of any finite values to ``W_gate`` and ``W_up`` and the same number of zero
columns to ``W_down``: the extra units are computed and multiplied by zero, so ``y`` is unchanged
(up to the summation order of the kernel), while every routed expert now streams ``W / I`` times
the bytes. Routing, acceptance and an EAGLE-3 head's inputs stay those of the trained pair; only the
cost physics of a verification pass changes (the book's regimes page: the bundled target is
*cache-resident*, the twin is meant to be *memory-bound*, as the paper's A100 is).

The twin is rebuilt, deterministically and in seconds, from the bundled target
(``speclimits models twin --expert-width 256``), so its weights stay out of git; ``twin.json``
in its folder records the recipe (source folder and hash, width, seed, the weights' hash), and a
trace made on it copies that record into its ``meta.json``.

Expert weight names understood: Hugging Face's per-expert ``…experts.{e}.gate_proj/up_proj/down_proj``
(Qwen2/3-MoE, OLMoE, DeepSeek) and Mixtral's ``…experts.{e}.w1/w3/w2``. Where a family sizes its shared
experts from the same width (DeepSeek-V2/V3 style: ``…shared_experts.*`` of ``n_shared_experts ×
moe_intermediate_size`` units), those are widened in proportion, since the config key they read
changes; a shared expert with a width of its own (Qwen2-MoE's ``shared_expert_intermediate_size``) and
dense layers (``intermediate_size``) are left as they are.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

from speclimits.errors import SpeclimitsError
from speclimits.paths import BUILD_DIR, REPO_ROOT, TARGET_MODEL

#: The width chosen by measurement (scripts/make_regime.sh, data/traces/designed-w*): on this project's 2-core
#: CPU the designed experiment's alpha grows linearly with the width (0.06 ms per unique expert per layer at
#: the trained 64, 0.85 at 1024), and at 1024 the expert term is about half of a verification pass at m >= 5
#: at the target's own routing, as on the paper's A100.
DEFAULT_EXPERT_WIDTH = 1024

#: ``(name pattern, role)``: ``rows`` = a projection into the intermediate units ([I, H]: extra rows),
#: ``cols`` = the projection out of them ([H, I]: extra zero columns).
_EXPERT_WEIGHTS = (
    (re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|w1|w3)\.weight$"), "rows"),
    (re.compile(r"\.experts\.\d+\.(down_proj|w2)\.weight$"), "cols"),
)
#: config.json keys that hold the expert width, by family.
_WIDTH_KEYS = ("moe_intermediate_size", "intermediate_size")

RECIPE_FILE = "twin.json"


def default_twin_dir(expert_width: int = DEFAULT_EXPERT_WIDTH) -> Path:
    """Where ``speclimits models twin`` writes the twin of the bundled target by default (a build output)."""
    return BUILD_DIR / "models" / f"target-twin-w{expert_width}"


def file_sha256(path: Path) -> str:
    """sha256 hex digest of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def relative_path(path: Path) -> str:
    """``path`` relative to the checkout when inside it (so a recipe reads the same on every clone)."""
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _width_key(config: dict[str, Any], path: Path) -> str:
    if config.get("model_type") == "mixtral":
        return "intermediate_size"
    if "moe_intermediate_size" in config:
        return "moe_intermediate_size"
    raise SpeclimitsError(f"{path}: no expert width in config.json (looked for {', '.join(_WIDTH_KEYS)})")


def _role(name: str, patterns=_EXPERT_WEIGHTS) -> str | None:
    return next((role for pattern, role in patterns if pattern.search(name)), None)


_SHARED_WEIGHTS = (
    (re.compile(r"\.shared_experts\.(gate_proj|up_proj)\.weight$"), "rows"),
    (re.compile(r"\.shared_experts\.down_proj\.weight$"), "cols"),
)


def _widen(tensors: dict[str, Any], patterns, seed: int, extra) -> tuple[dict[str, Any], set[int]]:
    """``tensors`` (in name order) with every weight ``patterns`` names padded by ``extra(name, units)``
    units: random rows for a projection into the units (``rows``, drawn with the matrix's own std, so the
    extra units' activations are of the usual size), zero columns for the one out (``cols``, so they never
    reach the output). Returns the tensors and the widths found."""
    import torch

    gen = torch.Generator().manual_seed(int(seed))
    out = {name: tensors[name] for name in sorted(tensors)}
    old: set[int] = set()
    for name, t in list(out.items()):
        role = _role(name, patterns)
        if role is None:
            continue
        inter = int(t.shape[0] if role == "rows" else t.shape[1])
        old.add(inter)
        n = extra(name, inter)
        if role == "rows":
            std = float(t.float().std()) or 0.02
            pad = (torch.randn((n, t.shape[1]), generator=gen) * std).to(t.dtype)
            out[name] = torch.cat([t, pad], dim=0).contiguous()
        else:
            out[name] = torch.cat([t, torch.zeros((t.shape[0], n), dtype=t.dtype)], dim=1).contiguous()
    return out, old


def widen_shared(tensors: dict[str, Any], old_width: int, width: int, n_shared: int, seed: int = 0) -> dict[str, Any]:
    """Shared experts sized ``n_shared × old_width`` widened to ``n_shared × width`` (a family whose
    shared-expert width follows ``moe_intermediate_size``); raises for a shared expert of another width."""
    def extra(name: str, inter: int) -> int:
        if inter != n_shared * old_width:
            raise SpeclimitsError(f"{name}: {inter} units, not n_shared_experts × {old_width} = {n_shared * old_width}: "
                                  "cannot tell how the config sizes it")
        return n_shared * (width - old_width)
    return _widen(tensors, _SHARED_WEIGHTS, int(seed) + 1, extra)[0]


def widen_tensors(tensors: dict[str, Any], width: int, seed: int = 0) -> tuple[dict[str, Any], int]:
    """The twin's tensors (name -> torch tensor, per-expert SwiGLU weights): every expert projection widened
    to ``width`` intermediate units, the extra gate/up rows seeded by ``seed``. Returns the tensors and the
    old width; raises if no expert weight is found or the widths disagree."""
    def extra(name: str, inter: int) -> int:
        if inter > width:
            raise SpeclimitsError(f"--expert-width {width} is narrower than the experts' {inter} units ({name})")
        return width - inter
    out, old = _widen(tensors, _EXPERT_WEIGHTS, seed, extra)
    if not old:
        raise SpeclimitsError("no expert weights found (expected ...experts.N.gate_proj/up_proj/down_proj.weight "
                              "or Mixtral's w1/w3/w2)")
    if len(old) > 1:
        raise SpeclimitsError(f"experts of different widths {sorted(old)}: cannot widen consistently")
    return out, old.pop()


def build_twin(source: Path = TARGET_MODEL, out: Path | None = None, expert_width: int = DEFAULT_EXPERT_WIDTH,
               seed: int = 0, command: str | None = None) -> dict[str, Any]:
    """Write the twin of the target in ``source`` to ``out``; return its recipe (also ``out/twin.json``).

    Every file of ``source`` other than the weights and ``config.json`` (tokenizer, generation
    config) is copied unchanged; the config's expert width becomes ``expert_width``.
    """
    from safetensors.torch import load_file, save_file

    source = Path(source)
    out = Path(out) if out is not None else default_twin_dir(expert_width)
    cfg_path = source / "config.json"
    weights = sorted(source.glob("*.safetensors"))
    if not cfg_path.is_file():
        raise SpeclimitsError(f"{source}: no config.json (is this a model folder?)")
    if len(weights) != 1:
        raise SpeclimitsError(f"{source}: expected one .safetensors file, found {len(weights)}")
    if out.resolve() == source.resolve():
        raise SpeclimitsError("--out must differ from the source model folder")
    config = json.loads(cfg_path.read_text())
    key = _width_key(config, cfg_path)
    tensors, old_width = widen_tensors(load_file(str(weights[0])), expert_width, seed)
    if int(config[key]) != old_width:
        raise SpeclimitsError(f"{cfg_path}: {key} = {config[key]} but the expert weights have {old_width} units")
    if key == "moe_intermediate_size" and int(config.get("n_shared_experts") or 0) > 0 \
            and any(".shared_experts." in n for n in tensors):
        tensors = widen_shared(tensors, old_width, expert_width, int(config["n_shared_experts"]), seed)

    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(source.iterdir()):
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", RECIPE_FILE):
            shutil.copy2(f, out / f.name)
    config[key] = int(expert_width)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights_out = out / "model.safetensors"
    save_file(tensors, str(weights_out), metadata={"format": "pt"})
    recipe = {
        "kind": "memory-bound twin (function-preserving wider experts)",
        "command": command or f"speclimits models twin --expert-width {expert_width} --seed {seed}",
        "source": relative_path(source),
        "source_sha256": file_sha256(weights[0]),
        "expert_width_source": old_width,
        "expert_width": int(expert_width),
        "seed": int(seed),
        "weights_sha256": file_sha256(weights_out),
        "expert_bytes_stored": expert_bytes(tensors),
        "experts_params_total": experts_params_total(tensors),
        "stored_dtype": str(next(iter(tensors.values())).dtype).replace("torch.", ""),
    }
    (out / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n")
    return recipe


def expert_bytes(tensors: dict[str, Any]) -> int:
    """Bytes one expert's three matrices take in the checkpoint's dtype (as stored)."""
    names = sorted(n for n in tensors if _role(n) is not None and re.search(r"\.experts\.0\.", n))
    if not names:
        return 0
    layer = names[0].split(".experts.0.")[0]  # the first MoE layer (a family may begin with dense ones)
    return int(sum(tensors[n].numel() * tensors[n].element_size() for n in names if n.startswith(layer + ".experts.0.")))


def experts_params_total(tensors: dict[str, Any]) -> int:
    """Parameters of every routed expert's matrices together (the weights a pass may stream)."""
    return int(sum(t.numel() for n, t in tensors.items() if _role(n) is not None and re.search(r"\.experts\.\d+\.", n)))


#: bytes per parameter of the dtypes a twin is run in
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def cache_verdict(n_params: int, dtype: str = "float32", info: dict[str, Any] | None = None, least: float = 4.0) -> str:
    """One line on whether ``n_params`` expert parameters, run in ``dtype``, stream from memory on a CPU
    (``info``: a :func:`speclimits.machine.cpu_info` record; default this machine): their size over its
    last-level cache, and a warning under ``least`` times (then much of a pass may come from cache and the
    regime is closer to cache-resident than intended: widen with --expert-width)."""
    from speclimits.machine import cache_ratio, cpu_info

    info = info or cpu_info()
    total = n_params * DTYPE_BYTES.get(dtype, 4)
    ratio = cache_ratio(total, info)
    llc = (info.get("cache_kib") or {}).get("L3")
    if ratio is None:
        return f"routed experts {total / 1e6:.0f} MB in {dtype} (this CPU's cache sizes are unknown)"
    line = (f"routed experts {total / 1e6:.0f} MB in {dtype}: {ratio:.1f}× the last-level cache of "
            f"{info.get('model', '?')}" + (f" (L3 {llc / 1024:g} MiB)" if llc else ""))
    if ratio < least:
        line += (f"; warning: under {least:g}× the cache, a share of every pass may come from cache on this CPU "
                 f"(wider experts, --expert-width, stream more)")
    return line


def read_recipe(model_dir: Path) -> dict[str, Any] | None:
    """The twin recipe of ``model_dir`` (``twin.json``), or None for an ordinary model folder."""
    path = Path(model_dir) / RECIPE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def compare_logits(source: Path, twin: Path, token_ids: list[list[int]]) -> dict[str, Any]:
    """Teacher-forced check of a twin against its source with Hugging Face transformers (float32).

    ``token_ids``: sequences to run. Returns ``max_abs_diff`` (largest |logit difference| over every
    position and vocabulary entry), ``max_rel_diff`` (that over the largest |logit|), ``argmax_agree``
    (share of positions whose top token agrees) and ``positions``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    models = [AutoModelForCausalLM.from_pretrained(str(p), dtype=torch.float32).eval() for p in (source, twin)]
    worst, scale, agree, n = 0.0, 0.0, 0, 0
    with torch.no_grad():
        for ids in token_ids:
            x = torch.tensor([list(ids)])
            a, b = (m(x).logits[0] for m in models)
            worst = max(worst, float((a - b).abs().max()))
            scale = max(scale, float(a.abs().max()))
            agree += int((a.argmax(-1) == b.argmax(-1)).sum())
            n += a.shape[0]
    return {"max_abs_diff": worst, "max_rel_diff": worst / scale if scale else 0.0,
            "argmax_agree": agree / n if n else float("nan"), "positions": n}
