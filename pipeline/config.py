"""Typed configuration: grouped dataclasses, loaded from YAML, overridden by `--set`.

YAML is read once at the edge (`load_config`), every problem is collected and
reported in one line that names the key, and the resulting `Config` is passed
down explicitly. `training_config.yaml` at the project root documents every
field; a test keeps it equal to the defaults below.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

try:
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # a PyYAML built without libyaml (its wheels have it)
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]

from pipeline.errors import ConfigError
from scrapers.config import (
    FRACTION,
    FRACTION_OR_AUTO,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_OR_NULL,
    SEQUENCE_FORMATS,
    SHARE_OR_AUTO,
    Auto,
    ScrapeConfig,
)

SHIPPED_CONFIG_PATH = Path(__file__).resolve().parent.parent / "training_config.yaml"


@dataclass(frozen=True)
class PlanConfig:
    warmup_ratio: float = field(default=0.1, metadata=FRACTION)
    """Warmup as a fraction of total optimizer steps."""
    warmup_steps_min: int = field(default=10, metadata=NON_NEGATIVE)
    """Fewest warmup steps (optimizer steps); see override_min_warmup."""
    warmup_steps_max: int = field(default=1000, metadata=NON_NEGATIVE)
    """Most warmup steps (optimizer steps)."""
    override_min_warmup: bool = True
    """Let ratio-based warmup go below warmup_steps_min on small runs (a 66-step run gets 7, not 10)."""
    gradient_accumulation_steps: int | Auto = field(default=2, metadata=POSITIVE)
    """Micro-batches per optimizer step at the tier's micro-batch; with effective_batch_size auto it sets
    the target (tier batch × this), and the planner re-derives it when the micro-batch differs."""
    effective_batch_size: int | Auto = field(default="auto", metadata=POSITIVE)
    """Sequences per optimizer step over all processes; auto = tier micro-batch × gradient_accumulation_steps × processes."""
    batch_size: int | Auto = field(default="auto", metadata=POSITIVE)
    """Micro-batch size per device (sequences); auto: the tier below, scaled to the sequence length (or probed)."""
    batch_reference_tokens: int = field(default=1024, metadata=POSITIVE)
    """Sequence length (tokens) the tier batch sizes are meant for; shorter blocks get proportionally more."""
    gpu_memory_threshold_large_gb: float = field(default=7.0, metadata=POSITIVE)
    """A GPU with at least this much memory (GB) is in the large tier."""
    gpu_memory_threshold_medium_gb: float = field(default=4.0, metadata=POSITIVE)
    """A GPU with at least this much memory (GB) but under the large threshold is in the medium tier."""
    batch_size_large_gpu: int = field(default=8, metadata=POSITIVE)
    """Micro-batch size on a large-tier GPU (sequences)."""
    batch_size_medium_gpu: int = field(default=4, metadata=POSITIVE)
    """Micro-batch size on a medium-tier GPU (sequences)."""
    batch_size_small_gpu: int = field(default=2, metadata=POSITIVE)
    """Micro-batch size on a GPU under the medium threshold (sequences)."""
    batch_size_cpu: int = field(default=4, metadata=POSITIVE)
    """Micro-batch size when training on the CPU (sequences)."""
    batch_probe: bool = True
    """On CUDA, measure the largest micro-batch that fits (forward/backward on the longest blocks)."""
    probe_headroom: float = field(default=0.1, metadata=FRACTION)
    """Fraction of GPU memory the probe leaves free."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """auto: bf16 where the GPU supports it, fp16 on older CUDA GPUs, fp32 on CPU."""
    quantization: Literal["auto", "none", "4bit", "8bit"] = "auto"
    """How the frozen base model's linear weights are loaded: none (the compute dtype), 4bit (NF4 with double
    quantisation, QLoRA) or 8bit (LLM.int8), through bitsandbytes; auto: 4bit when the weights would not fit
    beside training at micro-batch 1 (GPU memory, or 70% of a CPU machine's RAM), none otherwise."""
    tf32: bool | Auto = "auto"
    """TF32 matmuls for the fp32 parts; auto: on for CUDA compute capability 8.0 and newer."""
    attention: Literal["auto", "flash_attention_2", "sdpa", "segments", "eager"] = "auto"
    """auto: flash-attention 2 when installed and supported, else on a CPU attention once per packed
    sequence (segments), else PyTorch SDPA, else eager."""
    gradient_checkpointing: bool | Auto = "auto"
    """Recompute activations in the backward pass; auto: only when the estimate says memory is tight."""
    drop_last: bool = False
    """Drop the last incomplete micro-batch of each epoch."""
    num_workers: int | Auto = field(default="auto", metadata=NON_NEGATIVE)
    """Dataloader worker processes; auto is physical cores // 2, and 0 for a small in-memory dataset."""
    pin_memory: bool = True
    """Pin host memory for faster host-to-GPU copies; only takes effect with CUDA."""
    cpu_threads: int | Auto = field(default="auto", metadata=POSITIVE)
    """Threads torch computes with on the CPU; auto: the usable cores other processes leave free when the
    run starts, and, while training, as that changes (a thread on a busy core stalls all the others)."""


@dataclass(frozen=True)
class TrainConfig:
    model: str = "smollm2-135m"
    """Base model: `smollm2-135m` (pretrained, shipped by a package), `tiny` (built in code, random weights),
    a Hugging Face id, or a local path."""
    style: Literal["auto", "chat", "raw"] = "auto"
    """How a commit becomes text: chat (a conversation in the model's chat template) or raw (the scraped
    text); auto: chat when the tokenizer has a chat template."""
    loss_on: Literal["auto", "response", "all"] = "auto"
    """Tokens that carry the loss: response (the answer: the message, or the change) or all;
    auto: response for chat, all for raw."""
    loss_average: Literal["auto", "token", "answer"] = "auto"
    """How a batch's loss is averaged: over its tokens, or over each answer's tokens and then answers (every
    commit counts once, whatever its length); auto: answer when the loss is on responses."""
    epochs: int = field(default=3, metadata=POSITIVE)
    """Passes over the training blocks."""
    time_budget: str | int | float | None = "auto"
    """Wall-clock bound on the run: `10m`, `90s`, `1h`, a number of seconds, or none; auto: 10m on a CPU,
    none on a GPU. Training gets what the rest of the run leaves of it: the planner trains the newest
    commits that fit, at measured speed."""
    newest_sequences: int | None = field(default=None, metadata=POSITIVE_OR_NULL)
    """Train on this many of the newest training sequences alone (a commit gives one per format); null: all,
    or what a time budget fits. Every commit is still indexed, retrieved from and scored on, unlike
    `scrape.max_commits`, which reads fewer commits for all of them."""
    files_share: float | Auto = field(default="auto", metadata=SHARE_OR_AUTO)
    """Of what a time budget trains, the share of tokens from the repository's files at the split point
    (the rest: its history); auto is half where there are files. Where one kind runs out, the other takes
    the rest; without a budget both are trained whole."""
    learning_rate: float | Auto = field(default="auto", metadata=POSITIVE)
    """Peak learning rate; auto is 5e-3 for the random tiny model and 2e-4 for a pretrained one."""
    lr_scheduler: Literal["linear", "cosine", "constant_with_warmup"] = "cosine"
    """Learning-rate shape after warmup."""
    weight_decay: float = field(default=0.0, metadata=NON_NEGATIVE)
    """AdamW weight decay."""
    max_grad_norm: float = field(default=1.0, metadata=POSITIVE)
    """Gradient clipping norm."""
    sequence_length: int | Auto = field(default="auto", metadata=POSITIVE)
    """Tokens per training block; auto is the p95 sequence length rounded up to 64, capped by max_sequence_length."""
    max_sequence_length: int = field(default=1024, metadata=POSITIVE)
    """Upper bound for sequence_length (tokens); the model's own limit also applies."""
    max_prompt_tokens: int = field(default=256, metadata=POSITIVE)
    """A chat example's prompt (the diff a commit message answers) is cut to this many tokens, in training
    and in evaluation: the answer is what is learned, and a long prompt costs time for no loss."""
    seed: int = 42
    """Seed for model initialisation, data order and dropout."""
    logging_steps: int | Auto = field(default="auto", metadata=POSITIVE)
    """Optimizer steps between loss/LR records; auto gives about 50 points per run."""
    eval_steps: int | Auto = field(default="auto", metadata=POSITIVE)
    """Optimizer steps between validations (loss on the validation commits, which chooses the checkpoint
    kept and when to stop); auto gives about 10 per run, fewer where they would cost much."""
    early_stopping_patience: int | Auto = field(default="auto", metadata=NON_NEGATIVE)
    """Validations in a row without a new best after which training stops (the best weights are kept
    either way); 0 never stops early; auto: 3 when there are validations during training."""
    save_steps: int | Auto = field(default="auto", metadata=POSITIVE)
    """Optimizer steps between checkpoints; auto gives about 10 per run."""
    save_total_limit: int = field(default=2, metadata=POSITIVE)
    """Checkpoints kept on disk (the newest)."""
    torch_compile: bool = False
    """Compile the model with torch.compile (slower start, often faster steps on GPUs)."""
    report_to: str | list[str] = field(default_factory=list)
    """Experiment trackers the Trainer logs to: tensorboard, mlflow, wandb, or any other the installed
    transformers supports (a name or a list); empty: none."""

    @property
    def trackers(self) -> list[str]:
        """`report_to` as a list of names, `none` left out."""
        names = [self.report_to] if isinstance(self.report_to, str) else self.report_to
        return list(dict.fromkeys(name for name in names if name != "none"))


@dataclass(frozen=True)
class EvalConfig:
    samples: int = field(default=100, metadata=NON_NEGATIVE)
    """Newest held-out commits asked both tasks (a commit message from its diff, the next line of its
    change), before and after training, greedy; 100 gives intervals narrow enough to decide; 0 scores
    held-out loss only."""
    message_tokens: int = field(default=48, metadata=POSITIVE)
    """Most tokens generated for a commit message."""
    code_cases: int | Auto = field(default="auto", metadata=NON_NEGATIVE)
    """Most next-line cases scored (lines the asked commits added, a few a commit: `scrapers.completions`),
    each asked of every model with and without retrieved context; auto: 300 (from 100 commits: intervals
    narrow enough to decide) where an evaluation costs little, 100 on a CPU, where each case is two
    prompts of a few hundred tokens for each model and the budget would go to scoring."""
    block_cases: int | Auto = field(default="auto", metadata=NON_NEGATIVE)
    """Most block cases scored (bodies of up to 8 lines the asked commits wrote under a line that opens
    one, two a commit at most), each asked of every model with and without retrieved context; auto: 100
    where an evaluation costs little, 30 on a CPU, where each body is up to 96 new tokens of each model."""
    max_blocks: int | Auto = field(default="auto", metadata=POSITIVE)
    """Held-out blocks per format scored for loss; auto: all on a GPU, bounded by time on a CPU."""
    validate_model: bool | Auto = "auto"
    """The fine-tuned model also answers the validation commits, so the suggestion system can be the
    model where it beats the repository's past there beyond its 95% interval; auto: on a GPU or without
    a time budget (on a CPU with a budget it takes training time from a model that minutes of CPU training
    have not made better than retrieval anywhere measured: docs/experiments.md)."""
    cache_base_scores: bool = True
    """Keep the base model's scores per model and held-out set (~/.cache/repotune/evaluations), and its
    answers to the validation lines, so a second run on the same commits evaluates only the fine-tuned
    model."""


@dataclass(frozen=True)
class RetrievalConfig:
    k: int = field(default=10, metadata=POSITIVE)
    """Most similar past commits retrieved for a diff: the selector's candidates."""
    selector_history: int = field(default=1000, metadata=NON_NEGATIVE)
    """Newest training commits the selector learns from (each answered from the commits older than
    itself); 0: no selector, the lookup's answer."""
    system: Literal["auto", "lookup", "selector", "model"] = "auto"
    """What makes a run's suggestions: the lookup, the selector over the past commits, or the fine-tuned
    model; auto: the best on the validation commits (the model only where it answered them)."""


@dataclass(frozen=True)
class LoraConfig:
    r: int = field(default=16, metadata=POSITIVE)
    """Rank of the LoRA update matrices."""
    alpha: int = field(default=32, metadata=POSITIVE)
    """LoRA scaling numerator (the update is scaled by alpha / r)."""
    dropout: float | Auto = field(default="auto", metadata=FRACTION_OR_AUTO)
    """Dropout on the LoRA branch (a fraction); auto: 0.05 on a GPU, none on a CPU, where it costs a quarter of a step."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get adapters: a list of names (q_proj, v_proj, ...) or `all-linear`."""


@dataclass(frozen=True)
class MonitorConfig:
    collection_interval_seconds: float = field(default=5.0, metadata=POSITIVE)
    """Seconds between hardware samples (CPU, RAM, GPU)."""
    track_per_step_metrics: bool = False
    """Record loss and learning rate at every optimizer step instead of every logging step."""
    include_epoch_summary: bool = True
    """Summarise each epoch (loss mean/min/max, duration, tokens/s) in the manifest."""


@dataclass(frozen=True)
class DistributedConfig:
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """Process-group backend under torchrun / accelerate launch; auto: nccl with CUDA, gloo on CPU."""
    setup_wait_hours: float = field(default=24.0, metadata=POSITIVE)
    """How long the other ranks wait for rank 0 to scrape, tokenize and pack (hours)."""
    fsdp: str = ""
    """Passed to the Trainer's `fsdp`, e.g. "full_shard auto_wrap"; empty: plain DDP."""
    fsdp_config: dict | None = None
    """Passed to the Trainer's `fsdp_config` (a mapping), e.g. {"use_orig_params": true}."""
    deepspeed: str | None = None
    """Path of a DeepSpeed JSON config, passed to the Trainer's `deepspeed`."""


@dataclass(frozen=True)
class OutputConfig:
    dir: str = "repotune-output"
    """Where sequences, checkpoints, the adapter and MANIFEST.json go (relative to the working directory)."""
    cache_dir: str | None = None
    """Token cache (tokenized sequences and packed blocks); null keeps it in <dir>/cache."""
    keep_adapter: bool = False
    """Also keep each completed run's adapter under <dir>/runs/ beside its record (the record, its manifest
    and answers, is always kept; an adapter with its retrieval index is tens of megabytes a run)."""


@dataclass(frozen=True)
class Config:
    scrape: ScrapeConfig = field(default_factory=ScrapeConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LoadedConfig:
    """A config and where its values came from, so decisions can name their source."""

    config: Config
    path: Path | None
    """The YAML file read; None when the built-in defaults were used."""
    overrides: dict[str, Any]
    """`section.key` → value for every `--set` (and CLI flag) override, in order."""
    user_keys: frozenset[str] = frozenset()
    """`section.key`s set in the user's own --config file (the shipped file holds defaults only)."""
    continues: dict[str, Any] | None = None
    """For an update: the plan of the run it continues (its `training_parameters`)."""

    def source_of(self, dotted_key: str) -> str:
        return "cli" if dotted_key in self.overrides else "config"

    def explicit(self, dotted_key: str) -> bool:
        """The user chose this value (--set, a flag, or their own config file), so it must win."""
        return dotted_key in self.overrides or dotted_key in self.user_keys

    def label(self) -> str:
        return self.path.name if self.path else "defaults"


def load_config(
    path: Path | None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
    base: dict[str, Any] | None = None,
) -> LoadedConfig:
    """Read `path` (the shipped file when None), apply `base` (typed values under the overrides: the
    parent's, for an update), `--set section.key=value` overrides (values parsed as YAML) and then CLI
    `flags` (already typed), and validate."""
    path = path or (SHIPPED_CONFIG_PATH if SHIPPED_CONFIG_PATH.exists() else None)
    label = path.name if path else "config"
    data = _read_yaml(path) if path else {}
    parsed_overrides = dict(base or {})
    parsed_overrides.update(_parse_override(text) for text in overrides or [])
    parsed_overrides.update(flags or {})
    for dotted, value in parsed_overrides.items():
        section, key = dotted.split(".", 1)
        if data.get(section) is None:
            data[section] = {}
        if not isinstance(data[section], dict):
            raise ConfigError(f"{label}: `{section}` must be a mapping of keys to values")
        data[section][key] = value
    user_keys = frozenset(
        f"{section}.{key}"
        for section, values in (data.items() if path and path != SHIPPED_CONFIG_PATH else [])
        if isinstance(values, dict)
        for key in values
    )
    config = _build(data, label, set(parsed_overrides))
    return LoadedConfig(
        config=config, path=path, overrides=parsed_overrides, user_keys=user_keys - set(parsed_overrides)
    )


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read config {path}: {err.strerror or err}") from err
    try:
        data = yaml.load(text, Loader=_UniqueKeys)  # a SafeLoader: no tags that build objects
    except _RepeatedKey as err:
        raise ConfigError(f"{path.name}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path.name}:{where} is not valid YAML ({getattr(err, 'problem', err)})") from err
    if data is None:
        raise ConfigError(f"{path.name}: the file is empty; remove --config to use the shipped defaults")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path.name}: must be a mapping of sections (scrape, plan, train, ...), got {type(data).__name__}"
        )
    return data


