"""The values that pass between stages: what each stage returns and the next one takes (the
scraped history, the tokenized data, the machine, the plan with every parameter an attribute and
its decision beside it, the packed blocks, the loaded model, scores, the training's outcome).
`pipeline.record.run` maps each of them to the manifest. Nothing heavy is imported here."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Step(Protocol):
    """How a stage's part runs inside a run: timed under `name` in the manifest's `.timings`, its result
    recorded (`pipeline.record.run.Record.step`). A stage that runs several parts takes one."""

    def __call__(self, name: str, stage: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T: ...


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_gb: float
    """Total device memory (GiB)."""
    free_memory_gb: float | None = None
    """Free device memory when detected (GiB)."""
    compute_capability: tuple[int, int] | None = None

    @property
    def bf16(self) -> bool | None:
        """Native bfloat16 (compute capability 8.0 and newer); None when the capability is unknown."""
        return self.compute_capability >= (8, 0) if self.compute_capability else None


@dataclass(frozen=True)
class Hardware:
    cpu_physical_cores: int | None
    cpu_logical_cores: int | None
    usable_cores: int
    """Cores this process may use: affinity mask and container CPU quota applied."""
    cpu_quota_cores: float | None
    """CPU quota granted by cgroups (cores), None when unlimited or unknown."""
    ram_total_gb: float | None
    ram_available_gb: float | None
    memory_limit_gb: float | None
    """cgroup memory limit (GiB), None when unlimited or unknown."""
    gpus: tuple[GpuInfo, ...] = ()
    cuda_usable: bool = False
    """torch can run on the GPUs (a CUDA build and a driver); GPUs seen only by NVML are not usable."""
    mps: bool = False
    cpu_bf16: str | None = None
    """The CPU instruction set that makes bfloat16 fast (`amx_bf16`, `avx512_bf16`), None without one."""
    platform: str = ""
    python_version: str = ""
    torch_version: str | None = None
    cuda_version: str | None = None
    transformers_version: str | None = None
    source: str = "detected"
    """`detected` on this machine, or the profile file it was described by."""
    busy_cores: float | None = None
    """Cores' worth of CPU that other processes used while this run started (None: not measured, as for
    a described machine): a training that shares the CPU plans its threads and speed for what is left."""
    busy_processes: tuple[str, ...] = ()
    """The other processes that used the most of it (`name (pid N): 1.0 core`)."""
    notes: dict[str, str] = field(default_factory=dict)
    """Why a field is None or a reader was skipped."""

    def to_manifest(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["gpus"] = [
            {
                **row,
                "compute_capability": list(gpu.compute_capability) if gpu.compute_capability else None,
                "bf16": gpu.bf16,
            }
            for row, gpu in zip(data["gpus"], self.gpus, strict=True)
        ]
        data["gpu_count"] = len(self.gpus)
        data["busy_processes"] = list(self.busy_processes)
        return data


@dataclass(frozen=True)
class TokenCache:
    """A token cache entry: where it is, its key, whether this run found it, and what it cost."""

    directory: Path
    key: str
    hit: bool
    seconds: float
    """Time to load (hit) or build (miss) the entry."""
    build_seconds: float | None
    """How long building this entry took (a hit saves about that much); None for older entries."""

    def to_manifest(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "dir": str(self.directory),
            "hit": self.hit,
            "seconds": round(self.seconds, 3),
            "build_seconds": self.build_seconds,
        }


@dataclass(frozen=True)
class PackedSplit:
    """One split's packed blocks on disk (`pipeline.data.dataset.block_dataset` reads them)."""

    directory: Path
    split: str
    blocks: int
    real_tokens: int
    block_size: int

    @property
    def efficiency(self) -> float:
        """Real tokens over token slots (1.0 means no padding)."""
        slots = self.blocks * self.block_size
        return self.real_tokens / slots if slots else 0.0


@dataclass(frozen=True)
class TextStyle:
    """How commits become training text."""

    style: str
    """`chat` (a conversation in the model's chat template) or `raw` (the scraped text)."""
    loss_on: str
    """`response` (the answer's tokens only) or `all`."""


@dataclass(frozen=True)
class Decision:
    value: Any
    source: str
    """`planned` (derived here), `config` (a config value) or `cli` (a --set or flag)."""
    reason: str


