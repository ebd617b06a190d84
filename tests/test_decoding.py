"""The evaluation's batched greedy decoding answers what `model.generate` answers, one prompt at a time."""

from __future__ import annotations

import pytest
import torch

from pipeline.data.examples import render_prompt
from pipeline.suggest import decoding
from pipeline.suggest.decoding import (
    SHARED_PREFIX_MIN,
    _batches,
    _Ends,
    _parts,
    _shared_prefix,
    finished,
    generate_batched,
    tokens_read,
    unlooped,
)
from pipeline.types import TextStyle
from tests.conftest import PRETRAINED, made_tensors

NEW_TOKENS = 8


def chat(tokenizer, diff: str) -> str:
    """The commit-message question as the evaluation asks it."""
    return render_prompt(tokenizer, TextStyle("chat", "response"), "message", diff)


DIFFS = [
    "diff --git a/app.py b/app.py\n--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,2 @@\n-x = 1\n+x = 2\n",
    "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n@@ -3 +3 @@\n-Install with pip.\n"
    "+Install with pip, then run the tests with pytest and read the docs in docs/index.md.\n",
    "diff --git a/src/cli.py b/src/cli.py\n--- a/src/cli.py\n+++ b/src/cli.py\n@@ -10,6 +10,9 @@ def main():\n"
    "     args = parse()\n+    if args.verbose:\n+        logging.basicConfig(level=logging.DEBUG)\n+\n     run(args)\n",
]
CODE = [
    "def add(a, b):\n    return",
    "import os\nimport sys\n\nfor name in os.listdir('.'):\n    print(",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y =",
]


class Told(list):
    """What `generate_batched` told its progress: (prompts read, their tokens), each time."""

    def __call__(self, read: int, tokens: int) -> None:
        self.append((read, tokens))


def one_at_a_time(model, tokenizer, prompt: str, stop_at_newline: bool, cut_loops: bool = False) -> str:
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )  # fmt: skip
    return finished(
        tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True), stop_at_newline, cut_loops
    )


def test_an_answer_that_starts_over_is_cut_where_it_repeats_a_line():
    assert unlooped("Update changelog\n\nUpdate changelog\n\nUpdate chan") == "Update changelog"
    assert unlooped("Fix the parser\n\n* handle tabs\n* handle tabs\n") == "Fix the parser\n\n* handle tabs"
    assert unlooped("Add a flag\n\nIt is off by default.") == "Add a flag\n\nIt is off by default."
    assert unlooped("Update\n\n\nUpdate") == "Update"  # blank lines are not lines that repeat
    assert unlooped("") == ""


def test_an_answer_that_says_one_phrase_over_and_over_in_a_line_is_cut_after_the_first():
    assert unlooped("fix: fix: fix: fix: fix:") == "fix:"
    assert unlooped("Update the test's own test's own test's own test's ow") == "Update the test's own"
    assert (
        unlooped("Add a test\n\nIt covers a a case") == "Add a test\n\nIt covers a a case"
    )  # twice is no loop
    assert unlooped("* * * *") == "* * * *"  # a phrase without a letter or digit is not one
    # The first line that loops or repeats decides: what follows never moves the cut.
    assert unlooped("Add x\nsay it say it say it\nAdd x") == "Add x\nsay it"


def test_a_message_ends_at_the_line_break_that_completes_a_repeated_line(pretrained):
    """The decoder stops a row there, saving the steps a loop would take to the token limit; a line that
    has not ended yet ("Update chan…") may still become another, and a line break ends code at once."""
    _, tokenizer = pretrained
    ends, code = _Ends(tokenizer, False, cut_loops=True), _Ends(tokenizer, True)
    free = _Ends(tokenizer, False)  # `generate` continuing code or writing a diff: lines repeat there
    answer: list[int] = []
    said = []
    looping = tokenizer("Update changelog\n\nUpdate changelog\n\nUpdate", add_special_tokens=False)[
        "input_ids"
    ]
    for token in looping:
        answer.append(token)
        said.append((tokenizer.decode(answer), ends.last(token, answer), code.last(token, answer)))
        assert not free.last(token, answer)
    first = next(text for text, last, _ in said if last)  # where the decoder takes the row out
    assert first.startswith("Update changelog\n\nUpdate changelog\n") and first.count("Update") == 2
    assert unlooped(first) == "Update changelog"
    code_ends = [text for text, _, last in said if last]
    assert code_ends[0].startswith("Update changelog\n") and code_ends[0].count("Update") == 1


