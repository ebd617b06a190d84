"""Find secrets in commit text and replace them with `<REDACTED:rule>` before anything is written.

Provider rules (AWS, GitHub, GitLab, Slack, Stripe, Google, private key
blocks, JWTs, passwords in URLs) are strict patterns. The generic rule (a
value assigned to a name like password/secret/token/api_key) fires only on
values that look random: mixed letters and digits, not a snake_case word,
enough entropy. Measured on real histories, "keyword + entropy" without
those checks fires mostly on identifiers and documentation examples.

Each rule names cheap substrings (`hints`); its regex runs only on the lines
that contain one (found with C-level `str.find`), so the cost follows the few
candidate lines, not the size of the history.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    hints: tuple[str, ...]
    """The regex only runs when one of these occurs in the text (checked on lowered text if lowercase)."""
    group: int = 0
    """The part of the match that is the secret (0: all of it)."""
    accept: Callable[[str], bool] | None = None
    """Extra check on the secret; the match is left alone when it returns False."""
    multiline: bool = False
    """The secret spans lines (a key block): run on the whole text, not on candidate lines."""

    @property
    def lowercase_hints(self) -> bool:
        """Hints in lower case are looked for in the lowered text (the regex is case-insensitive)."""
        return self.hints[0].islower()


def looks_random(value: str) -> bool:
    """A generated credential rather than a word, an identifier or a placeholder."""
    if len(value) < 12 or not any(c.isdigit() for c in value) or not any(c.isalpha() for c in value):
        return False
    if re.fullmatch(r"[a-z0-9]+(?:[_.-][a-z0-9]+)+", value) and not re.search(r"\d{4,}", value):
        return False  # snake_case / dotted / dashed words with short numbers: `system_type_id2`, `v1.2.3-rc1`
    counts = Counter(value)
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return entropy >= 3.0


_KEY_NAMES = (
    r"passwd|password|passphrase|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|auth[_-]?key|"
    r"private[_-]?key|client[_-]?secret|credentials?"
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
        ("AKIA", "ASIA", "ABIA", "ACCA"),
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
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    Rule("gitlab_token", re.compile(r"(?<![A-Za-z0-9_])glpat-[A-Za-z0-9_\-]{20,}"), ("glpat-",)),
    Rule("slack_token", re.compile(r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}"), ("xox",)),
    Rule(
        "slack_webhook",
        re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]+"),
        ("hooks.slack.com",),
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
        ("://",),
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
        ("pass", "pwd", "secret", "token", "key", "credential"),
        group=1,
        accept=looks_random,
    ),
)


def redact(text: str) -> tuple[str, Counter]:
    """`text` with every secret replaced by `<REDACTED:rule>`, and how many each rule replaced."""
    counts: Counter = Counter()
    lowered = text.lower()
    for rule in RULES:
        haystack = lowered if rule.lowercase_hints else text
        if not any(hint in haystack for hint in rule.hints):
            continue
        replace = partial(_replace, rule=rule, counts=counts)
        if rule.multiline:
            redacted = rule.pattern.sub(replace, text)
        else:
            redacted = "".join(
                rule.pattern.sub(replace, text[start:end]) if candidate else text[start:end]
                for start, end, candidate in _line_spans(haystack, rule.hints)
            )
        if redacted != text:
            text, lowered = redacted, redacted.lower()
    return text, counts


def _replace(match: re.Match[str], rule: Rule, counts: Counter) -> str:
    secret = match.group(rule.group)
    if rule.accept and not rule.accept(secret):
        return match.group(0)
    counts[rule.name] += 1
    whole = match.group(0)
    start = match.start(rule.group) - match.start(0)
    return whole[:start] + f"<REDACTED:{rule.name}>" + whole[start + len(secret) :]


def _line_spans(haystack: str, hints: tuple[str, ...]) -> list[tuple[int, int, bool]]:
    """Cover the text with (start, end, has_hint) spans: each line holding a hint is its own span."""
    lines: set[int] = set()
    for hint in hints:
        at = haystack.find(hint)
        while at >= 0:
            lines.add(haystack.rfind("\n", 0, at) + 1)
            at = haystack.find(hint, at + len(hint))
    spans, previous = [], 0
    for start in sorted(lines):
        if start < previous:
            continue
        end = haystack.find("\n", start)
        end = len(haystack) if end < 0 else end + 1
        if start > previous:
            spans.append((previous, start, False))
        spans.append((start, end, True))
        previous = end
    if previous < len(haystack):
        spans.append((previous, len(haystack), False))
    return spans
