"""One step under the profiler: its ops' self times and the Python between them add up to the step,
the groups name what the chapter argues about, and the conclusion is decided with a margin."""

from __future__ import annotations

import pytest

from minillm.bench.profile_step import (
    ATTENTION,
    GROUPS,
    HOST,
    MATMUL,
    OTHER,
    RUNTIME,
    STEP_LABEL,
    OpRow,
    StepProfile,
    merged,
    op_group,
    profile_steps,
    step_table,
    where_the_time_goes,
)
from minillm.bench.verdict import NOISY_NOTE


@pytest.mark.parametrize(("name", "group"), [
    ("aten::mm", MATMUL), ("aten::addmm", MATMUL), ("aten::linear", MATMUL),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", MATMUL), ("_gemv_kernel", MATMUL),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_bf16_64x64_64x4_tn_align8>", MATMUL),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", ATTENTION), ("_decode_partition_kernel", ATTENTION),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", ATTENTION), ("_ragged_attention_kernel", ATTENTION),
    ("cudaLaunchKernel", RUNTIME), ("cuLaunchKernelEx", RUNTIME), ("cudaStreamSynchronize", RUNTIME),
    ("aten::mul", OTHER), ("aten::rsqrt", OTHER), ("_fused_add_rms_norm_kernel", OTHER), ("aten::cumsum", OTHER),
    (STEP_LABEL, HOST),
])
def test_each_event_falls_in_its_group(name, group):
    assert op_group(name) == group


def test_a_profiled_step_adds_up_and_counts_every_matmul(tiny_llm):
    profiles = profile_steps(tiny_llm, batch=1, context=16, steps=2)
    assert len(profiles) == 3
    layers = tiny_llm.llm_engine.model_config.num_hidden_layers
    for p in profiles:
        assert not p.on_device
        groups = p.by_group("cpu")
        # Self times partition the step: the ops' own times and the Python between them.
        assert sum(groups.values()) == pytest.approx(p.step_us, rel=0.02)
        assert groups[HOST] > 0 and groups[MATMUL] > 0 and groups[RUNTIME] == 0
        calls = {r.name: r.calls for r in p.rows}
        # Per layer the merged q/k/v projection, the output one, the merged gate/up and the down
        # projection; then the head.
        assert calls["aten::mm"] == 4 * layers + 1
        assert 0 < p.work_share() < 1
    assert tiny_llm.llm_engine.scheduler.running == [] and not tiny_llm.llm_engine.scheduler.waiting
    lines = step_table(profiles, top=5).splitlines()
    groups_shown = sum(1 for us in merged(profiles).by_group("cpu").values() if us)  # no GPU: CPU time only
    assert len(lines) == 1 + 5 + 1 + groups_shown  # header, the top 5, then the groups
    assert any(line.startswith("aten::mm") for line in lines[1:6])


def _profile(share: float, step_us: float = 1000.0, on_device: bool = False) -> StepProfile:
    work = share * step_us
    rows = (OpRow("aten::mm", MATMUL, 4, 0.0 if on_device else work, work if on_device else 0.0),
            OpRow("aten::mul", OTHER, 8, (1 - share) * step_us / 2, 0.0),
            OpRow(STEP_LABEL, HOST, 1, (1 - share) * step_us / 2, 0.0))
    return StepProfile(step_us, on_device, rows)


def test_the_conclusion_needs_the_whole_band_on_one_side():
    most = where_the_time_goes([_profile(s) for s in (0.8, 0.85, 0.9)])
    assert "85% of a step as computation on the CPU" in most and "the work the roofline counts" in most
    little = where_the_time_goes([_profile(s, on_device=True) for s in (0.1, 0.12, 0.2)])
    assert "kernels on the GPU" in little and "what CUDA graphs and fused kernels remove" in little
    assert where_the_time_goes([_profile(s) for s in (0.3, 0.55, 0.7)]).endswith(NOISY_NOTE)


def test_the_mean_of_profiles_is_taken_op_by_op():
    mean = merged([_profile(0.4, 1000.0), _profile(0.6, 2000.0)])
    assert mean.step_us == 1500.0
    assert mean.by_group("cpu") == pytest.approx({**dict.fromkeys(GROUPS, 0.0), MATMUL: 800.0, OTHER: 350.0,
                                                   HOST: 350.0})


def test_bad_arguments_are_refused_by_name(tiny_llm):
    with pytest.raises(ValueError, match="rounds"):
        profile_steps(tiny_llm, rounds=2)
    with pytest.raises(ValueError, match="steps"):
        profile_steps(tiny_llm, steps=0)
    with pytest.raises(ValueError, match="side"):
        _profile(0.5).by_group("gpu")
    with pytest.raises(ValueError, match="profiles"):
        merged([])
    with pytest.raises(ValueError, match="samples"):
        where_the_time_goes([_profile(0.5)] * 2)


def test_on_a_gpu_the_table_shows_the_launches_beside_the_kernels():
    rows = (OpRow("cudaLaunchKernel", RUNTIME, 30, 600.0, 0.0), OpRow("sm90_xmma_gemm_bf16", MATMUL, 25, 0.0, 300.0),
            OpRow(STEP_LABEL, HOST, 1, 200.0, 0.0), OpRow("aten::mm", MATMUL, 25, 100.0, 0.0))
    lines = step_table([StepProfile(1000.0, True, rows)], top=2).splitlines()
    assert "GPU µs" in lines[0]
    assert lines[1].startswith("cudaLaunchKernel") and lines[2].startswith("sm90_xmma_gemm_bf16")
    groups = {line.split()[0]: line for line in lines[4:]}
    assert groups["matmuls"].split() == ["matmuls", "CPU", "100", "(10%)", "GPU", "300", "(30%)"]
    assert "CPU       600 (60%)" in next(line for line in lines[4:] if RUNTIME in line)