@pytest.fixture(scope="module")
def pretrained():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import pipeline.train.attention  # noqa: F401  (registers `segments`)
    from pipeline.base_models import load_pretrained

    model = load_pretrained(AutoModelForCausalLM, PRETRAINED).eval()
    return model, load_pretrained(AutoTokenizer, PRETRAINED)


@pytest.fixture(scope="module")
def generated(pretrained) -> dict[bool, list[str]]:
    """`model.generate`'s answers, one prompt at a time with torch's own attention, to the commit-message
    questions (False) and the code (True), keyed by whether an answer stops at a line break."""
    model, tokenizer = pretrained
    model.set_attn_implementation("sdpa")
    messages = [chat(tokenizer, diff) for diff in DIFFS]
    return {
        stop_at_newline: [
            one_at_a_time(model, tokenizer, prompt, stop_at_newline, not stop_at_newline)
            for prompt in prompts
        ]
        for prompts, stop_at_newline in ((messages, False), (CODE, True))
    }


@pytest.mark.parametrize("attention", ["sdpa", "segments"])
def test_batched_answers_are_those_generate_gives_one_prompt_at_a_time(
    pretrained, generated, attention, monkeypatch
):
    """Prompts of different lengths in one batch (left padding), their common beginning computed once,
    prefilled a few rows a forward into a cache with room for the answers, rows leaving the batch as
    they end (end-of-sequence; a line break for code) or later: the same tokens as `model.generate` on
    each prompt alone, with either attention."""
    model, tokenizer = pretrained
    model.set_attn_implementation(attention)
    monkeypatch.setattr(decoding, "CPU_PREFILL_TOKENS", 120)  # forwards of different widths, joined
    messages = [chat(tokenizer, diff) for diff in DIFFS]
    encoded = tokenizer(messages, add_special_tokens=False)["input_ids"]
    assert _shared_prefix(encoded) >= SHARED_PREFIX_MIN  # the chat template's beginning, computed once
    assert _shared_prefix(tokenizer(CODE, add_special_tokens=False)["input_ids"]) == 0

    one_batch = decoding.CPU_BATCH_TOKENS
    for prompts, stop_at_newline in ((messages, False), (CODE, True)):
        cut_loops = not stop_at_newline  # messages, as the evaluation asks them
        expected = generated[stop_at_newline]
        # One batch whose rows that ended are taken out at once; several, whose rows are kept in their
        # batch until every row has ended.
        for batch_tokens, left_share in ((one_batch, 0.0), (2 * (NEW_TOKENS + 20), 1.0)):
            monkeypatch.setattr(decoding, "CPU_BATCH_TOKENS", batch_tokens)
            monkeypatch.setattr(decoding, "LEFT_SHARE", left_share)
            told = Told()
            answers = generate_batched(
                model, tokenizer, prompts, NEW_TOKENS, "fp32", stop_at_newline, told, cut_loops
            )
            assert answers == expected
            assert sum(read for read, _ in told) == len(prompts)  # each forward's prompts, told as read
            # with their tokens (the common beginning's once): what `tokens_read` counts ahead
            assert sum(tokens for _, tokens in told) == tokens_read(tokenizer, prompts, heals=False)
            assert (0, 0) in told  # and each step that writes the answers: still at work
    # Rows left their batch early: an answer ended before the last token, and one at a line break.
    ended = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in expected]
    assert min(len(tokens) for tokens in ended) < NEW_TOKENS - 2


