"""What a run learns from and how it is bounded: text style, answers-only loss, time budget, CPU
precision, evaluation cadence and the task metrics (pure functions, exact values)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pipeline.config import budget_seconds, load_config
from pipeline.data.examples import TextStyle, encode_batch
from pipeline.errors import ConfigError
from pipeline.evaluate.evaluation import score_outputs
from pipeline.plan.planner import (
    VALIDATION_SHARE,
    Footprint,
    deadline_s,
    evaluation_interval,
    make_plan,
    time_left,
)
from pipeline.train.loss import answer_logits, per_answer_loss, sequence_ids
from pipeline.train.probe import resumed_train_time
from pipeline.types import DataStats, ModelFacts, Scores, Speed, TaskPrompt
from scrapers.formats import prompt_and_response
from tests.test_planner import TINY, cpu_machine

SMOLLM2 = ModelFacts(
    "smollm2-135m",
    False,
    8192,
    chat_template=True,
    parameters=134_515_008,
    hidden_size=576,
    num_layers=30,
    vocab_size=49152,
)
DIFF = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"


def test_prompt_and_response_cut_where_the_answer_begins():
    assert prompt_and_response("diff", f"Fix a\n\nBecause.\n\n{DIFF}") == ("Fix a\n\nBecause.\n\n", DIFF)
    assert prompt_and_response("message", f"{DIFF}\nCommit message:\nFix a\n") == (
        f"{DIFF}\nCommit message:\n",
        "Fix a\n",
    )
    assert prompt_and_response("diff", "no change here") == ("", "no change here")


class CharTokenizer:
    """One token per character: enough to check which tokens carry a loss."""

    eos_token_id = 0

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[ord(c) for c in text] for text in texts]}


def test_raw_text_learns_every_token_or_only_the_answer():
    texts = ["Fix a\n\n" + DIFF]
    ids, masks = encode_batch(CharTokenizer(), TextStyle("raw", "all"), ["diff"], texts, 1024, 256)
    assert len(ids[0]) == len(texts[0]) + 1 and set(masks[0]) == {1}
    ids, masks = encode_batch(CharTokenizer(), TextStyle("raw", "response"), ["diff"], texts, 1024, 256)
    learned = "".join(chr(t) for t, m in zip(ids[0], masks[0], strict=True) if m and t)
    assert learned == DIFF and masks[0][-1] == 1  # the change and the end-of-sequence


def test_a_long_prompt_is_cut_the_same_from_its_head_as_from_the_whole():
    """`render_prompt` tokenizes only the head of a long diff; the prompt is the one cutting the whole
    diff's tokens gives (the cut as it was first written, below), whatever the text: code, non-ASCII,
    a run of one character that the pre-tokenizer keeps in one piece, a diff shorter than the room."""
    from pipeline.base_models import pretrained_tokenizer
    from pipeline.data.examples import MIN_PROMPT_TOKENS, _head, _render, render_prompt

    tokenizer = pretrained_tokenizer("smollm2-135m")
    style = TextStyle("chat", "response")

    def whole_cut(content: str, room: int) -> str:
        content, room = content.strip(), max(MIN_PROMPT_TOKENS, room)  # a chat turn holds it stripped
        text = _render(tokenizer, style, "message", content)
        excess = len(tokenizer(text, add_special_tokens=False)["input_ids"]) - room
        if excess <= 0:
            return text
        ids = tokenizer(content, add_special_tokens=False)["input_ids"]
        return _render(tokenizer, style, "message", tokenizer.decode(ids[: len(ids) - excess]))

    hunk = '@@ -1,3 +1,3 @@\n-    naïve = "日本語のテキスト 🚀"\n+    name_with_underscores = compute(x, y)  # 说明\n     pass\n'
    contents = [
        DIFF,  # shorter than any room: left as it is
        "diff --git a/app.py b/app.py\n" + hunk * 400,
        "diff --git a/README.md b/README.md\n+" + "=" * 3000 + "\n" + hunk * 50,
        # One piece longer than any head: the whole is read.
        "diff --git a/data.txt b/data.txt\n+" + "x" * 20000,
        "diff --git a/a.py b/a.py\n" + "+\t\t  \n" * 2000 + hunk,
    ]

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    for content in contents:
        for room in (10, 64, 100, 256):
            assert render_prompt(tokenizer, style, "message", content, room) == whole_cut(content, room)
            # The head's tokens are the whole's first ones: it ends where a piece starts, never inside a word.
            head, counted = _head(tokenizer, content, room)
            assert head == content or (len(ids(head)) >= room and ids(content)[: len(ids(head))] == ids(head))
            assert counted is None or counted == ids(head)


def test_the_budget_less_what_the_run_spent_and_what_comes_after_is_trained_and_is_where_it_stops():
    loaded, data, speed = load_config(None), newest_first(1000, 512), Speed(200.0, "a test")
    # 64 s spent before training, the base model scored in 33 s: 600 − 64 − (33 + 10) = 493 s to the
    # deadline, of which training fills 8/9 (438.2 s × 200 tokens/s = 87,644 tokens: 171 blocks) and stops at 493.
    left = time_left(600.0, 64.0, Scores(None, None, seconds=33.0))
    assert left.seconds == pytest.approx(493.0)
    assert "64 s spent before training" in left.why and "33 s scoring the fine-tuned model" in left.why
    plan = make_plan(data, cpu_machine(), SMOLLM2, loaded, speed=speed, valid_tokens=4096, train_time=left)
    assert plan.train_seconds == 438.2 and deadline_s(plan.train_seconds) == pytest.approx(493.0, abs=0.2)
    assert plan.train_sequences == 171 and "438 s × 200 tokens/s" in plan.decisions["train_sequences"].reason
    assert "89% of the 493 s the 600 s budget leaves" in plan.decisions["train_seconds"].reason
    # Before the run knows what it spends, 80% of the budget, stopping at 90%, as before.
    share = make_plan(data, cpu_machine(), SMOLLM2, loaded, speed=speed, valid_tokens=4096)
    assert (share.train_seconds, deadline_s(share.train_seconds), share.train_sequences) == (
        480.0,
        540.0,
        187,
    )


def test_what_scoring_the_fine_tuned_model_takes_is_what_the_base_model_took_now_or_when_cached():
    cached = Scores(None, None, seconds=0.0, cached=True, scored_in_s=50.0)
    assert time_left(600.0, 30.0, cached).seconds == 600 - 30 - 60
    unrecorded = Scores(None, None, seconds=0.0, cached=True)  # cached before the time was kept
    assert time_left(600.0, 30.0, unrecorded).seconds == 600 - 30 - (60 + 10)
    assert "the base model's cached scores do not say" in time_left(600.0, 30.0, unrecorded).why


def test_a_first_runs_base_model_scoring_kept_for_the_next_run_is_left_out_of_its_budget():
    # 250 s spent before training, 200 of them scoring the base model, whose answers the next run on the
    # repository reads back: training gets what the second run will, 600 − 50 − (200 + 10).
    kept = time_left(600.0, 250.0, Scores(None, None, seconds=200.0, kept=True))
    assert kept.seconds == 600 - 50 - (200 + 10)
    assert "after 50 s spent before training" in kept.why
    assert (
        "not the 200 s scoring the base model took, once for this repository: its answers are cached"
        in kept.why
    )
    # Not kept (a random base, an update): charged, as it will be asked again.
    assert time_left(600.0, 250.0, Scores(None, None, seconds=200.0)).seconds == 600 - 250 - (200 + 10)


def test_where_the_model_answers_the_validation_commits_too_the_budget_keeps_time_for_it():
    # Set on a CPU with a budget (eval.validate_model=true), the answers come after training and take
    # longer than scoring the fine-tuned model (four systems answer each next line, not two): a plan that
    # kept no time for them could outlast its budget.
    scored = Scores(None, None, seconds=28.0)
    validates = time_left(600.0, 30.0, scored, validates=True)
    assert validates.seconds == pytest.approx(600 - 30 - (28 + 28 * VALIDATION_SHARE + 10))
    assert f"{28 * VALIDATION_SHARE:.0f} s its answers to the validation commits" in validates.why
    assert time_left(600.0, 30.0, scored).seconds == 600 - 30 - (28 + 10)


def test_a_run_that_spent_its_budget_before_training_still_trains_a_tenth_of_it():
    spent = time_left(600.0, 590.0, Scores(None, None, seconds=40.0))
    plan = make_plan(
        newest_first(1000, 512),
        cpu_machine(),
        SMOLLM2,
        load_config(None),
        speed=Speed(200.0, "t"),
        train_time=spent,
    )
    assert deadline_s(plan.train_seconds) == pytest.approx(60.0, abs=0.2)
    assert (
        "the past's backtest and saving): nothing, so 89% of 60 s, the least it trains (the run outlasts its budget)"
        in (plan.decisions["train_seconds"].reason)
    )


def test_a_resumed_run_plans_the_training_time_its_first_run_planned():
    loaded, data, speed = load_config(None), newest_first(1000, 512), Speed(200.0, "a test")
    first = make_plan(
        data,
        cpu_machine(),
        SMOLLM2,
        loaded,
        speed=speed,
        train_time=time_left(600.0, 77.7, Scores(None, None, seconds=31.3)),
    )
    manifest = {"training_parameters": first.to_manifest()}
    again = make_plan(
        data, cpu_machine(), SMOLLM2, loaded, speed=speed, train_time=resumed_train_time(manifest)
    )
    assert (again.train_seconds, again.train_sequences, again.total_steps) == (
        first.train_seconds,
        first.train_sequences,
        first.total_steps,
    )
    assert (
        resumed_train_time({"training_parameters": {"train_seconds": None}}) is None
    )  # an earlier version's run


def test_text_style_follows_the_chat_template_and_says_why():
    loaded = load_config(None)
    chat = make_plan(DataStats({100: 10}), cpu_machine(), SMOLLM2, loaded)
    assert (chat.style, chat.loss_on, chat.loss_average) == ("chat", "response", "answer")
    raw = make_plan(DataStats({100: 10}), cpu_machine(), TINY, loaded)
    assert (raw.style, raw.loss_on, raw.loss_average) == ("raw", "all", "token")
    assert "chat template" in chat.decisions["style"].reason
    forced = load_config(None, ["train.style=chat"])
    with pytest.raises(
        ConfigError, match=r"`train\.style` is chat but tiny's tokenizer has no chat template"
    ):
        make_plan(DataStats({100: 10}), cpu_machine(), TINY, forced)


def test_cpu_precision_is_bf16_only_with_native_instructions():
    loaded, data = load_config(None), DataStats({100: 10})
    fast = make_plan(data, dataclasses.replace(cpu_machine(), cpu_bf16="avx512_bf16"), SMOLLM2, loaded)
    assert fast.precision == "bf16" and "avx512_bf16" in fast.decisions["precision"].reason
    plain = make_plan(data, cpu_machine(), SMOLLM2, loaded)
    assert plain.precision == "fp32" and "no avx512_bf16 or AMX" in plain.decisions["precision"].reason


def newest_first(count: int, tokens: int) -> DataStats:
    return DataStats.from_lengths([tokens] * count)


def test_a_budget_trains_the_newest_sequences_that_fit_and_says_what_is_left_out():
    loaded = load_config(None)
    data = newest_first(1000, 512)  # blocks of 512 tokens, one sequence each
    plan = make_plan(data, cpu_machine(), SMOLLM2, loaded, speed=Speed(200.0, "a test"), valid_tokens=4096)
    # 600 s × 80% × 200 tokens/s = 96,000 tokens: 187 blocks of 512.
    assert plan.time_budget_s == 600.0 and plan.measured_tokens_per_s == 200.0
    assert (plan.train_sequences, plan.train_blocks, plan.epochs) == (187, 187, 1)
    assert "the 813 older ones (416256 tokens) are left out" in plan.decisions["train_sequences"].reason
    # At least 96 optimizer steps: an effective batch of 1 block (187 // 96), 187 steps.
    assert (plan.effective_batch_size, plan.total_steps) == (1, 187)
    assert plan.learning_rate == 5e-4 and "short run" in plan.decisions["learning_rate"].reason


def test_the_newest_sequences_alone_are_trained_when_asked_and_a_budget_cuts_further():
    data = newest_first(1000, 512)
    asked = {"train.newest_sequences": 300, "train.time_budget": "none"}
    plan = make_plan(data, cpu_machine(), SMOLLM2, load_config(None, flags=asked))
    assert (plan.train_sequences, plan.train_blocks) == (300, 300)
    decided = plan.decisions["train_sequences"]
    assert decided.source != "planned"
    assert "keeps the newest 300 of 1000 (the 700 older ones are left out" in decided.reason
    # A time budget that fits fewer still (187, as above) keeps the newest of those, and says both.
    flags = {"train.newest_sequences": 300}
    both = make_plan(
        data, cpu_machine(), SMOLLM2, load_config(None, flags=flags), speed=Speed(200.0, "a test")
    )
    assert both.train_sequences == 187 and "newest 300 of 1000" in both.decisions["train_sequences"].reason
    assert "the newest 187 of 300 sequences" in both.decisions["train_sequences"].reason
    more = {"train.newest_sequences": 5000, "train.time_budget": "none"}  # more than there are: all
    every = make_plan(data, cpu_machine(), SMOLLM2, load_config(None, flags=more))
    assert every.train_sequences == 1000 and every.decisions["train_sequences"].source == "planned"


def test_a_budget_that_fits_everything_changes_nothing():
    loaded = load_config(None)
    data = newest_first(40, 512)
    unbounded = make_plan(data, cpu_machine(), SMOLLM2, loaded)
    fitted = make_plan(data, cpu_machine(), SMOLLM2, loaded, speed=Speed(10_000.0, "a test"))
    for name in ("train_blocks", "epochs", "batch_size", "gradient_accumulation_steps", "total_steps"):
        assert getattr(fitted, name) == getattr(unbounded, name), name
    assert fitted.train_sequences == 40


@pytest.mark.parametrize("cheap", [True, False])
def test_the_training_speed_is_timed_at_the_micro_batch_it_is_given(cheap, monkeypatch):
    """A GPU's speed grows with the micro-batch (an H100: 2,777 tokens/s one block at a time, 9,379 in
    training at micro-batch 5), so on CUDA the speed is timed at the planned micro-batch. Where a pass is
    cheap (a GPU's), each timed micro-batch is warmed first: a shape's first pass loads its kernels (an
    H200 timed 0.61 s passes after one warm-up where training's steps took 0.19 s); where it costs
    seconds (a CPU's), one warm-up pass."""
    from types import SimpleNamespace

    from pipeline.train import probe
    from pipeline.train.probe import training_speed

    if not cheap:
        monkeypatch.setattr(probe, "WARM_EVERY_BELOW_S", 0.0)

    class Blocks:
        def __len__(self):
            return 10

        def __getitem__(self, indices):
            ids = torch.tensor([[index] * 8 for index in indices])
            return {"input_ids": ids, "position_ids": torch.arange(8).repeat(len(indices), 1), "labels": ids}

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(1))
            self.batches = []

        def forward(self, input_ids, position_ids, labels):
            self.batches.append(input_ids[:, 0].tolist())
            return SimpleNamespace(loss=(self.weight * input_ids.float()).mean())

    model = Model()
    speed = training_speed(model, Blocks(), "fp32", False, False, threads=1, batch=4)
    spread = [[0, 1, 2, 3], [4, 5, 6, 7], [9, 0, 1, 2]]
    assert model.batches == (spread if cheap else spread[:1]) + spread  # the warm-up, then the 3 timed
    assert "3 micro-batches of 4 training block(s)" in speed.how and "(96 tokens," in speed.how
    assert ("warm-up pass on each" in speed.how) == cheap


def test_no_budget_on_a_gpu_and_none_when_asked():
    from tests.test_planner import gpu_machine

    loaded = load_config(None)
    assert make_plan(newest_first(10, 100), gpu_machine(24), SMOLLM2, loaded).time_budget_s is None
    off = load_config(None, flags={"train.time_budget": "none"})
    assert make_plan(newest_first(10, 100), cpu_machine(), SMOLLM2, off).time_budget_s is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10m", 600),
        ("90s", 90),
        ("1h30m", 5400),
        ("2.5m", 150),
        ("450", 450),
        ("45s", 45),
        ("none", None),
        ("10 min", 600),
        ("1 hour 30 minutes", 5400),
        ("2 hrs", 7200),
        ("90 sec", 90),
        ("20minutes", 1200),
    ],
)
def test_budgets_are_durations(text, seconds):
    assert budget_seconds(text) == seconds


