"""The planner: invariants over many inputs (hypothesis) and the exact cases users hit."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import load_config
from pipeline.hardware import GpuInfo, Hardware
from pipeline.planner import DataStats, ModelFacts, make_plan

TINY = ModelFacts("tiny", random_init=True, max_positions=2048)
PRETRAINED = ModelFacts("org/coder", random_init=False, max_positions=4096)


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
    gpus = tuple(
        GpuInfo(i, f"GPU {memory_gb:g} GB", memory_gb, memory_gb, capability, capability >= (8, 0))
        for i in range(count)
    )
    return dataclasses.replace(cpu_machine(cores), gpus=gpus, cuda_usable=True)


def same_length(count: int, tokens: int) -> DataStats:
    return DataStats(token_lengths=(tokens,) * count)


def test_66_step_run_gets_7_warmup_steps_with_the_shipped_config():
    # 176 sequences of 64 tokens → 176 blocks; CPU batch 4 → 44 micro-batches; ÷ 2 accumulation → 22 steps × 3 epochs.
    plan = make_plan(same_length(176, 64), cpu_machine(), TINY, load_config(None))
    assert plan["sequence_length"] == 64
    assert plan["train_blocks"] == 176
    assert plan["total_steps"] == 66
    assert plan["warmup_steps"] == 7
    assert plan.decisions["warmup_steps"].source == "planned"


def test_warmup_minimum_applies_when_override_is_off():
    loaded = load_config(None, ["plan.override_min_warmup=false"])
    assert make_plan(same_length(176, 64), cpu_machine(), TINY, loaded)["warmup_steps"] == 10


def test_warmup_never_reaches_total_steps():
    loaded = load_config(None, ["plan.override_min_warmup=false", "train.epochs=1"])
    plan = make_plan(same_length(8, 64), cpu_machine(), TINY, loaded)
    assert (plan["total_steps"], plan["warmup_steps"]) == (1, 0)


def test_ratio_rounding_is_not_fooled_by_floating_point():
    # 0.1 × 70 is 7.000000000000001 in floating point; warmup must be 7, not 8.
    loaded = load_config(None, ["train.epochs=1", "plan.batch_size=1", "plan.gradient_accumulation_steps=1"])
    plan = make_plan(same_length(70, 64), cpu_machine(), TINY, loaded)
    assert (plan["total_steps"], plan["warmup_steps"]) == (70, 7)


def test_gpu_memory_tiers():
    loaded = load_config(None)
    data = same_length(100, 200)
    assert make_plan(data, gpu_machine(6, (7, 5)), TINY, loaded)["batch_size"] == 4  # RTX 2060
    assert make_plan(data, gpu_machine(24), TINY, loaded)["batch_size"] == 8  # RTX 4090
    assert make_plan(data, gpu_machine(7.0), TINY, loaded)["batch_size"] == 8  # the threshold is inclusive
    assert make_plan(data, gpu_machine(3.9, (6, 1)), TINY, loaded)["batch_size"] == 2
    assert make_plan(data, cpu_machine(), TINY, loaded)["batch_size"] == 4


def test_precision_follows_the_hardware():
    loaded = load_config(None)
    data = same_length(10, 100)
    assert make_plan(data, gpu_machine(80, (9, 0)), TINY, loaded)["precision"] == "bf16"
    assert make_plan(data, gpu_machine(6, (7, 5)), TINY, loaded)["precision"] == "fp16"
    cpu = make_plan(data, cpu_machine(), TINY, loaded)
    assert (cpu["device"], cpu["precision"], cpu["pin_memory"]) == ("cpu", "fp32", False)


def test_config_and_cli_values_are_recorded_with_their_source(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("train:\n  epochs: 2\n")
    loaded = load_config(path, ["plan.gradient_accumulation_steps=4"])
    plan = make_plan(same_length(40, 100), cpu_machine(), TINY, loaded)
    assert plan.decisions["epochs"].source == "config"
    assert plan.decisions["epochs"].reason == "set by mine.yaml: train.epochs"
    assert plan.decisions["gradient_accumulation_steps"].source == "cli"
    assert plan["effective_batch_size"] == 4 * 4


def test_learning_rate_depends_on_the_base_model():
    loaded = load_config(None)
    data = same_length(10, 100)
    assert make_plan(data, cpu_machine(), TINY, loaded)["learning_rate"] == 5e-3
    assert make_plan(data, cpu_machine(), PRETRAINED, loaded)["learning_rate"] == 2e-4
    assert make_plan(data, cpu_machine(), PRETRAINED, loaded)["base_modules_trained"] == []


def test_sequence_length_is_p95_rounded_to_64_and_capped():
    loaded = load_config(None)
    lengths = DataStats(token_lengths=tuple([100] * 95 + [5000] * 5))
    assert make_plan(lengths, cpu_machine(), TINY, loaded)["sequence_length"] == 128
    long = DataStats(token_lengths=(5000,) * 10)
    assert make_plan(long, cpu_machine(), TINY, loaded)["sequence_length"] == 1024


def test_plan_to_manifest_keeps_flat_values_and_decisions():
    manifest = make_plan(same_length(176, 64), cpu_machine(), TINY, load_config(None)).to_manifest()
    assert manifest["batch_size"] == 4 and manifest["total_steps"] == 66 and manifest["warmup_steps"] == 7
    assert set(manifest["decisions"]["warmup_steps"]) == {"value", "source", "reason"}


machines = st.one_of(
    st.builds(cpu_machine, cores=st.integers(1, 128)),
    st.builds(
        gpu_machine,
        memory_gb=st.floats(1, 192),
        capability=st.sampled_from([(6, 1), (7, 5), (8, 0), (8, 6), (9, 0)]),
        cores=st.integers(1, 128),
    ),
)
datasets = st.lists(st.integers(1, 6000), min_size=1, max_size=300).map(
    lambda lengths: DataStats(tuple(lengths))
)
overrides = st.fixed_dictionaries(
    {
        "plan.warmup_ratio": st.floats(0, 0.99),
        "plan.warmup_steps_min": st.integers(0, 50),
        "plan.override_min_warmup": st.booleans(),
        "plan.gradient_accumulation_steps": st.integers(1, 64),
        "train.epochs": st.integers(1, 5),
    }
)


@settings(max_examples=150, deadline=None)
@given(data=datasets, hardware=machines, values=overrides)
def test_plan_invariants(data, hardware, values):
    loaded = load_config(None, [f"{key}={value}" for key, value in values.items()])
    plan = make_plan(data, hardware, TINY, loaded)
    assert plan["total_steps"] >= 1
    assert 0 <= plan["warmup_steps"] < plan["total_steps"]
    assert (
        plan["effective_batch_size"]
        == plan["batch_size"] * plan["gradient_accumulation_steps"] * plan["world_size"]
    )
    assert 0 <= plan["num_workers"] <= hardware.usable_cores
    assert plan["sequence_length"] % 64 == 0 or plan["sequence_length"] == 1024
    assert make_plan(data, hardware, TINY, loaded) == plan  # a pure function