def test_a_single_prompt_is_answered_without_a_shared_beginning(pretrained):
    """`generate` asks one prompt: nothing is shared, the answer is generate's, and whoever follows the
    progress is told of it."""
    model, tokenizer = pretrained
    prompt = chat(tokenizer, DIFFS[2])
    assert _shared_prefix([tokenizer(prompt)["input_ids"]]) == 0
    told = Told()
    assert generate_batched(model, tokenizer, [prompt], NEW_TOKENS, "fp32", progress=told) == [
        one_at_a_time(model, tokenizer, prompt, False)
    ]
    # The progress line hears of every prompt read, then of each step that writes its answer.
    read = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert told[0] == (1, read) and len(told) > 1 and set(told[1:]) == {(0, 0)}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_prefill_never_copies_the_output_layer_once_per_row(pretrained, precision):
    """Each row's first answer token comes from its last position's hidden state through the output
    layer as one matrix product: handed a strided [rows, 1, hidden] slice, torch's matmul broadcast the
    49,152 × 576 weight to every row (0.4 s a forward of 8 rows in bf16)."""
    model, tokenizer = pretrained
    output_layer = model.get_output_embeddings().weight.numel()
    prompts = CODE[:2]  # two rows show a copy per row; short ones, since a copy does not depend on length
    with torch.no_grad():  # the first token alone: the prefill is what is looked at
        expected = generate_batched(model, tokenizer, prompts, 1, precision)
    for parameter in model.parameters():
        parameter.requires_grad_(False)  # a LoRA model's base; a weight that requires grad is folded
    try:
        with made_tensors() as made:
            answers = generate_batched(model, tokenizer, prompts, 1, precision)
    finally:
        for parameter in model.parameters():
            parameter.requires_grad_(True)
    assert made.most <= output_layer and answers == expected


def test_a_joined_cache_keeps_keys_and_values_in_the_dtypes_a_forward_gave_them(pretrained):
    """Under bf16 autocast the keys leave the rotary embedding in float32 and the values stay in bfloat16:
    the cache joined from a batch's forwards keeps each so, as the cache of one forward does (it made the
    values float32, a third more memory a token)."""
    from pipeline.train.model import scoring

    model, tokenizer = pretrained
    rows = sorted((tokenizer(p, add_special_tokens=False)["input_ids"] for p in CODE), key=len)
    pad = tokenizer.pad_token_id
    with scoring(model, "bf16"):
        joined, _ = decoding._prefilled(
            model, rows, 0, None, pad, _parts([len(r) for r in rows], 20), 4, None
        )
        whole, _ = decoding._prefilled(model, rows, 0, None, pad, None, 4, None)
    assert (joined.layers[0].keys.dtype, joined.layers[0].values.dtype) == (torch.float32, torch.bfloat16)
    assert [(layer.keys.dtype, layer.values.dtype) for layer in joined.layers] == [
        (layer.keys.dtype, layer.values.dtype) for layer in whole.layers
    ]


def test_batches_take_prompts_shortest_first_within_their_cache_tokens():
    lengths = [90, 400, 100, 120, 95, 140, 130, 85]
    batches = _batches(lengths, 10, 300)
    assert [[lengths[i] for i in batch] for batch in batches] == [
        [85, 90],
        [95, 100],
        [120, 130],
        [140],
        [400],
    ]
    assert [[lengths[i] for i in batch] for batch in _batches(lengths, 10, 10**6)] == [sorted(lengths)]
    assert _batches([], 10, 300) == []


def test_a_batch_is_prefilled_in_forwards_of_at_most_the_tokens_given():
    """Rows × the forward's longest row at most the tokens given, one row at least (a long prompt)."""
    assert _parts([10, 20, 30, 50, 200, 300], 1024) == [range(0, 5), range(5, 6)]
    assert _parts([2000, 3000], 1024) == [range(0, 1), range(1, 2)]
    assert _parts([5], 1024) == [range(0, 1)]