def test_a_bad_budget_is_one_line_naming_the_key():
    with pytest.raises(
        ConfigError,
        match=r"`train.time_budget` \(from the command line\) must be a duration such as 10m, 90s, 1h30m",
    ):
        load_config(None, ["train.time_budget=soon"])
    with pytest.raises(ConfigError, match=r"must be a duration .* got '10 mins later'"):
        load_config(None, flags={"train.time_budget": "10 mins later"})
    # `--budget 10` meant ten minutes, not the 10 seconds a bare number is.
    with pytest.raises(
        ConfigError, match=r"must say its unit: a bare 10 is 10 seconds, too short to train in; write 10m"
    ):
        load_config(None, flags={"train.time_budget": "10"})


def test_evaluations_and_checkpoints_are_spaced_by_their_cost():
    data, speed = newest_first(400, 512), Speed(50.0, "a slow machine")
    cheap, costly = (
        make_plan(
            data,
            cpu_machine(),
            SMOLLM2,
            load_config(None, ["train.time_budget=1h", f"eval.max_blocks={blocks}"]),
            speed=speed,
            valid_tokens=20_000,
        )
        for blocks in (8, 16)
    )
    # 2,880 s of training at 50 tokens/s: 281 blocks of 512, effective batch 2, 141 steps of about 20 s. The
    # validation loss on 8 blocks per format costs about 68 s: at most one evaluation per 67 steps, and not
    # in the last half-interval (at 67, the second would come 7 steps before the end): every 71.
    assert (cheap.train_blocks, cheap.total_steps, cheap.eval_steps) == (281, 141, 71)
    assert "costs at most 1/20 of the time between two" in cheap.decisions["eval_steps"].reason
    assert cheap.save_steps == 15  # about 10 checkpoints; each step is longer than a minute's share
    # Twice the blocks: about 137 s, so one evaluation per 134 steps at most; the only one would land 7 steps
    # before the end, where the evaluation after training follows soon. None in between.
    assert costly.eval_steps is None
    assert "not 20× its cost in between, so the last step is kept" in costly.decisions["eval_steps"].reason
    assert costly.early_stopping_patience is None and cheap.early_stopping_patience == 3


