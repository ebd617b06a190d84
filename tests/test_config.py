"""Config loading: the shipped file, overrides, and one clear line for every mistake."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config import SHIPPED_CONFIG_PATH, Config, ConfigError, load_config


def test_shipped_config_loads_and_equals_the_documented_defaults():
    loaded = load_config(SHIPPED_CONFIG_PATH)
    assert loaded.config == Config()
    plan = loaded.config.plan
    assert (plan.warmup_ratio, plan.warmup_steps_min, plan.warmup_steps_max) == (0.1, 10, 1000)
    assert plan.override_min_warmup is True
    assert plan.gradient_accumulation_steps == 2
    assert (plan.num_workers, plan.pin_memory) == ("auto", True)
    assert plan.gpu_memory_threshold_large_gb == 7.0
    assert (plan.batch_size_large_gpu, plan.batch_size_medium_gpu, plan.batch_size_small_gpu) == (8, 4, 2)
    monitor = loaded.config.monitor
    assert (
        monitor.collection_interval_seconds,
        monitor.track_per_step_metrics,
        monitor.include_epoch_summary,
    ) == (
        5,
        False,
        True,
    )
    assert (loaded.config.train.seed, loaded.config.train.model) == (42, "smollm2-135m")


def test_shipped_config_documents_every_field():
    text = SHIPPED_CONFIG_PATH.read_text()
    for section in dataclasses.fields(Config):
        assert f"\n{section.name}:\n" in text
        for field in dataclasses.fields(getattr(Config(), section.name)):
            line = next(line for line in text.splitlines() if line.strip().startswith(f"{field.name}:"))
            assert "#" in line, f"{section.name}.{field.name} has no comment"


def test_set_overrides_are_typed_and_recorded_as_cli():
    loaded = load_config(
        None, ["train.epochs=1", "lora.target_modules=[q_proj, v_proj]", "train.learning_rate=1e-3"]
    )
    assert loaded.config.train.epochs == 1
    assert loaded.config.lora.target_modules == ["q_proj", "v_proj"]
    assert loaded.config.train.learning_rate == 0.001  # PyYAML reads 1e-3 as a string; accepted as a number
    assert loaded.source_of("train.epochs") == "cli"
    assert loaded.source_of("train.seed") == "config"


def test_partial_config_file_keeps_other_defaults(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("train:\n  epochs: 7\n")
    loaded = load_config(path)
    assert loaded.config.train.epochs == 7
    assert loaded.config.plan == Config().plan


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "train:\n  learnin_rate: 0.1\n",
            "mine.yaml: unknown key `train.learnin_rate` (did you mean `train.learning_rate`?)",
        ),
        ("trian:\n  epochs: 1\n", "mine.yaml: unknown section `trian` (did you mean `train`?)"),
        ("train:\n  epochs: three\n", "mine.yaml: `train.epochs` must be an integer, got a string 'three'"),
        ("plan:\n  warmup_ratio: 1.5\n", "mine.yaml: `plan.warmup_ratio` must be in [0, 1), got 1.5"),
        ("plan:\n  pin_memory: 1\n", "mine.yaml: `plan.pin_memory` must be true or false, got an integer 1"),
        ("", "mine.yaml: the file is empty; remove --config to use the shipped defaults"),
        ("- a\n- b\n", "mine.yaml: must be a mapping of sections (scrape, plan, train, ...), got list"),
        ("train: [1\n", "mine.yaml: line 2 is not valid YAML"),
        (  # YAML itself keeps the second and drops the first section whole, learning rate and all
            "train:\n  learning_rate: 0.001\nplan:\n  warmup_ratio: 0.1\ntrain:\n  epochs: 2\n",
            "mine.yaml: line 5: `train` is given twice (line 1 first): give it once",
        ),
        (
            "train:\n  epochs: 2\n  epochs: 3\n",
            "mine.yaml: line 3: `epochs` is given twice (line 2 first): give it once",
        ),
        (
            "plan:\n  warmup_steps_min: 50\n  warmup_steps_max: 20\n",
            "mine.yaml: `plan.warmup_steps_min` (50) must not exceed `plan.warmup_steps_max` (20)",
        ),
    ],
)
def test_config_mistakes_give_one_line_naming_the_key(tmp_path, text, message):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_every_problem_is_reported_at_once(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("train:\n  epochs: 0\n  seed: x\n")
    with pytest.raises(
        ConfigError, match=r"`train.epochs` must be > 0, got 0; `train.seed` must be an integer"
    ):
        load_config(path)


def test_bad_set_syntax_and_values_name_the_command_line():
    with pytest.raises(ConfigError, match=r"expected section.key=value"):
        load_config(None, ["epochs"])
    with pytest.raises(ConfigError, match=r"`train.epochs` \(from the command line\) must be > 0, got -1"):
        load_config(None, ["train.epochs=-1"])
    # The checks across keys name it too: `--budget 0` had been said as if the config file gave it.
    for flags, said in (
        (
            {"train.time_budget": "0"},
            r"`train.time_budget` \(from the command line\) must be longer than 0 s",
        ),
        ({"scrape.rev": "-x"}, r"`scrape.rev` \(from the command line\) must be a revision or range"),
        ({"scrape.format": "nope"}, r"`scrape.format` \(from the command line\) must be one or more of"),
    ):
        with pytest.raises(ConfigError, match=said):
            load_config(None, [], flags)