def test_a_cpus_batches_are_fixed_and_a_gpus_are_what_its_free_memory_holds_in_cache(pretrained, monkeypatch):
    """A CPU's prefill and batch sizes are the module's numbers; on a CUDA GPU a batch holds
    GPU_CACHE_SHARE of the free memory (torch's own unused reserve counted) in this model's KV cache,
    measured in the dtype it answers in, and a cache that cannot be joined is one forward's."""
    from pipeline.train.model import scoring

    model, _ = pretrained
    config = model.config
    per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim
    cpu = torch.device("cpu")
    with scoring(model, "fp32"):
        assert decoding.cache_bytes_per_token(model, cpu) == 4 * per_token
    with scoring(model, "bf16"):  # under autocast the keys and values need not share a dtype
        assert 2 * per_token <= decoding.cache_bytes_per_token(model, cpu) < 4 * per_token
    assert decoding._sizes(model, cpu, True, 3) == (decoding.CPU_PREFILL_TOKENS, decoding.CPU_BATCH_TOKENS)

    gib = 2**30  # what NVML would say of a 6 GB RTX 2060 after training: 3 GiB free, 1 GiB held by torch
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (3 * gib, 6 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 2 * gib)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 1 * gib)
    monkeypatch.setattr(decoding, "cache_bytes_per_token", lambda model, device: 2 * per_token)
    cuda = torch.device("cuda")
    tokens = int(4 * gib * decoding.GPU_CACHE_SHARE) // (2 * per_token)
    assert decoding._sizes(model, cuda, True, 3) == (decoding.GPU_PREFILL_TOKENS, tokens)
    assert tokens > 16 * 1100  # more than the 16 rows of about a thousand tokens a batch used to be
    assert decoding._sizes(model, cuda, False, 3) == (
        decoding.GPU_PREFILL_TOKENS,
        decoding.GPU_PREFILL_TOKENS,
    )
    # A server's single prompt is a batch of one: no forward and no memory read for it.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: pytest.fail("memory read for one prompt"))
    assert decoding._sizes(model, cuda, True, 1) == (decoding.GPU_PREFILL_TOKENS, 0)


def test_a_next_line_begins_where_the_prompt_ends_a_line_as_generate_gives_it_with_that_first_token(
    pretrained,
):
    """A prompt that ends a line (before its line break, or after it and the blank lines under it) is
    answered with the next line: read without its line breaks, the first tokens spell them as the model
    chooses to (token healing: the tokenizer writes a line break with what follows it), and none has a
    line break while the line is blank (never a blank line), the same tokens `model.generate` gives one
    prompt at a time under that constraint."""
    from pipeline.suggest.decoding import healed_tokens

    model, tokenizer = pretrained
    prompts = [
        "<filename>calc.py\ndef add(a, b):",
        "<filename>walk.py\nimport os\nimport sys\n",
        "<filename>point.py\nclass Point:\n    def __init__(self, x, y):\n        self.x = x",
        "<filename>calc.py\ndef add(a, b):\n    return a + b",  # a lone line break, then another: not kept
        "<filename>calc.py\ndef add(a, b):\n    return a + b\n\n",  # under a blank line: both healed
        "<filename>point.py\nclass Point:\n    def __init__(self, x, y):\n        self.x = x\n\n\n",
    ]
    expected = []
    for prompt in prompts:
        read = prompt.rstrip("\n")
        breaks = max(len(prompt) - len(read), 1)
        ids = tokenizer(read, return_tensors="pt", add_special_tokens=False)["input_ids"]
        width = ids.shape[1]
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                prefix_allowed_tokens_fn=healed_tokens(tokenizer, width, [breaks]),
            )  # fmt: skip
        text = tokenizer.decode(out[0, width:], skip_special_tokens=True)
        assert text.startswith("\n" * breaks) and not text.startswith("\n" * (breaks + 1))
        expected.append(finished(text, True, False, next_line=True))
    told = Told()
    answers = generate_batched(model, tokenizer, prompts, NEW_TOKENS, "fp32", next_line=True, progress=told)
    assert answers == expected
    assert all(answer.strip() for answer in expected)  # a line of code each, never a blank one
    # The tokens told are the prompts' as read, without the line breaks they end with.
    read = [len(tokenizer(prompt.rstrip("\n"), add_special_tokens=False)["input_ids"]) for prompt in prompts]
    assert sum(tokens for _, tokens in told) == tokens_read(tokenizer, prompts, heals=True) == sum(read)