@pytest.mark.parametrize(
    ("total", "least", "every"), [(150, 15, 17), (100, 50, 51), (100, 40, 40), (10, 6, 6), (10, 7, None)]
)
def test_no_evaluation_lands_just_before_the_one_after_training(total, least, every):
    assert evaluation_interval(total, least) == every


def test_each_answer_counts_once():
    torch.manual_seed(0)
    logits = torch.randn(1, 8, 5)
    labels = torch.tensor([[-100, -100, 1, 2, -100, -100, 3, -100]])
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])
    token_losses = torch.nn.functional.cross_entropy(
        logits[0, :-1], labels[0, 1:], ignore_index=-100, reduction="none"
    )
    first, second = token_losses[1:3].mean(), token_losses[5]
    learned = labels[:, 1:].ne(-100)
    selected = logits[:, :-1][learned], labels[:, 1:][learned], sequence_ids(positions)[learned]
    assert per_answer_loss(*selected).item() == pytest.approx(((first + second) / 2).item())


def test_logits_are_computed_only_where_a_label_is_learned_and_match_the_full_forward():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules="all-linear"))
    inputs = {
        "input_ids": torch.randint(0, 64, (2, 12)),
        "position_ids": torch.tensor([list(range(6)) * 2, list(range(12))]),
        "labels": torch.full((2, 12), -100),
    }
    inputs["labels"][0, 3:6] = inputs["input_ids"][0, 3:6]
    inputs["labels"][1, 8:] = inputs["input_ids"][1, 8:]
    logits, targets, sequences = answer_logits(model, inputs)
    full = model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"]).logits
    learned = inputs["labels"][:, 1:].ne(-100)
    assert torch.allclose(logits, full[:, :-1][learned], atol=1e-5)
    assert targets.tolist() == inputs["labels"][:, 1:][learned].tolist()
    assert sequences.tolist() == [0, 0, 0, 2, 2, 2, 2]


