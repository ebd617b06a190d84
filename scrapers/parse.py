"""Parse the byte stream of one `git log -p` process into `Commit` objects.

The stream is produced with a header format framed by a per-run random nonce
(see `log_format`): a bare NUL or a fixed string is not a safe separator,
because real "text" diffs can contain both.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from scrapers.commit import Commit, FileChange

_HEADER_FIELDS = 6  # sha, parents, author name, author email, author date, encoding


def log_format(nonce: str) -> str:
    """The `--format` that frames each commit's header and message with the nonce."""
    return f"%x1e{nonce}%n%H%n%P%n%an%n%ae%n%aI%n%e%n%B%n%x1e{nonce}-end"


def parse_log(lines: Iterable[bytes], nonce: str, max_file_bytes: int) -> Iterator[Commit]:
    """Yield one Commit per framed record in `lines` (binary lines, newline kept).

    A file diff larger than `max_file_bytes` keeps only its first bytes and is
    marked `oversize`, so one huge generated file cannot exhaust memory.
    """
    start = b"\x1e" + nonce.encode() + b"\n"
    end = b"\x1e" + nonce.encode() + b"-end\n"
    record: list[bytes] = []
    diff: list[bytes] = []
    in_message = False
    for line in lines:
        if line == start:
            if record:
                yield _build_commit(record, diff, max_file_bytes)
            record, diff, in_message = [], [], True
        elif in_message:
            if line == end:
                in_message = False
            else:
                record.append(line)
        else:
            diff.append(line)
    if record:
        yield _build_commit(record, diff, max_file_bytes)


def _build_commit(record: list[bytes], diff: list[bytes], max_file_bytes: int) -> Commit:
    sha, parents, name, email, date, encoding = (
        line.rstrip(b"\n").decode("utf-8", "replace") for line in record[:6]
    )
    message = _decode(b"".join(record[_HEADER_FIELDS:]), encoding).strip()
    return Commit(
        sha=sha,
        parents=tuple(parents.split()),
        author_name=name,
        author_email=email,
        date=date,
        message=message,
        files=tuple(_parse_files(diff, encoding, max_file_bytes)),
    )


def _decode(data: bytes, encoding: str) -> str:
    """UTF-8 first (git re-encodes messages to it); then the commit's declared encoding; never fail."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    if encoding:
        try:
            return data.decode(encoding, "replace")
        except LookupError:
            pass
    return data.decode("utf-8", "replace")


def _parse_files(diff: list[bytes], encoding: str, max_file_bytes: int) -> Iterator[FileChange]:
    chunk: list[bytes] = []
    for line in diff:
        if line.startswith(b"diff --git ") and chunk:
            yield _parse_file(chunk, encoding, max_file_bytes)
            chunk = []
        if chunk or line.startswith(b"diff --git "):
            chunk.append(line)
    if chunk:
        yield _parse_file(chunk, encoding, max_file_bytes)


def _parse_file(chunk: list[bytes], encoding: str, max_file_bytes: int) -> FileChange:
    header_end = next((i for i, line in enumerate(chunk) if line.startswith(b"@@")), len(chunk))
    header, body = chunk[:header_end], chunk[header_end:]
    old_path = new_path = None
    status = "M"
    binary = submodule = False
    for line in header[1:]:
        if line.startswith(b"--- "):
            old_path = _strip_prefix(_unquote(line[4:].rstrip(b"\n").removesuffix(b"\t")), b"a/")
        elif line.startswith(b"+++ "):
            new_path = _strip_prefix(_unquote(line[4:].rstrip(b"\n").removesuffix(b"\t")), b"b/")
        elif line.startswith(b"new file mode"):
            status = "A"
            submodule |= line.rstrip().endswith(b"160000")
        elif line.startswith(b"deleted file mode"):
            status = "D"
            submodule |= line.rstrip().endswith(b"160000")
        elif line.startswith((b"rename from ", b"copy from ")):
            old_path = _unquote(line.split(b" ", 2)[2].rstrip(b"\n"))
            status = "R" if line.startswith(b"rename") else "C"
        elif line.startswith((b"rename to ", b"copy to ")):
            new_path = _unquote(line.split(b" ", 2)[2].rstrip(b"\n"))
        elif line.startswith(b"new mode"):
            status = "T" if status == "M" else status
        elif line.startswith(b"index "):
            submodule |= line.rstrip().endswith(b"160000")
        elif line.startswith((b"Binary files ", b"GIT binary patch")):
            binary = True
    if old_path is None or new_path is None:
        header_old, header_new = _paths_from_diff_line(header[0])
        old_path = old_path or header_old
        new_path = new_path or header_new
    path = old_path if status == "D" or new_path == b"/dev/null" else new_path
    patch_bytes = sum(len(line) for line in chunk)
    kept, size = [], 0
    added = deleted = 0
    for line in body:
        first = line[:1]
        if first == b"+":
            added += 1
        elif first == b"-":
            deleted += 1
        elif line.startswith(b"Subproject commit"):
            submodule = True
        if size < max_file_bytes:
            kept.append(line)
            size += len(line)
    return FileChange(
        path=path.decode("utf-8", "replace"),
        old_path=old_path.decode("utf-8", "replace") if status in ("R", "C") else None,
        status=status,
        hunks=_decode(b"".join(kept), encoding),
        patch_bytes=patch_bytes,
        added=added,
        deleted=deleted,
        binary=binary,
        submodule=submodule,
        oversize=size >= max_file_bytes,
    )


def _strip_prefix(path: bytes, prefix: bytes) -> bytes:
    return path if path == b"/dev/null" else path.removeprefix(prefix)


def _paths_from_diff_line(line: bytes) -> tuple[bytes, bytes]:
    """Paths from `diff --git a/X b/Y`, used when no ---/+++ lines exist (binary, mode-only, empty file)."""
    rest = line[len(b"diff --git ") :].rstrip(b"\n")
    if rest.startswith(b'"'):
        closing = rest.index(b'" ', 1) + 1
        old, new = _unquote(rest[:closing]), _unquote(rest[closing + 1 :])
    elif rest.endswith(b'"'):
        opening = rest.rindex(b' "')
        old, new = rest[:opening], _unquote(rest[opening + 1 :])
    else:
        # Without a rename both halves are the same path, so the split is at the middle.
        half = (len(rest) - 1) // 2
        old, new = rest[:half], rest[half + 1 :]
    return old.removeprefix(b"a/"), new.removeprefix(b"b/")


_ESCAPES = {b"n": 10, b"t": 9, b'"': 34, b"\\": 92, b"a": 7, b"b": 8, b"f": 12, b"r": 13, b"v": 11}


def _unquote(path: bytes) -> bytes:
    """Undo git's C-style quoting of unusual paths (`"sp\\303\\251cial \\"x\\""`)."""
    if not (len(path) >= 2 and path.startswith(b'"') and path.endswith(b'"')):
        return path
    body, out, i = path[1:-1], bytearray(), 0
    while i < len(body):
        if body[i : i + 1] == b"\\" and i + 1 < len(body):
            following = body[i + 1 : i + 2]
            if following.isdigit():
                out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
                i += 4
                continue
            out.append(_ESCAPES.get(following, following[0]))
            i += 2
            continue
        out.append(body[i])
        i += 1
    return bytes(out)
