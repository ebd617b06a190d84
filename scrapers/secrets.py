"""Find secrets in commit text and replace them with `<REDACTED:rule>` before anything is written.

Provider rules (AWS, GitHub, GitLab, Slack, Stripe, Google, the model,
package, mail, payment and cloud hosts' keys, webhooks, and the forms of
`scrapers.providers`), key material (key blocks, key files, JWKs, a
Kubernetes Secret's data), JWTs and passwords in URLs are strict patterns,
read under any name. The generic rule (any
value assigned to a name like password/secret/token/api_key) fires only on
values that look random: mixed letters and digits, not a snake_case word,
enough entropy. Measured on real histories, "keyword + entropy" without those
checks fires mostly on identifiers and documentation examples.

People's real passwords are words, though, so a literal assigned to a
credential-named key (`DB_PASSWORD`, `SECRET_KEY`, `_authToken`, `api-key`,
...) is redacted whatever its entropy. What is a literal depends on the
file's syntax, read from the `diff --git` header the line sits under: a
quoted value is a literal everywhere (`password = "hunter2"`); an unquoted
one is a literal in configuration (`.env`, YAML, INI, TOML, properties,
shell, Dockerfile `ENV`, `.netrc`, `.npmrc`), and in commit messages and
documents only as `KEY=value`; in source code it is an expression
(`password = form.password.data`) and is left alone. Variables, templates,
calls, booleans, paths and obvious placeholders are never literals. The same
holds where the name and the value sit apart: in two fields (`name:
DB_PASSWORD` / `value: ...`), in a call's arguments (`define('DB_PASSWORD',
'...')`), after a declared type (`db_password: str = "..."`), as a flag and
its value on a command line (`--api-key=...`, `mysql -p...`, `keytool
-storepass ...`), after its user (`smtp.login(user, "...")`), as what a
call signs with (`jwt.encode(payload, "...")`), by its place in a call
(`mysqli_connect(host, user, "...")`), in a sentence of a message ("the
password for staging is ..."). A file's syntax is read from its name through a
template's or a backup's suffix, and from what it holds where its name says
nothing. The lines of a text that read differently a second time (CR LF
endings, a command continued with `\\`, adjacent string literals, escaped
quotes: `_READINGS`) are read again so, and what that finds is redacted where
it stands in the text as written.

Each rule names cheap, literal-led regexes (`hints`); its own regex runs
only on the lines that hold one, so the cost follows the few candidate
lines, not the size of the history. A scrape redacts its texts in batches
(`redact_all`): every rule's hints are found in the whole batch in one pass
of an Aho-Corasick automaton, and only the texts that hold one go further.
"""

from __future__ import annotations

import binascii
import functools
import math
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property, partial
from itertools import accumulate
from typing import Any

from scrapers.formats import MESSAGE_HEADING
from scrapers.providers import PROVIDER_TOKENS


class Syntax(Enum):
    """How the lines of a file (or a commit message) assign values, which decides what is a literal."""

    CODE = "code"
    """A programming language: an unquoted value is an expression (`token = get_token()`)."""
    CONFIG = "config"
    """.env, YAML, INI/cfg, TOML, properties, shell, Makefile: an unquoted value is a literal."""
    DOCKERFILE = "dockerfile"
    """Configuration, and `ENV KEY value` / `ARG KEY=value`."""
    NETRC = "netrc"
    """`machine HOST login USER password SECRET`."""
    PROSE = "prose"
    """Commit messages, documents and files of unknown kind: `KEY=value` is a literal, `key: value` prose."""


EVERY_SYNTAX = frozenset(Syntax)


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    hints: tuple[str, ...]
    """Regexes that each start with a literal (ANCHOR_CHARS or more: one automaton finds every
    rule's at once); every match of `pattern` holds a match of one (in the lowered text when the
    rule ignores case). Texts and lines without one never meet `pattern`: the more precise the
    hints, the less it runs."""
    group: int | str = 0
    """The part of the match that is the secret (0: all of it), by number or name."""
    accept: Callable[[re.Match[str]], bool] | None = None
    """Extra check on the match; it is left alone when this returns False."""
    syntaxes: frozenset[Syntax] = EVERY_SYNTAX
    """The kinds of text the rule reads: a line elsewhere never meets it."""
    multiline: bool = False
    """The secret spans lines (a key block): run on the whole text, not on candidate lines."""

    @cached_property  # asked for every text of a batch, for each rule its hints name
    def ignores_case(self) -> bool:
        """Its hints are written in lower case and looked for in the lowered text."""
        return bool(self.pattern.flags & re.IGNORECASE)

    @cached_property
    def hint_patterns(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(hint) for hint in self.hints)


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
        or _says_it_stands_in(lowered)
        or re.sub(r"[^a-z]", "", lowered) in ("password", "passwd", "pass", "pwd", "pw", "secret", "token")
    )


def _says_it_stands_in(lowered: str) -> bool:
    """`******`, `your-token-here`, `changeme`, `TODO`: a value that says it is not the real one."""
    return (
        len(set(lowered)) <= 1
        or any(word in lowered for word in _PLACEHOLDER_WORDS)
        or re.sub(r"[^a-z]", "", lowered) in ("none", "null", "todo", "tbd")
    )


_CREDENTIAL_WORDS = frozenset(
    {"password", "passwd", "passphrase", "pwd", "pass", "secret", "token", "credential", "credentials",
     "auth", "apikey", "accesskey", "privatekey", "secretkey", "authkey", "authtoken", "accesstoken",
     "requirepass", "masterauth", "psk", "sshpass", "bindpw", "rootpw"}
)  # fmt: skip
"""The last word of a credential-named key: DB_PASSWORD, client_secret, GITHUB_TOKEN, _auth, apiKey, Redis's
requirepass, wpa_supplicant's psk, the variable sshpass reads a password from (and, in `credential_name`,
a word ending in a password, a secret key's base and some salts)."""
_KEY_PREFIXES = (
    "api", "access", "auth", "private", "secret", "signing", "encryption", "master", "jwt", "subscription",
    "preshared",
)  # fmt: skip
"""Words before `key` that make it a secret: API_KEY, SECRET_KEY, signing-key, JWT_KEY, Azure's
Ocp-Apim-Subscription-Key, WireGuard's PresharedKey (not `key`, `cache_key`)."""
_NOT_CREDENTIAL_TOKENS = frozenset(
    {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "start", "end", "stop", "special", "image", "audio",
     "video", "placeholder", "next", "prev", "previous", "page", "continuation", "cursor", "sync", "max", "min",
     "num", "first", "last", "new", "old", "current", "split", "input", "output", "decoder", "tokenizer"}
)  # fmt: skip
"""Words before `token` where it is a unit of text or a cursor, not a credential: pad_token, next_token."""
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def credential_name(name: str) -> bool:
    """Whether a key names a credential, by its last words: `DB_PASSWORD`, `_authToken`, `client-key-data`
    and `SECRET_KEY` do; `password_hash`, `token_url`, `pad_token` and `cache_key` do not."""
    words = [word.lower() for word in _WORD.findall(name)]
    if not words:
        return False
    last, before = words[-1], words[-2] if len(words) > 1 else ""
    if last == "token" and before in _NOT_CREDENTIAL_TOKENS:
        return False
    if last == "data":  # kubeconfig's client-key-data: a PEM key, base64
        return before == "key"
    if last == "base":  # Rails' secret_key_base
        return before == "key" and len(words) > 2 and words[-3] in _KEY_PREFIXES
    if last == "login":  # SonarQube's sonar.login holds a token (Maven's -Dsonar.login joins the D)
        return before in ("sonar", "dsonar")
    if last == "salt":  # WordPress's AUTH_SALT, LOGGED_IN_SALT, Drupal's hash_salt; not itsdangerous' `salt`
        return before in ("auth", "in", "nonce", "hash")
    # A word run together as DBPASSWORD and PGPASSWORD (psql's) is read as DB_PASSWORD and dbPassword are.
    return (
        last in _CREDENTIAL_WORDS
        or last.endswith(("password", "passwd"))
        or (last == "key" and before in _KEY_PREFIXES)
    )


_PLAIN_SUFFIXES = frozenset({"", ".txt", ".pass", ".pwd", ".secret", ".secrets", ".token", ".cred", ".creds"})
"""What a file holding nothing but a credential is called after its name: `db_password`, `.vault_pass`,
`api_token.txt` (not `auth.py` or `password.md`, which are code and documents)."""


_CREDENTIAL_FILES = frozenset({".pgpass", ".htpasswd", ".git-credentials"})
"""Files whose every line holds a password or its hash by their format (`host:port:db:user:password`,
`user:$apr1$...`, `https://user:password@host`)."""
_KEY_FILES = frozenset({"id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk"})
_KEY_SUFFIXES = (".key", ".pem", ".ppk", ".p8", ".pk8")
"""Files that hold key material by their name: ssh's keys, a server's `.key`, Rails' `master.key`, PuTTY's
`.ppk`, PKCS #8; a `.pem` or `.key` that shows only a certificate or a public key is not one."""
_FILE_WORD = r"(?:pass|pwd|secret|token|key|auth|cred|id_[a-z0-9]+|\.pem|\.ppk|\.p8|\.pk8)"
"""A word of a credential file's name, for a rule's hints (lowered): its own check is `credential_file`."""


def key_file(path: str) -> bool:
    """Whether a file holds key material by its name (`_KEY_FILES`, `_KEY_SUFFIXES`)."""
    name = path.rsplit("/", 1)[-1].lower()
    return name in _KEY_FILES or name.endswith(_KEY_SUFFIXES)


CREDENTIAL_LINES = 3
"""A file named for a credential holds one, where it holds at most this many lines and no program's."""


def credential_file(path: str) -> bool:
    """Whether a file is, by its name, a credential alone: `deploy/db_password.txt`, `.vault_pass`,
    `GITHUB_TOKEN`, `.pgpass`, `id_rsa`, `config/master.key`. Nothing around its lines says so
    (`hunter2`, a line to itself): what it holds decides the rest (`_credential_content`)."""
    name = path.rsplit("/", 1)[-1]
    if name.lower() in _CREDENTIAL_FILES or key_file(path):
        return True
    name = name.lstrip(".")
    dot = name.find(".")
    stem, suffix = (name[:dot], name[dot:].lower()) if dot > 0 else (name, "")
    return suffix in _PLAIN_SUFFIXES and credential_name(stem)


def _credential_file_match(match: re.Match[str], keys: bool) -> bool:
    """A file's header (group 1: its path) and lines (group 2) that are a credential file's, of key
    material where `keys` says so, and of any other credential where it does not."""
    path = match.group(1)
    return credential_file(path) and key_file(path) == keys and _credential_content(path, match.group(2))


def _credential_content(path: str, body: str) -> bool:
    """Whether a credential file's diff (`body`, after its `diff --git` line) holds what its name says: a
    key file anything but a certificate or a public key alone; a file whose format is credentials
    (`.pgpass`) anything; any other a few lines that are no program (an example named `password` is
    one: `#!/usr/bin/env node` ...)."""
    name = path.rsplit("/", 1)[-1].lower()
    if name in _CREDENTIAL_FILES:
        return True
    if key_file(path):
        return "PRIVATE" in body or not ("CERTIFICATE" in body or "PUBLIC KEY" in body)
    shown = [
        line
        for line in body.split("\n")
        if line[:1] in ("+", "-", " ") and not line.startswith(("+++ ", "--- "))
    ]
    new = [line[1:] for line in shown if line[0] != "-" and line[1:].strip()]
    old = [line[1:] for line in shown if line[0] != "+" and line[1:].strip()]
    return max(len(new), len(old)) <= CREDENTIAL_LINES and not any(
        line.startswith("#!") for line in new + old
    )


_NOT_LITERALS = frozenset(
    {"true", "false", "yes", "no", "on", "off", "null", "none", "nil", "undefined", "required", "optional",
     "read", "write",
     "str", "string", "text", "int", "integer", "bool", "boolean", "bytes", "object", "array", "number",
     "basic", "bearer", "digest", "oauth", "oauth2", "jwt", "include", "omit", "same-origin", "inherit",
     "hidden", "env", "default", "auto", "empty", "random", "any", "self", "this"}
)  # fmt: skip
"""Values that configure or type a credential field rather than being one: `auth: basic`,
`credentials: 'include'`, `password: str`, `secrets: inherit`."""


_TEMPLATE = re.compile(r"\$\{|#\{|\{\{|\{\w*\}|%[sdrif(]")
"""Where a string is filled in by code: `${X}`, Ruby's and Elixir's `#{x}`, `{{ x }}`, `{}`, `{0}`, `{name}`,
`%s`, `%(name)s`."""


def is_literal(value: str, name: str = "") -> bool:
    """A value a person wrote down, not code, a reference or a placeholder: `hunter2hunter`, `secret`
    (people's passwords are words); not `${DB_PASSWORD}`, `#{ENV['DB_PASSWORD']}`, `{{ vault_pw }}`,
    `!vault`, `*alias`, `$(cat f)`, `getpass()`, `/run/secrets/db`, `true`, `changeme`, or the key's own
    name (`password=password`)."""
    value = value.strip()
    lowered = value.lower()
    return not (
        not any(c.isalnum() for c in value)
        or (
            value.startswith(
                ("$", "%", "{", "<", "(", "[", "!", "&", "*", "|", ">", "@", "~", "\\", "`", "/", "./")
            )
            # ... but bytes written as escapes are (`app.secret_key = b'\x8f\x12...'`, os.urandom's output),
            # and base64 that begins with `/` or `+` (WireGuard's `PresharedKey = /Uwc...=`)
            and not re.match(r"(?:\\x[0-9a-fA-F]{2}){4}", value)
            and not _base64_key(value)
        )
        or "(" in value
        or value.startswith((",", ";", ")", "]", "}", "+", "=", "|", "?", ":"))  # code after a string ends
        or "}}" in value  # the end of a template's placeholder: `{{user%password}}`'s last part
        or _TEMPLATE.search(value) is not None
        or lowered in _NOT_LITERALS
        or lowered in (name.lower(), name.lower().rsplit(".", 1)[-1])  # `app.secret_key = "secret_key"`
        or _named_placeholder(value)
        or _VERSION.fullmatch(value) is not None
        or re.sub(r"[^a-z]", "", lowered) in ("pass", "pw", "pwd", "passwd")  # `password pass`
        or lowered == (_WORD.findall(name) or [""])[-1].lower()
        or _says_it_stands_in(lowered)
        or (is_phrase(value) and "passphrase" not in name.lower())
    )