@dataclass(frozen=True)
class DataStats:
    """What the planner needs to know about the tokenized training data."""

    length_counts: Mapping[int, int]
    """Histogram of tokens per training sequence (EOS included) → how many sequences."""
    newest_first: tuple[int, ...] = ()
    """The same lengths in the training split's order, newest commit first (what a time budget keeps)."""

    @classmethod
    def from_lengths(cls, lengths) -> DataStats:
        lengths = tuple(lengths)
        return cls(Counter(lengths), lengths)

    def truncated(self, length: int) -> DataStats:
        """The same sequences cut to their first `length` tokens."""
        counts: Counter = Counter()
        for size, count in self.length_counts.items():
            counts[min(size, length)] += count
        return DataStats(counts, tuple(min(size, length) for size in self.newest_first))

    @property
    def sequences(self) -> int:
        return sum(self.length_counts.values())

    @property
    def tokens(self) -> int:
        return sum(length * count for length, count in self.length_counts.items())

    def percentile(self, pct: float) -> int:
        """Nearest-rank percentile of the sequence lengths (an actual length from the data)."""
        rank = max(1, math.ceil(pct / 100 * self.sequences))
        seen = 0
        for length in sorted(self.length_counts):
            seen += self.length_counts[length]
            if seen >= rank:
                return length
        return 0


@dataclass(frozen=True)
class ModelFacts:
    name: str
    random_init: bool
    """The tiny model: randomly initialised, so it needs a higher learning rate."""
    max_positions: int | None
    """Longest context the model supports (tokens), if it says."""
    source: dict[str, str] | None = None
    """A built-in model's origin: package, version, file and sha256."""
    chat_template: bool = False
    """The tokenizer has a chat template (an instruct model)."""
    parameters: int = 0
    linear_parameters: int = 0
    """Weights of the linear layers, the ones a 4-bit or 8-bit load quantizes (not the embeddings, not
    the output layer)."""
    linear_widths: int = 0
    """Input plus output width, summed over those layers: a rank-r adapter on each has r × this many weights."""
    hidden_size: int = 0
    num_layers: int = 0
    vocab_size: int = 0
    supports_sdpa: bool = True
    supports_attention_backend: bool = False
    """The model class takes a registered attention function (so `segments` can run it)."""
    supports_flash_attention: bool = False
    """The model class has a flash-attention path and the flash_attn package is installed."""


@dataclass(frozen=True)
class Launch:
    """How many processes train together, which one this is, and how we know."""

    world_size: int = 1
    reason: str = "one process"
    rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    launcher: str | None = None
    """`torchrun` or `accelerate`; None for a plain process (or a plan for a described machine)."""

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def writes(self) -> bool:
        """Only rank 0 writes the manifest, the sequences, the cache and the adapter."""
        return self.rank == 0


@dataclass(frozen=True)
class ProbeRow:
    batch_size: int
    peak_memory_gb: float | None
    step_time_s: float | None
    fits: bool


@dataclass(frozen=True)
class Speed:
    """Measured training throughput on this machine, for a time budget."""

    tokens_per_s: float
    how: str
    """How it was measured, e.g. `forward and backward passes on 3 training blocks spread over the data`."""
    cores_gflops: float | None = None
    """How fast the CPU's cores multiplied matrices (GFLOP/s) just before this run trained (None on a
    GPU): a later run uses the speed this run leaves while its cores run at about this pace, and
    measures again where they do not."""


@dataclass(frozen=True)
class TrainTime:
    """What a time budget leaves training, known once the run has spent what comes before it."""

    seconds: float
    """The deadline's share for training: the budget less what was spent and what comes after."""
    why: str


