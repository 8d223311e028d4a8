"""The machine record and the dtype vLLM's CPU build can run, on the flag sets of ``tests/data/cpuinfo``
(AMD EPYC: AVX-512, no AMX, L3 32 MB; Intel Xeon: AMX, L3 300 MB), whatever the machine's own CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speclimits.errors import SpeclimitsError
from speclimits.machine import (AMX_MLA_DTYPE, KERNEL_FLAGS, cache_kib, cache_ratio, cpu_info, describe,
                                engine_dtype, has_amx, uses_mla)
from speclimits.vocabulary import DEFAULT_DTYPE

HERE = Path(__file__).parent / "data" / "cpuinfo"
CPUS = {"epyc": "amd-epyc-avx512", "xeon": "intel-xeon-amx"}
#: a DeepSeek-V2-style config (MLA: kv_lora_rank + qk_rope_head_dim) and a Qwen3-MoE one (none)
MLA = {"architectures": ["DeepseekV2ForCausalLM"], "kv_lora_rank": 512, "qk_rope_head_dim": 64}
GQA = {"architectures": ["Qwen3MoeForCausalLM"], "num_key_value_heads": 4}


def info(cpu: str) -> dict:
    return cpu_info(HERE / f"{CPUS[cpu]}.txt", sysfs=HERE / f"{CPUS[cpu]}.cache")


def test_cpu_info_reads_model_flags_and_caches_of_both_cpus():
    epyc, xeon = info("epyc"), info("xeon")
    assert epyc["model"] == "AMD EPYC" and xeon["model"] == "Intel(R) Xeon(R) Processor"
    assert epyc["cache_kib"] == {"L1d": 32, "L2": 1024, "L3": 32768}
    assert xeon["cache_kib"] == {"L1d": 48, "L2": 2048, "L3": 307200}
    assert "avx512f" in epyc["flags"] and not has_amx(epyc["flags"])
    assert {"amx_tile", "amx_bf16", "amx_int8", "avx512_fp16"} <= set(xeon["flags"]) and has_amx(xeon["flags"])
    assert list(xeon["flags"]) == [f for f in KERNEL_FLAGS if f in xeon["flags"]]  # the vocabulary's order
    assert describe(epyc) == ("AMD EPYC (2 cores; L2 1 MiB/core, L3 32 MiB; avx2, fma, avx512f, avx512bw, avx512vl, "
                              "avx512_vnni, avx512_bf16)").replace("2 cores", f"{epyc['cores']} cores")
    assert "L3 300 MiB" in describe(xeon) and "amx_tile" in describe(xeon)
    # a record written before caches were kept still reads
    assert describe({"model": "old", "cores": 2, "flags": ["avx2"]}) == "old (2 cores; avx2)"


def test_cache_sizes_read_from_this_machine_and_the_twin_over_them():
    here = cache_kib()
    assert all(isinstance(v, int) and v > 0 for v in here.values())
    assert cache_kib(HERE / "no-such-folder") == {}
    twin_experts = 805e6  # the width-1024 twin's experts in float32
    assert cache_ratio(twin_experts, info("epyc")) == pytest.approx(twin_experts / (32768 * 1024))
    assert 2.5 < cache_ratio(twin_experts, info("xeon")) < 2.7  # 2.6 times a 300 MB L3, 25 times a 32 MB one
    assert cache_ratio(1.0, {"cache_kib": {}}) is None


def test_mla_is_read_from_the_config():
    assert uses_mla(MLA) and not uses_mla(GQA)
    assert uses_mla({"text_config": MLA})


@pytest.mark.parametrize("cpu", list(CPUS))
def test_engine_dtype_for_mla_on_each_cpu(cpu):
    flags = info(cpu)["flags"]
    default = engine_dtype(None, MLA, flags, DEFAULT_DTYPE)
    if cpu == "xeon":  # AMX: vLLM's AMX_MLA backend, bfloat16 weights only
        assert default.dtype == AMX_MLA_DTYPE and "AMX_MLA" in default.reason
        assert default.record() == {"requested": None, "dtype": "bfloat16", "reason": default.reason}
        with pytest.raises(SpeclimitsError, match=r"--dtype float32: .*run with --dtype bfloat16.*CPU_MLA"):
            engine_dtype("float32", MLA, flags, DEFAULT_DTYPE)
        # the reference backend asked for by name runs float32
        assert engine_dtype("float32", MLA, flags, DEFAULT_DTYPE, attention_backend="CPU_MLA").dtype == "float32"
    else:  # no AMX: vLLM's reference CPU_MLA backend runs float32
        assert default.dtype == DEFAULT_DTYPE and default.reason is None
        assert engine_dtype("float32", MLA, flags, DEFAULT_DTYPE).dtype == "float32"
    for dtype in ("bfloat16", "auto"):  # what either backend takes stays as asked
        assert engine_dtype(dtype, MLA, flags, DEFAULT_DTYPE) .dtype == dtype
    # a target without MLA runs what was asked on either CPU
    assert engine_dtype(None, GQA, flags, DEFAULT_DTYPE).dtype == DEFAULT_DTYPE
    assert engine_dtype("float32", GQA, flags, DEFAULT_DTYPE).dtype == "float32"


def test_trace_refuses_a_dtype_the_engine_cannot_run_before_building_it(tmp_path, monkeypatch, capsys):
    """On an AMX CPU (the Xeon's flags planted), ``speclimits trace --dtype float32`` of an MLA target
    exits 2 with one line naming the flag that works, before vLLM is imported or an engine built."""
    import speclimits.machine as machine
    from speclimits.cli import main
    from speclimits.paths import DATA_DIR

    model = tmp_path / "mla"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**MLA, "model_type": "deepseek_v2", "vocab_size": 512}))
    monkeypatch.setattr(machine, "cpu_info", lambda *a, **k: info("xeon"))
    monkeypatch.setattr("speclimits.tracing.engine.require_vllm_findable", lambda: None)
    argv = ["trace", "--target", str(model), "--method", "ngram", "--k", "0,2", "--prompts",
            str(DATA_DIR / "prompts" / "smoke.jsonl"), "--out", str(tmp_path / "t"), "--dtype", "float32"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dtype float32" in err[0] and "--dtype bfloat16" in err[0]
    assert not (tmp_path / "t").exists()


def test_the_twin_verdict_names_the_cache_it_is_measured_against():
    """The width-1024 twin's routed experts (16 layers × 32 experts × 3 × 1024 × 128 parameters) run in
    float32: 805 MB, 24× the EPYC's L3 and 2.6× the Xeon's, where the verdict warns."""
    from speclimits.models.twin import cache_verdict

    params = 16 * 32 * 3 * 1024 * 128
    epyc, xeon = cache_verdict(params, info=info("epyc")), cache_verdict(params, info=info("xeon"))
    assert epyc.startswith("routed experts 805 MB in float32: 24.0× the last-level cache of AMD EPYC (L3 32 MiB)")
    assert "warning" not in epyc
    assert "2.6×" in xeon and "L3 300 MiB" in xeon and "warning: under 4×" in xeon
    assert "403 MB in bfloat16" in cache_verdict(params, "bfloat16", info=info("epyc"))
    assert "unknown" in cache_verdict(params, info={"model": "x", "cache_kib": {}})
