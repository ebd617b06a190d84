"""Parse the byte stream of one `git log -p` process into `Commit` objects.

Each commit's header and message are framed by a per-run random nonce (see
`log_format`): a bare NUL or a fixed string is not a safe separator, because
real "text" diffs contain both. The stream is cut into segments (a commit
header, then one segment per file diff) with `bytes.find`, so the work per
line happens in C, and memory holds one file's diff at a time, never a
whole commit (git reports files above `core.bigFileThreshold` as binary
without diffing them, which bounds a single file's diff).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from scrapers.commit import Commit, FileChange

_FILE = b"\ndiff --git "
_COMPACT_AT = 1 << 20  # drop consumed bytes from the buffer once this many have piled up


def log_format(nonce: str) -> str:
    """The `--format` that frames each commit's header and message with the nonce."""
    return f"%x1e{nonce}%n%H%n%P%n%an%n%ae%n%aI%n%e%n%B%n%x1e{nonce}-end"


def parse_log(chunks: Iterable[bytes], nonce: str, max_file_bytes: int) -> Iterator[Commit]:
    """Yield one Commit per framed record in a stream given as arbitrary byte chunks.

    A file diff larger than `max_file_bytes` keeps only its first bytes and is
    marked `oversize` (its line counts still cover all of it).
    """
    header: bytes | None = None
    files: list[FileChange] = []
    encoding = ""
    for kind, data in _segments(chunks, nonce.encode()):
        if kind == "header":
            if header is not None:
                yield _build_commit(header, files)
            header, files = data, []
            encoding = _header_fields(data)[5]
        else:
            files.append(_parse_file(data, encoding, max_file_bytes))
    if header is not None:
        yield _build_commit(header, files)


def parse_diff(text: bytes, max_file_bytes: int) -> list[FileChange]:
    """The files of one plain `git diff` (a staged change, a diff given to `generate`), parsed as a
    logged commit's are; none when `text` holds no `diff --git` line."""
    if not text.startswith(b"diff --git "):
        at = text.find(_FILE)
        if at < 0:
            return []
        text = text[at + 1 :]
    parts = text.split(_FILE)
    # Each file's segment as the log's parser cuts it: from its `diff --git` line to the next one's newline.
    segments = [parts[0], *(b"diff --git " + part for part in parts[1:])]
    last = len(segments) - 1
    return [
        _parse_file(segment + (b"\n" if number < last else b""), "", max_file_bytes)
        for number, segment in enumerate(segments)
    ]


def _segments(chunks: Iterable[bytes], nonce: bytes) -> Iterator[tuple[str, bytes]]:
    """Cut the stream into ("header", bytes) and ("file", bytes) segments."""
    start = b"\x1e" + nonce + b"\n"
    end = b"\x1e" + nonce + b"-end\n"
    next_commit = b"\n" + start
    source = iter(chunks)
    buffer = bytearray()
    pos = 0  # start of the unconsumed part of buffer

    def fill() -> bool:
        nonlocal buffer, pos
        chunk = next(source, None)
        if chunk is None:
            return False
        if pos >= _COMPACT_AT:
            del buffer[:pos]
            pos = 0
        buffer += chunk
        return True

    margin = max(len(_FILE), len(next_commit))  # a delimiter may straddle two chunks
    while True:
        while True:
            while buffer.startswith(b"\n", pos):
                pos += 1
            if len(buffer) - pos >= len(start) or not fill():
                break
        if len(buffer) == pos:
            return
        if buffer.startswith(start, pos):
            while (stop := buffer.find(end, pos)) < 0:
                if not fill():
                    return  # a truncated record: git was stopped mid-commit
            yield "header", bytes(buffer[pos + len(start) : stop])
            pos = stop + len(end)
            continue
        # A file diff runs to the next file or the next commit, whichever comes first. The commit
        # boundary is only looked for before the next file, so a commit with many files stays linear.
        scan = pos
        while True:
            file_at = buffer.find(_FILE, scan)
            commit_at = buffer.find(next_commit, scan, file_at if file_at >= 0 else len(buffer))
            if commit_at >= 0 or file_at >= 0:
                stop = (commit_at if commit_at >= 0 else file_at) + 1
                break
            # Only the new bytes (and a delimiter's length before them) need searching after a fill;
            # measured from `pos`, which fill() may move when it compacts the buffer.
            searched = max(0, len(buffer) - pos - margin)
            if not fill():
                stop = len(buffer)
                break
            scan = pos + searched
        yield "file", bytes(buffer[pos:stop])
        pos = stop


def _header_fields(header: bytes) -> list[str]:
    """sha, parents, author name, author email, author date, encoding (the lines before the message)."""
    return [field.decode("utf-8", "replace") for field in header.split(b"\n", 6)[:6]]