def _parse_override(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or "." not in key:
        raise ConfigError(f"--set {text!r}: expected section.key=value, e.g. --set train.epochs=1")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def _build(data: dict[str, Any], label: str, cli_keys: set[str]) -> Config:
    problems: list[str] = []
    sections: dict[str, Any] = {}
    section_types = {f.name: f.type for f in dataclasses.fields(Config)}
    hints = typing.get_type_hints(Config)
    for name, raw in data.items():
        if name not in section_types:
            problems.append(f"unknown section `{name}`{_suggest(name, section_types)}")
        elif not isinstance(raw, dict):
            problems.append(f"`{name}` must be a mapping of keys to values, got {_describe(raw)}")
    for name in section_types:
        raw = data.get(name) or {}
        if isinstance(raw, dict):
            sections[name] = _build_section(hints[name], name, raw, cli_keys, problems)
    if problems:
        raise ConfigError(f"{label}: " + "; ".join(problems))
    config = Config(**sections)
    _check_relations(config, problems, cli_keys)
    if problems:
        raise ConfigError(f"{label}: " + "; ".join(problems))
    return config


def _build_section(cls: type, section: str, raw: dict[str, Any], cli_keys: set[str], problems: list[str]):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        dotted = f"{section}.{key}"
        name = _named(dotted, cli_keys)
        if key not in fields:
            problems.append(f"unknown key {name}{_suggest(key, fields, section)}")
            continue
        ok, value = _coerce(value, hints[key])
        if not ok:
            problems.append(f"{name} must be {_type_name(hints[key])}, got {_describe(value)}")
            continue
        check = fields[key].metadata.get("check")
        if check and not check[0](value):
            problems.append(f"{name} {check[1]}, got {value!r}")
            continue
        values[key] = value
    return cls(**values)


def _named(dotted: str, cli_keys: set[str]) -> str:
    """A key as a problem names it, and where its value came from when that was the command line (a flag
    such as --budget, or --set): the config file the message begins with did not give it."""
    return f"`{dotted}` (from the command line)" if dotted in cli_keys else f"`{dotted}`"


def _check_relations(config: Config, problems: list[str], cli_keys: set[str]) -> None:
    scrape = config.scrape
    unknown = [name for name in scrape.formats if name not in SEQUENCE_FORMATS]
    if unknown or not scrape.formats:
        problems.append(
            f"{_named('scrape.format', cli_keys)} must be one or more of {', '.join(SEQUENCE_FORMATS)}, "
            f"got {scrape.format!r}"
        )
    if scrape.rev.startswith("-"):
        problems.append(
            f"{_named('scrape.rev', cli_keys)} must be a revision or range, not an option: {scrape.rev!r}"
        )
    for pattern in scrape.trivial_messages:
        try:
            re.compile(pattern)
        except re.error as err:
            problems.append(f"`scrape.trivial_messages` has an invalid regex {pattern!r}: {err}")
    plan = config.plan
    if plan.warmup_steps_min > plan.warmup_steps_max:
        problems.append(
            f"`plan.warmup_steps_min` ({plan.warmup_steps_min}) must not exceed "
            f"`plan.warmup_steps_max` ({plan.warmup_steps_max})"
        )
    if plan.gpu_memory_threshold_medium_gb > plan.gpu_memory_threshold_large_gb:
        problems.append(
            f"`plan.gpu_memory_threshold_medium_gb` ({plan.gpu_memory_threshold_medium_gb}) must not exceed "
            f"`plan.gpu_memory_threshold_large_gb` ({plan.gpu_memory_threshold_large_gb})"
        )
    train = config.train
    try:
        budget_seconds(train.time_budget)
    except ValueError as err:
        problems.append(f"{_named('train.time_budget', cli_keys)} {err}")
    # Trackers are checked here, before any scraping: a typo or a missing package costs nothing.
    if train.trackers and (problem := tracker_problem(train.trackers)):
        problems.append(problem)
    if isinstance(train.sequence_length, int) and train.sequence_length > train.max_sequence_length:
        problems.append(
            f"`train.sequence_length` ({train.sequence_length}) must not exceed "
            f"`train.max_sequence_length` ({train.max_sequence_length})"
        )


# Package to install for a tracker whose pip name is not its report_to name with - for _.
PACKAGES = {"azure_ml": "azureml-core", "flyte": "flytekit", "kubeflow": "kfp"}


def tracker_problem(names: list[str]) -> str | None:
    """Why the trackers asked for cannot be used (one transformers does not know, or whose package is not
    installed), naming the key and the fix; None when all can."""
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    for name in names:
        if name not in INTEGRATION_TO_CALLBACK:
            known = ", ".join(sorted(INTEGRATION_TO_CALLBACK))
            return (
                f"`train.report_to`: {name!r} is not a tracker this transformers supports (one of: {known})"
            )
    installed = set(get_available_reporting_integrations())
    for name in names:
        if name not in installed:
            return f"`train.report_to`: {name} needs its package: pip install {PACKAGES.get(name, name.replace('_', '-'))}"
    return None


class _RepeatedKey(ValueError):
    pass


class _UniqueKeys(_SafeLoader):
    """YAML as `safe_load` reads it, but a key said twice in one mapping is an error: YAML's last-wins
    would drop a whole first `train:` section without a word. Parsed by libyaml where there is one: every
    command reads the config, and libyaml parses it an order of magnitude faster than pure Python."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _RepeatedKey(
                    f"line {line}: `{key}` is given twice (line {seen[key]} first): give it once"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


# 1h30m as written, and as said: "10 min", "1 hour 30 minutes", "90 sec" (spaces are taken out first).
_DURATION = re.compile(
    r"(?:(\d+(?:\.\d+)?)h(?:ours?|rs?)?)?(?:(\d+(?:\.\d+)?)m(?:in(?:ute)?s?)?)?(?:(\d+(?:\.\d+)?)s(?:ec(?:ond)?s?)?)?"
)


BARE_BUDGET_MIN_S = 60


def budget_seconds(value: str | int | float | None) -> float | str | None:
    """`train.time_budget` in seconds; None for no bound; "auto" is left for the planner."""
    if value is None or value == "auto":
        return value
    text = str(value).strip().lower().replace(" ", "")
    if text in ("none", "off"):
        return None
    if re.fullmatch(r"\d+(\.\d+)?", text):
        total = float(text)
        if 0 < total < BARE_BUDGET_MIN_S:  # `--budget 10` for ten minutes would plan a 10-second run
            raise ValueError(
                f"must say its unit: a bare {text} is {text} seconds, too short to train in; write {text}m for "
                f"minutes, or {text}s if you mean seconds"
            )
    else:
        match = _DURATION.fullmatch(text)
        if not match or not any(match.groups()):
            raise ValueError(f"must be a duration such as 10m, 90s, 1h30m, or none; got {value!r}")
        hours, minutes, seconds = (float(part or 0) for part in match.groups())
        total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise ValueError(f"must be longer than 0 s, got {value!r}")
    return total


def _coerce(value: Any, annotation: Any) -> tuple[bool, Any]:
    """Return (matches, value), accepting what YAML users naturally write for a number."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            ok, coerced = _coerce(value, option)
            if ok:
                return True, coerced
        return False, value
    if origin is Literal:
        return value in typing.get_args(annotation), value
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if not isinstance(value, list):
            return False, value
        return all(_coerce(item, item_type)[0] for item in value), value
    if annotation is type(None):
        return value is None, value
    if annotation is bool:
        return isinstance(value, bool), value
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if annotation is float:
        if isinstance(value, bool):
            return False, value
        if isinstance(value, int | float):
            return True, float(value)
        # PyYAML reads `1e-3` (no dot) as a string; accept what float() accepts.
        if isinstance(value, str):
            try:
                return True, float(value)
            except ValueError:
                return False, value
        return False, value
    if annotation is str:
        return isinstance(value, str), value
    if annotation is dict:
        return isinstance(value, dict), value
    raise TypeError(f"unsupported config annotation {annotation!r}")


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(option) for option in typing.get_args(annotation))
    if origin is Literal:
        return " or ".join(
            repr(v) if not isinstance(v, str) else f"`{v}`" for v in typing.get_args(annotation)
        )
    if origin is list:
        plurals = {str: "strings", int: "integers", float: "numbers"}
        return f"a list of {plurals[typing.get_args(annotation)[0]]}"
    names = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        dict: "a mapping",
        type(None): "null",
    }
    return names[annotation]


def _describe(value: Any) -> str:
    kind = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }
    return f"{kind.get(type(value), type(value).__name__)} {value!r}" if value is not None else "null"


def _suggest(name: str, known, section: str | None = None) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    if not close:
        return ""
    return f" (did you mean `{section}.{close[0]}`?)" if section else f" (did you mean `{close[0]}`?)"