_VERSION = re.compile(
    r"(?i)[\^=]?v?\d+(?:\.(?:\d+|x|\*)){1,3}(?:-?(?:alpha|beta|rc|pre|dev|next|canary)\.?\d*)?"
)
"""A version, or a range a manifest pins a dependency to: `"basic-auth": "^2.0.1"` and `"pbkdf2-password":
"1.2.1"` in package.json name packages, not credentials (docs/data.md). Its tail only a pre-release's
word (`1.0.0-beta.1`): `1.0-hunter2` is a password a person wrote."""


def _named_placeholder(value: str) -> bool:
    """A constant's name written where the value goes: `oauth_token = 'USER_OAUTH_TOKEN'`, `API_KEY_HERE`."""
    return (
        re.fullmatch(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+", value) is not None
        and re.search(r"PASS|PWD|SECRET|TOKEN|KEY|AUTH|CRED", value) is not None
    )


def _base64_key(value: str) -> bool:
    """Base64 of a key rather than a path: padded, or long and mixed as generated bytes are."""
    return re.fullmatch(r"[A-Za-z0-9+/]{16,}={1,2}|[A-Za-z0-9+/]{40,}", value) is not None and (
        value.endswith("=")
        or (len(value) % 4 == 0 and not value.islower() and any(c.isdigit() for c in value))
    )


PHRASE_CHARACTERS = 300
"""A label or a help text is shorter than this; a longer value is read as whatever else it is."""


def is_phrase(value: str) -> bool:
    """Words of a sentence, not a password: a label, a translation, a help text (`Mot de passe`, `Passwort
    vergessen?`, `password for user, default to ""`). People's passphrases are phrases too, and are kept
    under a `passphrase` name alone: a limit of reading without a dictionary."""
    if len(value) > PHRASE_CHARACTERS or " " not in value.strip():
        return False
    words = value.split()
    if re.fullmatch(r"[a-z]{4}(?: [a-z]{4}){3}", value):  # Google's app password
        return False
    alphabetic = [word for word in words if re.fullmatch(r"[^\W\d_]+(?:['’-][^\W\d_]+)*[.,:;!?…]?", word)]
    return len(alphabetic) * 4 >= len(words) * 3 and any(len(word) >= 3 for word in alphabetic)


def _named_literal(match: re.Match[str], name_group: int = 1, value_group: int = 2) -> bool:
    name, value = match.group(name_group), match.group(value_group)
    return credential_name(name) and is_literal(value, name) and not _a_word_for_a_token(match, name, value)


_DESCRIBING = frozenset(
    {"type", "types", "url", "uri", "endpoint", "name", "names", "path", "file", "length", "len", "expiry",
     "expires", "ttl", "lifetime", "count", "size", "format", "header", "prefix", "field", "kind", "mode",
     "method", "policy", "hash", "id", "ids"}
)  # fmt: skip
"""A name's last word that makes it describe a secret rather than hold one: `token_type`, `password_hash`."""
_CREDENTIAL_TOKENS = frozenset(
    {"api", "auth", "access", "refresh", "bearer", "session", "secret", "private", "personal", "oauth",
     "client", "service", "bot", "app", "user", "admin", "deploy", "csrf", "xsrf", "jwt", "id", "github",
     "gitlab", "npm", "pypi", "slack", "discord", "telegram", "registry", "ci", "hub"}
)  # fmt: skip
"""Words before `token` that make it a credential's whatever its value (`API_TOKEN`, `authToken`)."""


def _a_word_for_a_token(match: re.Match[str], name: str, value: str) -> bool:
    """A word given to a `token` in code, where a token is a unit of text: a lexer's `token = "while"`, an
    NLP fixture's `{"token": "running"}`, a migration tool's `upgrade_token = "upgrades"`. A credential
    token is generated, not a word; in configuration (`token: swordfish`), and after a word that makes
    it a credential's (`apiToken`), a word is taken for one all the same."""
    words = [word.lower() for word in _WORD.findall(name)]
    return (
        words[-1:] == ["token"]
        and (len(words) < 2 or words[-2] not in _CREDENTIAL_TOKENS)
        and (
            re.fullmatch(r"[A-Za-z]{1,16}", value.strip()) is not None
            or (  # words joined by underscores, one of them a word of four letters: `engine1_upgrades`
                re.fullmatch(r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+", value.strip()) is not None
                and re.search(r"(?:^|_)[A-Za-z]{4,}(?:_|$)", value) is not None
            )
        )
        and _syntax_at(match.string, match.start()) in (Syntax.CODE, Syntax.PROSE)
    )


@functools.lru_cache(maxsize=8)  # the text being redacted, for its few matches that ask
def _section_starts(text: str) -> tuple[list[int], list[Syntax]]:
    where = sections(text)
    return [offset for offset, _ in where], [syntax for _, syntax in where]


def _syntax_at(text: str, offset: int) -> Syntax:
    """The syntax of the file (or message) `text[offset]` is in."""
    offsets, syntaxes = _section_starts(text)
    return syntaxes[bisect_right(offsets, offset) - 1]


_LIBPQ_KEYWORD = re.compile(
    r"""(?i)(?:^|[\s'"])(?:host|hostaddr|dbname|user|port|sslmode)=[^\s'"]++[^'"\n]*+$"""
)
LIBPQ_REACH = 300
"""How far before a `password=` a connection string's other keyword is looked for, in characters."""


def _after_a_libpq_keyword(match: re.Match[str]) -> bool:
    """Whether libpq's keywords come before a `password=` in its string: `"host=db user=app password=..."`."""
    line_start = match.string.rfind("\n", 0, match.start()) + 1
    before = match.string[max(line_start, match.start() - LIBPQ_REACH) : match.start()]
    return _LIBPQ_KEYWORD.search(before) is not None


def _in_a_string(match: re.Match[str]) -> bool:
    """Whether a match stands inside a string literal of its line: an odd number of one kind of quote
    before it."""
    line = match.string[match.string.rfind("\n", 0, match.start()) + 1 : match.start()]
    return any(line.count(quote) % 2 == 1 for quote in ('"', "'", "`"))


_MEMBER = re.compile(r"[A-Za-z_]\w*(?:\.\w+)+")
"""A member read, `self.auth` or `auth.pass`: code, where a literal would be quoted."""


def _a_member_assigned(match: re.Match[str]) -> bool:
    """A statement of code, not a connection string: outside any string, a member read into the name
    (express's `auth.password = auth.pass;`)."""
    return (
        _MEMBER.fullmatch(match.group(2)) is not None
        and _syntax_at(match.string, match.start()) is Syntax.CODE
        and not _in_a_string(match)
    )


def _named_word(match: re.Match[str]) -> bool:
    """`KEY=value` outside configuration: a literal, unless it reads as a call's keyword argument
    (`f(password=pw)`, `auth=self.auth`)."""
    value, after = match.group(2), match.string[match.end() : match.end() + 1]
    code = after in (",", ")", "(", "[", ".") or _MEMBER.fullmatch(value) is not None
    return not code and _named_literal(match)


_TYPE = r"&?(?:'[a-z]+[ \t]+)?[A-Za-z_][\w.]*(?:\[[^\]=\n]*\]|<[^>=\n]*>)?\??"
"""A declared type between a name and its value: `str`, `Optional[str]`, `&'static str`, `String?`, `Map<K, V>`."""
_CREDENTIAL_WORD = "(?:pass|pwd|secret|token|key|auth|cred)"
"""A word a credential's name holds, for a rule's hints (lowered): its own check is `credential_name`."""


_FLAG_HINTS = (rf"--[a-z0-9\-]*{_CREDENTIAL_WORD}",)
_COMMAND = r"(?m:(?:^[+\- ]?|(?<=[\s;&|(`'\"$])))"
"""Where a command begins: a line's start (after a diff's marker), a space, a separator, a quote or `$(`."""


def _flag_value(match: re.Match[str]) -> bool:
    """A credential-named flag's value (group 3) that a person typed, not the next flag."""
    return (
        _named_literal(match, value_group=3)
        and _chosen(match.group(3))
        and not match.group(3).startswith("-")
    )


def _mixes_letters_and_digits(value: str) -> bool:
    """A word of letters and digits (and a password's symbols), not code: `arguments[0]`, `a.b2()`."""
    return (
        len(value) >= 6
        and re.fullmatch(r"[A-Za-z0-9!@#$%^&*+=~_\-]+", value) is not None
        and any(c.isdigit() for c in value)
        and any(c.isalpha() for c in value)
    )


_SETTER_PREFIXES = frozenset({"set", "with", "use"})
_CREDENTIAL_PARTS = frozenset(
    {"password", "passwd", "pwd", "passphrase", "secret", "token", "key", "api", "auth", "access", "client",
     "private", "bearer", "credentials"}
)  # fmt: skip


def _credential_method(name: str) -> bool:
    """A method that sets a credential: a setter of one (`setPassword`, `WithAuthToken`, `set_token`,
    `setApiKey`) or a builder's step named only for one (`.password(...)`, `.apiKey(...)`); not a lookup
    or a check (`get_secret`, `check_password`, `hash_password`)."""
    words = [word.lower() for word in _WORD.findall(name)]
    if len(words) > 1 and words[0] in _SETTER_PREFIXES:
        return credential_name("_".join(words[1:]))
    return bool(words) and set(words) <= _CREDENTIAL_PARTS and credential_name(name)


def _chosen(value: str) -> bool:
    """A value a person typed as a password: a literal, not a placeholder (`password`, `<password>`)."""
    return is_literal(value) and not is_placeholder(value)


_NAME = r"(?<![A-Za-z0-9_])[$@:]?([A-Za-z_][A-Za-z0-9_.\-]*)['\"]?\]?"
"""A key as code and configuration write it: `DB_PASSWORD`, `self.token`, `$password`, `:password`,
`"api-key"`, `config['SECRET_KEY']`, `--password`."""
_COMMENT_OR_END = r"(?=[ \t]+[#;]|[ \t]*$)"
_CONFIG = frozenset({Syntax.CONFIG, Syntax.DOCKERFILE})

_KEY_NAME_HINTS = (
    r"pass(?:wd|word|phrase)",
    "pwd",
    "secret",  # also client_secret
    "token",
    "credential",
    # `pass` and `auth` alone only where something is assigned to them (`pass` is a Python statement).
    r"pass['\"]?\]?[ \t]*[?:]?[:=]",  # Makefile's `DB_PASS ?= ...` too
    r"auth['\"]?\]?[ \t]*[?:]?[:=]",
    r"key[_-]data",
    "salt",  # WordPress's AUTH_SALT, Drupal's hash_salt
    r"psk['\"]?[ \t]*[:=]",  # wpa_supplicant's pre-shared key
    "requirepass",
    "masterauth",
    "bindpw",
    "rootpw",
    r"sonar\.login",
    # `key` alone is in most lines of code that touch a dict; the lookbehinds keep the named ones.
    "key(?:" + "|".join(f"(?<={prefix}{sep}key)" for prefix in _KEY_PREFIXES for sep in ("", "_", "-")) + ")",
)
_KEY_NAMES = (
    r"passwd|password|passphrase|pwd|secret|token|(?:"
    + "|".join(_KEY_PREFIXES[:4])
    + r")[_-]?key|client[_-]?secret|credentials?"
)
"""What the entropy rule looks for: names holding a secret word anywhere."""


_CODE_SUFFIXES = frozenset(
    [
        ".py",
        ".pyi",
        ".pyx",
        ".ipynb",
        ".js",
        ".mjs",
        ".cjs",
        ".jsx",
        ".ts",
        ".tsx",
        ".vue",
        ".svelte",
        ".go",
        ".rb",
        ".java",
        ".kt",
        ".kts",
        ".scala",
        ".groovy",
        ".gradle",
        ".c",
        ".h",
        ".ino",  # an Arduino sketch (C++), where WiFi passwords are `#define`d
        ".cc",
        ".cpp",
        ".cxx",
        ".hh",
        ".hpp",
        ".cs",
        ".fs",
        ".php",
        ".rs",
        ".swift",
        ".m",
        ".mm",
        ".pl",
        ".pm",
        ".lua",
        ".r",
        ".jl",
        ".dart",
        ".ex",
        ".exs",
        ".erl",
        ".clj",
        ".hs",
        ".ml",
        ".zig",
        ".nim",
        ".tf",
        ".hcl",
        ".json",
        ".jsonc",
        ".sql",
        ".html",
        ".htm",
        ".css",
        ".scss",
    ]
)
"""Files in a programming (or data) language: unquoted values there are expressions, not literals."""
_CONFIG_SUFFIXES = frozenset(
    [
        ".env",
        ".yaml",
        ".yml",
        ".ini",
        ".cfg",
        ".conf",
        ".cnf",
        ".config",
        ".properties",
        ".toml",
        ".sh",
        ".bash",
        ".zsh",
        ".ksh",
        ".envrc",
        ".mk",
        ".npmrc",
        ".pypirc",
        ".yarnrc",
        ".kubeconfig",
        ".service",
        ".plist",
    ]
)
_CONFIG_NAMES = frozenset(
    [
        "makefile",
        "gnumakefile",
        "procfile",
        ".npmrc",
        ".pypirc",
        ".yarnrc",
        ".envrc",
        ".pgpass",
        "kubeconfig",
        "config",
        ".htpasswd",
    ]
)
_NETRC_NAMES = frozenset({".netrc", "_netrc", "netrc"})


_WRAPPERS = frozenset(
    {".bak", ".orig", ".old", ".save", ".backup", ".dist", ".example", ".sample", ".template", ".tmpl", ".tpl",
     ".j2", ".jinja", ".jinja2", ".erb", ".mako", ".in", ".default", ".defaults", ".local", ".dev", ".prod",
     ".production", ".staging", ".development"}
)  # fmt: skip
"""Suffixes that keep a file in its syntax: a backup (`values.yml.bak`), a template (`app.conf.j2`,
`database.yml.erb`, `config.yml.dist`), an environment's copy (`settings.toml.prod`)."""
_CONFIG_FOLDERS = ("group_vars/", "host_vars/")
"""Folders whose files are configuration whatever their name: Ansible's variables (`group_vars/all`)."""
_DOCUMENTS = frozenset(
    {".md", ".markdown", ".mdx", ".rst", ".adoc", ".asciidoc", ".org", ".tex", ".rdoc", ".textile", ".pod",
     ".wiki", ".1", ".man"}
)  # fmt: skip
_DOCUMENT_NAMES = frozenset(
    {"readme", "changes", "changelog", "news", "history", "authors", "contributors", "license", "copying",
     "notice", "todo", "contributing", "install", "thanks", "credits"}
)  # fmt: skip
"""Prose by their name, never read for a syntax from what they hold (`_content_syntax`)."""


@functools.lru_cache(maxsize=4096)  # a history touches the same files again and again
def syntax_of(path: str) -> Syntax:
    """How a file assigns values, from its name: `.env.local` and `settings.yaml` are configuration, so
    are `values.yml.bak`, `app.conf.j2` and Ansible's `group_vars/all`; `Dockerfile.dev` a Dockerfile,
    `app.py` code, `README.md` and unknown files prose (an unknown one may read as configuration by
    what it holds: `sections`)."""
    name = path.rsplit("/", 1)[-1].lower()
    while (dot := name.rfind(".")) > 0 and name[dot:] in _WRAPPERS:
        name = name[:dot]
    dot = name.rfind(".")
    suffix = name[dot:] if dot > 0 else ""  # `.env` is a name, not a suffix
    if name in _NETRC_NAMES:
        return Syntax.NETRC
    if name in ("dockerfile", "containerfile") or name.startswith("dockerfile.") or suffix == ".dockerfile":
        return Syntax.DOCKERFILE
    if (
        name.startswith(".env")
        or name in _CONFIG_NAMES
        or suffix in _CONFIG_SUFFIXES
        or any(folder in f"/{path.lower()}" for folder in _CONFIG_FOLDERS)
    ):
        return Syntax.CONFIG
    return Syntax.CODE if suffix in _CODE_SUFFIXES else Syntax.PROSE


@functools.lru_cache(maxsize=4096)
def _unknown_kind(path: str) -> bool:
    """A file whose name says neither its syntax nor that it is a document: what it holds may."""
    name = path.rsplit("/", 1)[-1].lower()
    dot = name.rfind(".")
    stem, suffix = (name[:dot], name[dot:]) if dot > 0 else (name, "")
    return syntax_of(path) is Syntax.PROSE and suffix not in _DOCUMENTS and stem not in _DOCUMENT_NAMES


_SETTING = re.compile(
    r"""[ \t]*(?:-[ \t]+)?["']?[A-Za-z_][\w.\-]*["']?[ \t]*(?::(?:[ \t]|$)|[:?]?=)|[ \t]*\[[^\]\n]+\][ \t]*$|---$"""
)
"""A line of configuration: `key: value`, `- key: value`, `key = value`, `KEY=value`, an INI section, a YAML
document's start."""
CONFIG_SHARE = 0.6
"""A file of unknown kind is configuration where two of its lines and this share of them (those shown, not
blank, not a comment) are settings: one is as often a script's line (`token = arguments[0]`)."""


def _content_syntax(lines: list[str]) -> Syntax:
    """A file's syntax from its lines as a diff shows them (each after its marker): configuration where
    most are settings (`_SETTING`), prose otherwise."""
    shown = [
        line[1:] for line in lines if line[:1] in ("+", "-", " ") and not line.startswith(("+++ ", "--- "))
    ]
    counted = [line for line in shown if line.strip() and not line.lstrip().startswith(("#", ";", "//"))]
    settings = sum(_SETTING.match(line) is not None for line in counted)
    return Syntax.CONFIG if settings >= 2 and settings >= CONFIG_SHARE * len(counted) else Syntax.PROSE


_SECTION = re.compile(
    rf'^(?:diff --git (?:a/.* b/(.*)|"a/.*" "b/(.*)")|{re.escape(MESSAGE_HEADING)})$', re.MULTILINE
)
"""A file's header (a path git quotes: `"b/..."`), or the `message` format's heading."""


def sections(text: str) -> list[tuple[int, Syntax]]:
    """Where each kind of text begins in a rendered commit: the message (and `rich`'s header) is prose,
    each file's lines follow their `diff --git` header, and the `message` format's message its heading."""
    found = [(0, Syntax.PROSE)]
    matches = list(_SECTION.finditer(text))
    for number, match in enumerate(matches):
        path = match.group(1) or match.group(2)
        syntax = syntax_of(path) if path else Syntax.PROSE
        if path and _unknown_kind(path):
            end = matches[number + 1].start() if number + 1 < len(matches) else len(text)
            syntax = _content_syntax(text[match.end() : end].split("\n"))
        found.append((match.start(), syntax))
    return found


def line_syntaxes(text: str) -> list[Syntax]:
    """The syntax of each of `text.split("\\n")`."""
    where, syntaxes, offset = sections(text), [], 0
    offsets = [start for start, _ in where]
    for line in text.split("\n"):
        syntaxes.append(where[bisect_right(offsets, offset) - 1][1])
        offset += len(line) + 1
    return syntaxes


def _keyed(
    name: str,
    pattern: str,
    hints: tuple[str, ...] = _KEY_NAME_HINTS,
    value_group: int = 2,
    syntaxes: frozenset[Syntax] = EVERY_SYNTAX,
    accept: Callable[[re.Match[str]], bool] | None = None,
) -> Rule:
    """A rule whose pattern captures a key (group 1) and its value (`value_group`): the value is redacted
    when the key names a credential and the value is a literal (or what `accept` says)."""
    return Rule(
        name,
        re.compile(pattern),
        hints,
        group=value_group,
        accept=accept or partial(_named_literal, value_group=value_group),
        syntaxes=syntaxes,
    )


def _typed(
    name: str,
    pattern: re.Pattern[str],
    hints: tuple[str, ...],
    group: int,
    check: Callable[[str], bool] | None = None,
    **options: Any,
) -> Rule:
    """A rule whose `group` is a password a person typed (`_chosen`, or `check`): not a variable, a
    template or a placeholder."""
    kept = check or _chosen
    return Rule(name, pattern, hints, group=group, accept=lambda match: kept(match.group(group)), **options)


def _authorization(separator: str, syntaxes: frozenset[Syntax] = EVERY_SYNTAX) -> Rule:
    """An `Authorization` header's credential, the header's name and its scheme (Basic, Bearer, Token)
    `separator` apart."""
    return _typed(
        "authorization_header",
        re.compile(
            rf"(?i)(?<![A-Za-z0-9_])authorization{separator}(basic|bearer|token)[ \t]+([A-Za-z0-9+/=._~\-]{{8,}})"
        ),
        ("authorization",),
        group=2,
        check=is_literal,
        syntaxes=syntaxes,
    )


def _on_command_line(commands: str, flag: str, hints: tuple[str, ...]) -> Rule:
    """A password given by `flag` (a regex whose group 2 is the password) on the command line of one of
    `commands` (a regex), which must begin a command, the flag its own word after it. The flag is looked
    for up to the next of `commands`, not beyond: a long line that names one again and again is read once
    (to its end from each, it took seconds)."""
    return _typed(
        "command_line_password",
        re.compile(rf"{_COMMAND}(?:{commands})[ \t](?:(?!(?:{commands})[ \t])[^\n|;&])*?(?<=[ \t]){flag}"),
        hints,
        group=2,
    )


_KEY_KIND = r"(?:PRIVATE KEY(?: BLOCK)?|OpenVPN [\w \-]*?[Kk]ey(?: V\d+)?)"
_KEY_BEGIN = rf"-{{4,5}} ?BEGIN[A-Z0-9 ]*{_KEY_KIND} ?-{{4,5}}"
_KEY_END = rf"-{{4,5}} ?END[A-Z0-9 ]*{_KEY_KIND} ?-{{4,5}}"
"""A key block's first and last lines: PEM's and OpenSSH's `-----BEGIN ... PRIVATE KEY-----`, PGP's `PRIVATE
KEY BLOCK`, ssh.com's `---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----`, OpenVPN's `OpenVPN Static key V1`."""
_KEY_HINTS = ("PRIVATE KEY", "OpenVPN ")
_KEY_LINE = r"[+\- ]?+[A-Za-z0-9+/=]{16,}+"
"""A line of key material as a diff shows it: base64 (or hex), after the line's marker. Possessive: a `+`
could be the marker or the key's, and a run of lines read both ways each would be read 2ⁿ times."""


def _base64_decoded(value: str) -> bytes:
    """What base64 `value` holds (padded as needed); nothing where it is no base64."""
    try:
        return binascii.a2b_base64(value + "=" * (-len(value) % 4))
    except binascii.Error:
        return b""


def _encodes_a_secret(value: str) -> bool:
    """Whether a Kubernetes Secret's value is one: base64 of text (a password, a config) or of a private key
    or a registry's auths; not of a certificate, and not a word that only happens to be base64's letters
    (a Secret's `name: backend1` decodes to no text)."""
    if len(value) % 4:
        return False
    raw = _base64_decoded(value)
    if b"PRIVATE KEY" in raw or b'"auths"' in raw:
        return True
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return (
        bool(text.strip())
        and text.replace("\n", "").replace("\t", "").replace("\r", "").isprintable()
        and ("CERTIFICATE" not in text and "PUBLIC KEY" not in text)
    )


def _alternatives(form: str) -> list[str]:
    """A regex's alternatives at its top level (none inside a group or a class)."""
    parts, depth, start, at, in_class = [], 0, 0, 0, False
    while at < len(form):
        char = form[at]
        if char == "\\":
            at += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif char == "|" and depth == 0:
            parts.append(form[start:at])
            start = at + 1
        at += 1
    return [*parts, form[start:]]


def _provider_rule(name: str, form: str, hints: tuple[str, ...] | None = None) -> Rule:
    """A token known by its form (`scrapers.providers`), between word boundaries; each alternative of the
    form is a hint of its own unless the row names others."""
    return Rule(
        name, re.compile(rf"(?<![A-Za-z0-9_])(?:{form})(?![A-Za-z0-9_])"), hints or tuple(_alternatives(form))
    )


_ASSIGNED_WORDS = tuple(
    f"{word}="
    for word in ("PASSWORD", "PASSWD", "PASS", "PWD", "SECRET", "TOKEN", "KEY", "AUTH", "CREDENTIALS", "SALT",
                 "PSK", "PASSPHRASE", "APIKEY", "DATA", "BASE", "LOGIN")
)  # fmt: skip
"""The last word of an upper-case credential name (`credential_name`'s) and the `=` that sets it."""
_ARGUMENT = r"""(?:'[^'\n]*'|"[^"\n]*"|[$\w.]+(?:\([^()\n]*\))?|[^,\n()'"]+)"""
"""A call's argument as the positional rules step over it: a string (commas and all), a name or a call of
one, or any other expression without a comma."""
_PASSWORD_ARGUMENTS = (
    (
        r"(?:smtp\.)?PlainAuth|set_password|FTP(?:_TLS)?|(?:pymysql|MySQLdb|pymssql)\.connect|mysqli_connect"
        r"|mysql_connect|mysqli|PDO|ftp_login|ldap_bind|Sequelize",
        3,
        (
            "PlainAuth",
            "set_password",
            "FTP",
            r"\.connect\(",
            "mysqli",
            "PDO",
            "ftp_login",
            "ldap_bind",
            "Sequelize",
        ),
    ),
    (r"(?:cx_Oracle|oracledb)\.connect", 2, (r"cx_Oracle\.connect", r"oracledb\.connect")),
    (r"SMTP\.start", 5, (r"SMTP\.start\(",)),
)
"""Calls that take a password by its place (counted from 1): (the call as a regex, its place, its hints)."""


_VALUE = r"""(?P<quote>['"`]?)(?P<value>[^\s'"`()]+?)(?P=quote)"""
_SENTENCE_END = r"(?=[\s,;)]|[.!?](?:\s|$)|$)"
_STRONG = r"(?:password|passphrase|passwd|api[ _-]?key|token|secret)"
"""Words that name a credential in a sentence; `pass`, `pw`, `pwd` and `creds` only where a colon or `is`
follows them (`pass to`, `pw of` are no disclosure)."""
_SENTENCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (  # the password [for staging] is / was / to / : / = VALUE
        rf"(?i)(?<![A-Za-z0-9_]){_STRONG}(?:[ \t]+(?:for|of|on|in|at)[ \t]+(?:[\w.\-]+[ \t]+){{0,3}}?[\w.\-]+)?"
        rf"(?:[ \t]+(?P<verb>is|was|are|to|will[ \t]+be|has[ \t]+been)|[ \t]*[=:])[ \t]+(?:now[ \t]+|still[ \t]+)?{_VALUE}"
        + _SENTENCE_END,
        ("password", "passphrase", "passwd", r"api[ _-]?key", "token", "secret"),
    ),
    (  # pw is VALUE, pass: VALUE
        rf"(?i)(?<![A-Za-z0-9_])(?:pw|pwd|pass|creds)(?:[ \t]+(?:is|was)|[ \t]*[=:])[ \t]+{_VALUE}{_SENTENCE_END}",
        (r"pw[ \t]", r"pw:", "pwd", r"pass[ \t]", r"pass[:=]", "creds"),
    ),
    (  # creds: admin:VALUE, login with admin / VALUE
        # Not in a URL or a path (`driver://user:pass@host/db`); a slash between the user and the password
        # with spaces around it.
        r"(?i)(?<![A-Za-z0-9_/:.@])(?:creds|credentials|login|log[ \t]+in|sign[ \t]+in)"
        rf"(?:[ \t]+(?:with|as|is))?[ \t]*:?[ \t]*([`'\"]?)[\w.@\-]+\1(?:[ \t]*:|[ \t]+/[ \t]+)[ \t]*{_VALUE}{_SENTENCE_END}",
        ("creds", "credentials", "login", "log in", "sign in"),
    ),
    (  # user admin, password VALUE (its hints the password's word: `user` is in most texts)
        r"(?i)(?<![A-Za-z0-9_/:.@])user(?:name)?[ \t]*:?[ \t]*[\w.@\-]+,?[ \t]+(?:and[ \t]+)?(?:password|pass|pw)"
        rf"[ \t]*:?[ \t]*{_VALUE}{_SENTENCE_END}",
        ("password", r"pass[ \t:]", r"pw[ \t:]"),
    ),
    (  # use VALUE as the [admin] password (its hints the password's words: `use` is in most texts)
        rf"(?i)(?<![A-Za-z0-9_])use[ \t]+{_VALUE}[ \t]+as[ \t]+(?:the[ \t]+|a[ \t]+|your[ \t]+)?(?:[\w\-]+[ \t]+)?{_STRONG}\b",
        ("password", "passphrase", "passwd", r"api[ _-]?key", "token", "secret"),
    ),
    (  # VALUE is the [admin] password
        rf"(?i)(?<![A-Za-z0-9_]){_VALUE}[ \t]+(?:is|was)[ \t]+(?:the|our|my|your)[ \t]+(?:[\w\-]+[ \t]+){{0,2}}(?:password|passphrase)\b",
        ("password", "passphrase"),
    ),
)
"""The sentences that give a credential, each a regex (`value` the credential, `verb` what gives it where it
says) and its hints."""
_RENAMING = re.compile(
    r"(?i)\b(?:renam|mov|migrat|convert|bump|upgrad|downgrad|port|switch)(?:e|es|ed|ing|s)?\b"
)


def _given_in_a_sentence(match: re.Match[str]) -> bool:
    """A sentence's value that is a credential: quoted or mixing letters and digits, not a version
    (`v1beta1`) or a name holding the credential's own word (`token_v2`); after `to`, the end of its clause
    ("set the password to bcrypt12 hashing" names a scheme) and no renaming or moving before it ("rename
    the token to token_v2")."""
    value = match.group("value")
    if not (_chosen(value) and (match.group("quote") or _mixes_letters_and_digits(value))):
        return False
    if re.fullmatch(r"(?i)v?\d+(?:\.\d+)*(?:[a-z]+\d*)?|v\d+(?:alpha|beta|rc)\d*", value) or re.search(
        r"(?i)pass|pwd|token|secret|key", value
    ):
        return False
    if (match.groupdict().get("verb") or "").lower() != "to":
        return True
    line_start = match.string.rfind("\n", 0, match.start()) + 1
    clause = re.split(r"[.!?;]\s", match.string[line_start : match.start()])[-1]
    after = match.string[match.end() : match.end() + 2]
    return not _RENAMING.search(clause) and not re.match(r"[ \t]+\w", after)


RULES: tuple[Rule, ...] = (
    # A file that is a credential by its name (`db_password.txt`, `.vault_pass`): its lines, whatever
    # they hold, up to the next file's header.
    # A file that is a credential by its name (`db_password.txt`, `.vault_pass`) or key material (`id_rsa`,
    # `master.key`): its lines, whatever they hold, up to the next file's header.
    *(
        Rule(
            name,
            re.compile(
                rf"(?im)^diff --git a/([^\n]*?{_FILE_WORD}[^/\n]*) b/[^\n]*\n"
                r"((?!diff --git )[^\n]*(?:\n(?!diff --git |\Z)[^\n]*)*)"
            ),
            # The header of such a file, not every header: this rule reads whole texts. (Up to the next
            # header alone: a line that repeats `diff --git a/` is read once, not once from each.)
            (rf"diff --git a/(?:(?!diff --git )[^\n])*?{_FILE_WORD}[^/\n]* b/",),
            group=2,
            accept=partial(_credential_file_match, keys=keys),
            multiline=True,
        )
        for name, keys in (("credential_file", False), ("private_key", True))
    ),
    # A key block (PEM, OpenSSH, PGP, ssh.com's SSH2, OpenVPN's static key), whole, however long: to its END
    # line, or, where the diff cuts that off, through the lines of key material and its headers.
    Rule(
        "private_key",
        re.compile(
            rf"{_KEY_BEGIN}(?:(?:(?!-{{4,5}} ?(?:BEGIN|END))[\s\S])*{_KEY_END}"
            r"|(?:\n[+\- ]?(?:[A-Za-z0-9+/=]+|[A-Za-z][A-Za-z0-9\-]*:[^\n]*)?(?=\n|\Z))*)"
        ),
        _KEY_HINTS,
        multiline=True,
    ),
    # ... and where the diff cuts off its BEGIN line: the lines of key material just above its END (a later
    # change beside a committed key shows them as context).
    Rule(
        "private_key",
        re.compile(rf"(?m)^(?!{_KEY_LINE}\n)[^\n]*\n((?:{_KEY_LINE}\n)*{_KEY_LINE})\n(?=[+\- ]?{_KEY_END})"),
        _KEY_HINTS,
        group=1,
        multiline=True,
    ),
    # PuTTY's key file: its private part, `Private-Lines: N` and the lines of base64 after it.
    Rule(
        "private_key",
        re.compile(
            r"(?m)^[+\- ]?Private-Lines:[ \t]*\d+[ \t]*\n((?:[+\- ]?+[A-Za-z0-9+/=]++\n)*[+\- ]?+[A-Za-z0-9+/=]++)"
        ),
        ("Private-Lines:",),
        group=1,
        multiline=True,
    ),
    # A PEM private key encoded again in base64 (a Kubernetes Secret's `tls.key`, kubeconfig's key data).
    Rule(
        "private_key",
        re.compile(r"(?<![A-Za-z0-9+/])LS0tLS1CRUdJTi[A-Za-z0-9+/]{16,}={0,2}"),
        ("LS0tLS1CRUdJTi",),
        accept=lambda match: b"PRIVATE KEY" in _base64_decoded(match.group(0)),
    ),
    # A JSON Web Key's private members (RSA's `d`, `p`, `q`, `dp`, `dq`, `qi`; a symmetric key's `k`).
    Rule(
        "private_key",
        re.compile(r'"(?:d|p|q|dp|dq|qi|k)"[ \t]*:[ \t]*"([A-Za-z0-9_\-]{16,}={0,2})"'),
        ('"kty"',),
        group=1,
        multiline=True,  # the hint need not be on the member's line: the text holds a JWK
    ),
    # A Kubernetes Secret's data: every value, base64 of what it keeps (a password, a key, a registry's
    # `.dockerconfigjson`), where it decodes to text or a key, in YAML or JSON.
    Rule(
        "kubernetes_secret",
        re.compile(
            r"""(?m)^[+\- ]?[ \t]+["']?[\w.\-]+["']?:[ \t]+["']?([A-Za-z0-9+/]{8,}={0,2})["']?[ \t]*,?[ \t]*$"""
        ),
        ("kind: Secret", 'kind: "Secret"', "kind: 'Secret'", '"kind": "Secret"'),
        group=1,
        accept=lambda match: _encodes_a_secret(match.group(1)),
        multiline=True,
    ),
    # An Azure shared access signature's `sig=`: whoever holds the URL holds the access.
    Rule("azure_sas_signature", re.compile(r"[?&;]sig=([A-Za-z0-9%+/=]{20,})"), ("sig=",), group=1),
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
    Rule(  # personal, runner, deploy and pipeline-trigger tokens
        "gitlab_token",
        re.compile(r"(?<![A-Za-z0-9_])gl(?:pat|rt|dt|ptt)-[A-Za-z0-9_\-]{20,}"),
        ("glpat-", "glrt-", "gldt-", "glptt-"),
    ),
    Rule("slack_token", re.compile(r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}"), ("xox[abposr]-",)),
    Rule(
        "slack_webhook",
        re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]+"),
        (r"hooks\.slack\.com",),
    ),
    Rule(  # secret and restricted keys, and a webhook's signing secret
        "stripe_key",
        re.compile(r"(?<![A-Za-z0-9])(?:[sr]k_live_[A-Za-z0-9]{20,}|whsec_[A-Za-z0-9]{24,})"),
        ("k_live_", "whsec_"),
    ),
    Rule("google_api_key", re.compile(r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_\-]{35}"), ("AIza",)),
    # Model and package hosts' keys, by the prefix each gives its own (as gitleaks reads them).
    Rule(
        "openai_key",
        re.compile(
            r"(?<![A-Za-z0-9_-])sk-(?:(?:proj|svcacct|admin)-[A-Za-z0-9_\-]{20,}|[A-Za-z0-9]{48})(?![A-Za-z0-9])"
        ),
        ("sk-",),
    ),
    Rule(
        "anthropic_key", re.compile(r"(?<![A-Za-z0-9_-])sk-ant-[a-z]+\d*-[A-Za-z0-9_\-]{20,}"), ("sk-ant-",)
    ),
    Rule("huggingface_token", re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z]{34}(?![A-Za-z0-9])"), ("hf_",)),
    Rule("npm_token", re.compile(r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])"), ("npm_",)),
    Rule("pypi_token", re.compile(r"(?<![A-Za-z0-9_])pypi-AgE[A-Za-z0-9_\-]{50,}"), ("pypi-AgE",)),
    Rule(
        "sendgrid_key",
        re.compile(r"(?<![A-Za-z0-9_])SG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}(?![A-Za-z0-9_\-])"),
        (r"SG\.",),
    ),
    Rule("shopify_token", re.compile(r"(?<![A-Za-z0-9_])shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"), ("shp",)),
    Rule(
        "digitalocean_token",
        re.compile(r"(?<![A-Za-z0-9_])do[por]_v1_[a-f0-9]{64}"),
        ("dop_v1_", "doo_v1_", "dor_v1_"),
    ),
    Rule("vault_token", re.compile(r"(?<![A-Za-z0-9_])hv[sb]\.[A-Za-z0-9_\-]{24,}"), (r"hvs\.", r"hvb\.")),
    Rule(
        "databricks_token", re.compile(r"(?<![A-Za-z0-9_])dapi[a-f0-9]{32}(?:-\d)?(?![A-Za-z0-9])"), ("dapi",)
    ),
    Rule("postman_key", re.compile(r"(?<![A-Za-z0-9_])PMAK-[a-f0-9]{24}-[a-f0-9]{34}"), ("PMAK-",)),
    Rule(
        "telegram_bot_token",  # the bot's id, a colon, and its secret
        re.compile(r"(?<![0-9])[0-9]{8,10}:AA[A-Za-z0-9_\-]{33}(?![A-Za-z0-9_\-])"),
        (":AA",),
    ),
    Rule(
        "mailgun_key",
        re.compile(r"(?<![A-Za-z0-9_\-])key-[0-9a-z]{32}(?![A-Za-z0-9])"),
        ("key-",),
        accept=lambda match: looks_random(match.group(0)[4:]),
    ),
    Rule("mailchimp_key", re.compile(r"(?<![A-Za-z0-9])[0-9a-f]{32}-us[0-9]{1,2}(?![A-Za-z0-9])"), ("-us",)),
    Rule("square_token", re.compile(r"(?<![A-Za-z0-9_])sq0(?:atp|csp|idp)-[A-Za-z0-9_\-]{22,}"), ("sq0",)),
    Rule(
        "sonarqube_token",
        re.compile(r"(?<![A-Za-z0-9_])sq[apu]_[a-f0-9]{40}(?![A-Za-z0-9])"),
        ("sqa_", "sqp_", "squ_"),
    ),
    Rule("sentry_token", re.compile(r"(?<![A-Za-z0-9_])sntry[su]_[A-Za-z0-9+/=_\-]{30,}"), ("sntry",)),
    Rule(  # the URL is the credential: whoever holds it posts to the channel
        "discord_webhook",
        re.compile(
            r"(?i)https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_\-]+"
        ),
        ("discord",),
    ),
    Rule(
        "twilio_auth_token",  # given after its account's (AC...) or API key's (SK...) id, as Twilio's examples do
        re.compile(r"""(?<![A-Za-z0-9])(?:AC|SK)[0-9a-f]{32}(['"])[ \t]*,[ \t]*(['"])([0-9a-f]{32})\2"""),
        ("AC", "SK"),
        group=3,
    ),
    Rule(
        "azure_storage_key",  # a connection string's `AccountKey=...;` (base64 of 64 bytes)
        re.compile(
            r"(?i)(?<![A-Za-z0-9_])(?:AccountKey|SharedAccessKey)[ \t]*=[ \t]*([A-Za-z0-9+/]{30,}={0,2})"
        ),
        ("accountkey", "sharedaccesskey"),
        group=1,
    ),
    Rule(
        "jwt",
        re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
        ("eyJ",),
    ),
    *(_provider_rule(*row) for row in PROVIDER_TOKENS),
    Rule(
        "url_password",
        # The user may be empty: Redis's `redis://:PASSWORD@host` has none. A password pasted unencoded may
        # hold `@`: it runs to the last `@` before the host.
        re.compile(
            r"(?i)[a-z][a-z0-9+.-]*://[^/\s:@'\"<>]*:([^/\s'\"<>]+)@(?=[^/\s@'\"<>]*(?:[/\s'\"<>?#]|$))"
        ),
        # The pattern without its scheme: only lines with a password in a URL.
        (r"://[^/\s:@'\"<>]*:[^/\s@'\"<>]+@",),
        group=1,
        # Not a template's placeholder: `$PASS`, `{password}`, `<password>`, `%s`, or one `_TEMPLATE` knows, as
        # Ruby's and Elixir's `"http://127.0.0.1:#{@port}/ws"` (its `@` is an attribute's, not a host's).
        accept=lambda match: (
            not (
                match.group(1).startswith(("$", "{", "<", "%"))
                or _TEMPLATE.match(match.group(1))
                or match.group(1) in ("password", "pass")
                or _says_it_stands_in(match.group(1).lower())  # `u:p@host`, a log's `scott:***@host`
            )
        ),
    ),
    Rule(
        "secret_assignment",
        re.compile(
            rf"(?i)((?:{_KEY_NAMES})[A-Za-z0-9_.-]*)['\"]?\s*(?::=|=>|[:=])\s*[rbuf]?['\"]?([A-Za-z0-9+/=_\-.~!@#$%^&*]{{12,}})"
        ),
        _KEY_NAME_HINTS,
        group=2,
        # Not a call (`password_mgr = urllib2.HTTPPasswordMgrWithDefaultRealm()`), nor a name that says what
        # describes a secret (`token_type=example&expires_in=3600`).
        accept=lambda match: (
            looks_random(match.group(2))
            and match.string[match.end() : match.end() + 1] != "("
            and _WORD.findall(match.group(1))[-1].lower() not in _DESCRIBING
        ),
    ),
    _keyed(
        "connection_string_password",
        # ADO.NET / ODBC / JDBC-style `Server=db;User Id=app;Password=hunter2;`, in code strings too; last in
        # the string, its `;` may be left out (`...;Password=hunter2"`).
        # (A value of 80 characters at most: each `password=` of a long line would be read to its end.)
        r"(?i)(?<![A-Za-z0-9_])(password|pwd)[ \t]*=[ \t]*([^;'\"\n]{0,80}?[^;'\"\s])[ \t]*;",
        hints=(r"pass(?:wd|word|phrase)", "pwd"),
        accept=lambda match: _named_literal(match) and not _a_member_assigned(match),
    ),
    _keyed(
        "connection_string_password",
        r"(?i)(?<=;)[ \t]*(password|pwd)[ \t]*=[ \t]*([^;'\"\n]{0,80}?[^;'\"\s])[ \t]*(?=['\"]|$)",
        hints=(r"pass(?:wd|word|phrase)", "pwd"),
    ),
    # libpq's `"host=db user=app password=..."`, in a string of any language: a password after another of
    # its keywords.
    _keyed(
        "connection_string_password",
        r"(?i)(?<![A-Za-z0-9_.\-])(password)=([^\s'\"`;]+)",
        hints=("password=",),
        accept=lambda match: _named_literal(match) and _after_a_libpq_keyword(match),
    ),
    # A credential-named variable set for a command inside a string of code: `"docker run -e
    # POSTGRES_PASSWORD=..."`, `os.system("PGPASSWORD=... pg_dump")`, `` `MYSQL_PWD=... mysql` ``.
    _keyed(
        "unquoted_secret",
        r"""(?<![\w$.\-])([A-Z][A-Z0-9_]*)=([^\s'"`;&|()\[\]{}<>]+)(?=[\s'"`;&|)]|$)""",
        # A variable's capitals: its last word, then `=` (`SECRET_KEY = ...` in Python is no candidate).
        hints=_ASSIGNED_WORDS,
        accept=lambda match: _named_word(match) and _in_a_string(match),
        syntaxes=frozenset({Syntax.CODE}),
    ),
    _keyed("url_query_secret", r"(?i)[?&]([A-Za-z_][A-Za-z0-9_.\-]*)=([^&\s'\"#<>]+)"),
    # ... and a bare `key` there, as many APIs name theirs (`?q=x&key=...`), where its value looks generated.
    Rule(
        "url_query_secret",
        re.compile(r"[?&]key=([^&\s'\"#<>]+)"),
        (r"\?key=", "&key="),
        group=1,
        accept=lambda match: looks_random(match.group(1)),
    ),
    # `"Authorization": "Bearer ..."`, and as a call's two arguments: Go's `Header.Set("Authorization", "Bearer
    # ...")`, Java's `setRequestProperty(...)`; after a space in configuration, quoted: nginx's
    # `proxy_set_header Authorization "Basic ..."`.
    _authorization(r"""['"]?[ \t]*[:=,][ \t]*[rbuf]?['"]?"""),
    _authorization(r"""[ \t]+['"]""", syntaxes=_CONFIG),
    # A quoted value assigned to a credential-named key (`password = "..."`, `"db_password": "..."`,
    # `API_TOKEN='...'`, `login(password="...")`): whatever it looks like, a person chose it.
    _keyed(
        "quoted_secret",
        rf"(?i){_NAME}[ \t]*(?::=|=>|[:=])[ \t]*[rbuf]?(['\"])((?:\\.|(?!\2)[^\n\\])+)\2",
        value_group=3,
    ),
    # ... with its type between: `db_password: str = "..."` (Python, a pydantic setting), `apiKey: string`
    # (TypeScript), `val password: String` (Kotlin), `const API_KEY: &'static str` (Rust), Go's
    # `const apiKey string = "..."`.
    _keyed(
        "quoted_secret",
        # A declared name is no string: `type="password" size="30"` is no `password: size = "30"`.
        rf"""(?i)(?<!["'])(?<![A-Za-z0-9_])[$@:]?([A-Za-z_][A-Za-z0-9_.\-]*)(?:[ \t]*:[ \t]*|[ \t]+){_TYPE}[ \t]*=[ \t]*[rbuf]?(['"])((?:\\.|(?!\2)[^\n\\])+)\2""",
        value_group=3,
    ),
    # ... or with nothing between but a space, in code: Gradle's `storePassword "..."`, C's `#define
    # WIFI_PASSWORD "..."`, Clojure's `{:password "..."}`.
    _keyed(
        "quoted_secret",
        rf"""(?i){_NAME}[ \t]+(['"])((?:\\.|(?!\2)[^\n\\])+)\2""",
        value_group=3,
        syntaxes=frozenset({Syntax.CODE}),
    ),
    # ... and in code a template literal (in prose backticks mark code: "`auth=` over `netrc`").
    _keyed(
        "quoted_secret",
        rf"(?i){_NAME}[ \t]*(?::=|=>|[:=])[ \t]*(`)((?:\\.|[^`\n\\])+)`",
        value_group=3,
        syntaxes=frozenset({Syntax.CODE}),
    ),
    # An element named for a credential: Maven's <password>...</password>.
    _keyed("xml_secret", r"(?i)<([A-Za-z_][A-Za-z0-9_.\-]*)>([^<>\n]+)</\1>"),
    # ... or an element whose `name` (or `key`) attribute names one: Hibernate's `<property
    # name="hibernate.connection.password">...</property>`, `<entry key="password">...</entry>`.
    _keyed(
        "xml_secret",
        r"""(?i)<([A-Za-z_][\w.:\-]*)[ \t][^<>\n]*?(?<=[ \t])(?:name|key)[ \t]*=[ \t]*(["'])([^"'\n]+)\2[^<>\n]*>([^<>\n]+)</\1>""",
        accept=lambda match: _named_literal(match, name_group=3, value_group=4),
        value_group=4,
    ),
    # A JSON object named for a credential, its `value` member the credential: Terraform state's outputs
    # (`"db_password": {"value": "...", "sensitive": true}`), Heroku's app.json (`"SECRET_TOKEN":
    # {"description": "...", "value": "..."}`), over lines as they are written.
    Rule(
        "named_value",
        re.compile(r'"([A-Za-z_][\w.\-]*)"[ \t]*:[ \t]*\{[^{}]{0,600}?"value"[ \t]*:[ \t]*"([^"\n]+)"'),
        ('"value"',),
        group=2,
        accept=_named_literal,
        multiline=True,
    ),
    # A credential named by a call's first argument and given by the next: PHP's `define('DB_PASSWORD',
    # '...')`, Java's `setProperty("mail.smtp.password", "...")`, `os.environ.setdefault("SECRET_KEY",
    # "...")`, a settings tuple. One word: a label after the name (`field("password", "Your password")`)
    # is no password.
    _keyed(
        "named_argument",
        r"""(?i)\([ \t]*['"]([A-Za-z_][A-Za-z0-9_.\-]*)['"][ \t]*,[ \t]*(['"])([^'"\s]+)\2(?=[ \t]*[),])""",
        hints=(rf"""\([ \t]*['"][a-z0-9_.\-]*{_CREDENTIAL_WORD}""",),
        value_group=3,
        # A dashed name is a header's (`X-Auth-Token`, `X-API-Key`), or a path's: `('basic-auth', 'user')`.
        accept=lambda match: (
            _named_literal(match, value_group=3)
            and ("-" not in match.group(1) or match.group(1).lower().endswith(("token", "key", "secret")))
        ),
    ),
    # A password given after its user, last: `auth=("alice", "...")`, `HTTPBasicAuth("alice", "...")`,
    # `smtp.login(user, "...")`.
    _typed(
        "auth_argument",
        re.compile(
            r"(?:(?<![A-Za-z0-9_])auth[ \t]*=[ \t]*\(|(?<![A-Za-z0-9_])(?:HTTP)?(?:Basic|Digest|Proxy)Auth\("
            r"|\.(?:login|simple_bind_s|simple_bind|bind_s)\(|(?<![A-Za-z0-9_])WiFi\.begin\("
            # NetworkCredential, pika's PlainCredentials, BasicAWSCredentials, AwsBasicCredentials.create,
            # javax.mail's PasswordAuthentication.
            r"|(?<![A-Za-z0-9_])(?:[A-Z]\w*)?(?:Credentials?|PasswordAuthentication)(?:\.create)?\()"
            # One word, or Google's app password: four groups of four letters.
            r"""[ \t]*(?:(['"])[^'"\n]*\1|[A-Za-z_][\w.]*)[ \t]*,[ \t]*(['"])([^'"\s]+|[a-z]{4}(?: [a-z]{4}){3})\2(?=[ \t]*\))"""
        ),
        (
            r"auth[ \t]*=[ \t]*\(",
            r"Auth\(",
            r"\.login\(",
            r"_bind",
            r"Credentials?\(",
            r"Credentials?\.create\(",
            r"PasswordAuthentication\(",
            r"WiFi\.begin\(",
        ),
        group=3,
    ),
    # ... or at the place the call gives it (`_PASSWORD_ARGUMENTS`): Go's `smtp.PlainAuth("", user, "...",
    # host)`, PHP's `mysqli_connect(host, user, "...")` and `new PDO($dsn, user, "...")`, `cx_Oracle.connect(user,
    # "...", dsn)`, Ruby's `Net::SMTP.start(address, port, helo, user, "...", :plain)`.
    *(
        _typed(
            "auth_argument",
            re.compile(
                rf"""(?<![A-Za-z0-9_$])(?:new[ \t]+)?(?:{calls})\([ \t]*(?:{_ARGUMENT}[ \t]*,[ \t]*){{{place - 1}}}"""
                r"""(['"])([^'"\s]+)\1(?=[ \t]*[,)])"""
            ),
            hints,
            group=2,
        )
        for calls, place, hints in _PASSWORD_ARGUMENTS
    ),
    # A signing key given as a call's argument: `jwt.encode(payload, "...")`, `jwt.sign(payload, '...')`,
    # `Fernet(b"...")`, `hmac.new(b"...", msg)`.
    _typed(
        "signing_key",
        re.compile(
            # The payload: an object or a list written out (commas inside), a string, or an expression.
            r"""(?:(?<![A-Za-z0-9_])jwt\.(?:encode|decode|sign|verify)\([ \t]*"""
            r"""(?:\{[^{}\n]*\}|\[[^\[\]\n]*\]|(['"])[^'"\n]*\1|[^,\n()'"{}\[\]]+)[ \t]*,"""
            r"""|(?<![A-Za-z0-9_])(?:Fernet|hmac\.new)\()[ \t]*[rbuf]?(['"])((?:\\.|(?!\2)[^\n\\])+)\2"""
        ),
        (r"jwt\.", r"Fernet\(", r"hmac\.new\("),
        group=3,
    ),
    # JDBC's `DriverManager.getConnection(url, "user", "...")`.
    _typed(
        "auth_argument",
        re.compile(
            r"""(?<![A-Za-z0-9_])getConnection\([^,\n()]+,[ \t]*(['"])[^'"\n]*\1[ \t]*,[ \t]*(['"])([^'"\s]+)\2(?=[ \t]*\))"""
        ),
        (r"getConnection\(",),
        group=3,
    ),
    # Go's MySQL data source name, `user:password@tcp(host:3306)/db`: a URL without its scheme.
    _typed(
        "url_password",
        re.compile(r"""(?<![A-Za-z0-9_])[A-Za-z0-9_.\-]+:([^\s@'"/]+)@(?:tcp|unix)\("""),
        (r"@tcp\(", r"@unix\("),
        group=1,
    ),
    # A credential's fallback beside the variable that overrides it, in code: `process.env.JWT_SECRET ||
    # '...'` (or `??`), `os.environ.get("API_KEY") or "..."`, Ruby's `ENV.fetch('DB_PASSWORD') { '...' }` and
    # `ENV["DB_PASSWORD"] || "..."`, Rust's `env::var("JWT_SECRET").unwrap_or("...")`: the value everyone
    # runs with until someone sets it.
    _keyed(
        "default_secret",
        r"""process\.env\.([A-Za-z_][A-Za-z0-9_]*)[ \t]*(?:\|\||\?\?)[ \t]*(['"`])([^'"`\n]+)\2""",
        hints=(r"process\.env\.",),
        value_group=3,
    ),
    _keyed(
        "default_secret",
        r"""os\.(?:environ\.get|getenv)\([ \t]*['"]([A-Za-z_][A-Za-z0-9_]*)['"][ \t]*\)[ \t]+or[ \t]+(['"])([^'"\n]+)\2""",
        hints=(r"os\.environ\.get", r"os\.getenv"),
        value_group=3,
    ),
    _keyed(
        "default_secret",
        r"""ENV(?:\.fetch\([ \t]*|\[[ \t]*)['"]([A-Za-z_][A-Za-z0-9_]*)['"][ \t]*(?:\)[ \t]*\{|\][ \t]*\|\|)[ \t]*(['"])([^'"\n]+)\2""",
        hints=(r"ENV\.fetch", r"ENV\["),
        value_group=3,
    ),
    _keyed(
        "default_secret",
        r'env::var\([ \t]*"([A-Za-z_][A-Za-z0-9_]*)"[ \t]*\)\s*\.unwrap_or(?:_else\([ \t]*\|_\|)?[ \t]*\(?[ \t]*"([^"\n]+)"',
        hints=("env::var",),
    ),
    # .NET's configuration: `Configuration["Jwt:Key"] = "..."`, and appsettings.json's `"Jwt": { "Key": "..." }`.
    _keyed(
        "quoted_secret",
        r"""(?i)\[[ \t]*["']([A-Za-z_][\w.]*(?::[A-Za-z_][\w.]*)+)["'][ \t]*\][ \t]*=[ \t]*(["'])([^"'\n]+)\2""",
        hints=(":key", ":secret", ":password", ":token", ":apikey"),
        value_group=3,
    ),
    _typed(
        "quoted_secret",
        re.compile(
            r'(?i)"jwt"[ \t]*:[ \t]*\{[^{}]*?"(?:key|secret|secretkey|signingkey)"[ \t]*:[ \t]*"([^"\n]+)"'
        ),
        ('"jwt"',),
        group=1,
        check=is_literal,
        multiline=True,
    ),
    # Composer's auth.json: a host's token under `github-oauth`, `gitlab-token` or `bitbucket-oauth`.
    _typed(
        "quoted_secret",
        re.compile(
            r'"(?:github-oauth|gitlab-oauth|gitlab-token)"[ \t]*:[ \t]*\{[^{}]*?"[^"\n]+"[ \t]*:[ \t]*"([^"\n]+)"'
        ),
        ("github-oauth", "gitlab-oauth", "gitlab-token"),
        group=1,
        check=is_literal,
        multiline=True,
    ),
    # Android's `buildConfigField "String", "API_KEY", "\"...\""` (and `resValue "string", "api_key", "..."`).
    _keyed(
        "quoted_secret",
        r"""(?:buildConfigField|resValue)[ \t(]+["'][A-Za-z]+["'][ \t]*,[ \t]*["']([A-Za-z_][\w.]*)["'][ \t]*,[ \t]*"""
        r"""["'](?:\\")?([^"'\\\n]+)(?:\\")?["']""",
        hints=("buildConfigField", "resValue"),
    ),
    # A property list's `<key>APIKey</key>` and the `<string>...</string>` on the line after it (iOS, macOS).
    Rule(
        "named_value",
        re.compile(r"<key>([A-Za-z_][\w.\-]*)</key>[ \t]*\n?[+\- ]?[ \t]*<string>([^<\n]+)</string>"),
        ("<key>",),
        group=2,
        accept=_named_literal,
        multiline=True,
    ),
    # A credential flag and its value as two elements of an exec-form command: compose's
    # `command: ["redis-server", "--requirepass", "..."]`, a Dockerfile's `CMD [...]`.
    _keyed(
        "command_line_password",
        r"""(?i)["'](--[A-Za-z][A-Za-z0-9-]*)["'][ \t]*,[ \t]*(["'])([^"'\n]+)\2""",
        hints=_FLAG_HINTS,
        value_group=3,
        accept=lambda match: _flag_value(match),
    ),
    # A literal given to a setter or a builder's step named for a credential: `dataSource.setPassword("...")`,
    # `Client.builder().apiKey("...")`, Go's `WithAuthToken("...")`, PHP's `$mail->setPassword('...')`.
    Rule(
        "quoted_secret",
        re.compile(r"""(?i)(?:\.|->)([A-Za-z_][A-Za-z0-9_]*)\([ \t]*(['"])([^'"\n]+)\2[ \t]*\)"""),
        tuple(
            rf"{word}\("
            for word in ("password", "passwd", "secret", "token", "key", "passphrase", "credentials")
        ),
        group=3,
        accept=lambda match: _credential_method(match.group(1)) and _chosen(match.group(3)),
    ),
    # Laravel's `APP_KEY=base64:...`, the key that encrypts its cookies and sessions.
    Rule(
        "app_key",
        re.compile(r"(?<![A-Za-z0-9_])APP_KEY[ \t]*=[ \t]*['\"]?(base64:[A-Za-z0-9+/]{20,}={0,2})"),
        ("APP_KEY",),
        group=1,
    ),
    # A variable's default, where the variable is a credential: Spring's `${db.password:...}`, the shell's
    # and Compose's `${POSTGRES_PASSWORD:-...}` (the value when nothing sets it: often the one everyone
    # uses); not `:?` (an error's message) or `:+` (a value when it is set).
    _keyed("default_secret", r"(?i)\$\{([A-Za-z_][A-Za-z0-9_.\-]*)(?::-|:=|:(?![?+]))([^}\s]+)\}"),
    # A credential named in one field and given in the next: .NET's `<add key="ApiKey" value="..." />`,
    # an environment list's `{"name": "DB_PASSWORD", "value": "..."}` (ECS, Kubernetes) ...
    _keyed(
        "named_value",
        r"""(?i)(?<![A-Za-z0-9_])['"]?(?:name|key)['"]?[ \t]*[:=][ \t]*['"]?([A-Za-z_][A-Za-z0-9_.\-]*)['"]?"""
        r"""[ \t]*,?[ \t]*['"]?value['"]?[ \t]*[:=][ \t]*(['"])([^'"\n]+)\2""",
        value_group=3,
    ),
    # ... and over two lines, as YAML and pretty-printed JSON write it (`- name: DB_PASSWORD` /
    # `  value: "..."`), each line perhaps a diff's.
    Rule(
        "named_value",
        re.compile(
            r"""(?im)^[+\- ]?[ \t]*(?:-[ \t]+)?['"]?name['"]?[ \t]*:[ \t]*['"]?([A-Za-z_][A-Za-z0-9_.\-]*)['"]?[ \t]*,?"""
            r"""[ \t]*\n[+\- ]?[ \t]*['"]?value['"]?[ \t]*:[ \t]*(['"]?)([^'"\s][^'"\n]*?)\2[ \t]*,?[ \t]*$"""
        ),
        # A name line with a credential's word in it: this rule reads whole texts, and `value` is in most.
        (rf"name['\"]?[ \t]*:[ \t]*['\"]?[a-z0-9_.\-]*{_CREDENTIAL_WORD}",),
        group=3,
        accept=partial(_named_literal, value_group=3),
        multiline=True,
    ),
    # Terraform's `variable "db_password" {` ... `default = "..."`.
    Rule(
        "named_value",
        re.compile(
            r'''(?im)^[+\- ]?[ \t]*variable[ \t]+"([A-Za-z_][A-Za-z0-9_\-]*)"[ \t]*\{[^}]*?\n[+\- ]?[ \t]*default[ \t]*=[ \t]*"([^"\n]+)"'''
        ),
        (rf"variable[ \t]+\"[a-z0-9_\-]*{_CREDENTIAL_WORD}",),
        group=2,
        accept=_named_literal,
        multiline=True,
    ),
    # YAML's block scalar: `password: |` and the value on the lines below it (its first).
    Rule(
        "named_value",
        re.compile(
            r"""(?im)^[+\- ]?[ \t]*['"]?([A-Za-z_][A-Za-z0-9_.\-]*)['"]?[ \t]*:[ \t]*[|>][-+0-9]*[ \t]*(?:#[^\n]*)?\n[+\- ]?[ \t]+([^\s][^\n]*)"""
        ),
        (r":[ \t]*[|>][\-+0-9]*[ \t]*\n",),
        group=2,
        accept=_named_literal,
        multiline=True,
    ),
    # A password on a command line, in a script, a CI step or a document: `curl -u user:PASSWORD`,
    # `mysql -pPASSWORD` (the password joined to its flag), `sshpass -p PASSWORD`, `docker login -p
    # PASSWORD`. The command must begin a command (not `/etc/mysql/ -print0`), and the flag be its own.
    _on_command_line("curl", r"(?:-u|--user)(?:[ \t]+|=)(['\"]?)[^\s:'\"]+:([^\s'\"]+)", ("curl",)),
    _on_command_line(
        "mysql|mysqldump|mysqladmin|mariadb|mariadb-dump",
        r"-p(['\"]?)([^\s'\"]+)\1(?=\s|$)",
        ("mysql", "mariadb"),
    ),
    _on_command_line(
        r"sshpass|(?:docker|podman|buildah|skopeo|helm[ \t]+registry|az)[ \t]+login",
        r"(?:-p|--password)[ \t]+(['\"]?)([^\s'\"]+)\1(?=\s|$)",
        ("sshpass", "login"),
    ),
    _on_command_line(
        "mongo|mongosh|mongodump|mongorestore|mongoexport|mongoimport",
        r"-p[ \t]+(['\"]?)([^\s'\"]+)\1(?=\s|$)",
        ("mongo",),
    ),
    _on_command_line("influx", r"-password[ \t]+(['\"]?)([^\s'\"]+)\1(?=\s|$)", ("influx",)),
    _on_command_line("schtasks", r"/RP[ \t]+(['\"]?)([^\s'\"/]+)\1(?=\s|$)", ("schtasks",)),
    # PowerShell's `ConvertTo-SecureString "..." -AsPlainText`: a password in the script, made a secure one.
    _typed(
        "command_line_password",
        re.compile(
            r"""(?i)convertto-securestring[ \t]+(?:-string[ \t]+)?(['"])([^'"\n]+)\1[^\n]*?[ \t]-asplaintext"""
        ),
        ("convertto-securestring",),
        group=2,
    ),
    _on_command_line("redis-cli", r"(?:-a|--pass)[ \t]+(['\"]?)([^\s'\"]+)\1(?=\s|$)", ("redis-cli",)),
    _on_command_line("sqlcmd|bcp|osql", r"-P[ \t]*(['\"]?)([^\s'\"]+)\1(?=\s|$)", ("sqlcmd", "bcp", "osql")),
    _on_command_line(r"ldap[a-z]+", r"-w[ \t]+(['\"]?)([^\s'\"]+)\1(?=\s|$)", ("ldap",)),
    _on_command_line(
        "smbclient|rpcclient|smbmap|smbget",
        r"(?:-U|--user)[ \t=]*(['\"]?)[^\s%'\"]+%([^\s'\"]+)",
        ("smb", "rpcclient"),
    ),
    _on_command_line("7z|7za|7zr", r"-p(['\"]?)([^\s'\"]+)\1(?=\s|$)", ("7z",)),
    _on_command_line("zip|unzip", r"-P[ \t]+(['\"]?)([^\s'\"]+)\1(?=\s|$)", ("zip",)),
    _on_command_line("ssh-keygen", r"-N[ \t]*(['\"]?)([^\s'\"]+)\1(?=\s|$)", ("ssh-keygen",)),
    _on_command_line(
        "rabbitmqctl",
        r"(?:add_user|change_password)[ \t]+\S+[ \t]+(['\"]?)([^\s'\"]+)\1(?=\s|$)",
        ("rabbitmqctl",),
    ),
    _on_command_line(r"net[ \t]+use", r"/user:\S+[ \t]+(['\"]?)([^\s'\"/]+)\1(?=\s|$)", ("/user:",)),
    _on_command_line(
        "npm|yarn|pnpm",
        r"set[ \t]+\S*_(?:authToken|auth|password)[ \t]+(['\"]?)([^\s'\"]+)\1",
        (":_auth", ":_password"),
    ),
    _typed(  # HAProxy's `user admin insecure-password ...`, redis.conf's `requirepass ...` and `masterauth ...`,
        # OpenLDAP's `bindpw ...` (ldap.conf, nslcd.conf) and `rootpw ...` (slapd.conf)
        "unquoted_secret",
        re.compile(
            r"(?im)(?:(?<=[ \t])insecure-password|^[+\- ]?[ \t]*(?:requirepass|masterauth|bindpw|rootpw))[ \t]+(\S+)"
        ),
        ("insecure-password", "requirepass", "masterauth", "bindpw", "rootpw"),
        group=1,
        syntaxes=_CONFIG,
    ),
    # Setting a secret from the command line: `gh secret set NAME --body ...`, `az keyvault secret set ...
    # --value ...`, `aws configure set aws_secret_access_key ...`.
    _on_command_line(
        r"gh[ \t]+secret[ \t]+set", r"(?:--body|-b)(?:[ \t]+|=)(['\"]?)([^\s'\"]+)\1", ("gh secret",)
    ),
    _on_command_line(
        r"az[ \t]+keyvault[ \t]+secret[ \t]+set",
        r"--value(?:[ \t]+|=)(['\"]?)([^\s'\"]+)\1",
        ("az keyvault",),
    ),
    _on_command_line(
        r"aws[ \t]+configure[ \t]+set",
        r"\S*(?:secret_access_key|session_token)[ \t]+(['\"]?)([^\s'\"]+)\1",
        ("aws configure",),
    ),
    # A credential-named setting given its value on the command line: `git config --global github.token ...`,
    # fish's `set -x API_TOKEN ...`, Windows' `setx API_TOKEN "..."`.
    _keyed(
        "command_line_password",
        r"""(?<![A-Za-z0-9_])(?:git[ \t]+config(?:[ \t]+--[a-z\-]+)*|setx|set(?:[ \t]+-[a-zA-Z]+)+)[ \t]+"""
        r"""([A-Za-z_][\w.\-]*)[ \t]+(['"]?)([^\s'"]+)\2(?=\s|$)""",
        hints=("git config", "setx", "set -"),
        value_group=3,
    ),
    # `htpasswd -b FILE USER PASSWORD` (`-nb USER PASSWORD`: no file): the password is its last word.
    Rule(
        "command_line_password",
        re.compile(
            rf"{_COMMAND}htpasswd((?:[ \t]+-[A-Za-z]+)+)(?:[ \t]+(?!-)[^\s'\"]+){{1,2}}[ \t]+(['\"]?)([^\s'\"]+)\2"
            r"(?=[ \t]*(?:$|[;&|)#>]))"
        ),
        ("htpasswd",),
        group=3,
        accept=lambda match: (
            "b" in match.group(1)
            and len(match.group(0).split()) - len(match.group(1).split())
            == (3 if "n" in match.group(1) else 4)
            and _chosen(match.group(3))
        ),
    ),
    # An echoed password piped to a login that reads it (`echo "..." | docker login --password-stdin`,
    # `echo "..." | sudo -S ...`), or a user's (`echo "user:..." | chpasswd`).
    _typed(
        "command_line_password",
        re.compile(
            rf"""{_COMMAND}(?:echo|printf)[ \t]+(?:-n[ \t]+)?(['"]?)[^\s:'"|]+:([^\s'"|]+)\1[ \t]*\|[ \t]*(?:sudo[ \t]+)?chpasswd"""
        ),
        ("chpasswd",),
        group=2,
    ),
    _typed(
        "command_line_password",
        re.compile(
            rf"""{_COMMAND}(?:echo|printf)[ \t]+(?:-n[ \t]+)?(['"]?)([^\s'"|]+)\1[ \t]*\|"""
            r"(?:[^\n|]*?--password-stdin|[ \t]*sudo[ \t][^\n|]*?(?<=[ \t])-S(?=\s))"
        ),
        ("password-stdin", "sudo"),
        group=2,
    ),
    # OpenSSL's pass phrase arguments (`-passout pass:...`, `-passin`, `-password`, `-pass`) and Java's
    # keytool and jarsigner (`-storepass ...`, `-keypass`; `-storepass:env NAME` names a variable).
    _typed(
        "command_line_password",
        re.compile(r"""(?<=[ \t'"])-pass(?:in|out|word)?[ \t]+(['"]?)pass:([^\s'"]+)\1"""),
        ("pass:",),
        group=2,
    ),
    _typed(
        "command_line_password",
        re.compile(
            r"""(?<=[ \t'"])-(?:src|dest|new)?(?:store|key)pass[ \t]+(['"]?)([^\s'"]+)\1(?=[\s;|&)'"]|$)"""
        ),
        ("storepass", "keypass"),
        group=2,
    ),
    # A credential flag and its value: `--password=...` anywhere (a script, a CI step, a document, a
    # command in a string); `--password ...`, `redis-server --requirepass ...` in configuration alone
    # (shell, YAML, a Dockerfile): in prose the word after a switch is the sentence's ("add
    # --no-root-password flag").
    _keyed(
        "command_line_password",
        r"""(?i)(?<=[ \t'"])--([A-Za-z][A-Za-z0-9-]*)=(['"]?)([^\s'"]+)\2(?=[\s;|&)'"]|$)""",
        hints=_FLAG_HINTS,
        value_group=3,
        accept=lambda match: _flag_value(match),
    ),
    _keyed(
        "command_line_password",
        r"""(?i)(?<=[ \t'"])--([A-Za-z][A-Za-z0-9-]*)[ \t]+(['"]?)(?!-)([^\s'"]+)\2(?=[\s;|&)'"]|$)""",
        hints=_FLAG_HINTS,
        value_group=3,
        accept=lambda match: _flag_value(match),
        syntaxes=_CONFIG,
    ),
    # SQL's `CREATE USER app IDENTIFIED BY '...'`, `ALTER ROLE app WITH PASSWORD '...'`: a user's or a
    # role's statement ("the queue is identified by "name"" is not one).
    _typed(
        "sql_password",
        re.compile(
            r"""(?i)(?:(?<![A-Za-z0-9_])(?:user|role)[ \t][^\n;'"]*?(?<=[ \t])|'[^'\n]*'@'[^'\n]*'[ \t]+)"""
            r"""(?:identified[ \t]+(?:with[ \t]+\w+[ \t]+)?by|password)[ \t]+(['"])([^'"\n]+)\1"""
        ),
        ("identified", "password"),
        group=2,
    ),
    _typed(  # MySQL's `SET PASSWORD FOR 'app'@'%' = PASSWORD('...')`
        "sql_password",
        re.compile(
            r"""(?i)(?<![A-Za-z0-9_])set[ \t]+password[^\n;]*=[ \t]*password\([ \t]*(['"])([^'"\n]+)\1"""
        ),
        ("password",),
        group=2,
    ),
    _keyed(
        "netrc_password",
        # The password ends where its string does, written in one (`f.write("machine ... password x\\n")`).
        r"""(?i)(?<![A-Za-z0-9_])machine[ \t]+\S+[ \t]+login[ \t]+\S+[ \t]+(password)[ \t]+([^\s\\'"]+)""",
        hints=("password",),
    ),
    _keyed(
        "netrc_password",
        r"(?i)(?<![A-Za-z0-9_])(password)[ \t]+(\S+)",
        hints=("password",),
        syntaxes=frozenset({Syntax.NETRC}),
    ),
    # `KEY=value` in configuration: .env, `export KEY=value`, compose's `- KEY=value`, `db.password=x`.
    _keyed("unquoted_secret", rf"(?i){_NAME}[:?]?=(?![\s'\"=])([^\s'\"]+)", syntaxes=_CONFIG),
    # `key: value` and `key = value` in configuration (YAML, INI, TOML, properties, Makefile's `?=` and
    # `:=` too): the rest of the line, up to a comment.
    _keyed(
        "unquoted_secret",
        rf"(?i){_NAME}(?:[ \t]*:[ \t]+|[ \t]+[:?]?=[ \t]*|[:?]?=[ \t]+)(?![\s'\"])([^\n]*?[^\s]){_COMMENT_OR_END}",
        syntaxes=_CONFIG,
    ),
    _keyed(
        "unquoted_secret",
        rf"(?i)(?<![A-Za-z0-9_])(?:ENV|ARG)[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]+(?![\s'\"=])([^\n]*?[^\s]){_COMMENT_OR_END}",
        syntaxes=frozenset({Syntax.DOCKERFILE}),
    ),
    # In a commit message or a document only `KEY=value` is an assignment (`key: value` is prose).
    _keyed(
        "unquoted_secret",
        rf"(?i){_NAME}=(?![\s'\"=])([^\s'\"(),;\[\]`]+)",
        syntaxes=frozenset({Syntax.PROSE}),
        accept=_named_word,
    ),
    # ... and a sentence that gives one (`_SENTENCES`): "the staging password is hunter22", "the password for
    # staging is ...", "pw is ...", "creds: admin:...", "login with admin / ...", "use ... as the password",
    # "... is the admin password". A word is a password there when it is quoted or mixes letters and digits
    # ("the password is required", "the token is 32 bytes" are sentences), and is no name or version
    # ("rename the token to token_v2", "migrate Secret to v1beta1").
    *(
        Rule(
            "prose_password",
            re.compile(sentence),
            hints,
            group="value",
            accept=_given_in_a_sentence,
            syntaxes=frozenset({Syntax.PROSE}),
        )
        for sentence, hints in _SENTENCES
    ),
)


_LOWER_TO_ASCII = (re.compile("\u0130".encode()), re.compile("\u212a".encode()))
"""İ and the Kelvin sign K: the non-ASCII characters whose lower case holds an ASCII letter (i, k),
so a hint like `key` can hide behind them from bytes.lower()."""


REDACTION = re.compile(r"<REDACTED:([a-z_]+)>")
"""The mark a secret leaves, its rule's name inside."""


def redact(text: str) -> tuple[str, Counter]:
    """`text` with every secret replaced by `<REDACTED:rule>`, and how many each rule replaced."""
    return redact_all([text])[0]


def redact_all(texts: Sequence[str]) -> list[tuple[str, Counter]]:
    """`redact` for many texts at once, which is how a scrape calls it.

    The hints are looked for in all the texts joined as UTF-8, every rule's at
    once (`_HintIndex`) for the whole batch instead of text by text: most texts
    hold no hint of most rules, and only those that hold one meet its regex.
    """
    encoded = [text.encode("utf-8", "surrogatepass") for text in texts]  # any str encodes
    joined = b"\0".join(encoded)  # no hint holds a NUL, so none straddles two texts
    lowered = joined.lower()  # ASCII only, so byte offsets stay put
    starts = [0, *accumulate(len(data) + 1 for data in encoded)]
    candidates: list[list[int]] = [[] for _ in texts]
    holding = _hint_index().texts_holding(joined, lowered, starts)
    for number, rule in enumerate(RULES):
        for index in set().union(*(holding.get((rule.ignores_case, hint), ()) for hint in rule.hints)):
            candidates[index].append(number)
    if not joined.isascii():
        for index in _texts_holding(joined, _LOWER_TO_ASCII, starts):
            candidates[index] = list(range(len(RULES)))  # its lowered str decides, in _redact_text
    redacted = [
        _redact_text(text, candidates[index]) if candidates[index] else (text, Counter())
        for index, text in enumerate(texts)
    ]
    return _redact_readings(redacted)


def redact_files(files: Sequence[tuple[str, str]]) -> list[tuple[str, Counter]]:
    """Each (path, text) file's text redacted as the diff that adds it would be (its syntax read from its
    path, every line an added one), with what was found: a file as it stands, or a window of one."""
    added = [
        "".join([f"diff --git a/{path} b/{path}\n", *(f"+{line}\n" for line in text.split("\n"))])
        for path, text in files
    ]
    return [(_added_text(redacted), counts) for redacted, counts in redact_all(added)]


def _added_text(redacted: str) -> str:
    """A file's text back from the diff that adds it, redacted (a key block replaced whole may have taken
    lines with it, and their `+`)."""
    body = redacted.split("\n", 1)[1] if "\n" in redacted else ""
    return "\n".join(line.removeprefix("+") for line in body.split("\n")[:-1])  # the last line ended in one


_ESCAPED_QUOTE = re.compile(r"\\(['\"])")
"""A quote inside a quoted string (`"--password=\\"...\\""`, `'{\\"api_key\\": \\"...\\"}'`)."""
_READINGS: tuple[tuple[re.Pattern[str], str | int], ...] = (
    # A line ending in CR LF is read as one ending in LF: the rules' values end where a line does.
    (re.compile(r"\r(?=\n)"), ""),
    # A command line continued with a backslash is read as one with the line it continues (`curl ... \`
    # then `-u user:...`), whatever the diff's marker and the indentation of the next, where that begins
    # with a flag (a docstring's or a macro's continued line is not read again for nothing).
    (re.compile(r"\\\n[+\- ]?[ \t]*(?=-)"), " "),
    # Adjacent string literals are read as the one they make (`"ghp_..." + "..."`, Python's and C's
    # `"..." "..."`, PHP's `.`, Lua's `..`, SQL's `||`, across a line as a diff shows it).
    (
        re.compile(
            r"""(["'])(?<=[^\s\\'"=:(,\[{]["'])[ \t]*(?:\+|\.\.?|\|\|)?[ \t]*(?:\n[+ ][ \t]*)?\1(?=[^\s,;)\]}'"])"""
        ),
        "",
    ),
    # An escaped quote is read as the quote it stands for: a command or a JSON body written inside a string
    # (`curl -d "{\\"password\\": \\"...\\"}"`, `sh -c "mysql --password=\\"...\\""`).
    (_ESCAPED_QUOTE, 1),
)
"""How the rules read a text a second time, each a pattern and what replaces it (a group of it, or text)."""
_READINGS_IN_BYTES = tuple(re.compile(pattern.pattern.encode()) for pattern, _ in _READINGS)


def _redact_readings(redacted: list[tuple[str, Counter]]) -> list[tuple[str, Counter]]:
    """What the rules find in each text's second reading (`_READINGS`), redacted in the text as written.

    Each text that a reading changes is read again so (by `redact_all`, so a quote escaped twice is read a
    third time); each secret found there is replaced where it stands in the text as written, its line
    endings, continuations and quotes kept.
    """
    encoded = [text.encode("utf-8", "surrogatepass") for text, _ in redacted]
    starts = [0, *accumulate(len(data) + 1 for data in encoded)]
    # The texts a reading changes, found in the batch at once (most texts are read as they are).
    holding = _texts_holding(b"\0".join(encoded), _READINGS_IN_BYTES, starts)
    readings = [(index, _reading(redacted[index][0])) for index in sorted(holding)]
    changed = [(index, reading) for index, reading in readings if reading is not None]
    if not changed:
        return redacted
    read_again = redact_all([text for _, (text, _) in changed])
    for (index, (text, where)), (read, found) in zip(changed, read_again, strict=True):
        if found:
            written, counts = redacted[index]
            spans = _replaced(text, read)  # only the new: a mark the first reading left is found again
            new = Counter(mark.removeprefix("<REDACTED:").removesuffix(">") for _, _, mark in spans)
            redacted[index] = _marked(written, where, spans), counts + new
    return redacted


def _marked(written: str, where: list[int], spans: list[tuple[int, int, str]]) -> str:
    """`written` with each of `spans` (of a reading of it whose characters stand in it `where`) replaced by
    its mark, where it stands in `written`."""
    for start, end, mark in reversed(spans):
        written = written[: where[start]] + mark + written[where[end - 1] + 1 :]
    return written


def _reading(text: str) -> tuple[str, list[int]] | None:
    """The lines of `text` that `_READINGS` change, as they read them, each under the header of its file (or
    the `message` format's heading), and where each character of that reading is in `text`; None where
    they read it as it is. What a second reading can find, the first could not only on those lines: a long
    diff with one continued command is read again for that command, not whole."""
    lines = _lines_read_again(text)
    if not lines:
        return None
    pieces: list[str] = []
    where: list[int] = []
    for start, end in lines:
        end = min(end + 1, len(text))  # the line and its newline, where it has one
        pieces.append(text[start:end])
        where += range(start, end)
    read = "".join(pieces)
    for pattern, replacement in _READINGS:
        pieces, mapped, done = [], [], 0
        for match in pattern.finditer(read):
            pieces.append(read[done : match.start()])
            mapped += where[done : match.start()]
            if isinstance(replacement, int):  # a group of the match, which stands where it stood
                pieces.append(match.group(replacement))
                mapped += where[match.start(replacement) : match.end(replacement)]
            else:  # text, which stands where the match began
                pieces.append(replacement)
                mapped += [where[match.start()]] * len(replacement)
            done = match.end()
        if pieces:
            read, where = "".join([*pieces, read[done:]]), mapped + where[done:]
    return read, where


def _lines_read_again(text: str) -> list[tuple[int, int]]:
    """The lines (start, end) a reading changes, with the header of the file each is in, in order."""
    starts: set[int] = set()
    for pattern, _ in _READINGS:
        for match in pattern.finditer(text):
            line = text.rfind("\n", 0, match.start()) + 1
            while line <= match.end() - 1 or line == match.start():  # a match may join two lines
                starts.add(line)
                after = text.find("\n", line)
                if after < 0 or after >= match.end():
                    break
                line = after + 1
    headers = [match.start() for match in _SECTION.finditer(text)]
    lines: list[int] = []
    for start in sorted(starts):
        header = bisect_right(headers, start) - 1
        if header >= 0 and headers[header] != start and (not lines or lines[-1] < headers[header]):
            lines.append(headers[header])
        lines.append(start)
    ends = [text.find("\n", start) for start in lines]
    return [(start, end if end >= 0 else len(text)) for start, end in zip(lines, ends, strict=True)]


def _replaced(text: str, read: str) -> list[tuple[int, int, str]]:
    """The spans of `text` that its redaction `read` replaced, each with its mark, in order. `read` is
    `text` with some spans replaced by marks, and marks already in `text` are kept as they were."""
    spans: list[tuple[int, int, str]] = []
    at = done = 0  # in `text`, in `read`
    for mark in REDACTION.finditer(read):
        at += mark.start() - done
        done = mark.end()
        if text.startswith(mark.group(0), at):  # a mark the text already held
            at += len(mark.group(0))
            continue
        after = REDACTION.search(read, done)
        following = read[done : after.start() if after else len(read)]
        end = text.find(following, at + 1) if following else len(text)
        spans.append((at, end, mark.group(0)))
        at = end
    return spans


ANCHOR_CHARS = 3
"""A hint's literal beginning this long or longer is looked for by the automaton; a shorter one (`7z`,
`--`, `(`) is a scan of its own."""


def _literal_start(hint: str) -> tuple[str, bool]:
    """The literal a hint regex begins with, and whether that literal is the whole hint."""
    literal: list[str] = []
    at = 0
    while at < len(hint):
        char = hint[at]
        if char == "\\" and at + 1 < len(hint) and not hint[at + 1].isalnum():
            literal.append(hint[at + 1])  # an escaped punctuation mark: itself
            at += 2
        elif char in "*?{":  # a quantifier makes the character before it optional
            return "".join(literal[:-1]), False
        elif char in ".^$+[]()|\\":
            return "".join(literal), False
        else:
            literal.append(char)
            at += 1
    return "".join(literal), True


class _HintIndex:
    """Every rule's hints, found in a batch in one pass of an Aho-Corasick automaton over their
    literal beginnings (two: the text as it is, and lowered for the rules that ignore case), each
    hint's regex then tried only where its literal is: what a scan of the batch per hint found, in one
    pass instead of one per hint."""

    def __init__(self, rules: Sequence[Rule]):
        import ahocorasick_rs

        hints = sorted({(rule.ignores_case, hint) for rule in rules for hint in rule.hints})
        self.scanned: list[tuple[tuple[bool, str], re.Pattern[bytes]]] = []
        self.automata: dict[
            bool, tuple[Any, list[list[tuple[tuple[bool, str], re.Pattern[bytes] | None]]]]
        ] = {}
        for lowered in (False, True):
            by_literal: dict[str, list[tuple[tuple[bool, str], re.Pattern[bytes] | None]]] = {}
            for key in (key for key in hints if key[0] == lowered):
                literal, whole = _literal_start(key[1])
                if len(literal) < ANCHOR_CHARS:
                    self.scanned.append((key, re.compile(key[1].encode())))
                else:
                    by_literal.setdefault(literal, []).append(
                        (key, None if whole else re.compile(key[1].encode()))
                    )
            literals = sorted(by_literal)
            automaton = ahocorasick_rs.BytesAhoCorasick([literal.encode() for literal in literals])
            self.automata[lowered] = (automaton, [by_literal[literal] for literal in literals])

    def texts_holding(
        self, joined: bytes, lowered: bytes, starts: list[int]
    ) -> dict[tuple[bool, str], set[int]]:
        """For each hint ((ignores case, regex)), the indexes of the texts (`starts`: where each begins
        in `joined`, then the end) that hold a match of it."""
        found: dict[tuple[bool, str], set[int]] = {}
        for ignores_case, (automaton, users) in self.automata.items():
            haystack = lowered if ignores_case else joined
            settled: dict[int, int] = {}  # a literal whose every hint is known for the text it is in
            text = 0
            for literal, start, _ in automaton.find_matches_as_indexes(haystack, overlapping=True):
                while start >= starts[text + 1]:
                    text += 1
                if settled.get(literal) == text:
                    continue
                unsettled = False
                for key, pattern in users[literal]:
                    texts = found.setdefault(key, set())
                    if text in texts:
                        continue
                    if pattern is None or pattern.match(haystack, start):
                        texts.add(text)
                    else:
                        unsettled = True
                if not unsettled:
                    settled[literal] = text
        for key, pattern in self.scanned:
            found[key] = _texts_holding(lowered if key[0] else joined, (pattern,), starts)
        return found


@functools.cache
def _hint_index() -> _HintIndex:
    return _HintIndex(RULES)


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
    view, changed = _View(text), False
    for number, rule in enumerate(RULES):
        if number not in candidates and not (changed and view.holds(rule)):
            continue
        if rule.multiline:
            redacted = substituted(rule, view.text, 0, len(view.text), counts) or view.text
        else:
            redacted = _redact_lines(view, rule, counts)
        if redacted != view.text:
            view, changed = _View(redacted), True
    return view.text, counts


class _View:
    """A text as the rules read it, with what several rules would each compute again: its lowered copy,
    the lines holding each set of hints (most rules share theirs), where its files' syntaxes begin."""

    def __init__(self, text: str):
        self.text = text
        self._line_starts: dict[tuple[bool, tuple[str, ...]], list[int]] = {}

    @cached_property
    def lowered(self) -> str:
        return _lowercase(self.text)

    @cached_property
    def sections(self) -> tuple[list[int], list[Syntax]]:
        where = sections(self.text)
        return [offset for offset, _ in where], [syntax for _, syntax in where]

    def haystack(self, rule: Rule) -> str:
        return self.lowered if rule.ignores_case else self.text

    def holds(self, rule: Rule) -> bool:
        return any(pattern.search(self.haystack(rule)) for pattern in rule.hint_patterns)

    def line_starts(self, rule: Rule) -> list[int]:
        """Start offsets of the lines that hold one of the rule's hints, in order."""
        key = (rule.ignores_case, rule.hints)
        if key not in self._line_starts:
            self._line_starts[key] = _hint_line_starts(self.haystack(rule), rule.hint_patterns)
        return self._line_starts[key]

    def syntax_at(self, offset: int) -> Syntax:
        offsets, syntaxes = self.sections
        return syntaxes[bisect_right(offsets, offset) - 1]


def _redact_lines(view: _View, rule: Rule, counts: Counter) -> str:
    """Run `rule` on the lines of the text that hold one of its hints (and are of a syntax it reads);
    the text is rebuilt only when a secret is found."""
    text, pieces, done = view.text, [], 0
    starts = view.line_starts(rule)
    if rule.syntaxes != EVERY_SYNTAX:
        starts = [start for start in starts if view.syntax_at(start) in rule.syntaxes]
    for start in starts:
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        line = substituted(rule, text, start, end, counts)
        if line is not None:
            pieces += [text[done:start], line]
            done = end
    return "".join([*pieces, text[done:]]) if pieces else text


_ASSIGNS = re.compile(r"[=:]")
"""In a value a rule rejected: it assigns something itself, so a secret may begin inside it."""


INSIDE_READS = 16
"""Rejected values read from inside, at most, in one run of a rule over a line (`substituted`)."""


def substituted(rule: Rule, text: str, start: int, end: int, counts: Counter) -> str | None:
    """`text[start:end]` with `rule`'s secrets replaced, None where it has none. Where the rule rejects a
    match whose value assigns something itself, the search goes on from where that value begins, not
    after the match as `finditer` would: the value may begin a secret of its own (`env =
    "DB_PASSWORD=\\"hunter2\\""`, read with its quotes unescaped, is first a quoted value `DB_PASSWORD=`
    of a name `env`). Any other rejected value is left whole: read from inside, its closing quote would
    open a string (`type="password" size="30"` would give `password" size="30"`). A value that runs to the
    end of its line is read from inside `INSIDE_READS` times at most: a long line of `pass: pass: ...`
    would be read again from each."""
    pieces, done, at, inside_reads = [], start, start, 0
    while at <= end and (match := rule.pattern.search(text, at, end)):
        if rule.accept and not rule.accept(match):
            inside = inside_reads < INSIDE_READS and _ASSIGNS.search(match.group(rule.group)) is not None
            inside_reads += inside
            at = max(match.start(rule.group) if inside else match.end(), match.start() + 1)
            continue
        pieces += [text[done : match.start()], _redacted(match, rule, counts)]
        done, at = match.end(), max(match.end(), match.start() + 1)
    return "".join([*pieces, text[done:end]]) if pieces else None


def _hint_line_starts(haystack: str, patterns: tuple[re.Pattern[str], ...]) -> list[int]:
    """Start offsets of the lines that hold a match of one of the patterns, in order."""
    lines: set[int] = set()
    for pattern in patterns:
        for match in pattern.finditer(haystack):
            lines.add(haystack.rfind("\n", 0, match.start()) + 1)
    return sorted(lines)


def _redacted(match: re.Match[str], rule: Rule, counts: Counter) -> str:
    """The match with its secret replaced by `<REDACTED:rule>` (the rule accepted it), counted."""
    secret = match.group(rule.group)
    counts[rule.name] += 1
    whole = match.group(0)
    start = match.start(rule.group) - match.start(0)
    return whole[:start] + f"<REDACTED:{rule.name}>" + whole[start + len(secret) :]  # REDACTION's form


MESSAGE_ORIGIN = "(commit message)"


def redaction_origins(diff_text: str) -> Counter:
    """Where a redacted diff-format text (message, then `diff --git a/PATH b/PATH` sections) had its
    secrets: counts per file path, the message's as MESSAGE_ORIGIN. Counts only, never values."""
    origins: Counter = Counter()
    where = MESSAGE_ORIGIN
    for line in diff_text.splitlines():
        if line.startswith(("diff --git a/", 'diff --git "a/')):
            where = line.removeprefix("diff --git ").removeprefix('"').removeprefix("a/")
            where = where.rsplit(' "b/' if line.endswith('"') else " b/", 1)[0].removesuffix('"')
        elif "<REDACTED:" in line:
            origins[where] += line.count("<REDACTED:")
    return origins
