"""The planner: invariants over many inputs (hypothesis) and the exact cases users hit."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import load_config
from pipeline.data.packing import count_blocks
from pipeline.hardware import PROFILES_DIR, launch_for_profile, load_hardware_profile
from pipeline.plan.planner import Footprint, make_plan
from pipeline.train.probe import ProbeOutOfMemory, candidate_sizes, probe_batch_sizes
from pipeline.types import DataStats, GpuInfo, Hardware, Launch, ModelFacts, ProbeRow

TINY = ModelFacts(
    "tiny",
    random_init=True,
    max_positions=2048,
    parameters=1_100_000,
    hidden_size=128,
    num_layers=4,
    vocab_size=1024,
)
# Qwen2.5-Coder-0.5B's shape: the planner only needs these numbers, not the weights.
QWEN_05B = ModelFacts(
    "Qwen/Qwen2.5-Coder-0.5B",
    False,
    32768,
    parameters=494_032_768,
    linear_parameters=357_898_112,  # all but the (tied) 151,936 × 896 embedding
    linear_widths=24 * 22_912,  # per layer: q, k, v, o, gate, up, down (in + out)
    hidden_size=896,
    num_layers=24,
    vocab_size=151936,
)
QWEN_7B = ModelFacts(
    "Qwen/Qwen2.5-Coder-7B",
    False,
    32768,
    parameters=7_615_616_512,
    linear_parameters=6_525_621_760,  # all but the embedding and the (untied) output layer, 152,064 × 3,584 each
    linear_widths=28 * 90_112,
    hidden_size=3584,
    num_layers=28,
    vocab_size=152064,
)


def cpu_machine(cores: int = 8) -> Hardware:
    return Hardware(
        cpu_physical_cores=cores,
        cpu_logical_cores=cores * 2,
        usable_cores=cores,
        cpu_quota_cores=None,
        ram_total_gb=32.0,
        ram_available_gb=30.0,
        memory_limit_gb=None,
    )


def gpu_machine(memory_gb: float, capability=(8, 6), cores: int = 8, count: int = 1) -> Hardware:
    gpus = tuple(GpuInfo(i, f"GPU {memory_gb:g} GB", memory_gb, memory_gb, capability) for i in range(count))
    return dataclasses.replace(cpu_machine(cores), gpus=gpus, cuda_usable=True)


def same_length(count: int, tokens: int) -> DataStats:
    return DataStats({tokens: count})


def test_66_step_run_gets_7_warmup_steps_with_the_shipped_config():
    # 176 sequences of 64 tokens → 176 blocks; the CPU tier's target effective batch is 4 × 2 = 8 → 22 steps × 3 epochs.
    plan = make_plan(same_length(176, 64), cpu_machine(), TINY, load_config(None))
    assert plan.sequence_length == 64
    assert plan.train_blocks == 176
    assert plan.effective_batch_size == 8
    assert plan.total_steps == 66
    assert plan.warmup_steps == 7
    assert plan.decisions["warmup_steps"].source == "planned"


def test_warmup_minimum_applies_when_override_is_off():
    loaded = load_config(None, ["plan.override_min_warmup=false"])
    assert make_plan(same_length(176, 64), cpu_machine(), TINY, loaded).warmup_steps == 10


def test_warmup_never_reaches_total_steps():
    loaded = load_config(None, ["plan.override_min_warmup=false", "train.epochs=1"])
    plan = make_plan(same_length(8, 64), cpu_machine(), TINY, loaded)
    assert (plan.total_steps, plan.warmup_steps) == (1, 0)


def test_ratio_rounding_is_not_fooled_by_floating_point():
    # 0.1 × 70 is 7.000000000000001 in floating point; warmup must be 7, not 8.
    loaded = load_config(None, ["train.epochs=1", "plan.batch_size=1", "plan.gradient_accumulation_steps=1"])
    plan = make_plan(same_length(70, 64), cpu_machine(), TINY, loaded)
    assert (plan.total_steps, plan.warmup_steps) == (70, 7)


@pytest.mark.parametrize(
    ("profile", "micro", "accumulation", "precision"),
    [
        ("rtx2060", 4, 2, "fp16"),  # 6 GB: the medium tier, not the smallest (a 7 GB threshold, not 8)
        ("rtx4090", 8, 2, "bf16"),
        ("a100-80gb", 8, 2, "bf16"),
        ("h100-80gb", 8, 2, "bf16"),
        ("cpu-laptop", 1, 8, "fp32"),  # one 1,024-token block a micro-batch: a CPU's fastest (planner.py)
    ],
)
def test_shipped_profiles_at_the_reference_length(profile, micro, accumulation, precision):
    hardware = load_hardware_profile(profile)
    plan = make_plan(same_length(400, 1024), hardware, TINY, load_config(None), launch_for_profile(hardware))
    assert (plan.batch_size, plan.gradient_accumulation_steps, plan.precision) == (
        micro,
        accumulation,
        precision,
    )
    assert plan.device == ("cpu" if profile == "cpu-laptop" else "cuda")


def test_8xh100_profile_plans_for_8_processes():
    hardware = load_hardware_profile("8xh100")
    plan = make_plan(
        same_length(4000, 1024), hardware, QWEN_05B, load_config(None), launch_for_profile(hardware)
    )
    assert plan.world_size == 8
    assert plan.effective_batch_size == 8 * 2 * 8
    # 4000 blocks / (8 per device × 8 processes) = 63 micro-batches per process, / 2 accumulation = 32 steps.
    assert (plan.steps_per_epoch, plan.total_steps) == (32, 96)
    assert plan.tf32 is True and plan.attention == "sdpa"


def test_shorter_blocks_get_a_bigger_micro_batch_and_the_same_effective_batch():
    loaded = load_config(None)
    long = make_plan(same_length(400, 1024), gpu_machine(24), TINY, loaded)
    short = make_plan(same_length(400, 256), gpu_machine(24), TINY, loaded)
    assert (long.batch_size, long.gradient_accumulation_steps) == (8, 2)
    assert (short.batch_size, short.gradient_accumulation_steps) == (16, 1)
    assert long.effective_batch_size == short.effective_batch_size == 16


def test_memory_estimate_turns_on_checkpointing_then_shrinks_the_micro_batch():
    loaded = load_config(None)
    data = same_length(400, 1024)
    assert make_plan(data, gpu_machine(80, (9, 0)), QWEN_05B, loaded).gradient_checkpointing is False
    tight = make_plan(data, gpu_machine(24), QWEN_7B, loaded)
    assert tight.gradient_checkpointing is True
    assert tight.batch_size < 8
    assert tight.effective_batch_size >= 16  # the target survives: accumulation makes up for it
    memory = Footprint(QWEN_7B, "bf16", "none", 16, 1024)
    assert memory.total_gb(tight.batch_size, checkpointing=True) <= 24 * 0.9


def test_a_micro_batch_shrunk_under_configured_checkpointing_says_so():
    loaded = load_config(None, ["plan.gradient_checkpointing=false"])
    plan = make_plan(same_length(400, 1024), gpu_machine(24), QWEN_7B, loaded)
    assert plan.decisions["gradient_checkpointing"].source == "cli"
    assert plan.batch_size < 8
    assert f"halved from 8 to {plan.batch_size} to fit 24 GB" in plan.decisions["batch_size"].reason


def test_probe_results_set_the_micro_batch_and_keep_the_effective_batch():
    probe = (
        ProbeRow(1, 3.0, 0.1, True),
        ProbeRow(2, 5.5, 0.12, True),
        ProbeRow(4, 10.0, 0.2, True),
        ProbeRow(8, None, None, False),
    )
    plan = make_plan(same_length(400, 1024), gpu_machine(24), QWEN_05B, load_config(None), probe=probe)
    assert (plan.batch_size, plan.gradient_accumulation_steps, plan.effective_batch_size) == (
        4,
        4,
        16,
    )
    assert "probe" in plan.decisions["batch_size"].reason
    assert plan.to_manifest()["batch_probe"][3] == {
        "batch_size": 8,
        "peak_memory_gb": None,
        "step_time_s": None,
        "fits": False,
    }


def test_probe_stops_at_the_first_out_of_memory_or_missing_headroom():
    def step(batch):
        if batch > 8:
            raise ProbeOutOfMemory("CUDA out of memory")
        return 2.0 * batch, 0.01 * batch

    rows = probe_batch_sizes(step, largest=32, memory_gb=24, headroom=0.1)
    assert [(r.batch_size, r.fits) for r in rows] == [(1, True), (2, True), (4, True), (8, True), (16, False)]
    rows = probe_batch_sizes(lambda batch: (3.0 * batch, 0.1), largest=16, memory_gb=24, headroom=0.1)
    assert [(r.batch_size, r.fits) for r in rows] == [
        (1, True),
        (2, True),
        (4, True),
        (8, False),
    ]  # 24 GB > 21.6
    assert candidate_sizes(12) == [1, 2, 4, 8, 12]


def test_precision_tf32_and_attention_follow_the_hardware():
    loaded = load_config(None)
    data = same_length(10, 100)
    h100 = make_plan(data, gpu_machine(80, (9, 0)), TINY, loaded)
    assert (h100.precision, h100.tf32, h100.attention) == ("bf16", True, "sdpa")
    turing = make_plan(data, gpu_machine(6, (7, 5)), TINY, loaded)
    assert (turing.precision, turing.tf32) == ("fp16", False)
    cpu = make_plan(data, cpu_machine(), TINY, loaded)
    assert (cpu.device, cpu.precision, cpu.pin_memory, cpu.tf32) == ("cpu", "fp32", False, False)
    flash = make_plan(
        data, gpu_machine(80, (9, 0)), dataclasses.replace(TINY, supports_flash_attention=True), loaded
    )
    assert flash.attention == "flash_attention_2"
    eager = make_plan(data, cpu_machine(), dataclasses.replace(TINY, supports_sdpa=False), loaded)
    assert eager.attention == "eager"


def test_config_and_cli_values_win_and_are_recorded_with_their_source(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("train:\n  epochs: 2\nplan:\n  batch_size: 3\n")
    loaded = load_config(path, ["plan.gradient_accumulation_steps=4", "plan.precision=fp32"])
    plan = make_plan(same_length(40, 100), gpu_machine(24), TINY, loaded)
    assert (plan.epochs, plan.decisions["epochs"].source) == (2, "config")
    assert plan.decisions["epochs"].reason == "set by mine.yaml: train.epochs"
    assert (plan.batch_size, plan.decisions["batch_size"].source) == (3, "config")
    assert (plan.gradient_accumulation_steps, plan.decisions["gradient_accumulation_steps"].source) == (
        4,
        "cli",
    )
    assert (plan.precision, plan.decisions["precision"].source) == ("fp32", "cli")
    assert plan.effective_batch_size == 3 * 4


@pytest.mark.parametrize(
    ("length", "micro", "accumulation"), [(1024, 1, 8), (512, 2, 4), (256, 4, 2), (64, 8, 1)]
)
def test_a_cpu_micro_batch_holds_about_1024_tokens_and_accumulates_the_tier_batch(
    length, micro, accumulation
):
    # The tier's effective batch (4 × accumulation 2 = 8 blocks) at any length, in micro-batches of at
    # most 1,024 tokens: a CPU trains larger ones no faster per token.
    plan = make_plan(same_length(400, length), cpu_machine(), TINY, load_config(None))
    assert (plan.sequence_length, plan.batch_size, plan.gradient_accumulation_steps) == (
        length,
        micro,
        accumulation,
    )
    assert plan.effective_batch_size == 8


def test_shipped_defaults_are_recorded_as_config_when_the_planner_keeps_them():
    # (a CPU accumulates its tier batch in one-block micro-batches: there accumulation is planned)
    plan = make_plan(same_length(400, 1024), gpu_machine(24), TINY, load_config(None))
    assert plan.decisions["gradient_accumulation_steps"].source == "config"
    assert plan.decisions["batch_size"].source == "planned"


def test_workers_never_exceed_the_usable_cores_and_stay_off_for_small_data():
    loaded = load_config(None)
    assert make_plan(same_length(100, 100), cpu_machine(8), TINY, loaded).num_workers == 0
    big = make_plan(same_length(50_000, 1024), cpu_machine(8), TINY, loaded)
    assert big.num_workers == 4 and big.persistent_workers is True
    forced = make_plan(same_length(100, 100), cpu_machine(2), TINY, load_config(None, ["plan.num_workers=8"]))
    assert forced.num_workers == 1


def test_short_runs_still_log_every_step_and_long_runs_about_50_times():
    loaded = load_config(None)
    short = make_plan(same_length(176, 64), cpu_machine(), TINY, loaded)
    assert (short.total_steps, short.logging_steps) == (66, 1)
    long = make_plan(same_length(80_000, 1024), cpu_machine(), TINY, loaded)
    assert long.logging_steps == long.total_steps // 50


def test_drop_last_counts_full_micro_batches_only():
    loaded = load_config(
        None,
        ["plan.drop_last=true", "plan.batch_size=4", "plan.gradient_accumulation_steps=1", "train.epochs=1"],
    )
    assert make_plan(same_length(10, 64), cpu_machine(), TINY, loaded).total_steps == 2
    tiny = make_plan(same_length(3, 64), cpu_machine(), TINY, loaded)
    assert (tiny.drop_last, tiny.total_steps) == (False, 1)


def test_sequence_length_is_p95_rounded_to_64_and_capped():
    loaded = load_config(None)
    lengths = DataStats({100: 95, 5000: 5})
    assert make_plan(lengths, cpu_machine(), TINY, loaded).sequence_length == 128
    assert make_plan(same_length(10, 5000), cpu_machine(), TINY, loaded).sequence_length == 1024


def test_plan_to_manifest_keeps_flat_values_and_decisions():
    manifest = make_plan(same_length(176, 64), cpu_machine(), TINY, load_config(None)).to_manifest()
    assert manifest["batch_size"] == 8 and manifest["total_steps"] == 66 and manifest["warmup_steps"] == 7
    assert set(manifest["decisions"]["warmup_steps"]) == {"value", "source", "reason"}


def test_profiles_are_validated(tmp_path):
    from pipeline.errors import ConfigError

    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": [{"name": "X", "memory_gb": "six", "cc": [7, 5]}], "cores": 4}')
    with pytest.raises(ConfigError) as caught:
        load_hardware_profile(str(bad))
    message = str(caught.value)
    assert "unknown key `cores`" in message and "`gpus[0].memory_gb` has the wrong type" in message
    assert "unknown key `gpus[0].cc`" in message
    with pytest.raises(ConfigError, match=r"no such file \(shipped profiles: 8xh100, a100-80gb"):
        load_hardware_profile("nope")


# Property tests: any data size (histograms up to 10^6 sequences), any shipped or random machine.
machines = st.one_of(
    st.sampled_from(sorted(p.stem for p in PROFILES_DIR.glob("*.json"))).map(load_hardware_profile),
    st.builds(cpu_machine, cores=st.integers(1, 128)),
    st.builds(
        gpu_machine,
        memory_gb=st.floats(1, 192),
        capability=st.sampled_from([(6, 1), (7, 5), (8, 0), (8, 6), (9, 0)]),
        cores=st.integers(1, 128),
        count=st.integers(1, 8),
    ),
)
histograms = st.dictionaries(
    st.integers(1, 20_000), st.integers(1, 1_000_000), min_size=1, max_size=8
).filter(lambda counts: sum(counts.values()) <= 1_000_000)
overrides = st.fixed_dictionaries(
    {
        "plan.warmup_ratio": st.floats(0, 0.99),
        "plan.warmup_steps_min": st.integers(0, 50),
        "plan.override_min_warmup": st.booleans(),
        "plan.gradient_accumulation_steps": st.integers(1, 64),
        "train.epochs": st.integers(1, 5),
    }
)


@settings(max_examples=120, deadline=None)
@given(
    counts=histograms,
    hardware=machines,
    values=overrides,
    world=st.integers(1, 8),
    model=st.sampled_from([TINY, QWEN_05B, QWEN_7B]),
)
def test_plan_invariants(counts, hardware, values, world, model):
    loaded = load_config(None, [f"{key}={value}" for key, value in values.items()])
    data = DataStats(counts)
    launch = Launch(world, "test")
    plan = make_plan(data, hardware, model, loaded, launch)
    assert plan.total_steps >= 1
    assert 0 <= plan.warmup_steps < plan.total_steps
    assert plan.effective_batch_size == plan.batch_size * plan.gradient_accumulation_steps * plan.world_size
    assert 0 <= plan.num_workers < max(2, hardware.usable_cores)
    assert plan.train_blocks == count_blocks(counts, plan.sequence_length)
    batches = math.ceil(plan.train_blocks / (plan.batch_size * world))
    assert plan.total_steps == plan.epochs * math.ceil(batches / plan.gradient_accumulation_steps)
    assert make_plan(data, hardware, model, loaded, launch) == plan  # a pure function


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 3000), min_size=1, max_size=400), block=st.sampled_from([64, 128, 1024])
)
def test_histogram_and_list_give_the_same_plan(lengths, block):
    loaded = load_config(None, [f"train.sequence_length={block}"])
    assert make_plan(DataStats.from_lengths(lengths), cpu_machine(), TINY, loaded) == make_plan(
        DataStats(Counter(lengths)), cpu_machine(), TINY, loaded
    )


def test_a_first_run_says_its_base_model_scoring_is_left_out_of_its_budget():
    """A budgeted run whose base-model answers were not cached (a repository's first run) says that
    scoring, kept for the next run, is left out of its budget; a cached, an uncacheable (a random base,
    an update) or an unbounded run says nothing."""
    from pipeline.plan.planner import first_run_note
    from pipeline.types import Scores

    plan = dataclasses.replace(
        make_plan(same_length(176, 64), cpu_machine(), TINY, load_config(None)),
        time_budget_s=600.0, train_seconds=300.0, total_steps=40,
    )  # fmt: skip
    first = Scores(None, None, seconds=230.0, kept=True)
    assert first_run_note(plan, first) == (
        "scoring the base model took 230 s, once for this repository (its answers are cached now): left out "
        "of the 600 s budget, so this run takes about that much longer"
    )
    cached = dataclasses.replace(first, cached=True, kept=False)  # read back, not written
    assert first_run_note(plan, cached) is None
    assert first_run_note(plan, dataclasses.replace(first, kept=False)) is None  # a random base, an update
    assert first_run_note(dataclasses.replace(plan, time_budget_s=None), first) is None