def test_folded_weights_stay_folded_and_a_base_answer_is_still_the_bases():
    """A server folds the adapter once (`fold`), so answering (`merged`) neither folds nor unfolds it; a
    base model's answer (`base_only`) unfolds it, and folding again answers as the fine-tuned model."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.suggest.decoding import base_only, fold, folded, merged

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    lora = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)  # a non-zero update
    model = get_peft_model(LlamaForCausalLM(config), lora).eval()
    ids = torch.arange(12).unsqueeze(0)
    with torch.no_grad():
        tuned = model(ids).logits
        with base_only(model):
            base = model(ids).logits
        assert not torch.allclose(tuned, base, atol=1e-3)
        fold(model, "none")
        assert folded(model)
        with merged(model, "none"):
            torch.testing.assert_close(model(ids).logits, tuned, atol=1e-5, rtol=1e-4)
        assert folded(model)  # answering left it folded
        with base_only(model):
            torch.testing.assert_close(model(ids).logits, base, atol=1e-5, rtol=1e-4)
        assert not folded(model)
        fold(model, "none")
        torch.testing.assert_close(model(ids).logits, tuned, atol=1e-5, rtol=1e-4)
        with base_only(model):
            model(ids)
        fold(model, "4bit")  # a quantized base is never folded into
        assert not folded(model)


def test_a_bf16_base_is_the_base_again_after_every_fold_and_unfold():
    """peft takes a folded adapter out by subtracting it, which in bf16 does not give every weight back,
    and each fold and unfold moved those further: a server answering by turns as the base model and as
    the fine-tuned one would drift from both. Unfolded, the base's weights are the base's, bit for bit,
    however often; folded, they are peft's merge."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.suggest.decoding import base_only, fold, merged

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    lora = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    model = get_peft_model(LlamaForCausalLM(config).to(torch.bfloat16), lora).eval()

    def base_weights() -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in model.named_parameters() if "base_layer" in name}

    pristine = base_weights()
    model.merge_adapter()
    merged_by_peft = base_weights()
    model.unmerge_adapter()
    drifted = base_weights()
    assert any(not torch.equal(drifted[name], pristine[name]) for name in pristine)  # peft alone
    for name, p in model.named_parameters():
        if name in pristine:
            p.data.copy_(pristine[name])
    for _ in range(3):
        fold(model, "none")
        assert all(torch.equal(weight, merged_by_peft[name]) for name, weight in base_weights().items())
        with base_only(model):
            assert all(torch.equal(weight, pristine[name]) for name, weight in base_weights().items())
        with merged(model, "none"):
            pass
    assert all(torch.equal(weight, pristine[name]) for name, weight in base_weights().items())


def test_a_block_is_the_body_generate_writes_after_a_line_that_opens_one(pretrained):
    """A prompt that ends a line opening a body is answered with the body: healed as a next line is, ended
    where the answer writes a line indented less than its first (or BLOCK_LINES), and cut there: what
    `model.generate` gives one prompt at a time under the same first-token constraint, cut the same way."""
    from pipeline.suggest.decoding import healed_tokens

    model, tokenizer = pretrained
    body_tokens = 20  # long enough for both bodies to end (their answers: 5 and 12 tokens)
    prompts = [
        "<filename>calc.py\ndef add(a, b):",
        "<filename>point.py\nclass Point:\n    def __init__(self, x, y):",
    ]
    expected = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
        width = ids.shape[1]
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=body_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                prefix_allowed_tokens_fn=healed_tokens(tokenizer, width),
            )  # fmt: skip
        expected.append(
            finished(
                tokenizer.decode(out[0, width:], skip_special_tokens=True), False, False, True, block=True
            )
        )
    assert generate_batched(model, tokenizer, prompts, body_tokens, "fp32", block=True) == expected
    assert all(answer.startswith("    ") for answer in expected)  # a body, indented under its line