def test_task_scores_use_chrf_edit_similarity_and_flag_blank_outputs():
    prompts = [
        TaskPrompt("message", "a", "", "", "Fix the parser\n\nLonger body."),
        TaskPrompt("message", "b", "", "", "Add tests"),
        TaskPrompt("code", "a", "", "", "    return parse(text)"),
    ]
    outputs = {"message": ["Fix the parser\n\nLonger body.", "  \n"], "code": ["return parse(text)  "]}
    scores = score_outputs(prompts, outputs)
    message = scores["message"]
    assert message["samples"] == 2 and message["whitespace_only"] == 1
    assert (message["subject_exact_match_pct"], message["first_word_match_pct"]) == (50.0, 50.0)
    assert message["edit_similarity"] == 50.0  # one identical (100), one blank (0)
    assert 0 < message["chrf"] < 100
    assert scores["code"]["exact_match_pct"] == 100.0  # spaces at the line's ends do not count


def test_a_cpu_trains_answers_with_segments_attention_no_dropout_and_512_token_sequences():
    from tests.test_planner import gpu_machine

    model = dataclasses.replace(SMOLLM2, supports_attention_backend=True)
    data = DataStats.from_lengths([2000] * 10 + [300] * 90)  # p95 past 1024: 1024-token blocks
    cpu = make_plan(data, cpu_machine(), model, load_config(None))
    assert (cpu.attention, cpu.lora_dropout, cpu.sequence_length, cpu.truncate_at) == (
        "segments",
        0.0,
        1024,
        512,
    )
    assert cpu.decisions["truncate_at"].reason.startswith(
        "10 of 100 sequences are longer than 512 tokens on a CPU"
    )
    # Ten 2000-token sequences cut at 512 pack two to a 1024-token block, ninety of 300 tokens three: 5 + 30.
    assert cpu.train_blocks == 35
    gpu = make_plan(data, gpu_machine(24), model, load_config(None))
    assert (gpu.attention, gpu.lora_dropout, gpu.truncate_at) == ("sdpa", 0.05, 1024)
    raw = make_plan(data, cpu_machine(), TINY, load_config(None))
    assert raw.truncate_at is None and "split into block-sized pieces" in raw.decisions["truncate_at"].reason
    chosen = make_plan(data, cpu_machine(), model, load_config(None, ["lora.dropout=0.1"]))
    assert (chosen.lora_dropout, chosen.decisions["lora_dropout"].source) == (0.1, "cli")


