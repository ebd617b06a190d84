#!/usr/bin/env python3
"""How fast `serve` answers an editor, warm, through the real HTTP path, against a cold `generate`.

    python benchmarks/bench_serve.py --adapter RUN_DIR [--requests 20] [--clients 4] [--leak-requests 1000]
        [--shorter 512,256] [--name flask] [--llama-server /path/to/llama-server] [--typed-files 8]

Starts `run_pipeline.py serve` on a free port and asks it, with the official OpenAI client, for the next
line of `--requests` files of the run's split point (RUN_DIR/adapter/files.jsonl), each cut at a line
break to about `--context-tokens` tokens before the cursor (1,024; a shorter file before its last line),
streamed, stopping at the line break: the time to the first token and to the complete line, p50 and p95,
and how many lines came back blank; then the same cursors after the next line's indentation (as an
editor indents a new line before it asks); then the same prompts cut to their last lines within
`--shorter` tokens (512 and 256: the same cursor, for an editor set to send less before it). Then the
same requests from `--clients` clients at once (every request answered, and what waiting for the one
model costs), then an editor typing in one file (the cursor a line further each request) with the last
request's cached keys and values kept and evicted, in two files by turns, and with only the last lines
within the smallest `--shorter` budget sent (as Continue cuts what it sends from the top), then
`--leak-requests` short requests with the server's resident memory before and after. The baseline, in
the same run: `generate --task code` as a fresh process for a few of the same files (what a tool that
shells out pays each time). The goal (issue 72): p50 ≤ 500 ms to a complete next line. With
`--llama-server`, llama.cpp's server binary, the same editor typing in `--typed-files` files (10 lines
each) through serve and through llama-server serving the exported GGUF (f16, the merged weights): asked
as an editor asks (the text up to a cursor at a line's start), and with that last line break left for
the model to write (what serve's healing asks; llama-server has none); each line scored against the
file's own next line (exact match and edit similarity, intervals resampled by file). Everything it prints
goes to benchmarks/results/serve-NAME.json too, which docs/use.md's figures are generated from.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measured import RESULTS, measured_by, name_option, percentile, repository_name, write_result  # noqa: E402  (after the path it is found on)

GOAL_S = 0.5
KEPT_FILES = 3  # files typed in, 12 lines each, one after another, with the cache kept and evicted


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--adapter", required=True, help="a run's output directory")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--context-tokens", type=int, default=1024)
    parser.add_argument(
        "--shorter",
        default="512,256",
        help="the same prompts' last lines within these many tokens, one client (comma-separated)",
    )
    parser.add_argument("--leak-requests", type=int, default=1000)
    parser.add_argument(
        "--llama-server", metavar="PATH", help="llama.cpp's server binary: the same typing through it, beside"
    )
    parser.add_argument("--typed-files", type=int, default=8, help="files typed in, with --llama-server")
    parser.add_argument(
        "--cold", type=int, default=3, help="cold `generate --task code` processes (the baseline)"
    )
    name_option(parser)
    args = parser.parse_args()

    import openai
    import psutil
    from transformers import AutoTokenizer

    from pipeline.use.generate import adapter_directory

    directory = adapter_directory(args.adapter)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    files = [orjson.loads(line) for line in (directory / "files.jsonl").read_bytes().splitlines()]
    cases = contexts(files, tokenizer, args.context_tokens, args.requests)
    mean_tokens = statistics.mean(tokens for _, _, tokens in cases)
    print(f"{len(cases)} files, {mean_tokens:.0f} tokens before the cursor on average")
    measured: dict = {
        "files": len(cases), "context_tokens": args.context_tokens, "tokens_mean": mean_tokens, "goal_s": GOAL_S
    }  # fmt: skip

    process, url = start_server(args.adapter)
    try:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)
        name = client.models.list().data[0].id
        ask(client, name, cases[0][1])  # warm: the first request pays for what loads lazily
        alone = [ask(client, name, prompt) for _, prompt, _ in cases]
        measured["one_client"] = report("one client", alone)
        texts = {record["path"]: record["text"] for record in files}
        indented = [prompt + indentation(texts[path], prompt) for path, prompt, _ in cases]
        measured["indented"] = report(
            "one client, the cursor after the next line's indentation",
            [ask(client, name, prompt) for prompt in indented],
        )
        measured["shorter"] = []
        budgets = [int(tokens) for tokens in args.shorter.split(",") if tokens] or [args.context_tokens]
        for budget in budgets:
            cut = [last_lines(prompt, tokenizer, budget) for _, prompt, _ in cases]
            timed = [ask(client, name, prompt) for prompt in cut]
            said = report(f"one client, at most {budget} tokens before the cursor", timed)
            tokens = statistics.mean(
                len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) for prompt in cut
            )
            measured["shorter"].append({"context_tokens": budget, "tokens_mean": tokens, **said})
        together, failed = concurrently(client, name, cases, args.clients)
        measured["clients"] = {
            "clients": args.clients, "failed": failed,
            **report(f"{args.clients} clients at once", together),
        }  # fmt: skip
        measured |= typing(client, name, [prompt for _, prompt, _ in cases], tokenizer, min(budgets))
        typed = [(path, cursors(prompt, 10)) for path, prompt, _ in cases[: args.typed_files]]
        served = typed_lines(client, name, typed, ask) if args.llama_server else []
        server = psutil.Process(process.pid)
        before = server.memory_info().rss
        for index in range(args.leak_requests):
            client.completions.create(model=name, prompt=f"x_{index} = ", max_tokens=2, temperature=0)
        after = server.memory_info().rss
        print(
            f"resident memory over {args.leak_requests} requests: {before / 1e6:.0f} MB → {after / 1e6:.0f} MB "
            f"({(after - before) / 1e6:+.0f} MB)"
        )
        measured["memory"] = {
            "requests": args.leak_requests,
            "before_mb": before / 1e6,
            "after_mb": after / 1e6,
        }
    finally:
        process.terminate()
        process.wait(timeout=60)
    if args.llama_server:
        measured["llama_server"] = through_llama_server(args.adapter, args.llama_server, typed, served, texts)
    cold = [cold_generate(args.adapter, path, prompt) for path, prompt, _ in cases[: args.cold]]
    cold_p50, warm_p50 = percentile(cold, 50), measured["one_client"]["line_p50_s"]
    print(f"baseline, `generate --task code` as a fresh process: p50 {cold_p50:.2f} s over {len(cold)}")
    print(
        f"serve, warm, complete next line: p50 {warm_p50:.2f} s: {cold_p50 / warm_p50:.1f}× as fast as the baseline"
    )
    for asked, p50 in (
        ("a file's first request", warm_p50),
        ("typing", measured["typing_kept"]["line_p50_s"]),
    ):
        print(
            f"goal p50 ≤ {GOAL_S:.1f} s to a complete next line, {asked}: {'met' if p50 <= GOAL_S else 'not met'}"
        )
    measured["baseline"] = {"processes": len(cold), "p50_s": cold_p50}
    run = orjson.loads((Path(args.adapter) / "MANIFEST.json").read_bytes())
    name = repository_name(args.name, run["repository"]["path"])
    path = write_result(RESULTS / f"serve-{name}.json", provenance(run, args.adapter) | measured)
    print(f"results: {path}")


def provenance(run: dict, directory: str) -> dict:
    """What measured (measured_by()) and which run's adapter it served, in what precision."""
    from pipeline.use.generate import Answerer

    adapter = {
        "repository": run["repository"]["path"],
        "model": run["model"]["name"],
        "budget": run["config"]["effective"]["train"]["time_budget"],
        "precision": Answerer(directory).precision,
    }
    return measured_by() | {"adapter": adapter}