def _build_commit(header: bytes, files: list[FileChange]) -> Commit:
    sha, parents, name, email, date, encoding = _header_fields(header)
    parts = header.split(b"\n", 6)
    message = _decode(parts[6] if len(parts) > 6 else b"", encoding).strip()
    return Commit(
        sha=sha,
        parents=tuple(parents.split()),
        author_name=name,
        author_email=email,
        date=date,
        message=message,
        files=tuple(files),
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
        # A name that is no text encoding (`rot13`, `base64`), or one that takes no "replace" (`idna`).
        except (LookupError, UnicodeError):
            pass
    return data.decode("utf-8", "replace")


def _parse_file(segment: bytes, encoding: str, max_file_bytes: int) -> FileChange:
    header_end = segment.find(b"\n@@")
    header, body = (segment, b"") if header_end < 0 else (segment[:header_end], segment[header_end + 1 :])
    lines = header.split(b"\n")
    old_side, new_side = _halves(lines[0])
    old_prefix, new_prefix = _prefixes(old_side, new_side)
    old_path, new_path = old_side.removeprefix(old_prefix), new_side.removeprefix(new_prefix)
    named: dict[str, bytes] = {}  # the paths a rename or copy names exactly, without any prefix
    status = "M"
    blob = old_blob = mode = None
    binary = submodule = False
    for line in lines[1:]:
        if line.startswith(b"--- "):
            old_path = _strip_prefix(_unquote(line[4:].removesuffix(b"\t")), old_prefix)
        elif line.startswith(b"+++ "):
            new_path = _strip_prefix(_unquote(line[4:].removesuffix(b"\t")), new_prefix)
        elif line.startswith((b"new file mode ", b"deleted file mode ")):
            status = "A" if line.startswith(b"new") else "D"
            mode = line.rsplit(b" ", 1)[1].decode()
            submodule |= mode == "160000"
        elif line.startswith((b"rename from ", b"copy from ")):
            named["old"] = _unquote(line.split(b" ", 2)[2])
            status = "R" if line.startswith(b"rename") else "C"
        elif line.startswith((b"rename to ", b"copy to ")):
            named["new"] = _unquote(line.split(b" ", 2)[2])
        elif line.startswith(b"new mode"):
            status = "T" if status == "M" else status
        elif line.startswith(b"index "):
            ids = line[6:].split(b" ")[0].split(b"..")
            blob = (ids[0] if ids[-1].strip(b"0") == b"" else ids[-1]).decode()
            old_blob = ids[0].decode() if ids[0].strip(b"0") else None
            submodule |= line.endswith(b"160000")
        elif line.startswith((b"Binary files ", b"GIT binary patch")):
            binary = True
    old_path, new_path = named.get("old", old_path), named.get("new", new_path)
    path = old_path if status == "D" or new_path == b"/dev/null" else new_path
    oversize = len(body) > max_file_bytes
    kept = body[: body.rfind(b"\n", 0, max_file_bytes) + 1] if oversize else body
    return FileChange(
        path=path.decode("utf-8", "replace"),
        old_path=old_path.decode("utf-8", "replace") if status in ("R", "C") else None,
        status=status,
        hunks=_decode(kept, encoding),
        patch_bytes=len(segment),
        binary=binary,
        submodule=submodule or body.startswith(b"@@ -1 +1 @@\n-Subproject commit "),
        oversize=oversize,
        mode=mode,
        blob=blob,
        old_blob=old_blob,
    )


def _strip_prefix(path: bytes, prefix: bytes) -> bytes:
    return path if path == b"/dev/null" else path.removeprefix(prefix)


def _halves(line: bytes) -> tuple[bytes, bytes]:
    """The two paths of `diff --git a/X b/Y`, prefixes and all."""
    rest = line[len(b"diff --git ") :]
    if rest.startswith(b'"'):
        closing = rest.index(b'" ', 1) + 1
        return _unquote(rest[:closing]), _unquote(rest[closing + 1 :])
    if rest.endswith(b'"'):
        opening = rest.rindex(b' "')
        return rest[:opening], _unquote(rest[opening + 1 :])
    # Without a rename both halves name one path: with prefixes of one length (git's a/ and b/) the
    # split is at the middle, with others (`--src-prefix=old/ --dst-prefix=new/`) at the space where
    # they do. A rename's halves may be cut wrong here: its `rename from`/`rename to` lines name both.
    half = (len(rest) - 1) // 2
    middle = rest[:half], rest[half + 1 :]
    if _named_alike(*middle):  # every file the scrape reads: the other splits are for piped diffs alone
        return middle
    for at, byte in enumerate(rest):
        if byte == 32 and _named_alike(rest[:at], rest[at + 1 :]):
            return rest[:at], rest[at + 1 :]
    return middle


def _named_alike(old: bytes, new: bytes) -> bool:
    """Whether two sides of a `diff --git` line are one path, with or without a prefix each."""
    return old == new or old.partition(b"/")[2] == new.partition(b"/")[2] != b""


def _prefixes(old: bytes, new: bytes) -> tuple[bytes, bytes]:
    """The prefixes a file's paths carry in its diff: `a/` and `b/` as the scrape pins them, or what a
    user's own git prints in a diff piped to `generate` (`diff.noprefix`: none; `diff.mnemonicPrefix`:
    `c/` and `i/` for a staged change; `diff.srcPrefix`/`dstPrefix`), read where the `diff --git`
    line's sides name one path. Otherwise git's: a path that begins `c/` is not a mnemonic prefix."""
    if old == new:
        return b"", b""
    if _named_alike(old, new):
        return old[: old.index(b"/") + 1], new[: new.index(b"/") + 1]
    return b"a/", b"b/"


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