def test_quantization_follows_memory_and_refuses_what_cannot_be_quantized():
    from tests.test_planner import QWEN_7B, gpu_machine

    data = DataStats.from_lengths([1024] * 100)
    big_gpu = make_plan(data, gpu_machine(80), QWEN_7B, load_config(None))
    assert (
        big_gpu.quantization == "none"
        and "within GPU 80 GB's 80 GB" in big_gpu.decisions["quantization"].reason
    )
    small_gpu = make_plan(data, gpu_machine(12), QWEN_7B, load_config(None))
    assert small_gpu.quantization == "4bit"
    dense, nf4 = (Footprint(QWEN_7B, "bf16", q, 16, 1024) for q in ("none", "4bit"))
    assert round(dense.weights_gb, 1) == 14.2 and round(nf4.weights_gb, 1) == 5.2
    with pytest.raises(
        ConfigError, match=r"`plan.quantization` 4bit loads a pretrained base in fewer bits; tiny"
    ):
        make_plan(data, cpu_machine(), TINY, load_config(None, ["plan.quantization=4bit"]))
    apple = dataclasses.replace(cpu_machine(), mps=True)
    with pytest.raises(ConfigError, match=r"bitsandbytes has no mps kernels"):
        make_plan(data, apple, QWEN_7B, load_config(None, ["plan.quantization=4bit"]))