def contexts(files: list[dict], tokenizer, budget: int, count: int) -> list[tuple[str, str, int]]:
    """(path, text before the cursor, its tokens) for up to `count` files: each cut at the line break
    where its first `budget` tokens end, a line of the file still after the cursor (a file shorter than
    that is cut before its last line: at a file's end there is no next line to write)."""
    found = []
    for record in files:
        ids = tokenizer(record["text"], add_special_tokens=False)["input_ids"]
        text = tokenizer.decode(ids[:budget])
        text = text[: text.rfind("\n") + 1]
        if not record["text"][len(text) :].strip():
            whole = record["text"].rstrip()
            text = whole[: whole.rfind("\n") + 1]
        if text.strip():
            found.append((record["path"], text, len(tokenizer(text, add_special_tokens=False)["input_ids"])))
        if len(found) == count:
            break
    return found


def indentation(text: str, prompt: str) -> str:
    """The spaces and tabs that begin the line after `prompt` in `text`: what an editor writes on a new
    line before it asks."""
    after = text[len(prompt) :]
    return after[: len(after) - len(after.lstrip(" \t"))]


def last_lines(prompt: str, tokenizer, budget: int) -> str:
    """The whole lines at the end of `prompt` within its last `budget` tokens: the same cursor, with
    less before it, as an editor that sends fewer tokens cuts its prefix."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if len(ids) <= budget:
        return prompt
    text = tokenizer.decode(ids[-budget:])
    return text[text.find("\n") + 1 :] if "\n" in text else text


def start_server(adapter: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "run_pipeline.py"), "serve", "--adapter", adapter, "--port", "0"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    for line in process.stderr:
        if line.startswith("serving "):
            threading.Thread(
                target=lambda: [None for _ in process.stderr], daemon=True
            ).start()  # keep draining
            return process, line.split(" on ", 1)[1].split(" ", 1)[0]
    raise SystemExit(f"serve did not start (exit {process.wait()})")


def ask(client, name: str, prompt: str) -> tuple[float, float, str]:
    """Seconds to the first token and to the complete next line, streamed, and the line."""
    started = time.perf_counter()
    first = None
    stream = client.completions.create(
        model=name, prompt=prompt, max_tokens=32, temperature=0, stop=["\n"], stream=True
    )
    line = ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            first = first or time.perf_counter() - started
            line += chunk.choices[0].text
    done = time.perf_counter() - started
    return (done if first is None else first), done, line


def typing(client, name: str, texts: list[str], tokenizer, window: int, steps: int = 12) -> dict:
    """An editor's successive requests in a file, the cursor a line further each time, in KEPT_FILES files
    one after another (so that a p50 is not one file's): with the last request's keys and values kept
    (what serve does), and with them evicted before each (`typed_in`): what the reuse buys; two files
    typed in by turns, each request finding its file's keys and values among those kept; and one file
    with only the lines within `window` tokens before the cursor sent, as Continue cuts its prefix from
    the top: a request then begins where the last one did not, and reads it all. Each under its results
    key."""
    typed = [cursors(text, steps) for text in texts[:KEPT_FILES]]
    kept, evicted = typed_in(client, name, typed), typed_in(client, name, typed, evicted=True)
    first, second = typed[0], typed[1]
    ask(client, name, first[0])
    ask(client, name, second[0])
    by_turns = [
        ask(client, name, prompt) for pair in zip(first[1:], second[1:], strict=False) for prompt in pair
    ]
    windowed = [last_lines(prompt, tokenizer, window) for prompt in first]
    ask(client, name, windowed[0])
    in_window = [ask(client, name, prompt) for prompt in windowed[1:]]
    kept_said = report("typing, the last request's cache kept", kept)
    evicted_said = report("typing, the cache evicted before each", evicted)
    turns_said = report("typing in two files by turns", by_turns)
    window_said = report(f"typing, the last {window} tokens' lines before the cursor", in_window)
    was, now = evicted_said["line_p50_s"], kept_said["line_p50_s"]
    print(
        f"reusing the shared beginning: complete line p50 {was:.2f} s → {now:.2f} s ({was / now:.1f}× as fast)"
    )
    return {
        "typing_kept": {"files": len(typed), **kept_said}, "typing_evicted": {"files": len(typed), **evicted_said},
        "typing_by_turns": turns_said, "typing_in_window": {"context_tokens": window, **window_said},
    }  # fmt: skip


def typed_in(
    client, name: str, typed: list[list[str]], evicted: bool = False
) -> list[tuple[float, float, str]]:
    """Each file's cursors (`typed`) asked in order, its first not timed; with `evicted`, as many other
    files' requests as serve keeps before each (not timed), each beginning with another token, so that
    none takes another's place."""
    from pipeline.use.serve import KEPT_CACHES

    timed = []
    for number, prompts in enumerate(typed):
        ask(client, name, prompts[0])
        for index, prompt in enumerate(prompts[1:]):
            for other in range(KEPT_CACHES if evicted else 0):
                other_file = f"{chr(65 + other)}_{number}_{index} = "
                client.completions.create(model=name, prompt=other_file, max_tokens=1, temperature=0)
            timed.append(ask(client, name, prompt))
    return timed


def cursors(text: str, steps: int) -> list[str]:
    """The text before a cursor at each of the last `steps` + 1 lines of `text`."""
    lines = text.splitlines(keepends=True)
    start = max(1, len(lines) - steps)
    return ["".join(lines[: start + k]) for k in range(min(steps, len(lines) - start) + 1)]


def concurrently(
    client, name: str, cases: list[tuple[str, str, int]], clients: int
) -> tuple[list[tuple[float, float, str]], int]:
    results: list[tuple[float, float, str]] = []
    failures: list[str] = []

    def work(mine: list[str]) -> None:
        for prompt in mine:
            try:
                results.append(ask(client, name, prompt))
            except Exception as error:  # counted, not raised: the benchmark says how many failed
                failures.append(f"{type(error).__name__}: {error}")

    prompts = [prompt for _, prompt, _ in cases]
    threads = [threading.Thread(target=work, args=(prompts[i::clients],)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(
        f"{clients} clients: {len(results)} answered, {len(failures)} failed"
        + (f" ({failures[0]})" if failures else "")
    )
    return results, len(failures)


def typed_lines(client, name: str, typed: list[tuple[str, list[str]]], asking) -> list[tuple]:
    """(path, cursor's text, `asking`'s timing and line) for each file's cursors in turn, a line further
    each request; each file's first cursor is asked untimed (it reads the file)."""
    rows = []
    for path, prompts in typed:
        asking(client, name, prompts[0])
        rows += [(path, prompt, asking(client, name, prompt)) for prompt in prompts[1:]]
    return rows


def ask_before_break(client, name: str, prompt: str) -> tuple[float, float, str]:
    """`ask`, with the prompt's last line break left for the model to write (as serve heals a prompt; a
    server without healing reads a prompt that ends in one as code never ends): the line is what follows
    the first line break it writes, complete at the next."""
    started = time.perf_counter()
    first = None
    stream = client.completions.create(
        model=name, prompt=prompt.removesuffix("\n"), max_tokens=40, temperature=0, stream=True
    )
    written = ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            written += chunk.choices[0].text
            line = written[1:] if written.startswith("\n") else ""
            first = first or (time.perf_counter() - started if line else None)
            if "\n" in line or not written.startswith("\n"):
                stream.close()  # the line is complete: llama-server stops generating when the client leaves
                break
    done = time.perf_counter() - started
    line = written[1:].split("\n", 1)[0] if written.startswith("\n") else ""
    return (done if first is None else first), done, line


def through_llama_server(
    adapter: str, binary: str, typed: list[tuple[str, list[str]]], served: list[tuple], texts: dict[str, str]
) -> dict:
    """The same typing through llama-server serving the exported GGUF (f16), as an editor asks and with
    the last line break left for the model; each system's lines scored against the files' next lines,
    and llama-server's − serve's, paired, intervals resampled by file."""
    import os
    import tempfile

    import openai

    from benchmarks.bench_gguf import LlamaServer
    from pipeline.evaluate.metrics import paired_difference, score_code
    from pipeline.scores import difference
    from pipeline.use.export import export

    with tempfile.TemporaryDirectory() as scratch:
        exported = export(adapter, Path(scratch) / "model.gguf")  # f16, the merged weights
        server = LlamaServer(binary, {"model_path": str(exported.gguf)}, len(os.sched_getaffinity(0)))
        try:
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none", max_retries=0, timeout=600
            )
            name = client.models.list().data[0].id
            raw, healed = (typed_lines(client, name, typed, asking) for asking in (ask, ask_before_break))
        finally:
            server.close()
    files = [path for path, _, _ in served]
    wanted = [texts[path][len(prompt) :].split("\n", 1)[0] for path, prompt, _ in served]
    found = {}
    for key, label, rows in (
        ("serve", "serve, typing", served),
        ("raw", "llama-server, as an editor asks", raw),
        ("line_break_left", "llama-server, the line break left for the model", healed),
    ):
        lines = [line for _, _, (_, _, line) in rows]
        found[key] = report(label, [timing for _, _, timing in rows]) | {
            "scores": score_code(lines, wanted, files),
            "lines": lines,
        }
        scores = found[key]["scores"]
        print(
            f"  exact match {scores['exact_match_pct']:.1f}% edit similarity {scores['edit_similarity']:.1f}"
        )
    for key in ("raw", "line_break_left"):
        found[f"{key}_minus_serve"] = paired_difference(
            "code", found["serve"]["lines"], found[key]["lines"], wanted, files
        )
        gain = found[f"{key}_minus_serve"]
        print(
            f"{key} − serve: exact match {difference(gain, 'exact_match_pct')}, "
            f"edit similarity {difference(gain, 'edit_similarity')}"
        )
    return {"files": len(typed), "weights": "f16", **found}


def report(label: str, timings: list[tuple[float, float, str]]) -> dict:
    """Prints the percentiles and how many lines were blank, and gives them for the results file."""
    firsts = sorted(first for first, _, _ in timings)
    lines = sorted(line for _, line, _ in timings)
    said = {
        "requests": len(lines), "line_s": lines,
        "first_token_p50_s": percentile(firsts, 50), "first_token_p95_s": percentile(firsts, 95),
        "line_p50_s": percentile(lines, 50), "line_p95_s": percentile(lines, 95),
        "blank": sum(not text.strip() for _, _, text in timings),
    }  # fmt: skip
    print(
        f"{label}: first token p50 {said['first_token_p50_s']:.2f} s p95 {said['first_token_p95_s']:.2f} s; "
        f"complete line p50 {said['line_p50_s']:.2f} s p95 {said['line_p95_s']:.2f} s ({len(lines)} requests, "
        f"{said['blank']} blank)"
    )
    return said


def cold_generate(adapter: str, path: str, prompt: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, str(ROOT / "run_pipeline.py"), "generate", "--adapter", adapter, "--task", "code",
         "--system", "model", "--path", path, "--prompt", "-"],
        input=prompt, text=True, capture_output=True, check=True, cwd=ROOT,
    )  # fmt: skip
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
