"""Taking the model home: its model card, its GGUF export (llama.cpp, Ollama), and the commit hook that
suggests a message and never blocks a commit."""

from __future__ import annotations

import io
import os
import shlex
import shutil
import stat
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import orjson
import pytest
import torch
import yaml

import run_pipeline
from pipeline.use.hook import MARK, installed_adapter
from tests.conftest import FAST_TRAINING, GIT_ENV, WITH_FILES, GitRepo, module_source, read_json

PROMPTS = [
    "def compute_3(values):",
    "Add compute_7 and describe_7",
    "diff --git a/pkg/feature_2.py b/pkg/feature_2.py\n+    return total * 2\n",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("take-home")
    repo = GitRepo(root / "repo")
    for index in range(1, 31):
        repo.commit(f"Add compute_{index}", {f"pkg/feature_{index}.py": module_source(index)})
    out = root / "out"
    # fp32 on every CPU: `generate` answers in the run's precision, but the scoreboard in a batch, which in
    # bf16 rounds otherwise than one prompt and changes some greedy answers (on a 2-core EPYC, 1 of 3). The
    # history alone: the scoreboard answers through training's attention kernel and `generate` through
    # sdpa, and the random model's near-flat logits flip a greedy token on that rounding in some trainings
    # (this one's, with the files).
    argv = [
        "--repo", str(repo.path), "--output-dir", str(out), *FAST_TRAINING, *WITH_FILES, "--set", "train.epochs=1",
        "--set", "plan.precision=fp32", "--set", "scrape.files=false", "--set", "eval.block_cases=auto",
    ]  # fmt: skip
    assert run_pipeline.main(argv) == 0
    return out


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n", 2)[1])


def assert_travels(card: str) -> None:
    """A card names no local path and keeps nothing of peft's empty template."""
    assert "[More Information Needed]" not in card and "{{" not in card
    for local in ("/tmp/", "/root", "/home/", str(Path.home()), "/nonexistent", "pytest-of"):
        assert local not in card, local


# --- model card --------------------------------------------------------------------------------


def test_the_card_of_a_built_in_base_names_its_hub_id_and_the_scores(pretrained_run):
    card = (pretrained_run / "adapter" / "README.md").read_text()
    meta = front_matter(card)
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (meta["base_model_relation"], meta["library_name"], meta["pipeline_tag"]) == (
        "adapter", "peft", "text-generation",
    )  # fmt: skip
    assert "repotune" in meta["tags"]
    metrics = meta["model-index"][0]["results"][0]["metrics"]
    names = {metric["name"] for metric in metrics}
    for system in ("fine-tuned model", "base model", "lookup (nearest past commit)"):
        assert f"chrF, {system}" in names and f"edit similarity, {system}" in names
    manifest = read_json(pretrained_run / "MANIFEST.json")
    after = manifest["training_report"]["evaluation"]["tasks"]["after"]["message"]
    assert {"type": "chrf", "value": after["chrf"], "name": "chrF, fine-tuned model"} in metrics
    assert (
        "Q4_1" in card and "## Data" in card and "## Limits" in card and "PeftModel.from_pretrained" in card
    )
    assert "newest held out" in card and "secrets removed" in card
    assert_travels(card)
    listed = {entry["path"] for entry in manifest["outputs"]["adapter_files"]}
    assert "adapter/README.md" in listed  # hashed with the adapter's other files
    # The Hub reads it as its own card loader does: the metadata and its evaluation results.
    from huggingface_hub import ModelCard

    loaded = ModelCard.load(pretrained_run / "adapter" / "README.md")
    assert loaded.data.base_model == meta["base_model"] and loaded.data.library_name == "peft"
    assert {result.metric_name for result in loaded.data.eval_results} == names


def test_the_card_of_a_random_base_names_none(tiny_run):
    card = (tiny_run / "adapter" / "README.md").read_text()
    meta = front_matter(card)
    assert "base_model" not in meta and "base_model_relation" not in meta
    assert meta["library_name"] == "peft" and "load it with repotune" in card
    assert_travels(card)


def test_the_card_says_which_weights_were_kept_and_why(tiny_run):
    """It had said "step 151 (last: validation loss 1.9841; the last step 151: 1.9841)"."""
    from pipeline.record.card import model_card

    manifest = read_json(tiny_run / "MANIFEST.json")
    kept = manifest["training_report"]["training"]["kept"] = {"stopped_early": None}
    kept.update(kept="last", step=24, validation_loss=1.5, last_step=24, last_validation_loss=1.5)
    assert "| weights kept | step 24 (the last, and the best: validation loss 1.5000) |" in model_card(
        manifest
    )
    kept.update(kept="best", step=16, validation_loss=1.25, stopped_early={"step": 20, "reason": "no better"})
    assert (
        "| weights kept | step 16 (the best: validation loss 1.2500, where the last step, 24, had 1.5000); "
        "stopped early: no better |"
    ) in model_card(manifest)


def test_a_hub_model_is_its_base_and_a_local_one_is_not(tmp_path):
    from pipeline.record.card import base_model_id

    assert base_model_id("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert base_model_id("smollm2-135m") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert base_model_id(str(tmp_path / "org" / "model")) is None and base_model_id("tiny") is None
    assert base_model_id("./models/mine") is None and base_model_id("~/models/mine") is None


# --- GGUF export -------------------------------------------------------------------------------


def merged_in_f16(run: Path):
    """The merged model with its weights rounded through fp16, as the f16 GGUF stores them (norms
    stay fp32 there)."""
    from pipeline.use.generate import load_adapter

    model, tokenizer = load_adapter(run, dense=True)
    merged = model.merge_and_unload()
    with torch.no_grad():
        for parameter in merged.parameters():
            if parameter.ndim > 1:
                parameter.copy_(parameter.half().float())
    return merged.eval(), tokenizer


def greedy(model, tokenizer, prompt: str, tokens: int = 12) -> list[int]:
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    return out[0, ids.shape[1] :].tolist()


def load_gguf(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.builtin import reading_gguf_once

    with reading_gguf_once():
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
    return model.eval(), tokenizer


def exported(run: Path, directory: Path) -> tuple[Path, Path, str]:
    """`export` of a run with its defaults: the run, the GGUF file and what export printed."""
    printed = io.StringIO()
    with redirect_stdout(printed):
        assert (
            run_pipeline.main(["export", "--adapter", str(run), "--output", str(directory / "model.gguf")])
            == 0
        )
    return run, directory / "model.gguf", printed.getvalue()


@pytest.fixture(scope="module")
def tiny_export(tiny_run, tmp_path_factory) -> tuple[Path, Path, str]:
    return exported(tiny_run, tmp_path_factory.mktemp("tiny-export"))


@pytest.fixture(scope="module")
def pretrained_export(pretrained_run, tmp_path_factory) -> tuple[Path, Path, str]:
    """Exported once for the tests that read the GGUF and those that read its Modelfiles."""
    return exported(pretrained_run, tmp_path_factory.mktemp("pretrained-export"))


@pytest.mark.parametrize("which", ["tiny", "pretrained"])
def test_the_gguf_reloads_with_the_same_tokens_and_the_same_greedy_answers(which, request):
    run, gguf, printed = request.getfixturevalue(f"{which}_export")
    assert "model.gguf" in printed and "ollama create" in printed
    assert "git diff --cached --no-color --no-ext-diff -- :/ ':(top,exclude,glob)**/*.lock'" in printed
    gguf_model, gguf_tokenizer = load_gguf(gguf)
    merged, tokenizer = merged_in_f16(run)
    texts = [*PROMPTS, "Fix the 2024 parser: ünïcode, tabs\tand  spaces"]
    for text in texts:
        assert (
            gguf_tokenizer(text, add_special_tokens=False)["input_ids"]
            == tokenizer(text, add_special_tokens=False)["input_ids"]
        )
    for prompt in PROMPTS:
        assert greedy(gguf_model, gguf_tokenizer, prompt) == greedy(merged, tokenizer, prompt)


def test_the_modelfile_asks_what_training_asked(pretrained_export):
    from pipeline.data.examples import SYSTEM_PROMPT

    _, gguf, _ = pretrained_export
    modelfile = (gguf.parent / "Modelfile").read_text()
    assert "FROM ./model.gguf" in modelfile
    assert (
        "<|im_start|>user\nWrite the commit message for this change.\n\n{{ .Prompt }}<|im_end|>" in modelfile
    )
    assert modelfile.count("{{ .System }}") == 1 and f'SYSTEM """{SYSTEM_PROMPT}"""' in modelfile
    assert 'PARAMETER stop "<|im_end|>"' in modelfile and "PARAMETER temperature 0" in modelfile
    # the staged change, as training read commits: lockfiles and vendored code left out
    assert "#   git diff --cached --no-color --no-ext-diff -- :/ ':(top,exclude,glob)**/*.lock' " in modelfile
    # named after the repository, so two repositories' models do not overwrite each other in Ollama
    assert (
        "':(top,exclude,glob)**/vendor/**'" in modelfile
        and modelfile.count(" | ollama run repotune-repo") == 1
    )
    assert "#   ollama create repotune-repo -f Modelfile" in modelfile
    # and a code completer: the editor's text as it is (SmolLM2 has no fill-in-the-middle tokens)
    code = (gguf.parent / "Modelfile.code").read_text()
    assert (
        "FROM ./model.gguf" in code and 'TEMPLATE """{{ .Prompt }}"""' in code and "{{ .Suffix }}" not in code
    )
    assert "#   ollama create repotune-repo-code -f Modelfile.code" in code


def test_the_code_modelfile_fills_in_the_middle_where_the_tokenizer_can():
    from types import SimpleNamespace

    from pipeline.use.export import code_modelfile

    fim = {"<fim_prefix>": 1, "<fim_suffix>": 2, "<fim_middle>": 3}
    tokenizer = SimpleNamespace(get_vocab=lambda: fim, eos_token="<|endoftext|>")
    code = code_modelfile(["FROM ./m.gguf"], tokenizer, "repotune-repo-code")
    assert (
        'TEMPLATE """{{ if .Suffix }}<fim_prefix>{{ .Prompt }}<fim_suffix>{{ .Suffix }}<fim_middle>'
        '{{ else }}{{ .Prompt }}{{ end }}"""'
    ) in code
    assert 'PARAMETER stop "<|endoftext|>"' in code


def test_q8_0_is_smaller_and_loads(tiny_run, tmp_path, cli):
    home = tmp_path / "take home"  # the commands it prints are pasted into a shell: quoted
    assert cli("export", "--adapter", tiny_run, "--output", home / "f16.gguf").code == 0
    exported = cli("export", "--adapter", tiny_run, "--output", home / "q8.gguf", "--type", "q8_0")
    assert exported.code == 0
    printed = {
        line.split(": ", 1)[0].strip(): line.split(": ", 1)[1] for line in exported.out.splitlines()[1:3]
    }
    assert shlex.split(printed["llama.cpp"]) == ["llama-cli", "-m", str(home / "q8.gguf")]
    assert shlex.split(printed["ollama"])[:2] == ["cd", str(home)]
    assert (home / "q8.gguf").stat().st_size < (home / "f16.gguf").stat().st_size
    model, tokenizer = load_gguf(home / "q8.gguf")
    assert len(greedy(model, tokenizer, PROMPTS[0], 4)) == 4


def test_the_adapter_alone_applies_to_its_base_as_peft_applies_it(pretrained_run, tmp_path, cli):
    """`--adapter-only`: llama.cpp's LoRA file beside the base, written once per folder. llama.cpp adds
    alpha / rank × lora_b @ lora_a to each weight in its own layout: that is peft's update of the same
    weight, in fp32 (a merged f16 file would hide a wrong layout or scale under rounding)."""
    import gguf

    from pipeline.use.export import rotary_layout
    from pipeline.use.generate import load_adapter

    home = tmp_path / "models"
    first = cli("export", "--adapter", pretrained_run, "--output", home / "repo.gguf", "--adapter-only")
    assert first.code == 0, first.err
    (base,) = home.glob("smollm2-135m.f16.*.gguf")
    assert f"on its base {base} (f16" in first.out and "written now" in first.out
    printed = {line.split(": ", 1)[0].strip(): line.split(": ", 1)[1] for line in first.out.splitlines()[1:3]}
    assert shlex.split(printed["llama.cpp"]) == [
        "llama-cli",
        "-m",
        str(base),
        "--lora",
        str(home / "repo.gguf"),
    ]
    assert shlex.split(printed["ollama"])[-2:] == ["-f", "repo.Modelfile"]
    for modelfile in ("repo.Modelfile", "repo.Modelfile.code"):
        assert f"FROM ./{base.name}\nADAPTER ./repo.gguf\n" in (home / modelfile).read_text()
    second = cli("export", "--adapter", pretrained_run, "--output", home / "other.gguf", "--adapter-only")
    assert second.code == 0 and "kept: an earlier export wrote this base" in second.out
    assert sorted(path.name for path in home.glob("*.gguf")) == sorted([base.name, "other.gguf", "repo.gguf"])

    reader = gguf.GGUFReader(home / "repo.gguf")
    assert (reader.fields["general.type"].contents(), reader.fields["adapter.type"].contents()) == (
        "adapter",
        "lora",
    )
    alpha = reader.fields["adapter.lora.alpha"].contents()
    stored = {tensor.name: np.array(tensor.data, dtype=np.float32) for tensor in reader.tensors}
    based = {tensor.name: np.array(tensor.data) for tensor in gguf.GGUFReader(base).tensors}
    model, _ = load_adapter(pretrained_run)
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    adapted = 0
    for module_name, module in model.named_modules():
        if "default" not in getattr(module, "lora_A", {}):
            continue
        name = names.get_name(
            module_name.removeprefix("base_model.model.") + ".weight", try_suffixes=(".weight",)
        )
        heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}.get(
            module_name.rsplit(".", 1)[-1]
        )
        delta = module.get_delta_weight("default").detach().float().numpy()
        weight = module.base_layer.weight.detach().half().numpy()
        if heads:
            delta, weight = rotary_layout(delta, heads), rotary_layout(weight, heads)
        down, up = stored[f"{name}.lora_a"], stored[f"{name}.lora_b"]
        np.testing.assert_allclose(alpha / down.shape[0] * (up @ down), delta, rtol=1e-4, atol=1e-9)
        np.testing.assert_array_equal(based[name], weight)  # the base is the base, without the update
        adapted += 1
    assert 2 * adapted == len(stored) > 0


def test_export_refuses_bad_input_in_one_line(tiny_run, tmp_path, cli):
    wrong = cli("export", "--adapter", tiny_run, "--output", tmp_path / "model.bin")
    assert wrong.code == 2 and "ending in .gguf" in wrong.err and wrong.err.count("\n") == 1
    missing = cli("export", "--adapter", tmp_path / "nothing", "--output", tmp_path / "model.gguf")
    assert missing.code == 2 and "adapter_config.json" in missing.err
    assert not (tmp_path / "model.gguf").exists()
    # the tiny model's base is random: its embeddings train in full, which a LoRA file cannot hold
    whole = cli("export", "--adapter", tiny_run, "--output", tmp_path / "lora.gguf", "--adapter-only")
    assert whole.code == 2 and "trains the base's" in whole.err and whole.err.count("\n") == 1, whole.err
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_an_adapter_whose_local_base_model_moved_says_so(tiny_run, tmp_path, cli):
    """An adapter records where its base model was (a local directory, for `--model DIR`): once that is
    moved, `generate` and `export` had said "--model DIR: no such directory", an option the user never gave."""
    moved = tmp_path / "run"
    shutil.copytree(tiny_run, moved, ignore=shutil.ignore_patterns("base_model", "checkpoints"))
    config = moved / "adapter" / "adapter_config.json"
    settings = orjson.loads(config.read_bytes())
    settings["base_model_name_or_path"] = str(tmp_path / "models" / "mine")
    config.write_bytes(orjson.dumps(settings))
    asked = cli("generate", "--adapter", moved, "--prompt", "def f")
    exported = cli("export", "--adapter", moved, "--output", tmp_path / "model.gguf")
    for result in (asked, exported):
        assert result.code == 2 and result.err.count("\n") == 1, result.err
        assert f"its base model {tmp_path / 'models' / 'mine'} is gone" in result.err
        assert f"into {config} (base_model_name_or_path)" in result.err


# --- the commit hook ---------------------------------------------------------------------------


@pytest.fixture
def work_repo(tmp_path) -> GitRepo:
    repo = GitRepo(tmp_path / "work")
    repo.commit("Add compute_1", {"pkg/feature_1.py": module_source(1)})
    return repo


def git_commit(
    repo: GitRepo, *args: str, env: dict[str, str] | None = None, given: str | None = None
) -> subprocess.CompletedProcess:
    """`git commit` as a user runs it (no editor: the message git would open is what it keeps); `given`
    is its standard input (`-F -`)."""
    return subprocess.run(
        ["git", "commit", "--quiet", *args],
        cwd=repo.path,
        env={**os.environ, **GIT_ENV, "GIT_EDITOR": "true", **(env or {})},
        input=given,
        capture_output=True,
        text=True,
    )


def stage(repo: GitRepo, index: int) -> None:
    path = repo.path / f"pkg/feature_{index}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(module_source(index))
    repo.git("add", "-A")


def last_message(repo: GitRepo) -> str:
    return repo.git("log", "-1", "--format=%B")


def test_a_hook_with_another_projects_adapter_says_so(tiny_run, work_repo, tmp_path, cli):
    """A hook installed with an adapter trained on another project suggests that project's messages: the
    install says so. A clone of the history trained on (the commit trained up to is in it) is the same
    project, and is told nothing."""
    trained = read_json(tiny_run / "MANIFEST.json")["repositories"][0]["path"]
    elsewhere = cli("hook", "install", "--repo", work_repo.path, "--adapter", tiny_run)
    assert elsewhere.code == 0 and elsewhere.out.strip().endswith(
        f"; note: {tiny_run / 'adapter'} learned {trained}, not this repository: it suggests from that history"
    )
    # A run of that project that stopped there before reading its history (a model name that is not one)
    # leaves its adapter, and the install still says whose it is.
    stopped = tmp_path / "stopped"
    shutil.copytree(tiny_run, stopped)
    assert cli("--repo", trained, "--output-dir", stopped, "--model", "./no-model").code == 2
    still = cli("hook", "install", "--repo", work_repo.path, "--adapter", stopped)
    assert still.code == 0 and f"learned {trained}, not this repository" in still.out
    assert cli("hook", "uninstall", "--repo", work_repo.path).code == 0
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", trained, str(clone)], check=True)
    for repo in (trained, clone, clone / "pkg"):
        same = cli("hook", "install", "--repo", repo, "--adapter", tiny_run)
        assert same.code == 0 and "note:" not in same.out
        assert cli("hook", "uninstall", "--repo", repo).code == 0


def test_the_hook_suggests_a_past_message_for_the_staged_change(tiny_run, work_repo, tmp_path, cli):
    result = cli("hook", "install", "--repo", work_repo.path, "--adapter", tiny_run)
    assert result.code == 0 and "installed" in result.out and "2 more below it, commented out" in result.out
    hook = work_repo.path / ".git" / "hooks" / "prepare-commit-msg"
    assert hook.stat().st_mode & stat.S_IXUSR
    stage(work_repo, 12)
    seen = tmp_path / "seen"
    seen.mkdir()
    done = git_commit(work_repo, env={"GIT_EDITOR": f"cp -t {seen}"})  # the editor keeps what it is shown
    assert done.returncode == 0, done.stderr
    assert last_message(work_repo).startswith("Add compute_")  # a message from the trained history
    assert done.stderr == ""
    shown = (seen / "COMMIT_EDITMSG").read_text().splitlines()
    more = shown.index(
        "# repotune: 2 more from this repository's past (to use one, put it in place of the first line):"
    )
    assert shown[0] == last_message(work_repo).strip() and shown[1] == ""
    alternatives = [line.removeprefix("# 1. ").removeprefix("# 2. ") for line in shown[more + 1 : more + 3]]
    assert all(line.startswith("Add compute_") for line in alternatives) and shown[0] not in alternatives
    assert "repotune" not in last_message(work_repo)  # commented out: git dropped them


@pytest.mark.parametrize(
    "config", [["core.commentChar", ";"], ["commit.cleanup", "whitespace"], ["core.commentChar", "auto"], []]
)
def test_the_hook_shows_alternatives_only_where_git_drops_them(config, tiny_run, work_repo, tmp_path, cli):
    alternatives = [] if config else ["--alternatives", "0"]
    assert cli("hook", "install", "--repo", work_repo.path, "--adapter", tiny_run, *alternatives).code == 0
    if config:
        work_repo.git("config", *config)
    stage(work_repo, 12)
    assert git_commit(work_repo, env={"GIT_EDITOR": f"cp -t {tmp_path}"}).returncode == 0
    shown = (tmp_path / "COMMIT_EDITMSG").read_text()
    assert ("; repotune: 2 more" in shown) == (config == ["core.commentChar", ";"])  # git's own character
    message = last_message(work_repo)
    assert message.startswith("Add compute_")
    assert "repotune" not in message  # git's own comment character dropped them; elsewhere none were shown
    if config != ["commit.cleanup", "whitespace"]:  # (which keeps git's own comments too)
        assert message.strip().count("\n") == 0


@pytest.mark.parametrize(
    ("options", "shown"),
    [(["--cleanup=verbatim"], False), (["--cleanup=whitespace"], False), (["--cleanup=scissors"], False),
     (["--verbose"], True), (["--verbose", "--cleanup=scissors"], False)],
)  # fmt: skip
def test_the_hook_shows_no_alternatives_where_the_command_line_keeps_comments(
    options, shown, tiny_run, work_repo, tmp_path, cli
):
    """`git commit --cleanup=verbatim` (or whitespace) keeps every comment line, and no config says so:
    the alternatives would have been committed. git's own words in the message ("… will be kept") say
    it. `--cleanup=scissors` keeps the comments above its scissors line, and writes none of its own
    there, where `git commit -v`, which strips them, writes its help text."""
    assert cli("hook", "install", "--repo", work_repo.path, "--adapter", tiny_run).code == 0
    stage(work_repo, 12)
    committed = git_commit(work_repo, *options, env={"GIT_EDITOR": f"cp -t {tmp_path}", "LC_ALL": "C"})
    assert committed.returncode == 0
    assert ("# repotune: 2 more" in (tmp_path / "COMMIT_EDITMSG").read_text()) == shown
    message = last_message(work_repo)
    assert message.startswith("Add compute_") and "repotune" not in message


@pytest.mark.parametrize(
    ("template", "options"),
    [("JIRA-: \n\n# Why?\n", []), ("# Subject, then why\n", []), ("JIRA-: \n", ["--cleanup=verbatim"])],
)
def test_a_commit_template_keeps_its_place_and_the_suggestions_come_as_comments(
    template, options, tiny_run, work_repo, tmp_path, cli
):
    """A template's text (`commit.template`) begins the message as the team wrote it: the suggestion
    above it had pushed "JIRA-: " into the body, where an unedited commit kept it, and git no longer
    refused the template left as it was. Its comments alone leave the suggestion first."""
    assert cli("hook", "install", "--repo", work_repo.path, "--adapter", tiny_run).code == 0
    (tmp_path / "template").write_text(template)
    work_repo.git("config", "commit.template", str(tmp_path / "template"))
    stage(work_repo, 12)
    committed = git_commit(work_repo, *options, env={"GIT_EDITOR": f"cp -t {tmp_path}", "LC_ALL": "C"})
    shown = (tmp_path / "COMMIT_EDITMSG").read_text()
    if template.startswith("#"):  # comments only: the suggestion is the message
        assert committed.returncode == 0 and last_message(work_repo).startswith("Add compute_")
        return
    assert shown.startswith("JIRA-: \n")
    if options:  # verbatim keeps comments: nothing can be shown (and git commits the template as it was)
        assert committed.returncode == 0 and "repotune" not in shown
    else:
        assert committed.returncode == 1 and "you did not edit the message" in committed.stderr
        heading, choice = shown.splitlines()[2:4]
        assert heading == "# repotune: suggestions (to use one, copy it into the message above):"
        assert choice.startswith("# 1. Add compute_") and "# Why?" in shown


@pytest.fixture(scope="module")
def german(tmp_path_factory) -> dict[str, str]:
    """The environment of a user whose git speaks German: a de_DE.UTF-8 locale built for the test
    (`localedef`, into LOCPATH) where the machine has the locale's source and git's German catalog."""
    locales = tmp_path_factory.mktemp("locales")
    env = {"LOCPATH": str(locales), "LANG": "de_DE.UTF-8", "LC_ALL": "", "LANGUAGE": ""}
    built = shutil.which("localedef") and subprocess.run(
        ["localedef", "-i", "de_DE", "-f", "UTF-8", str(locales / "de_DE.UTF-8")], capture_output=True
    )
    usage = subprocess.run(["git", "commit", "-h"], env={**os.environ, **env}, capture_output=True, text=True)
    if not built or built.returncode != 0 or "Commit-Beschreibung" not in usage.stdout + usage.stderr:
        pytest.skip("no German locale for git here (localedef's de_DE source or git's German catalog)")
    return env


@pytest.mark.parametrize(("options", "shown"), [([], True), (["--cleanup=verbatim"], False)])
def test_where_git_speaks_another_language_the_hook_still_reads_that_comments_will_be_kept(
    options, shown, german, tiny_run, work_repo, tmp_path, cli
):
    """git words its notice that comments will be kept in the user's language ("… werden beibehalten"):
    the hook looks it up in git's own message catalog, so a translated `git commit --cleanup=verbatim`
    does not commit the alternatives either."""
    assert cli("hook", "install", "--repo", work_repo.path, "--adapter", tiny_run).code == 0
    stage(work_repo, 12)
    committed = git_commit(work_repo, *options, env={"GIT_EDITOR": f"cp -t {tmp_path}", **german})
    assert committed.returncode == 0, committed.stderr
    written = (tmp_path / "COMMIT_EDITMSG").read_text()
    assert "Commit-Beschreibung" in written and ("# repotune: 2 more" in written) == shown
    message = last_message(work_repo)
    assert message.startswith("Add compute_") and "repotune" not in message


def test_without_an_editor_the_hook_suggests_nothing_to_commit_unread(tiny_run, work_repo, cli, monkeypatch):
    """`git commit --no-edit` opens no editor (git runs its hooks with GIT_EDITOR=:): a suggestion would be
    committed unread, so git's message stays empty and git refuses it, as without the hook. Committing a
    suggestion without an editor on purpose is `generate`'s, piped into `git commit -F -`."""
    assert cli("hook", "install", "--repo", work_repo.path, "--adapter", tiny_run).code == 0
    stage(work_repo, 12)
    refused = git_commit(work_repo, "--no-edit")
    assert refused.returncode == 1 and "empty commit message" in refused.stderr
    assert "repotune" not in refused.stderr and last_message(work_repo) == "Add compute_1"
    monkeypatch.setattr(sys, "stdin", io.StringIO(work_repo.git("diff", "--cached")))
    suggested = cli("generate", "--adapter", tiny_run, "--task", "message", "--prompt", "-")
    assert suggested.code == 0 and suggested.out.startswith("Add compute_")
    assert git_commit(work_repo, "-F", "-", given=suggested.out).returncode == 0
    assert last_message(work_repo) == suggested.out.strip()


def suggested_in_process(work_repo: GitRepo, tmp_path: Path, monkeypatch, *argv: str) -> str:
    """The message file `hook.suggest` leaves for the staged feature 12, run in this process (its alarm
    cancelled after: the deadline is the hook process's, not the tests')."""
    import signal

    from pipeline.use.hook import suggest

    stage(work_repo, 12)
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text("\n# Please enter the commit message\n")
    monkeypatch.chdir(work_repo.path)
    handler = signal.getsignal(signal.SIGALRM)
    try:
        suggest([str(message), *argv])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
    return message.read_text()


def test_a_hook_installed_before_alternatives_still_suggests(tiny_run, work_repo, tmp_path, monkeypatch):
    shown = suggested_in_process(work_repo, tmp_path, monkeypatch, str(tiny_run / "adapter"), "20")
    assert shown.startswith("Add compute_") and "# 2. " in shown  # three arguments, as those hooks pass


def test_where_the_model_answers_retrievals_answers_are_the_alternatives(
    tiny_run, work_repo, tmp_path, monkeypatch
):
    from pipeline.use import generate

    adapter = tmp_path / "adapter"
    shutil.copytree(tiny_run / "adapter", adapter)
    system = adapter / "retrieval" / "system.json"
    system.write_bytes(orjson.dumps({**orjson.loads(system.read_bytes()), "system": "model"}))
    monkeypatch.setattr(generate, "generate", lambda *args, **kwargs: "Written by the model")
    shown = suggested_in_process(work_repo, tmp_path, monkeypatch, str(adapter), "20", "2")
    lines = shown.splitlines()
    assert lines[0] == "Written by the model" and lines[3].startswith("# 1. Add compute_")
    assert lines[4].startswith("# 2. Add compute_") and "Written by the model" not in "\n".join(lines[1:])


def test_the_past_reads_a_new_diff_as_it_read_the_history(tiny_run, work_repo, monkeypatch):
    """A vendored copy of another module in the staged change: training never saw vendored files, and
    read whole, its names would pick that module's commit."""
    from pipeline.suggest.suggestion import Suggester
    from pipeline.use.hook import staged_diff
    from scrapers.config import ScrapeConfig
    from scrapers.filters import file_filters

    suggester = Suggester.load(tiny_run / "adapter")
    assert suggester.files == file_filters(ScrapeConfig())  # saved with the run's scrape settings
    monkeypatch.chdir(work_repo.path)
    stage(work_repo, 12)
    alone = staged_diff()
    (work_repo.path / "vendor").mkdir()
    (work_repo.path / "vendor" / "feature_5.py").write_text(module_source(5) * 3)
    work_repo.git("add", "-A")
    with_vendored = staged_diff()
    assert suggester.lookup(with_vendored) == "Add compute_5"  # read whole
    assert (
        suggester.suggest(with_vendored, "lookup") == suggester.suggest(alone, "lookup") == "Add compute_12"
    )
    # A regenerated lockfile of megabytes, sorted before the code, does not push the code out of what is read.
    lockfile = "".join(f'"node_modules/pkg{i}": {{"version": "1.0.{i}"}},\n' for i in range(60_000))
    (work_repo.path / "package-lock.json").write_text(lockfile)
    work_repo.git("add", "-A")
    with_lockfile = staged_diff()
    assert with_lockfile.index("package-lock.json") < with_lockfile.index("pkg/feature_12.py")
    assert suggester.suggest(with_lockfile, "lookup") == "Add compute_12"


def test_generate_says_what_it_waits_for_where_nothing_is_piped(tiny_run, work_repo, cli, monkeypatch):
    """`generate --prompt -` in a terminal, nothing piped: it said nothing and seemed to hang."""
    from pipeline.use.hook import staged_diff

    monkeypatch.chdir(work_repo.path)
    stage(work_repo, 12)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal(staged_diff()))
    typed = cli("generate", "--adapter", tiny_run, "--task", "message", "--prompt", "-")
    assert typed.code == 0 and typed.out.startswith("Add compute_")
    assert typed.err.startswith("reading the prompt from the terminal: paste it, then Ctrl-D")
    monkeypatch.setattr(sys, "stdin", io.StringIO(staged_diff()))
    piped = cli("generate", "--adapter", tiny_run, "--task", "message", "--prompt", "-")
    assert piped.out == typed.out and "terminal" not in piped.err


def test_generate_prints_the_alternatives_the_hook_shows(tiny_run, work_repo, cli, monkeypatch):
    from pipeline.use.hook import staged_diff

    monkeypatch.chdir(work_repo.path)
    stage(work_repo, 12)
    diff = staged_diff()
    monkeypatch.setattr(sys, "stdin", io.StringIO(diff))
    shown = cli(
        "generate", "--adapter", tiny_run, "--task", "message", "--prompt", "-", "--alternatives", "2"
    )
    assert shown.code == 0, shown.err
    first, blank, header, *more = shown.out.splitlines()
    assert first.startswith("Add compute_") and blank == "" and header.startswith("# repotune: 2 more")
    assert [line[:15] for line in more] == ["# 1. Add comput", "# 2. Add comput"] and first not in shown.out[
        len(first) :
    ]
    refused = cli("generate", "--adapter", tiny_run, "--prompt", "def ", "--alternatives", "2")
    assert refused.code == 2 and "use it with --task message" in refused.err
    # Counts out of range are one line (a negative one had printed ten past messages, and a --max-new-tokens
    # below 1 ended in an internal error; beyond the model's positions it wrote noise for minutes).
    for argv, said in (
        (
            ("--task", "message", "--alternatives", "-1"),
            "--alternatives -1: give how many more messages to show, 0 to 9",
        ),
        (("--max-new-tokens", "-3"), "--max-new-tokens -3: give how many tokens to write, 1 or more"),
        (
            ("--max-new-tokens", "100000"),
            "--max-new-tokens 100000: the model reads at most 2,048 positions and the prompt takes ",
        ),
    ):
        wrong = cli("generate", "--adapter", tiny_run, "--prompt", "def f(", *argv)
        assert (
            wrong.code == 2
            and wrong.err.startswith(f"repotune: error: {said}")
            and wrong.err.count("\n") == 1
        )


def test_a_diff_that_is_not_utf8_is_read_as_the_scrape_reads_it(tiny_run, work_repo, cli, monkeypatch):
    """A staged Latin-1 file, piped (`git diff --cached | generate … --prompt -`) or given as an argument
    (`--prompt "$(git diff --cached)"`): Python hands its byte over as a lone surrogate, which had ended in
    an internal error. Now read as the scrape decodes the history (U+FFFD), and answered."""
    from pipeline.use.cli import as_text

    (work_repo.path / "pkg" / "legacy.py").write_bytes(b"caf\xe9 = 1\n")
    work_repo.git("add", "-A")
    raw = subprocess.run(
        ["git", "diff", "--cached", "--no-ext-diff"], cwd=work_repo.path, capture_output=True, check=True
    ).stdout
    given = raw.decode("utf-8", "surrogateescape")  # what sys.stdin and sys.argv hold
    assert "\udce9" in given and as_text(given) == raw.decode("utf-8", "replace")
    monkeypatch.setattr(sys, "stdin", io.StringIO(given))
    piped = cli("generate", "--adapter", tiny_run, "--task", "message", "--prompt", "-")
    assert piped.code == 0 and piped.out.strip() and "internal error" not in piped.err
    argument = cli("generate", "--adapter", tiny_run, "--task", "message", "--prompt", given)
    assert argument.code == 0 and argument.out == piped.out


def test_the_model_answers_a_diff_at_use_as_the_scoreboard_scored_it(tiny_run):
    """`generate --task message --system model` on a held-out commit's whole diff gives the fine-tuned
    model's answer in evaluation.jsonl: the prompt cut where training cut it, the same greedy tokens, as
    many as the scoreboard let it write (by default: the run's `eval.message_tokens`, which the suite's runs
    set below the default; `generate` had written the default's)."""
    from pipeline.config import EvalConfig, TrainConfig
    from pipeline.suggest.retrieval import past_commits
    from pipeline.train.model import adapter_facts
    from pipeline.use.generate import generate

    records = [orjson.loads(line) for line in (tiny_run / "sequences.jsonl").read_bytes().splitlines()]
    diffs = {commit.sha: commit.diff for commit in past_commits(records)}
    scored = [orjson.loads(line) for line in (tiny_run / "evaluation.jsonl").read_bytes().splitlines()]
    asked = [row for row in scored if row["task"] == "message"]
    facts = adapter_facts(tiny_run / "adapter")
    assert facts.prompt_tokens == TrainConfig().max_prompt_tokens
    assert facts.message_tokens != EvalConfig().message_tokens  # the run's own, recorded beside the adapter
    assert asked
    for row in asked:
        answer = generate(tiny_run, diffs[row["commit"]], task="message", system="model")
        assert answer == row["fine_tuned"]


def test_the_hook_stays_out_of_the_way(tiny_run, work_repo, cli):
    assert cli("hook", "install", "--repo", work_repo.path, "--adapter", tiny_run).code == 0
    stage(work_repo, 2)
    assert git_commit(work_repo, "-m", "Mine").returncode == 0
    assert last_message(work_repo) == "Mine"
    assert git_commit(work_repo, "--amend", "--no-edit").returncode == 0
    assert last_message(work_repo) == "Mine"
    stage(work_repo, 3)
    assert git_commit(work_repo, env={"REPOTUNE_HOOK": "off"}).returncode == 1  # an empty message: git's own
    (work_repo.path / ".git" / "rebase-merge").mkdir()
    assert git_commit(work_repo).returncode == 1  # a rebase under way: nothing suggested
    (work_repo.path / ".git" / "rebase-merge").rmdir()


@pytest.mark.parametrize("breakage", ["moved adapter", "gone interpreter", "timeout", "broken module"])
def test_the_hook_never_blocks_a_commit(breakage, tiny_run, work_repo, tmp_path, cli):
    """Whatever goes wrong, the commit goes on and the editor opens on git's own text, and the hook
    says so in one line at most."""
    assert (
        cli("hook", "install", "--repo", work_repo.path, "--adapter", tiny_run, "--timeout", "20").code == 0
    )
    hook = work_repo.path / ".git" / "hooks" / "prepare-commit-msg"
    text = hook.read_text()
    if breakage == "moved adapter":
        text = text.replace(str((tiny_run / "adapter").resolve()), str(tmp_path / "gone"))
    elif breakage == "gone interpreter":
        text = text.replace(sys.executable, str(tmp_path / "no-python"))
    elif breakage == "timeout":
        text = text.replace("timeout=20", "timeout=0.05")
    else:
        text = text.replace("from pipeline.use.hook import suggest", "from pipeline.nothing import suggest")
    hook.write_text(text)
    seen = tmp_path / "seen.txt"
    editor = tmp_path / "editor.sh"  # keeps what the user would see, then writes the user's message
    editor.write_text(f'#!/bin/sh\ncp "$1" {seen}\necho "Mine" > "$1"\n')
    editor.chmod(0o755)
    stage(work_repo, 5)
    done = git_commit(work_repo, env={"GIT_EDITOR": str(editor)})
    assert done.returncode == 0, done.stderr
    assert last_message(work_repo) == "Mine"
    assert seen.read_text().startswith("\n# Please enter the commit message")  # git's text, nothing added
    assert done.stderr.count("\n") <= 1 and "Traceback" not in done.stderr
    if breakage == "timeout":
        assert "no suggestion within 0.05s" in done.stderr


THEIRS = {  # a hook already in place, each saying the name it was called by (husky 4 dispatches on it)
    "sh": '#!/bin/sh\necho "theirs ran as $(basename "$0")" >> "$1"\n',
    "python": '#!/usr/bin/env python3\nimport sys\nopen(sys.argv[1], "a").write("theirs ran in Python\\n")\n',
}


@pytest.mark.parametrize("kind", THEIRS)
def test_an_existing_hook_is_kept_run_first_and_restored(kind, tiny_run, work_repo, tmp_path, cli):
    hooks = work_repo.path / ".git" / "hooks"
    hooks.mkdir(exist_ok=True)
    theirs = hooks / "prepare-commit-msg"
    theirs.write_text(THEIRS[kind])
    theirs.chmod(0o755)
    installed = cli("hook", "install", "--repo", work_repo.path, "--adapter", tiny_run)
    assert installed.code == 0 and "runs first" in installed.out
    stage(work_repo, 7)
    assert git_commit(work_repo, env={"GIT_EDITOR": f"cp -t {tmp_path}"}).returncode == 0
    said = {"sh": "theirs ran as prepare-commit-msg", "python": "theirs ran in Python"}[kind]
    assert last_message(work_repo).strip() == said  # what their hook wrote begins the message, as a template
    shown = (tmp_path / "COMMIT_EDITMSG").read_text().splitlines()
    assert shown[shown.index(said) + 3].startswith("# 1. Add compute_")  # and the suggestion is offered
    removed = cli("hook", "uninstall", "--repo", work_repo.path)
    assert removed.code == 0 and "was there before" in removed.out
    assert theirs.read_text() == THEIRS[kind]
    assert not (hooks / "prepare-commit-msg.repotune-previous").exists()
    refused = cli("hook", "uninstall", "--repo", work_repo.path)
    assert refused.code == 2 and "not repotune's" in refused.err
    # repotune's hook deleted by hand: uninstall puts theirs back (set aside, it would never run again).
    assert cli("hook", "install", "--repo", work_repo.path, "--adapter", tiny_run).code == 0
    theirs.unlink()
    restored = cli("hook", "uninstall", "--repo", work_repo.path)
    assert restored.code == 0 and "put back" in restored.out and theirs.read_text() == THEIRS[kind]
    assert not (hooks / "prepare-commit-msg.repotune-previous").exists()


def test_a_hook_managers_folder_is_left_alone_and_told_how_to_call_the_hook(
    tiny_run, work_repo, tmp_path, cli
):
    """husky (v9) sets core.hooksPath to .husky/_, whose stubs find the user's script by their own file
    name: renamed to make room, its prepare-commit-msg would stop running without a word."""
    stubs = work_repo.path / ".husky" / "_"
    stubs.mkdir(parents=True)
    (stubs / "h").write_text(
        '#!/bin/sh\ns="$(dirname "$(dirname "$0")")/$(basename "$0")"\n[ ! -f "$s" ] || sh -e "$s" "$@"\n'
    )
    (stubs / "prepare-commit-msg").write_text('#!/bin/sh\n. "$(dirname "$0")/h"\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    theirs = work_repo.path / ".husky" / "prepare-commit-msg"
    theirs.write_text('echo "Refs: #12" >> "$1"\n')
    work_repo.git("config", "core.hooksPath", ".husky/_")
    before = {path: path.read_bytes() for path in stubs.iterdir()}
    # What an earlier version left there: husky's stub set aside, repotune's hook in its place.
    (stubs / "prepare-commit-msg").rename(stubs / "prepare-commit-msg.repotune-previous")
    (stubs / "prepare-commit-msg").write_text(f"#!/bin/sh\n{MARK}\nadapter={tiny_run}/adapter\n")
    assert installed_adapter(work_repo.path) == tiny_run / "adapter"
    installed = cli("hook", "install", "--repo", work_repo.path, "--adapter", tiny_run)
    assert installed.code == 0, installed.err
    assert "the hook an earlier install wrote there is taken out" in installed.out
    assert {path: path.read_bytes() for path in stubs.iterdir()} == before  # the manager's, as it was
    assert (work_repo.path / ".git" / "hooks" / "prepare-commit-msg").exists()
    line = installed.out.strip().rsplit("(husky: .husky/prepare-commit-msg): ", 1)[1]
    stage(work_repo, 7)
    assert git_commit(work_repo).returncode == 0
    assert last_message(work_repo) == "Refs: #12"  # theirs runs, ours not yet called
    theirs.write_text(f"{line}\n" + theirs.read_text())
    stage(work_repo, 8)
    assert git_commit(work_repo).returncode == 0
    message = last_message(work_repo)
    assert message.startswith("Add compute_") and message.endswith("Refs: #12")  # both
    removed = cli("hook", "uninstall", "--repo", work_repo.path)
    assert removed.code == 0 and "now does nothing" in removed.out
    stage(work_repo, 9)
    assert git_commit(work_repo).returncode == 0 and last_message(work_repo) == "Refs: #12"  # a no-op


def test_hook_bad_input_is_one_line(tiny_run, tmp_path, cli):
    not_a_repo = cli("hook", "install", "--repo", tmp_path, "--adapter", tiny_run)
    assert not_a_repo.code == 2 and "not a git repository" in not_a_repo.err
    no_adapter = cli("hook", "install", "--repo", tmp_path)
    assert no_adapter.code == 2 and "--adapter" in no_adapter.err
    bare = GitRepo(tmp_path / "bare.git", bare=True)  # where nobody commits: the hook would never run
    in_bare = cli("hook", "install", "--repo", bare.path, "--adapter", tiny_run)
    assert in_bare.code == 2 and in_bare.err == (
        f"repotune: error: --repo {bare.path}: a bare repository, where no commit is written: install in a clone of it\n"
    )
    assert not (bare.path / "hooks" / "prepare-commit-msg").exists()


@pytest.mark.parametrize("task", ["code", "block"])
def test_the_model_writes_the_next_line_and_the_block_at_use_as_the_scoreboard_asked_them(
    tiny_run, cli, task
):
    """`generate --task code|block --path FILE --after TEXT` on a held-out case's text before and after the
    cursor gives the fine-tuned model's answer in evaluation.jsonl: the same prompt (tiny has
    fill-in-the-middle tokens: the text after the cursor read as the scoreboard gave it), the same healed
    first token, the same line or body (a run without files: the fine-tuned model alone, the default where
    there is no context to retrieve)."""
    chosen = read_json(tiny_run / "MANIFEST.json")["training_report"]["evaluation"]["code_system"]
    assert chosen["name"] == "model"
    for row, case in held_out_lines(tiny_run, task):
        result = cli(
            "generate", "--adapter", tiny_run, "--task", task, "--path", case["path"], "--prompt", case["before"],
            "--after", case["after"],
        )  # fmt: skip
        assert result.code == 0, result.err
        assert result.out == row["fine_tuned"] + "\n" and not result.err
    # The same file written on Windows: read with LF, a body given back in CR LF.
    windows = cli(
        "generate", "--adapter", tiny_run, "--task", task, "--path", case["path"],
        "--prompt", case["before"].replace("\n", "\r\n"), "--after", case["after"].replace("\n", "\r\n"),
    )  # fmt: skip
    assert windows.out == row["fine_tuned"].replace("\n", "\r\n") + "\n"


@pytest.mark.parametrize(
    ("system", "task", "column"),
    [
        (None, "code_context", "fine_tuned"),  # the run's choice: the default, too few validation commits
        ("base-context", "code_context", "base"),
        ("lookup", "code", "nearest_commit"),
    ],
)
def test_each_system_writes_the_next_line_at_use_as_the_scoreboard_asked_it(
    pretrained_run, cli, system, task, column
):
    """`generate --task code --system S` gives S's answer in evaluation.jsonl, retrieved context and the
    base model's own weights included; without --system, the system the run chose, which the manifest
    names with why."""
    chosen = read_json(pretrained_run / "MANIFEST.json")["training_report"]["evaluation"]["code_system"]
    assert chosen["name"] == "model-context" and "too few to tell systems apart" in chosen["reason"]
    row, case = held_out_lines(pretrained_run, task)[0]
    asked = ("generate", "--adapter", pretrained_run, "--task", "code", "--path", case["path"])
    result = cli(*asked, "--prompt", case["before"], *(["--system", system] if system else []))
    assert result.code == 0, result.err
    assert result.out == row[column] + "\n"
    if system is None:  # the same file written on Windows: the same context retrieved, the same line
        assert cli(*asked, "--prompt", case["before"].replace("\n", "\r\n")).out == result.out


@pytest.mark.parametrize("typed", ["    ", "        ", "\t"], ids=["its indentation", "deeper", "a tab"])
def test_a_cursor_after_the_indentation_an_editor_wrote_gets_the_rest_of_the_line(pretrained_run, cli, typed):
    """The text before the cursor ends in the indentation an editor writes on a new line: the question is
    the scoreboard's (the line's start), and the answer is what an editor inserts at the cursor: the line
    after that indentation, or, where the line is indented otherwise, the line without its own. The lookup
    answers without a model; the model's answers are cut alike (tests/test_serve.py)."""
    _, case = held_out_lines(pretrained_run, "code")[0]
    asked = (
        "generate",
        "--adapter",
        pretrained_run,
        "--task",
        "code",
        "--path",
        case["path"],
        "--system",
        "lookup",
    )
    whole = cli(*asked, "--prompt", case["before"]).out
    assert whole.startswith("    return ")  # at the line's start: the line, indented 4 spaces
    indented = cli(*asked, "--prompt", case["before"] + typed)
    assert indented.code == 0 and indented.out == whole.lstrip(" ")


def test_text_after_the_cursor_is_read_as_context_and_said_unread_where_nothing_reads_it(pretrained_run, cli):
    """smollm2-135m has no fill-in-the-middle tokens: with retrieved context (the run's choice) `--after`
    is read, its lines most like those before the cursor a chunk of the context, as the scoreboard gave
    the case's, and the answer is the scoreboard's; without context it is said to be unread."""
    row, case = held_out_lines(pretrained_run, "code_context")[0]
    asked = ("generate", "--adapter", pretrained_run, "--task", "code", "--path", case["path"])
    result = cli(*asked, "--prompt", case["before"], "--after", case["after"])
    assert result.code == 0 and result.out == row["fine_tuned"] + "\n" and result.err == ""
    alone = cli(*asked, "--system", "model", "--prompt", case["before"], "--after", "    return total\n")
    assert alone.code == 0 and alone.err == "--after not read: the model has no fill-in-the-middle tokens\n"
    misplaced = cli("generate", "--adapter", pretrained_run, "--prompt", "x", "--after", "y")
    assert (
        misplaced.code == 2
        and "--after says where in a file a next line or a block is written" in misplaced.err
    )


def held_out_lines(run: Path, task: str) -> list[tuple[dict, dict]]:
    """Each of `run`'s scored `task` questions (evaluation.jsonl) with its case (completions.jsonl)."""
    cases = [orjson.loads(line) for line in (run / "completions.jsonl").read_bytes().splitlines()]
    scored = [orjson.loads(line) for line in (run / "evaluation.jsonl").read_bytes().splitlines()]
    found = []
    for row in scored:
        if row["task"] == task:
            path = row["given"].split("\n", 1)[0]
            found.append((row, next(
                case for case in cases
                if (case["commit"], case["path"], case["line"]) == (row["commit"], path, row["reference"])
            )))  # fmt: skip
    assert found
    return found


def test_a_next_line_asked_wrongly_is_one_line(tiny_run, cli):
    no_path = cli("generate", "--adapter", tiny_run, "--task", "code", "--prompt", "x = 1")
    assert no_path.code == 2 and "--task code and block need --path" in no_path.err
    asked = ("generate", "--adapter", tiny_run, "--prompt", "x = 1")
    selector = cli(*asked, "--task", "code", "--path", "a.py", "--system", "selector")
    assert (
        selector.code == 2
        and "--system selector: with --task code or block, one of model-context" in selector.err
    )
    base = cli(*asked, "--task", "message", "--system", "base")
    assert base.code == 2 and "--system base: with --task message, one of lookup, selector, model" in base.err


def test_a_model_is_named_after_the_repository_it_trained_on(tmp_path):
    """What serve and Ollama call a model: the repository recorded beside the adapter, cleaned for a name;
    an adapter older than that record, the repository its files came from, else its run's folder."""
    from pipeline.use.generate import model_name

    adapter = tmp_path / "run" / "adapter"
    adapter.mkdir(parents=True)
    assert model_name(adapter) == "repotune-run"
    (adapter / "files.jsonl").write_bytes(orjson.dumps({"repo": "Old Name.git", "path": "a.py"}) + b"\n")
    assert model_name(adapter) == "repotune-old-name"
    (adapter / "repotune.json").write_bytes(orjson.dumps({"model": "tiny", "repository": "Flask"}))
    assert model_name(adapter) == "repotune-flask"