@dataclass(frozen=True)
class Plan:
    """Every training parameter, decided: the values as attributes, `decisions` with each one's source
    and reason (in the order they were decided, as the CLI prints them)."""

    device: str
    world_size: int
    style: str
    loss_on: str
    loss_average: str
    precision: str
    tf32: bool
    attention: str
    sequence_length: int
    truncate_at: int | None
    train_blocks: int
    quantization: str
    gradient_checkpointing: bool
    batch_size: int
    gradient_accumulation_steps: int
    epochs: int
    time_budget_s: float | None
    measured_tokens_per_s: float | None
    train_seconds: float | None
    train_sequences: int
    files_share: float
    train_files: int
    effective_batch_size: int
    drop_last: bool
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    learning_rate: float
    lr_scheduler: str
    optimizer: str
    weight_decay: float
    max_grad_norm: float
    base_modules_trained: list[str]
    lora_dropout: float
    num_workers: int
    pin_memory: bool
    cpu_threads: int
    follow_free_cores: bool
    persistent_workers: bool
    prefetch_factor: int | None
    eval_samples: int
    code_cases: int
    block_cases: int
    eval_blocks: int | None
    validate_model: bool
    logging_steps: int
    eval_steps: int | None
    early_stopping_patience: int | None
    save_steps: int
    save_total_limit: int
    fsdp: str
    fsdp_config: dict | None
    deepspeed: str | None
    torch_compile: bool
    seed: int
    report_to: list[str]
    decisions: dict[str, Decision] = field(repr=False)
    probe: tuple[ProbeRow, ...] = ()
    speed: Speed | None = None
    """The measured training speed the plan was fitted to (a time budget)."""
    train_time: TrainTime | None = None
    """What the time budget left training when the plan was fitted to it (None: not yet known)."""
    probe_note: str | None = None
    """Why the batch probe did not run (None when it ran, or before measuring)."""

    @classmethod
    def from_decisions(
        cls,
        decisions: dict[str, Decision],
        probe: tuple[ProbeRow, ...] = (),
        speed: Speed | None = None,
        train_time: TrainTime | None = None,
    ) -> Plan:
        """A plan from the planner's decisions; a parameter that was not decided is an error here, not
        later in training."""
        values = {name: decision.value for name, decision in decisions.items()}
        return cls(**values, decisions=dict(decisions), probe=probe, speed=speed, train_time=train_time)

    def to_manifest(self) -> dict[str, Any]:
        """Flat values (the paths users' jq scripts read) plus every decision with its reason."""
        flat = {name: decision.value for name, decision in self.decisions.items()}
        flat["decisions"] = {name: dataclasses.asdict(d) for name, d in self.decisions.items()}
        flat["decision_order"] = list(self.decisions)  # as the CLI prints them (the manifest sorts keys)
        flat["batch_probe"] = [dataclasses.asdict(row) for row in self.probe]
        flat["batch_probe_note"] = self.probe_note
        return flat


@dataclass(frozen=True)
class Scraped:
    """The repositories' history as training sequences: scraped now, or the output directory's earlier
    scrape when nothing it depends on changed."""

    sequences_path: Path
    repositories: list[dict[str, Any]]
    """Each repository as the manifest records it (path, HEAD, branch, remote without credentials, ...)."""
    summary: dict[str, Any]
    """Counts by reason, redactions, the split, duration and provenance (the manifest's `scrape`)."""

    @property
    def where(self) -> str:
        """The repository path(s), for messages."""
        return (
            self.repositories[0]["path"]
            if len(self.repositories) == 1
            else f"{len(self.repositories)} repositories"
        )


@dataclass(frozen=True)
class Prepared:
    """The sequences tokenized (in the token cache) and what the planner needs to know about the model."""

    tokenizer: Any
    model_config: Any
    facts: ModelFacts
    cache: TokenCache
    stats: DataStats
    """Token-length histogram of the training split."""
    counts: dict[str, int]
    """Sequences and tokens per split (`train_sequences`, `eval_tokens`, ...)."""
    style: TextStyle
    """How records became tokens (evaluation prompts are rendered the same way)."""
    estimate: str | None = None
    """How the statistics were estimated: from a sample (`plan` on a history not tokenized yet), or the
    older sequences' from their characters (tokenized ahead of a time budget); None: every sequence was
    tokenized."""
    tokenized: int | None = None
    """How many training sequences, newest first, are in the cache when not all are (tokenized ahead of a
    time budget: the statistics of the others are estimates); None: all, or a sample."""
    files: DataStats = field(default_factory=lambda: DataStats({}))
    """Token lengths of the files at the split point, most recently changed first (none: none read)."""
    repository: str = ""
    """The scraped repository's name (the first one's, with several): what tools call the adapter."""


