"""`serve`: a real server process on 127.0.0.1, talked to by the official OpenAI client."""

from __future__ import annotations

import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import orjson
import pytest

import run_pipeline
from pipeline.use.generate import after_typed
from tests.conftest import FAST_TRAINING, WITH_FILES, GitRepo, module_source

if TYPE_CHECKING:  # the client is imported by the tests that use it: every worker collects this module
    import openai

ROOT = Path(__file__).resolve().parent.parent

DIFF = (
    "diff --git a/pkg/feature_3.py b/pkg/feature_3.py\n--- a/pkg/feature_3.py\n+++ b/pkg/feature_3.py\n"
    "@@ -1,3 +1,3 @@\n-def compute_3(values):\n+def compute_3(values, scale=1):\n     total = 0\n"
)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serve")
    repo = GitRepo(root / "repo")
    for index in range(1, 25):
        repo.commit(f"Add compute_{index}", {f"pkg/feature_{index}.py": module_source(index)})
    out = root / "out"
    argv = [
        "--repo",
        str(repo.path),
        "--output-dir",
        str(out),
        *FAST_TRAINING,
        *WITH_FILES,
        "--set",
        "train.epochs=1",
    ]
    assert run_pipeline.main(argv) == 0
    return out


def start(*argv: str) -> tuple[subprocess.Popen, str]:
    """A `serve` process and the base URL it says it listens on (or the process, ended, and its last line)."""
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "run_pipeline.py"), "serve", *argv],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    said = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stderr], [], [], 1)
        if ready:
            line = process.stderr.readline()
            if not line:  # it ended
                process.wait()
                return process, said[-1] if said else ""
            said.append(line.strip())
            if line.startswith("serving "):
                return process, line.split(" on ", 1)[1].split(" ", 1)[0]
    process.kill()
    raise AssertionError("serve never said it was listening: " + " | ".join(said))


@pytest.fixture(scope="module")
def served(adapter):
    process, url = start("--adapter", str(adapter), "--port", "0")
    yield process, url
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture
def client(served) -> openai.OpenAI:
    import openai

    return openai.OpenAI(base_url=served[1], api_key="none", max_retries=0, timeout=60)


def test_the_server_lists_its_one_model_named_after_the_repository(client):
    assert [model.id for model in client.models.list()] == ["repotune-repo"]


