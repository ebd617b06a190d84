"""Scraping an untrusted repository must not run any program that the repository configures."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from scrapers.safe_git import safe_env
from tests.conftest import FAST_TRAINING, GIT_ENV, GitRepo, module_source, read_json

ROOT = Path(__file__).resolve().parent.parent
HOOKS = (
    "pre-commit",
    "post-commit",
    "post-checkout",
    "post-merge",
    "pre-push",
    "post-rewrite",
    "reference-transaction",
)


def make_hostile(repo: GitRepo, script) -> None:
    """Point every configurable program of the repository at `script`."""
    program = str(script)
    settings = {
        "core.fsmonitor": program,  # run by anything that scans the work tree (git status, diff)
        "core.pager": program,
        "pager.log": program,
        "diff.external": program,
        "diff.evil.textconv": program,
        "diff.evil.command": program,
        "filter.evil.clean": program,
        "filter.evil.smudge": program,
        "filter.evil.process": program,
        "gpg.program": program,
        "log.showSignature": "true",
        "core.sshCommand": program,
        "core.askPass": program,
        "credential.helper": f"!{program}",
        "core.editor": program,
        "core.hooksPath": str(repo.path / ".git" / "evil-hooks"),
        "core.alternateRefsCommand": program,
        "remote.origin.url": f"ext::{program} %S",
        "protocol.ext.allow": "always",
    }
    for key, value in settings.items():
        repo.git("config", key, value)
    hooks = repo.path / ".git" / "evil-hooks"
    hooks.mkdir()
    for name in HOOKS:
        (hooks / name).symlink_to(script)
        (repo.path / ".git" / "hooks" / name).symlink_to(script)


def hostile_repository(tmp_path):
    marker = tmp_path / "MARKER"
    script = tmp_path / "evil.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\nexit 0\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    repo = GitRepo(tmp_path / "hostile")
    repo.commit("Add attributes", {".gitattributes": "* diff=evil filter=evil\n", "app.py": module_source(1)})
    for index in range(2, 6):
        repo.commit(f"Add compute_{index}", {f"feature_{index}.py": module_source(index)})
    (repo.path / "app.py").write_text(module_source(9))  # a dirty work tree: fsmonitor's favourite
    _add_signed_commit(repo)
    make_hostile(repo, script)
    return repo, marker


def _add_signed_commit(repo: GitRepo) -> None:
    """A commit carrying a (fake) gpgsig header, so showing signatures would run gpg.program."""
    tree = repo.git("write-tree")
    parent = repo.head()
    body = (
        f"tree {tree}\nparent {parent}\n"
        "author Ada Lovelace <ada@example.com> 1704110400 +0000\n"
        "committer Ada Lovelace <ada@example.com> 1704110400 +0000\n"
        "gpgsig -----BEGIN PGP SIGNATURE-----\n \n iQEzBAABCAAdFiEE\n -----END PGP SIGNATURE-----\n\n"
        "Signed change\n"
    )
    sha = (
        subprocess.run(
            ["git", "hash-object", "-t", "commit", "-w", "--stdin"],
            input=body.encode(),
            cwd=repo.path,
            env={**os.environ, **GIT_ENV},
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .strip()
    )
    repo.git("update-ref", "HEAD", sha)


def test_the_hostile_config_does_run_programs_with_plain_git(tmp_path):
    """The check below means something: plain git in this repository runs the marker script."""
    repo, marker = hostile_repository(tmp_path)
    for command in (["status"], ["diff", "HEAD~2", "HEAD~1"], ["log", "-1"]):
        marker.unlink(missing_ok=True)
        subprocess.run(
            ["git", *command],
            cwd=repo.path,
            env={**os.environ, **GIT_ENV},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert marker.exists(), f"git {command[0]} did not run the hostile program"


def test_a_full_run_never_executes_what_the_repository_configures(cli, tmp_path):
    repo, marker = hostile_repository(tmp_path)
    out = tmp_path / "out"
    result = cli("--repo", repo.path, "--output-dir", out, *FAST_TRAINING)
    assert result.code == 0, result.err
    assert not marker.exists()
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["status"] == "completed"
    assert manifest["repository"]["remote_url"] == "ext::" + str(tmp_path / "evil.sh") + " %S"
    assert manifest["scrape"]["commits_kept"] == 5  # the signed commit changes nothing: no_text_changes


# A repository that says it is a partial clone and lacks one object makes git fetch it from the remote it
# names, through whatever that remote runs. Each form: the remote's config, given the marker script.
LAZY_FETCHES = {
    "ext helper": lambda script, repo: {
        "remote.origin.url": f"ext::sh -c {script}% %S",
        "protocol.ext.allow": "always",
    },
    "upload-pack of a local remote": lambda script, repo: {
        "remote.origin.url": str(repo.path.parent / "full"),
        "remote.origin.uploadpack": str(script),
        "protocol.file.allow": "always",
    },
    "ssh command": lambda script, repo: {
        "remote.origin.url": "ssh://git.example.com/x.git",
        "core.sshCommand": str(script),
        "protocol.ssh.allow": "always",
    },
}


def lazily_fetching(tmp_path, form: str, through_include: bool = False, fetch_works: bool = False) -> tuple:
    """A repository whose first commit's `data.txt` is missing (HEAD still holds it, unchanged), claiming to
    be a partial clone of a remote that runs the marker script; `fetch_works`: the script then hands over to
    git-upload-pack, so the fetch succeeds and nothing is ever said. Returns the repository and the marker."""
    marker = tmp_path / "MARKER"
    script = tmp_path / "remote.sh"
    handover = 'exec git-upload-pack "$@"' if fetch_works else "exit 2"
    script.write_text(f"#!/bin/sh\ntouch {marker}\n{handover}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    repo = GitRepo(tmp_path / "partial")
    repo.commit("Add the data and its reader", {"data.txt": "rows\n", "app.py": module_source(1)})
    repo.commit("Grow the reader", {"app.py": module_source(1) + module_source(2)})
    if form == "upload-pack of a local remote":  # the remote it names, whole
        repo.git("clone", "--quiet", "--bare", str(repo.path), str(tmp_path / "full"))
    blob = repo.git("rev-parse", "HEAD:data.txt")
    (repo.path / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    settings = {
        "extensions.partialClone": "origin",
        "remote.origin.promisor": "true",
        **LAZY_FETCHES[form](script, repo),
    }
    target = repo.path / ".git" / ("remote.inc" if through_include else "config")
    for key, value in settings.items():
        repo.git("config", "--file", str(target), key, value)
    if through_include:
        repo.git("config", "include.path", "remote.inc")
    return repo, marker


LAZY_CASES = [
    pytest.param(
        form,
        include,
        works,
        id=f"{form}{' through include.path' if include else ''}{', fetch works' if works else ''}",
    )
    for form, include, works in [
        *((form, False, False) for form in LAZY_FETCHES),
        *((form, True, False) for form in LAZY_FETCHES),
        ("upload-pack of a local remote", False, True),
    ]
]


@pytest.mark.parametrize(("form", "through_include", "fetch_works"), LAZY_CASES)
def test_a_scrape_never_fetches_and_skips_what_is_missing(cli, tmp_path, form, through_include, fetch_works):
    repo, marker = lazily_fetching(tmp_path, form, through_include, fetch_works)
    out = tmp_path / "out"
    result = cli("scrape", "--repo", repo.path, "--output-dir", out, "--set", "scrape.format=diff")
    assert result.code == 0, result.err
    assert not marker.exists()
    scraped = read_json(out / "MANIFEST.json")["scrape"]
    assert (scraped["commits_kept"], scraped["skipped"]) == (1, {"partial_clone": 1})
    # The check means something: git, even told `protocol.allow=never` on its command line as the scrape
    # once did, fetches the missing object through the repository's own program.
    subprocess.run(
        ["git", "-c", "protocol.allow=never", "log", "-p"],
        cwd=repo.path, env={**os.environ, **GIT_ENV}, stdin=subprocess.DEVNULL, capture_output=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert marker.exists()


def test_the_hook_and_generate_read_a_partial_repository_without_fetching(tmp_path, monkeypatch):
    """The hook's staged diff and a piped diff's notebooks are read by git in the user's repository: a
    missing object there is not asked for either."""
    from pipeline.use.hook import staged_diff
    from scrapers.notebooks import contents_here

    repo, marker = lazily_fetching(tmp_path, "ext helper")
    (repo.path / "data.txt").write_text("rows\nmore rows\n")
    repo.git("add", "data.txt")
    monkeypatch.chdir(repo.path)
    with pytest.raises(subprocess.CalledProcessError):
        staged_diff()  # the old version is missing: git says so, and the hook leaves the message alone
    assert contents_here([repo.git("rev-parse", "HEAD~1:data.txt")]) == {}
    assert not marker.exists()


@pytest.mark.parametrize("form", LAZY_FETCHES)
def test_the_protocol_allow_list_alone_stops_a_lazy_fetch(tmp_path, form):
    """GIT_NO_LAZY_FETCH is new (git 2.44, and security releases back to 2.39.4): on an older git the
    allow-list naming no protocol is what stops the fetch, whatever the repository allows."""
    repo, marker = lazily_fetching(tmp_path, form)
    environment = {key: value for key, value in safe_env().items() if key != "GIT_NO_LAZY_FETCH"}
    diffed = subprocess.run(
        ["git", "log", "-p"], cwd=repo.path, env=environment, stdin=subprocess.DEVNULL, capture_output=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert diffed.returncode != 0 and b"not allowed" in diffed.stderr
    assert not marker.exists()


def test_every_git_process_starts_with_the_safe_settings():
    """Outside `scrapers.safe_git` and `scrapers.git` (GitPython with SAFE_GIT_ENV), no module starts git
    itself: each new call site would be one more place a repository's config could run a program."""
    pattern = re.compile(r"""(?:subprocess\.\w+|Popen)\(\s*\[\s*["']git["']""")
    found = [
        str(path.relative_to(ROOT))
        for folder in ("pipeline", "scrapers")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "safe_git.py" and pattern.search(path.read_text())
    ]
    assert found == [], "start git with scrapers.safe_git.run_safe_git"