@dataclass(frozen=True)
class Machine:
    """What a plan is for: this machine as detected, or one a hardware profile describes, and the launch."""

    hardware: Hardware
    launch: Launch


@dataclass(frozen=True)
class Packed:
    """The training blocks and the held-out blocks of each format (scored apart: a commit message and a
    change are different tasks)."""

    train: PackedSplit
    held_out: dict[str, PackedSplit]
    method: str
    """How sequences were laid out in blocks, for people."""
    left_out: dict[str, Any] | None = None
    """What a time budget did not train on: sequences, tokens, reason."""
    validation: dict[str, PackedSplit] = field(default_factory=dict)
    """The validation commits' blocks by format: every choice is made on them, never on the held-out ones."""
    sample: bool = False
    """Blocks of a sample only (`plan`'s estimate): not the data's, so not recorded as its."""


@dataclass(frozen=True)
class Data:
    """What training needs from the history, prepared once (by rank 0 under torchrun); once fitted to the
    machine, with the plan measured there and the blocks it keeps."""

    scraped: Scraped
    prepared: Prepared
    machine: Machine
    plan: Plan
    packed: Packed


@dataclass(frozen=True)
class Loaded:
    """The base model with LoRA attached, as this process trains it."""

    model: Any
    base_dir: Path | None
    """Where a random base was saved beside the adapter (it cannot be downloaded again)."""
    trainable_parameters: int
    quantization: str
    weights_gb: float


@dataclass(frozen=True)
class PastCommit:
    """A kept commit as retrieval and evaluation see it (its text as scraped: secrets redacted)."""

    sha: str
    message: str
    diff: str
    split: str
    """`train`, `valid` or `eval` (see scrapers.scrape.SPLITS)."""
    repo: str = ""
    """The repository's name in a run over several (each sequence's `repo`)."""
    date: str = ""
    """Its date as the scrape wrote it (ISO 8601)."""


@dataclass(frozen=True)
class Past:
    """The repository's own past, indexed: every kept commit (newest first), and the suggestion system
    learned from the ones that are not held out (`pipeline.suggest.suggestion.Suggester`)."""

    commits: tuple[PastCommit, ...]
    suggester: Any
    facts: dict[str, Any]
    """Index size, build and selector times (the manifest's `retrieval`)."""
    whole_history: Any
    """The index over every commit, held-out ones included (a `pipeline.suggest.retrieval.Index`): what
    the run leaves for new diffs."""

    def split(self, name: str) -> list[PastCommit]:
        return [commit for commit in self.commits if commit.split == name]

    def older_than(self) -> dict[str, int]:
        """Each held-out commit's place in the index (which holds the other commits, in this order): the
        position of the newest indexed commit newer than it, -1 where none is. Retrieval answers it from
        the commits after that alone: in a run over several repositories each holds out its own newest,
        and one repository's held-out commits are older than another's newest indexed ones."""
        places, indexed = {}, 0
        for commit in self.commits:
            if commit.split == "eval":
                places[commit.sha] = indexed - 1
            else:
                indexed += 1
        return places


@dataclass(frozen=True)
class TaskPrompt:
    """One question of a task, asked of every system on a held-out (or validation) commit."""

    task: str
    """`message` (a commit message from its diff) or `code` (the next line of a change)."""
    commit: str
    text: str
    """What a model continues: the prompt rendered in the training style."""
    given: str
    """What the prompt gives, for people (the start of the diff, or the lines before the one asked)."""
    reference: str
    """What git has: the full message, or the line that was written."""
    diff: str = ""
    """The commit's diff (the `message` task: what retrieval looks up)."""


@dataclass(frozen=True)
class Scores:
    """One system's answers on the held-out commits: held-out loss (a model's, overall and per format),
    each task's metrics, and the answers themselves (by task, in the order of the prompts)."""

    loss: dict[str, Any] | None
    tasks: dict[str, Any] | None
    outputs: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    cached: bool = False
    """Read back from the evaluation cache (the base model's scores on the same held-out commits)."""
    scored_in_s: float | None = None
    """What scoring them took when they were cached (None: not cached, or cached without it)."""
    kept: bool = False
    """Written to the evaluation cache, where the next run on the same questions reads them."""


