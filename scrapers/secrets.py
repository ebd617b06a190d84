"""Find secrets in commit text and replace them with `<REDACTED:rule>` before anything is written.

Provider rules (AWS, GitHub, GitLab, Slack, Stripe, Google, private key
blocks, JWTs, passwords in URLs) are strict patterns. A quoted value of 6 or
more characters assigned to a name that ends in a secret word
(`password = "Summer2024!"`) is redacted whatever it looks like, unless it
is an obvious placeholder. The generic rule (any value assigned to a name
like password/secret/token/api_key) fires only on values that look random:
mixed letters and digits, not a snake_case word, enough entropy. Measured on
real histories, "keyword + entropy" without those checks fires mostly on
identifiers and documentation examples.

Each rule names cheap, literal-led regexes (`hints`); its own regex runs
only on the lines that hold one, so the cost follows the few candidate
lines, not the size of the history. A scrape redacts its texts in batches
(`redact_all`): each hint is looked for once in the whole batch, in C, and
only the texts that hold it go further.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from itertools import accumulate


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    hints: tuple[str, ...]
    """Regexes that each start with a literal, so re finds them in C; every match of `pattern`
    holds a match of one (in the lowered text when the rule ignores case). Texts and lines
    without one never meet `pattern`: the more precise the hints, the less it runs."""
    group: int = 0
    """The part of the match that is the secret (0: all of it)."""
    accept: Callable[[str], bool] | None = None
    """Extra check on the secret; the match is left alone when it returns False."""
    multiline: bool = False
    """The secret spans lines (a key block): run on the whole text, not on candidate lines."""

    @property
    def ignores_case(self) -> bool:
        """Its hints are written in lower case and looked for in the lowered text."""
        return bool(self.pattern.flags & re.IGNORECASE)

    @cached_property
    def hint_patterns(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(hint) for hint in self.hints)

    @cached_property
    def hint_byte_patterns(self) -> tuple[re.Pattern[bytes], ...]:
        return tuple(re.compile(hint.encode()) for hint in self.hints)


def looks_random(value: str) -> bool:
    """A generated credential rather than a word, an identifier or a placeholder."""
    if len(value) < 12 or not any(c.isdigit() for c in value) or not any(c.isalpha() for c in value):
        return False
    if re.fullmatch(r"[a-z0-9]+(?:[_.-][a-z0-9]+)+", value) and not re.search(r"\d{4,}", value):
        return False  # snake_case / dotted / dashed words with short numbers: `system_type_id2`, `v1.2.3-rc1`
    counts = Counter(value)
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return entropy >= 3.0


_PLACEHOLDER_WORDS = (
    "your",
    "example",
    "change",
    "placeholder",
    "dummy",
    "redacted",
    "sample",
    "fake",
    "xxx",
)


def is_placeholder(value: str) -> bool:
    """A value that stands for a secret in docs, templates and tests: a variable (`${TOKEN}`, `{{ x }}`,
    `<token>`, `%(pw)s`), one character repeated (`******`), or a word that says so."""
    lowered = value.strip().lower()
    return (
        lowered.startswith(("$", "{", "<", "%", "("))
        or len(set(lowered)) <= 1
        or any(word in lowered for word in _PLACEHOLDER_WORDS)
        or re.sub(r"[^a-z]", "", lowered) in ("password", "passwd", "secret", "token", "none", "null", "todo")
    )


_KEY_PREFIXES = ("api", "access", "auth", "private")
"""Names ending in key that hold a secret: api_key, accesskey, auth-key, private_key."""
_KEY_NAMES = (
    r"passwd|password|passphrase|pwd|secret|token|(?:"
    + "|".join(_KEY_PREFIXES)
    + r")[_-]?key|client[_-]?secret|credentials?"
)
_KEY_NAME_HINTS = (
    r"pass(?:wd|word|phrase)",
    "pwd",
    "secret",  # also client_secret
    "token",
    "credential",
    # `key` alone is in most lines of code that touch a dict; the lookbehinds keep the named ones.
    "key(?:" + "|".join(f"(?<={prefix}{sep}key)" for prefix in _KEY_PREFIXES for sep in ("", "_", "-")) + ")",
)


RULES: tuple[Rule, ...] = (
    Rule(
        "private_key",
        re.compile(
            r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
            # Until the END line, or, when the diff cuts it off, through the lines of key material.
            r"(?:[\s\S]{0,20000}?-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----"
            r"|(?:\n[+\- ]?(?:[A-Za-z0-9+/=]+|Proc-Type:[^\n]*|DEK-Info:[^\n]*)?(?=\n|\Z))*)"
        ),
        ("PRIVATE KEY",),
        multiline=True,
    ),
    Rule(
        "aws_access_key_id",
        # Access key ids (AKIA long-term, ASIA temporary); other AWS id prefixes name users and roles, not keys.
        re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}(?![A-Z0-9])"),
        ("A(?:KIA|SIA|BIA|CCA)",),
    ),
    Rule(
        "aws_secret_access_key",
        re.compile(
            r"(?i)aws[A-Za-z0-9_.-]{0,20}(?:secret|key)[A-Za-z0-9_.-]{0,20}['\"]?\s*(?:[:=]|=>)\s*['\"]?"
            r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])"
        ),
        ("aws",),
        group=1,
    ),
    Rule(
        "github_token",
        re.compile(r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})"),
        ("g(?:h[pousr]_|ithub_pat_)",),
    ),
    Rule("gitlab_token", re.compile(r"(?<![A-Za-z0-9_])glpat-[A-Za-z0-9_\-]{20,}"), ("glpat-",)),
    Rule("slack_token", re.compile(r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}"), ("xox[abposr]-",)),
    Rule(
        "slack_webhook",
        re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]+"),
        (r"hooks\.slack\.com",),
    ),
    Rule("stripe_key", re.compile(r"(?<![A-Za-z0-9])[sr]k_live_[A-Za-z0-9]{20,}"), ("k_live_",)),
    Rule("google_api_key", re.compile(r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_\-]{35}"), ("AIza",)),
    Rule(
        "jwt",
        re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
        ("eyJ",),
    ),
    Rule(
        "url_password",
        re.compile(r"(?i)[a-z][a-z0-9+.-]*://[^/\s:@'\"<>]+:([^/\s@'\"<>]+)@"),
        # The pattern without its scheme: only lines with a user and a password in a URL.
        (r"://[^/\s:@'\"<>]+:[^/\s@'\"<>]+@",),
        group=1,
        accept=lambda password: (
            not (password.startswith(("$", "{", "<", "%")) or password in ("password", "pass", "****"))
        ),
    ),
    Rule(
        "secret_assignment",
        re.compile(
            rf"(?i)(?:{_KEY_NAMES})[A-Za-z0-9_.-]*['\"]?\s*(?::=|=>|[:=])\s*[rbuf]?['\"]?([A-Za-z0-9+/=_\-.~!@#$%^&*]{{12,}})"
        ),
        _KEY_NAME_HINTS,
        group=1,
        accept=looks_random,
    ),
    Rule(
        "quoted_secret",
        # A quoted value assigned to a name that ends in a secret word (`password = "..."`,
        # `"db_password": "..."`, `API_TOKEN='...'`): whatever it looks like, a person chose it.
        re.compile(
            rf"(?i)(?<![A-Za-z0-9])(?:[A-Za-z0-9]+[_.-])*(?:{_KEY_NAMES})(?:[_-]?key)?['\"]?\s*(?::=|=>|[:=])\s*"
            r"[rbuf]?(['\"])((?:\\.|(?!\1)[^\n\\]){6,})\1"
        ),
        _KEY_NAME_HINTS,
        group=2,
        accept=lambda value: not is_placeholder(value),
    ),
)


_LOWER_TO_ASCII = (re.compile("\u0130".encode()), re.compile("\u212a".encode()))
"""İ and the Kelvin sign K: the non-ASCII characters whose lower case holds an ASCII letter (i, k),
so a hint like `key` can hide behind them from bytes.lower()."""


def redact(text: str) -> tuple[str, Counter]:
    """`text` with every secret replaced by `<REDACTED:rule>`, and how many each rule replaced."""
    return redact_all([text])[0]


def redact_all(texts: Sequence[str]) -> list[tuple[str, Counter]]:
    """`redact` for many texts at once, which is how a scrape calls it.

    The hints are looked for in all the texts joined as UTF-8, one C-level scan
    per hint for the whole batch instead of one per text: most texts hold no
    hint of most rules, and only those that hold one meet its regex.
    """
    encoded = [text.encode("utf-8", "surrogatepass") for text in texts]  # any str encodes
    joined = b"\0".join(encoded)  # no hint holds a NUL, so none straddles two texts
    lowered = joined.lower()  # ASCII only, so byte offsets stay put
    starts = [0, *accumulate(len(data) + 1 for data in encoded)]
    candidates: list[list[int]] = [[] for _ in texts]
    for number, rule in enumerate(RULES):
        haystack = lowered if rule.ignores_case else joined
        for index in _texts_holding(haystack, rule.hint_byte_patterns, starts):
            candidates[index].append(number)
    if not joined.isascii():
        for index in _texts_holding(joined, _LOWER_TO_ASCII, starts):
            candidates[index] = list(range(len(RULES)))  # its lowered str decides, in _redact_text
    return [
        _redact_text(text, candidates[index]) if candidates[index] else (text, Counter())
        for index, text in enumerate(texts)
    ]


def _lowercase(text: str) -> str:
    """`text.lower()` with every character at its own offset, so spans found in it apply to `text`.

    U+0130 (İ) is the one character whose lower case is two characters long;
    left in, it would shift every later span and hide the secrets after it.
    """
    lowered = text.lower()
    return lowered if len(lowered) == len(text) else text.replace("\u0130", "i").lower()


def _texts_holding(haystack: bytes, patterns: tuple[re.Pattern[bytes], ...], starts: list[int]) -> set[int]:
    """Indexes of the joined texts in which a pattern occurs (`starts`: where each text begins, then the end)."""
    found: set[int] = set()
    for pattern in patterns:
        match = pattern.search(haystack)
        while match:
            index = bisect_right(starts, match.start()) - 1
            found.add(index)
            match = pattern.search(haystack, starts[index + 1])  # one hit per text is enough
    return found


def _redact_text(text: str, candidates: list[int]) -> tuple[str, Counter]:
    """Run the rules on one text: the `candidates` (rule numbers whose hints it holds), and, once a
    replacement has changed the text, every later rule whose hints the changed text holds."""
    counts: Counter = Counter()
    lowered = _lowercase(text) if any(RULES[number].ignores_case for number in candidates) else text
    changed = False
    for number, rule in enumerate(RULES):
        haystack = lowered if rule.ignores_case else text
        if number not in candidates and not (changed and any(p.search(haystack) for p in rule.hint_patterns)):
            continue
        if rule.multiline:
            redacted = rule.pattern.sub(partial(_replace, rule=rule, counts=counts), text)
        else:
            redacted = _redact_lines(text, haystack, rule, counts)
        if redacted != text:
            text, lowered, changed = redacted, _lowercase(redacted), True
    return text, counts


def _redact_lines(text: str, haystack: str, rule: Rule, counts: Counter) -> str:
    """Run `rule` on the lines of `text` that hold one of its hints (found in `haystack`, the text or
    its lowered copy); the text is rebuilt only when a secret is found."""
    pieces: list[str] = []
    done = 0
    for start in _hint_line_starts(haystack, rule.hint_patterns):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        for match in rule.pattern.finditer(text, start, end):
            replacement = _replace(match, rule, counts)
            if replacement != match.group(0):
                pieces += [text[done : match.start()], replacement]
                done = match.end()
    return "".join([*pieces, text[done:]]) if pieces else text


def _hint_line_starts(haystack: str, patterns: tuple[re.Pattern[str], ...]) -> list[int]:
    """Start offsets of the lines that hold a match of one of the patterns, in order."""
    lines: set[int] = set()
    for pattern in patterns:
        for match in pattern.finditer(haystack):
            lines.add(haystack.rfind("\n", 0, match.start()) + 1)
    return sorted(lines)


def _replace(match: re.Match[str], rule: Rule, counts: Counter) -> str:
    secret = match.group(rule.group)
    if rule.accept and not rule.accept(secret):
        return match.group(0)
    counts[rule.name] += 1
    whole = match.group(0)
    start = match.start(rule.group) - match.start(0)
    return whole[:start] + f"<REDACTED:{rule.name}>" + whole[start + len(secret) :]


MESSAGE_ORIGIN = "(commit message)"


def redaction_origins(diff_text: str) -> Counter:
    """Where a redacted diff-format text (message, then `diff --git a/PATH b/PATH` sections) had its
    secrets: counts per file path, the message's as MESSAGE_ORIGIN. Counts only, never values."""
    origins: Counter = Counter()
    where = MESSAGE_ORIGIN
    for line in diff_text.splitlines():
        if line.startswith("diff --git a/"):
            where = line[len("diff --git a/") :].rsplit(" b/", 1)[0]
        elif "<REDACTED:" in line:
            origins[where] += line.count("<REDACTED:")
    return origins