def test_a_completion_streams_what_it_answers_whole(client):
    prompt = "def compute_3(values):\n    total = 0\n"
    whole = client.completions.create(model="repotune-repo", prompt=prompt, max_tokens=12, temperature=0)
    choice = whole.choices[0]
    assert choice.finish_reason in ("stop", "length") and whole.usage.completion_tokens <= 12
    streamed = list(
        client.completions.create(
            model="repotune-repo", prompt=prompt, max_tokens=12, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == choice.text
    assert streamed[-2].choices[0].finish_reason == choice.finish_reason
    # The usage, asked for, ends the stream in a chunk of no choices, as OpenAI's does.
    assert not streamed[-1].choices and streamed[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert streamed[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_a_cursor_at_the_start_of_a_line_gets_the_line_as_the_code_scoreboard_heals_it(client, adapter):
    """A prompt that ends in a line break (an editor's cursor on a new line) is read without it, and the
    answer begins with a token that holds it, as the code scoreboard asks a next line (token healing):
    read as it came, it is a prompt the model never saw code end with, and answered with another line
    break, a blank suggestion."""
    from pipeline.suggest.decoding import generate_batched
    from pipeline.use.generate import load_adapter

    prompt = module_source(3).split("    total")[0]  # the cursor below `def compute_3(values):`
    asked = {"model": "repotune-repo", "prompt": prompt, "max_tokens": 12, "stop": ["\n"]}
    answer = client.completions.create(**asked).choices[0].text
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(**asked, stream=True))
    model, tokenizer = load_adapter(adapter)
    expected = generate_batched(model, tokenizer, [prompt[:-1]], 12, "fp32", next_line=True)[0]
    assert answer == streamed == expected and answer.strip()


def test_a_healed_answer_counts_every_token_the_model_wrote(client):
    """The usage counts the tokens generated, the ones that spell the healed line break included, and
    `finish_reason` says `max_tokens` ended the answer: counted again from the answer's text, which
    leaves that line break out, a healed answer came out a token short and said "stop"."""
    prompt = module_source(3).split("    total")[0]  # ends a line: healed
    asked = {"model": "repotune-repo", "prompt": prompt, "max_tokens": 6, "temperature": 0}
    whole = client.completions.create(**asked)
    streamed = list(client.completions.create(**asked, stream=True, stream_options={"include_usage": True}))
    assert whole.choices[0].finish_reason == streamed[-2].choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == streamed[-1].usage.completion_tokens == 6
    cut = client.completions.create(**asked, stop=["\n"])
    assert cut.choices[0].finish_reason == "stop" and 1 <= cut.usage.completion_tokens <= 6


def test_a_cursor_after_the_indentation_an_editor_wrote_gets_the_rest_of_that_line(client):
    """An editor indents a new line before it asks (Continue sends the text before the cursor): the
    indentation is healed with the line break before it, so the answer is the line the model writes at
    the line's start, less the indentation already there; read as it came, the model sees a run of
    spaces it never saw code split so, and answers a blank or a space too many."""
    prompt = module_source(3).split("    total")[0]  # the cursor below `def compute_3(values):`
    asked = {"model": "repotune-repo", "max_tokens": 12, "stop": ["\n"]}
    line = client.completions.create(prompt=prompt, **asked).choices[0].text
    assert line.startswith("    ") and line.strip()
    indented = client.completions.create(prompt=prompt + "    ", **asked).choices[0].text
    streamed = client.completions.create(prompt=prompt + "    ", stream=True, **asked)
    assert indented == "".join(chunk.choices[0].text for chunk in streamed) == line[4:]


def test_a_file_written_on_windows_is_read_with_lf_and_answered_in_its_own_line_endings(client):
    """Its lines end in CR LF: read as they are, the prompt ends in a bare CR, which the model never saw
    code end with (its files were trained on with LF: `scrapers.files`); read with LF, the answer is the LF file's, written back in CR LF,
    and a stop sequence the editor gives in CR LF ends it where its line ends."""
    prompt = module_source(3).split("    total")[0]  # ends a line: healed
    asked = {"model": "repotune-repo", "max_tokens": 12, "temperature": 0}
    unix = client.completions.create(prompt=prompt, **asked).choices[0].text
    windows = prompt.replace("\n", "\r\n")
    answer = client.completions.create(prompt=windows, **asked).choices[0].text
    streamed = "".join(
        chunk.choices[0].text for chunk in client.completions.create(prompt=windows, stream=True, **asked)
    )
    assert answer == streamed == unix.replace("\n", "\r\n") and "\n" in unix
    line = client.completions.create(prompt=windows, stop=["\r\n"], **asked).choices[0].text
    assert line == unix.split("\n")[0] and line.strip()


def test_a_request_that_begins_as_a_recent_one_reads_only_what_follows_and_answers_the_same(client):
    """An editor's next request in a file shares an earlier one's beginning, with requests for another
    file between them: its keys and values are reused (`cached_tokens`, as OpenAI reports them), and
    the answer is the one read whole. The last KEPT_CACHES answers are kept, no more."""
    from pipeline.use.serve import KEPT_CACHES

    def ask(prompt: str, tokens: int = 6):
        return client.completions.create(model="repotune-repo", prompt=prompt, max_tokens=tokens)

    start = "def compute_3(values):\n    total = 0\n"
    longer = start + "    for value in values:\n"
    ask(start)
    ask("import os\n\nPATH = os.environ\n", 2)  # another file in between
    reused = ask(longer)
    assert reused.usage.prompt_tokens_details.cached_tokens > 0
    for index in range(KEPT_CACHES):
        # Other files, as many as are kept, each beginning as the last did ("x_"): too little of it to
        # take its place.
        ask(f"x_{index} = {index}\n", 2)
    whole = ask(longer)
    assert whole.usage.prompt_tokens_details.cached_tokens == 0
    assert whole.choices[0].text == reused.choices[0].text


def test_a_request_that_outgrows_a_kept_cache_reads_anew_into_one_with_room(client):
    """A kept cache has room for its request, its answer and CACHE_ROOM more tokens (a cache of fixed size,
    written in place): a request in the same file past that reads it anew, into a cache with room for
    it, which the next request there reuses."""
    from pipeline.use.serve import CACHE_ROOM

    def ask(prompt: str):
        return client.completions.create(model="repotune-repo", prompt=prompt, max_tokens=4).usage

    start = "def compute_4(values):\n    total = 0\n"
    ask(start)
    grown = start + "".join(f"    total += values[{index}]\n" for index in range(100))
    outgrown = ask(grown)
    assert outgrown.prompt_tokens > 2 * CACHE_ROOM and outgrown.prompt_tokens_details.cached_tokens == 0
    assert ask(grown + "    return total\n").prompt_tokens_details.cached_tokens > 2 * CACHE_ROOM


def test_a_guess_is_what_followed_the_last_tokens_where_they_last_occurred():
    from pipeline.use.serve import guess

    assert guess([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 2) == [7, 5]  # the most recent, not the first
    assert guess([4, 2, 3, 8, 1, 2, 3], 3) == [8, 1, 2]  # a shorter run where the longest never occurred
    assert guess([1, 2, 3], 5) == [] and guess([1, 1, 1], 0) == []


def test_a_completion_that_names_its_file_gets_the_next_line_generate_writes(client, adapter, cli):
    """With `path` (an extra field), the server answers as `generate --task code` does: the run's code
    system, the repository's context retrieved, one line; after the indentation an editor writes on the
    new line, that line after it."""
    before = "def compute_3(values):\n    total = 0\n"
    local = cli(
        "generate", "--adapter", adapter, "--task", "code", "--path", "pkg/feature_3.py", "--prompt", before
    )
    served = client.completions.create(
        model="repotune-repo", prompt=before, max_tokens=32, extra_body={"path": "pkg/feature_3.py"}
    )
    assert local.code == 0 and served.choices[0].text + "\n" == local.out
    streamed = client.completions.create(
        model="repotune-repo", prompt=before, stream=True, extra_body={"path": "pkg/feature_3.py"}
    )
    assert "".join(chunk.choices[0].text for chunk in streamed) == served.choices[0].text
    indented = client.completions.create(
        model="repotune-repo", prompt=before + "    ", max_tokens=32, extra_body={"path": "pkg/feature_3.py"}
    )
    assert indented.choices[0].text == after_typed(served.choices[0].text, "    ")


def test_a_suffix_is_read_as_training_infilled_files(served, adapter, cli):
    """tiny has fill-in-the-middle tokens: a completion's `suffix` is the text after the cursor, in the
    order its training's infilled files were (prefix, suffix, middle), and with `path` the next line reads
    it as `generate --task code --after` does."""
    before, after = "def compute_3(values):\n    total = 0", "\n    return total\n"
    asked = {"model": "repotune-repo", "prompt": before, "max_tokens": 8}
    infill = httpx.post(f"{served[1]}/completions", json={**asked, "suffix": after}, timeout=60)
    spelled = {**asked, "prompt": f"<fim_prefix>{before}<fim_suffix>{after}<fim_middle>"}
    written = httpx.post(f"{served[1]}/completions", json=spelled, timeout=60)
    assert infill.status_code == written.status_code == 200 and "x-repotune-suffix" not in infill.headers
    assert infill.json()["choices"][0]["text"] == written.json()["choices"][0]["text"]
    path = {**asked, "max_tokens": 32, "path": "pkg/feature_3.py", "suffix": "    return total\n"}
    line = httpx.post(f"{served[1]}/completions", json=path, timeout=60)
    local = cli(
        "generate", "--adapter", adapter, "--task", "code", "--path", "pkg/feature_3.py", "--prompt", before + "\n",
        "--after", "    return total\n",
    )  # fmt: skip
    assert line.status_code == 200 and local.code == 0 and not local.err
    assert line.json()["choices"][0]["text"] + "\n" == local.out


def test_an_autocomplete_request_as_continue_sends_it_is_answered(client):
    """Continue's autocomplete, for a model whose name it does not know: the infill template, streamed,
    with its template's 7 stop strings (it gives a local server all it has, where OpenAI's service takes
    4)."""
    stops = [
        "<fim_prefix>",
        "<fim_suffix>",
        "<fim_middle>",
        "<file_sep>",
        "<|endoftext|>",
        "</fim_middle>",
        "</code>",
    ]
    prompt = f"<fim_prefix>{module_source(3).split('    total')[0]}<fim_suffix>    return total\n<fim_middle>"
    chunks = client.completions.create(
        model="repotune-repo", prompt=prompt, max_tokens=12, temperature=0.01, stop=stops, stream=True
    )
    assert all(stop not in "".join(chunk.choices[0].text for chunk in chunks) for stop in stops)


def test_an_editors_infill_template_is_read_as_its_prefix_by_a_model_that_cannot_infill():
    """Editors send a model they do not know StarCoder's `<fim_prefix>…<fim_suffix>…<fim_middle>`
    (Continue's default autocomplete template): a model without those tokens (SmolLM2) reads the prefix,
    healed where it ends a line, the suffix said unread; one with them (tiny, above) reads it as sent.
    The engine is its two facts the request's reading depends on: the model's answer is the test above's."""
    from types import SimpleNamespace

    from pipeline.use.serve import SUFFIX_HEADER, _completion

    sent = "<fim_prefix>def add(a, b):\n<fim_suffix>\n\nprint(add(1, 2))\n<fim_middle>"
    plain = SimpleNamespace(infills=False, heals=True)
    asked, headers = _completion(plain, {"prompt": sent}, sent)
    assert (asked.prompt, asked.healed, list(headers)) == ("def add(a, b):\n", "\n", [SUFFIX_HEADER])
    infilling = SimpleNamespace(infills=True, heals=True)
    asked, headers = _completion(infilling, {"prompt": sent}, sent)
    assert (asked.prompt, asked.healed, headers) == (sent, "", {})


def test_a_diff_in_a_chat_gets_the_runs_commit_message_and_its_alternatives(client, adapter, cli):
    """The run's suggestion system answers, as `generate --task message --alternatives` does; a chat
    the model cannot hold (the tiny model trained raw, with no chat template) is refused in one line."""
    import openai

    asked = [{"role": "user", "content": f"Write the commit message for this change:\n{DIFF}"}]
    message = client.chat.completions.create(model="repotune-repo", messages=asked, n=3)
    local = cli(
        "generate", "--adapter", adapter, "--task", "message", "--prompt", DIFF, "--alternatives", "2"
    )
    first, *rest = [line for line in local.out.splitlines() if line.strip()]
    expected = [first, *(line.split(". ", 1)[1] for line in rest[1:])]  # "# 1. …" below the heading
    assert [choice.message.content for choice in message.choices] == expected[: len(message.choices)]
    assert message.usage.prompt_tokens_details.cached_tokens == 0  # a chat's usage is a completion's
    # Streamed, as an editor's chat asks (Continue's always does): the same messages, as chunks.
    streamed: dict[int, str] = {}
    for chunk in client.chat.completions.create(model="repotune-repo", messages=asked, n=3, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert [streamed[i] for i in sorted(streamed)] == [choice.message.content for choice in message.choices]
    with pytest.raises(openai.BadRequestError) as raw:
        client.chat.completions.create(model="repotune-repo", messages=[{"role": "user", "content": "Hello"}])
    assert raw.value.body["message"].startswith("the model has no chat template (it trained on raw text)")


def test_bad_requests_are_one_line_in_openais_error_shape(client, served):
    import openai

    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4o", prompt="x = 1", max_tokens=2)
    assert missing.value.body["message"] == "model 'gpt-4o': this server has 'repotune-repo' (GET /v1/models)"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model="repotune-repo", prompt="x = 1\n" * 50, max_tokens=100_000)
    assert (
        "the model reads at most" in too_long.value.body["message"]
        and too_long.value.body["param"] == "max_tokens"
    )
    broken = httpx.post(f"{served[1]}/completions", content=b"{not json", timeout=30)
    assert broken.status_code == 400 and broken.json()["error"]["message"].startswith(
        "the request body is not JSON"
    )
    streamed_badly = {"prompt": "x", "stream": True, "stream_options": "usage"}
    for bad in (
        {"prompt": ""},
        {"prompt": "x", "temperature": 5},
        {"prompt": "x", "max_tokens": 0},
        streamed_badly,
    ):
        refused = httpx.post(f"{served[1]}/completions", json=bad, timeout=30).json()["error"]
        assert refused["type"] == "invalid_request_error" and "\n" not in refused["message"]


def test_a_client_that_leaves_mid_stream_stops_its_generation(client, served):
    """The server stops writing for a client that left, and the next request is answered."""
    with httpx.stream(
        "POST", f"{served[1]}/completions", timeout=60,
        json={"prompt": "def compute_3(values):\n", "max_tokens": 200, "stream": True, "temperature": 0},
    ) as response:  # fmt: skip
        next(response.iter_lines())
    said = said_next(served[0])
    assert said.startswith("serve: a client left after ") and said.endswith("its generation stopped")
    after = client.completions.create(model="repotune-repo", prompt="x = ", max_tokens=2)
    assert after.choices[0].finish_reason in ("stop", "length")


def said_next(process: subprocess.Popen, timeout_s: float = 30) -> str:
    """The next line the server writes to its standard error."""
    ready, _, _ = select.select([process.stderr], [], [], timeout_s)
    assert ready, "the server said nothing"
    return process.stderr.readline().strip()


def test_a_port_in_use_and_a_directory_that_is_no_adapter_are_one_line(served, adapter, tmp_path):
    port = served[1].rsplit(":", 1)[1].split("/", 1)[0]
    process, said = start("--adapter", str(adapter), "--port", port)
    assert process.returncode == 2
    assert (
        said
        == f"repotune: error: --port {port}: cannot listen on 127.0.0.1:{port} (Address already in use): give another --port"
    )
    process, said = start("--adapter", str(tmp_path), "--port", "0")
    assert process.returncode == 2 and said.startswith(
        f"repotune: error: --adapter {tmp_path}: no adapter_config.json"
    )


def test_the_commit_hook_asks_a_running_server_and_loads_the_model_itself_without_one(
    adapter, tmp_path, monkeypatch
):
    """Where the run chose the model to suggest, the hook takes the message from a `serve` of its adapter
    (SERVE_FILE beside it says where), not loading the model per commit; once the server stops, the file
    is gone and the hook answers as before."""
    import openai

    from pipeline.use import generate
    from pipeline.use.hook import SERVE_FILE, staged_diff
    from tests.test_take_home import suggested_in_process

    run = tmp_path / "run"
    # the tiny model's saved base travels with the run's folder; the module's own server's file does not
    shutil.copytree(adapter, run, ignore=shutil.ignore_patterns("serve.json"))
    system = run / "adapter" / "retrieval" / "system.json"
    system.write_bytes(orjson.dumps({**orjson.loads(system.read_bytes()), "system": "model"}))
    work = GitRepo(tmp_path / "work")
    work.commit("Add compute_1", {"pkg/feature_1.py": module_source(1)})
    monkeypatch.setattr(generate, "generate", lambda *args, **kwargs: "Written in the hook's process")
    process, url = start("--adapter", str(run), "--port", "0")
    try:
        assert orjson.loads((run / "adapter" / SERVE_FILE).read_bytes())["url"] == url
        shown = suggested_in_process(work, tmp_path, monkeypatch, str(run / "adapter"), "60", "2")
        asked = [{"role": "user", "content": staged_diff()}]
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        answer = (
            client.chat.completions.create(model="repotune-repo", messages=asked).choices[0].message.content
        )
        assert shown.startswith(answer.strip() + "\n") and "Written in the hook's process" not in shown
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert not (run / "adapter" / SERVE_FILE).exists()
    alone = suggested_in_process(work, tmp_path, monkeypatch, str(run / "adapter"), "60", "2")
    assert alone.splitlines()[0] == "Written in the hook's process"