@dataclass(frozen=True)
class PastScores:
    """What the repository's past answers on the held-out commits: the lookup, the suggestion system, and
    which system that is (chosen on the validation commits)."""

    nearest_commit: Scores
    selector: Scores | None
    """The selector's choices, whichever system suggests (None without a selector)."""
    suggested: Scores
    system: dict[str, Any]


@dataclass(frozen=True)
class Evaluation:
    """Before and after training, on the same held-out commits, beside what the repository's own past
    offers (the lookup, and the suggestion system the run chose); the validation loss during training."""

    before: Scores
    after: Scores | None
    history: list[dict[str, Any]]
    prompts: tuple[TaskPrompt, ...] = ()
    nearest_commit: Scores | None = None
    selector: Scores | None = None
    suggested: Scores | None = None
    system: dict[str, Any] | None = None
    """Which system makes the run's suggestions, and the validation scores that chose it."""
    held_out_commits: dict[str, Any] | None = None
    """How many held-out commits were scored, and why fewer than asked when they were."""
    model_validation: Scores | None = None
    """The fine-tuned model's answers to the validation commits (when the plan has it answer them)."""
    held_out: dict[str, Any] = field(default_factory=dict)
    """The held-out blocks of each format the losses are measured on: the same before and after."""
    code_lookup: list[str] = field(default_factory=list)
    """The lookup for code's answers to the code cases (the line after the most similar lines elsewhere)."""
    block_lookup: list[str] = field(default_factory=list)
    """And to the block cases (the body that begins there)."""
    code_checks: tuple[TaskPrompt, ...] = ()
    """The next lines of the validation commits, asked as the held-out ones are: they choose who writes a
    next line (`code_system`), never the held-out ones."""
    code_checks_lookup: list[str] = field(default_factory=list)
    """The lookup for code's answers to `code_checks`' code questions."""
    base_cache: Path | None = None
    """Where the base model's answers are kept between runs (its held-out scores, its answers to
    `code_checks`); None where they cannot be reused."""
    code_system: dict[str, Any] | None = None
    """Who writes a next line at use (`pipeline.scores.CODE_SYSTEMS`), and the validation
    scores that chose it."""

    @property
    def chosen(self) -> str | None:
        """The system the run suggests with (None where the past was not scored)."""
        return self.system["name"] if self.system else None

    @property
    def code_chosen(self) -> str | None:
        """Who writes a next line at use (None where the past was not scored)."""
        return self.code_system["name"] if self.code_system else None


@dataclass(frozen=True)
class TrainOutcome:
    """What training did: its history, the plan it ran with (a smaller micro-batch after an out-of-memory),
    throughput and the hardware samples of every node."""

    history: dict[str, Any]
    """Loss and learning-rate history, epoch summaries, how it ended (the manifest's training report)."""
    evaluations: list[dict[str, Any]]
    """Held-out loss during training."""
    plan: Plan
    oom_retries: list[dict[str, Any]]
    throughput: dict[str, Any] | None
    hardware: dict[str, Any]
    resumed_from: str | None


@dataclass(frozen=True)
class Outputs:
    """The files a run leaves for use: the adapter (paths, sizes, sha256) and where everything went."""

    output_dir: Path
    adapter_dir: Path
    adapter_files: list[dict[str, Any]]
    base_model_dir: Path | None
    sequences_path: Path


@dataclass(frozen=True)
class Lineage:
    """An `update` run's parent and what changed since it: the manifest's `lineage`."""

    parent_manifest: Path
    parent_sha256: str
    old_head: str
    new_head: str
    commits_added: list[str]
    """Reachable from new_head and not from old_head, newest first."""
    forgetting: dict[str, Any] | None = None
    """The parent's held-out loss before and after this run trained."""

    def to_manifest(self) -> dict[str, Any]:
        return {
            "parent_manifest": str(self.parent_manifest.resolve()),
            "parent_sha256": self.parent_sha256,
            "parent_output_dir": str(self.parent_manifest.parent.resolve()),
            "old_head": self.old_head,
            "new_head": self.new_head,
            "commits_added": self.commits_added,
            "forgetting": self.forgetting,
        }
