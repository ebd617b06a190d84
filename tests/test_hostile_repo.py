"""Scraping an untrusted repository must not run any program that the repository configures."""

from __future__ import annotations

import os
import stat
import subprocess

from tests.conftest import FAST_TRAINING, GIT_ENV, GitRepo, module_source, read_json

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
    parent = repo.git("rev-parse", "HEAD")
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
