"""Secret redaction: every rule on planted values, lookalikes left alone, nothing leaks to any output file."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapers.secrets import (
    RULES,
    Syntax,
    _hint_index,
    _literal_start,
    _marked,
    _reading,
    _replaced,
    line_syntaxes,
    looks_random,
    redact,
    redact_all,
    substituted,
    syntax_of,
)
from tests.conftest import FAST_TRAINING, GitRepo, module_source, read_json
from tests.test_leak_forms import FAMILY_VALUES, SENTENCE_PASSWORD, planted_families

# Realistic but fake values, one per rule (these are not real credentials).
SECRETS = {
    "aws_access_key_id": "AKIAQ3EGRXZJ5T7K2M4P",
    "aws_secret_access_key": "h3Kq9vZ2LmN8pR4tW6yB1cD5fG7jK0sX2aQ9wE4r",
    "github_token": "ghp_7Hk2Lm9Qp4Rs8Tv1Wx3Yz5Ab6Cd0Ef2Gh4Ij",
    "gitlab_token": "glpat-Zx8Yw7Vu6Ts5Rq4Po3Nm",
    "slack_token": "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "jwt": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
    "url_password": "S3cr3tPassw0rdZ9",
    "secret_assignment": "q8ZxR2vLm9TbW4nKp7Yc",
    "stripe_key": "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "google_api_key": "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
    "openai_key": "sk-proj-Qz8Rm2Lx7Vb4Nc1Tp9Ws3Yd6Fh0Jk5Ga8",
    "anthropic_key": "sk-ant-api03-Zq8Rm2Lx7Vb4Nc1Tp9Ws3Yd6Fh0Jk5Ga8Bc2",
    "huggingface_token": "hf_QzRmLxVbNcTpWsYdFhJkGaBcDeFgHiJkLm",
    "npm_token": "npm_Qz8Rm2Lx7Vb4Nc1Tp9Ws3Yd6Fh0Jk5Ga8Bc2",
    "pypi_token": "pypi-AgEIcHlwaS5vcmcCJDk4ZWQyYzE3LTg0NmQtNGY1Yi05YzE2LWE3ZDk5YjBmNTM1OAACKlsz",
    "sendgrid_key": "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",
    "shopify_token": "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",
    "digitalocean_token": "dop_v1_4f1c9a7e2b8d3f6a0c5e9b1d7a3f2c8e4f1c9a7e2b8d3f6a0c5e9b1d7a3f2c8e",
    "vault_token": "hvs.CAESIJx8Rm2Lx7Vb4Nc1Tp9Ws3Yd6Fh0Jk5Ga8Bc2Dq7Er1",
    "databricks_token": "dapi4f1c9a7e2b8d3f6a0c5e9b1d7a3f2c8e",
    "postman_key": "PMAK-4f1c9a7e2b8d3f6a0c5e9b1d-7a3f2c8e4f1c9a7e2b8d3f6a0c5e9b1d7a",
    "telegram_bot_token": "7123456789:AAHq8Rm2Lx7Vb4Nc1Tp9Ws3Yd6Fh0Jk5Ga8",
    "mailgun_key": "key-3ax6xnjp29jd6fds4gc373sgvjxteol0",
    "mailchimp_key": "4f1c9a7e2b8d3f6a0c5e9b1d7a3f2c8e-us14",
    "square_token": "sq0atp-Q8zR2mL7xV4bN1cT9pW3sY",
    "sentry_token": "sntrys_Qz8Rm2Lx7Vb4Nc1Tp9Ws3Yd6Fh0Jk5Ga8Bc2",
    "sonarqube_token": "squ_4f1c9a7e2b8d3f6a0c5e9b1d7a3f2c8e4f1c9a7e",
    "discord_webhook": "https://discord.com/api/webhooks/123456789012345678/Zq8Rm2Lx7Vb4Nc1Tp9Ws3Yd6Fh0Jk5Ga8",
    "twilio_auth_token": "9f8e7d6c5b4a39281706f5e4d3c2b1a0",
}
PRIVATE_KEY_BODY = "MIIEowIBAAKCAQEA0Zk3VxTq8pL2mN9rS4tU7wX1yZ3aB5cD7eF9gH1iJ3kL5mN7"
PASSWORD_ALONE = "correct-horse-battery"  # a file's whole content: nothing but its name says what it is
PRIVATE_KEY = f"-----BEGIN RSA PRIVATE KEY-----\n{PRIVATE_KEY_BODY}\nq2W4e6R8t0Y2u4I6o8P0a2S4d6F8g0H2j4K6l8Z0x2C4v6B8n0M2\n-----END RSA PRIVATE KEY-----\n"

CONFIG_WITH_SECRETS = f'''"""Deployment settings."""

AWS_ACCESS_KEY_ID = "{SECRETS["aws_access_key_id"]}"
aws_secret_access_key = "{SECRETS["aws_secret_access_key"]}"
GITHUB_TOKEN = "{SECRETS["github_token"]}"
GITLAB = "{SECRETS["gitlab_token"]}"
SLACK = "{SECRETS["slack_token"]}"
SESSION = "{SECRETS["jwt"]}"
REMOTE = "https://deploy:{SECRETS["url_password"]}@git.example.com/team/app.git"
API_KEY = "{SECRETS["secret_assignment"]}"
STRIPE = "{SECRETS["stripe_key"]}"
MAPS = "{SECRETS["google_api_key"]}"
OPENAI = "{SECRETS["openai_key"]}"
ANTHROPIC = "{SECRETS["anthropic_key"]}"
HF = "{SECRETS["huggingface_token"]}"
NPM = "{SECRETS["npm_token"]}"
PYPI = "{SECRETS["pypi_token"]}"
MAIL = "{SECRETS["sendgrid_key"]}"
SHOP = "{SECRETS["shopify_token"]}"
DROPLETS = "{SECRETS["digitalocean_token"]}"
VAULT = "{SECRETS["vault_token"]}"
WAREHOUSE = "{SECRETS["databricks_token"]}"
POSTMAN = "{SECRETS["postman_key"]}"
BOT = "{SECRETS["telegram_bot_token"]}"
MAILGUN = "{SECRETS["mailgun_key"]}"
MAILCHIMP = "{SECRETS["mailchimp_key"]}"
SQUARE = "{SECRETS["square_token"]}"
SENTRY = "{SECRETS["sentry_token"]}"
SONAR = "{SECRETS["sonarqube_token"]}"
ALERTS = "{SECRETS["discord_webhook"]}"
SMS = Client("AC0123456789abcdef0123456789abcdef", "{SECRETS["twilio_auth_token"]}")
'''


@pytest.mark.parametrize("rule", sorted(SECRETS))
def test_each_rule_redacts_its_secret(rule):
    text, counts = redact(CONFIG_WITH_SECRETS)
    assert SECRETS[rule] not in text
    assert f"<REDACTED:{rule}>" in text
    assert counts[rule] == 1


@pytest.mark.parametrize("token", ["glrt-Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk", "gldt-Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk"])
def test_gitlab_runner_and_deploy_tokens_are_gitlab_tokens(token):
    assert redact(f'RUNNER_TOKEN_FOR_CI = "{token}"') == (
        'RUNNER_TOKEN_FOR_CI = "<REDACTED:gitlab_token>"',
        {"gitlab_token": 1},
    )


@pytest.mark.parametrize(
    ("line", "secret", "rule"),
    [
        (
            'STRIPE_WEBHOOK_SECRET = "whsec_4eC39HqLyjWDarjtT1zdp7dcAbCdEf"',
            "whsec_4eC39HqLyjWDarjtT1zdp7dcAbCdEf",
            "stripe_key",
        ),
        (
            'fernet = Fernet(b"q8ZxR2vLm9TbW4nKp7Yc3DfgQ8ZxR2vLm9TbW4nKp7Y=")',
            "q8ZxR2vLm9TbW4nKp7Yc3Dfg",
            "signing_key",
        ),
        (
            'digest = hmac.new(b"q8ZxR2vLm9TbW4nKp7Yc", body, hashlib.sha256)',
            "q8ZxR2vLm9TbW4nKp7Yc",
            "signing_key",
        ),
        # os.urandom's output pasted in, as Flask's documentation once showed it
        ("app.secret_key = b'\\x8f\\x12\\xaa\\x01\\x9c\\x33'", "\\x8f\\x12", "quoted_secret"),
        (
            'smtp.login("me@gmail.com", "abcd efgh ijkl mnop")',
            "abcd efgh",
            "auth_argument",
        ),  # an app password
        (
            "APP_KEY=base64:q8ZxR2vLm9TbW4nKp7Yc3DfgQ8ZxR2vLm9TbW4nKp7Y=",
            "q8ZxR2vLm9TbW4nKp7Yc3Dfg",
            "app_key",
        ),  # Laravel's, in .env
        # A URL's bare `key`, where its value looks generated.
        (
            "curl 'https://api.example.com/geo?q=x&key=q8ZxR2vLm9TbW4nKp7Yc'",
            "q8ZxR2vLm9TbW4nKp7Yc",
            "url_query_secret",
        ),
    ],
)
def test_secrets_in_their_own_shapes(line, secret, rule):
    text, counts = redact(line)
    assert secret not in text and counts == {rule: 1}, text


def test_a_secret_between_escaped_quotes_is_redacted_where_it_is_written():
    """Read with its quotes unescaped (twice where they are escaped twice), replaced in the text as
    written: every backslash stays, and so does a mark the text already held."""
    written = (
        'run("mysql --password=\\"hunter2x\\" app")  # <REDACTED:quoted_secret>\n'
        'x = "{\\\\\\"password\\\\\\": \\\\\\"s3cret99\\\\\\"}"\n'
    )
    assert redact(written) == (
        'run("mysql --password=\\"<REDACTED:quoted_secret>\\" app")  # <REDACTED:quoted_secret>\n'
        'x = "{\\\\\\"password\\\\\\": \\\\\\"<REDACTED:quoted_secret>\\\\\\"}"\n',
        {"quoted_secret": 2},
    )


def test_private_key_block_is_redacted_whole_even_inside_a_diff():
    diff = "".join(f"+{line}\n" for line in PRIVATE_KEY.splitlines())
    text, counts = redact(f"@@ -0,0 +1,4 @@\n{diff}")
    assert text == "@@ -0,0 +1,4 @@\n+<REDACTED:private_key>\n"
    assert counts == {"private_key": 1}
    cut_off = (
        "+-----BEGIN PRIVATE KEY-----\n+MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n+Kx7mPq2Rs9Tu\n diff context\n"
    )
    text, _ = redact(cut_off)  # no END line in view: the key material is still removed
    assert "MIIEvQ" not in text and "Kx7mPq2Rs9Tu" not in text and text.endswith(" diff context\n")


def test_a_file_that_is_a_credential_by_its_name_is_redacted_whole():
    def diff(path: str, body: str) -> str:
        return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n{body}"

    for path in ("deploy/db_password.txt", ".vault_pass", "secrets/GITHUB_TOKEN", "api_token.txt", ".pgpass",
                 "conf/.htpasswd"):  # fmt: skip
        code, credential = diff("app.py", "-x = 1\n+x = 2"), diff(path, "-old\n+new")
        text, counts = redact(f"Rotate it\n\n{code}\n{credential}")
        assert text.endswith(f"diff --git a/{path} b/{path}\n<REDACTED:credential_file>"), path
        assert "+x = 2" in text and counts == {"credential_file": 1}
    # Code, documents and names that only mention a credential are read line by line, as before.
    for path in ("requests/auth.py", "docs/password.md", "token.py", "password_hash.txt", "src/keys.txt"):
        assert redact(diff(path, "+hunter2")) == (diff(path, "+hunter2"), {}), path


@pytest.mark.parametrize(
    "line",
    [
        'key = "system_type_id"',
        "token = get_token(request)",
        'password = os.environ["DB_PASSWORD"]',
        'SECRET_KEY = "change-me-in-production"',
        'api_key: str = ""',
        'url = "postgres://user:${PGPASSWORD}@db/app"',
        'url = "http://127.0.0.1:#{@port}/ws/websocket"',  # Elixir's (and Ruby's) interpolation
        """password: "#{ENV['DB_PASSWORD']}",""",
        'password: "#{ENV["DB_PASSWORD"]}",',
        'clone = "https://github.com/org/repo.git"',
        'token_type = "bearer_token_v2"',
        "AKIA_PREFIX = 'AKIA'",
        "https://example.com/search?key=value&sort=asc",  # a bare `key` whose value is a word
        'cache.get("profile?key=user_profile_12")',
        "Net::SMTP.start(host, 25, helo, user, ENV['SMTP_PASSWORD'], :plain)",
        'msg = "the password is \\"required\\""',  # escaped quotes around a word in a sentence in code
        'raise ValueError("password=\\"" + pw + "\\"")',
        'pgpassword = os.environ["PGPASSWORD"]',
        'help = "set it with \\"--password\\" or PGPASSWORD"',
        'env = "DB_PASSWORD=\\"\\""',  # nothing between the quotes
        'forgotpassword = "/forgot"',
        "nopassword = True",
    ],
)
def test_lookalikes_are_left_alone(line):
    assert redact(line) == (line, {})


@pytest.mark.parametrize(
    "text",
    [
        # "İ".lower() is two characters: spans found in a plain lower() copy would land short of the secret.
        "# İstanbul İzmir İ\n" * 5 + f'API_KEY = "{SECRETS["secret_assignment"]}"\n',
        # The Kelvin sign lowers to an ASCII k, and the case-insensitive rule matches it as one.
        f'API_\u212aEY = "{SECRETS["secret_assignment"]}"\n',
    ],
)
def test_characters_that_lower_unusually_hide_no_secret(text):
    redacted, counts = redact(text)
    assert SECRETS["secret_assignment"] not in redacted
    assert counts == {"secret_assignment": 1}


_SECRET_LINES = [line for line in CONFIG_WITH_SECRETS.splitlines() if "=" in line] + [PRIVATE_KEY]


def _redact_without_hints(text: str) -> tuple[str, Counter]:
    """Every rule's regex on every line (the key block rule on the whole text): what redaction
    must give, since hints only choose which lines to skip."""
    counts: Counter = Counter()

    def replace(rule, text):
        return substituted(rule, text, 0, len(text), counts) or text

    for rule in RULES:
        if rule.multiline:
            text = replace(rule, text)
            continue
        pieces, start = [], 0  # each line read where it stands in the text (a rule may ask its syntax)
        for line, syntax in zip(text.split("\n"), line_syntaxes(text), strict=True):
            end = start + len(line)
            found = substituted(rule, text, start, end, counts) if syntax in rule.syntaxes else None
            pieces.append(line if found is None else found)
            start = end + 1
        text = "\n".join(pieces)
    if reading := _reading(text):
        plain, where = reading
        read, found = _redact_without_hints(plain)
        spans = _replaced(plain, read)
        text, counts = (
            _marked(text, where, spans),
            counts + Counter(mark[len("<REDACTED:") : -1] for _, _, mark in spans),
        )
    return text, counts


_VALUE = SECRETS["secret_assignment"]
_PIECES = [
    *_SECRET_LINES,
    f'API_\u212aEY = "{_VALUE}"',  # the Kelvin sign lowers to k
    f"Api-Key: {_VALUE}",
    f'privatekey="{_VALUE}"',
    f'client-secret => "{_VALUE}"',
    f"passphrase: {_VALUE}",
    f'auth_token = "{_VALUE}"',
    f"DB_PWD={_VALUE}",
    f"credentials: {_VALUE}",
    f'monkey = "{_VALUE}"',
    f"AWS_SECRET_ACCESS_KEY={SECRETS['aws_secret_access_key']}",
    "git+ssh://git:Xk39fj20DKsl@host/repo",
    "key = 1",
    "pass",
    # Quotes escaped inside a string, once and twice.
    'run("mysql --password=\\"hunter2x\\" app")',
    f'body = "{{\\"token\\": \\"{_VALUE}\\"}}"',
    'x = "{\\\\\\"password\\\\\\": \\\\\\"hunter2x\\\\\\"}"',
    '\\"',
    'env = "DB_PASSWORD=\\"hunter2x\\""',
    '<input type="password" name="password" size="30">',
    "İ",
    "ſ",
    "résumé",
    "\x00",
    "://x",
    "\r",
    # Lines whose syntax decides: a file header sets it for the lines below, the message heading ends it.
    "diff --git a/.env b/.env",
    "diff --git a/deploy/compose.yml b/deploy/compose.yml",
    "diff --git a/Dockerfile b/Dockerfile",
    "diff --git a/.netrc b/.netrc",
    "diff --git a/app.py b/app.py",
    "Commit message:",
    "+DB_PASS=hunter22",
    "  password: hunter2 # c",
    "ENV DB_PASSWORD hunter2",
    "machine h login u password p4ss",
    "password p4ss",
    "Password=abc;",
    "?token=abc&",
    "<secret>x</secret>",
    "f(password=pw)",
]


@given(
    st.lists(
        st.tuples(st.lists(st.sampled_from(_PIECES), max_size=6), st.sampled_from(["\n", " ", ""])).map(
            lambda pieces_and_separator: pieces_and_separator[1].join(pieces_and_separator[0])
        ),
        max_size=8,
    )
)
def test_redacting_a_batch_gives_what_every_rule_on_every_line_gives(texts):
    assert redact_all(texts) == [_redact_without_hints(text) for text in texts]


def test_randomness_check():
    assert looks_random("q8ZxR2vLm9TbW4nKp7Yc")
    assert not looks_random("system_type_id_2")
    assert not looks_random("abcdefghijkl")  # no digit
    assert not looks_random("aaaa1111aaaa")  # low entropy


def test_no_secret_reaches_any_output_file(cli, tmp_path):
    """Secrets committed, then "removed": the history still has them; no output file may, the token cache
    read back through its tokenizer and a tracker's logs included."""
    from transformers import AutoTokenizer  # here: transformers takes seconds to import, and one test reads

    from pipeline.data.token_cache import read_split

    repo = GitRepo(tmp_path / "leaky")
    repo.git("remote", "add", "origin", "https://bob:s3cr3t@pa?ss@git.example.com/team/app.git")
    repo.commit("Add package", {"app/__init__.py": "", "app/core.py": module_source(1)})
    families = planted_families()  # a form of each family of tests/test_leak_forms.py, beside them
    planted = repo.commit(
        f"Add deployment settings\n\nThe password for staging is {SENTENCE_PASSWORD}",
        {
            "app/settings.py": CONFIG_WITH_SECRETS,
            "deploy/id_rsa": PRIVATE_KEY,
            "deploy/db_password.txt": f"{PASSWORD_ALONE}\n",
            **families,
        },
    )
    rotated = repo.commit(
        f"Rotate key {SECRETS['aws_access_key_id']} after the leak", {"app/core.py": module_source(2)}
    )
    removed = repo.commit(
        "Remove credentials from the repository",
        {
            "app/settings.py": None,
            "deploy/id_rsa": None,
            "deploy/db_password.txt": None,
            **dict.fromkeys(families),
        },
    )
    for index in range(3, 8):
        repo.commit(f"Add compute_{index}", {f"app/feature_{index}.py": module_source(index)})
    out = tmp_path / "out"
    assert (
        cli(
            "--repo", repo.path, "--output-dir", out, *FAST_TRAINING, "--set", "train.report_to=[tensorboard]"
        ).code
        == 0
    )

    values = [*SECRETS.values(), PRIVATE_KEY_BODY, "horse-battery", *FAMILY_VALUES, "s3cr3t", "pa?ss"]
    written = [path for path in out.rglob("*") if path.is_file()]
    assert any("tfevents" in path.name for path in written)  # the tracker's logs are among them
    for path in written:
        data = path.read_bytes()
        leaked = [value[:12] for value in values if value.encode() in data]
        assert not leaked, f"{path.relative_to(out)} contains {leaked}"
    # The token cache holds token ids: read back through its tokenizer, it holds none either.
    decoded = [
        text
        for cache in out.rglob("tokens-*")
        for split in ("train", "valid", "eval", "files")
        if (cache / split).exists()
        for text in AutoTokenizer.from_pretrained(cache / "tokenizer").batch_decode(
            read_split(cache, split).column("input_ids").to_pylist()
        )
    ]
    assert any("REDACTED" in text for text in decoded)  # the cache decodes to the text it was made from
    assert not [value[:12] for value in values if any(value in text for text in decoded)]
    manifest = read_json(out / "MANIFEST.json")
    redactions = manifest["scrape"]["redactions"]
    # Each secret appears twice in the history: added, then deleted (the AWS id a third time, in a message).
    assert redactions["credential_file"] == 2, (redactions, manifest["scrape"]["redacted_paths"])
    assert redactions["private_key"] == 4  # id_rsa and the JWK
    assert {"prose_password", "docker_hub_token", "groq_key", "connection_string_password"} <= set(redactions)
    assert redactions["aws_access_key_id"] == 3
    assert all(redactions[rule] == 2 for rule in SECRETS if rule != "aws_access_key_id")
    assert sorted(manifest["scrape"]["redacted_commits"]) == sorted([planted, rotated, removed])
    assert b"<REDACTED:github_token>" in (out / "sequences.jsonl").read_bytes()


def test_a_clone_url_typed_with_its_token_reaches_no_file(cli, tmp_path):
    """A clone URL pasted with its token as `--repo` (not a repository: the run stops at once): the
    terminal is told what was typed; the manifest and its kept copy record the command and the error
    without the user info."""
    token = SECRETS["github_token"]
    url = f"https://bob:{token}@git.example.com/team/app.git"
    out = tmp_path / "out"
    result = cli("--repo", url, "--output-dir", out)
    assert result.code == 2 and token in result.err
    written = [path for path in out.rglob("*") if path.is_file()]
    assert sum(path.name == "MANIFEST.json" for path in written) == 2  # the manifest, its copy under runs/
    for path in written:
        assert token.encode() not in path.read_bytes() and b"bob" not in path.read_bytes(), path
    run = read_json(out / "MANIFEST.json")["run"]
    assert run["argv"][:2] == ["--repo", "https://git.example.com/team/app.git"]
    assert run["error"].startswith("https://git.example.com/team/app.git: ")


# A literal assigned to a credential-named key, in each syntax people keep them in: redacted whatever
# its entropy (people's passwords are words). Each line sits in a diff under its file's header.
CREDENTIALS = [
    (".env", "DB_PASSWORD=hunter2hunter"),
    (".env.production", "export API_TOKEN=swordfish"),
    ("config/settings.yaml", "DB_PASSWORD: hunter2hunter"),
    ("config/settings.yaml", "  password: 'swordfish'  # the staging one"),
    ("docker-compose.yml", "      - POSTGRES_PASSWORD=swordfish"),
    ("docker-compose.yml", '      POSTGRES_PASSWORD: "swordfish"'),
    ("secrets.json", '  "client_secret": "swordfish",'),
    ("pyproject.toml", 'token = "swordfish"'),
    ("setup.cfg", "password = swordfish"),
    ("app.ini", "secret_key: swordfish"),
    ("application.properties", "spring.datasource.password=swordfish"),
    ("deploy.sh", "export GITHUB_TOKEN=swordfish"),
    ("app/settings.py", 'SECRET_KEY = "dev"'),
    ("app/db.py", 'connect(host="db", password="swordfish")'),
    ("app/config.py", 'app.config["SECRET_KEY"] = "swordfish"'),
    ("src/client.js", "const apiKey = 'swordfish';"),
    ("src/client.ts", "fetch(url, { headers: { authToken: 'swordfish' } })"),
    ("cmd/main.go", 'cfg := Config{Password: "swordfish"}'),
    ("lib/client.rb", "client = Client.new(password: 'swordfish')"),
    ("lib/client.rb", "@password = 'swordfish'"),
    ("Dockerfile", "ENV DB_PASSWORD swordfish"),
    ("Dockerfile", "ARG NPM_TOKEN=swordfish"),
    ("src/Db.cs", 'var db = "Server=db;User Id=app;Password=swordfish;";'),
    ("app/db.py", 'url = "https://api.example.com/v1?api_key=swordfish&page=2"'),
    (".netrc", "machine example.com login ada password swordfish"),
    (".npmrc", "//registry.npmjs.org/:_authToken=swordfish"),
    (".pypirc", "password = swordfish"),
    ("kubeconfig", "    token: swordfish"),
    ("settings.xml", "      <password>swordfish</password>"),
    ("README.md", "Start it with DB_PASSWORD=swordfish make up"),
    ("Web.config", '    <add key="ApiKey" value="swordfish" />'),
    ("task-definition.json", '      {"name": "DB_PASSWORD", "value": "swordfish"},'),
    ("deploy.sh", "curl -fsS -u deploy:swordfish https://example.com/api"),
    ("docs/backup.md", "    mysqldump -u root -pswordfish app > app.sql"),
    ("app/backup.py", "os.system(\"mysql -uroot -p'swordfish' app < dump.sql\")"),
    (".github/workflows/ci.yml", "      - run: docker login -u ci -p swordfish registry.example.com"),
    ("deploy.sh", "sshpass -p 'swordfish' ssh deploy@host"),
    ("wp-config.php", "define( 'DB_PASSWORD', 'swordfish' );"),
    ("src/Mail.java", 'props.setProperty("mail.smtp.password", "swordfish");'),
    ("app/settings.py", 'os.environ.setdefault("SECRET_KEY", "swordfish")'),
    ("app/client.py", 'requests.get(url, auth=("alice", "swordfish"))'),
    ("app/client.py", 'session.auth = HTTPDigestAuth("alice", "swordfish")'),
    ("app/mail.py", 'smtp.login(user, "swordfish")'),
    (
        "app/storage.py",
        'CONN = "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=swordfishswordfishswordfishswordfish==;"',
    ),
    ("app/cache.py", 'REDIS_URL = "redis://:swordfish@cache:6379/0"'),
    ("src/db.ts", "const client = new Client({ user: 'app', password: `swordfish` })"),
    ("app/settings.py", 'db_password: str = "swordfish"'),  # a pydantic setting's default
    ("app/settings.py", 'API_KEY: Final[str] = "swordfish"'),
    ("src/api.ts", 'export const apiKey: string = "swordfish";'),
    ("src/main.rs", 'const API_KEY: &\'static str = "swordfish";'),
    ("cmd/main.go", 'const apiToken string = "swordfish"'),
    ("app/src/Db.kt", 'val password: String? = "swordfish"'),
    ("db/init.sql", "CREATE USER app IDENTIFIED BY 'swordfish';"),
    ("db/init.sql", "ALTER ROLE app WITH LOGIN PASSWORD 'swordfish';"),
    ("docker-compose.yml", "    command: redis-server --requirepass swordfish"),
    ("deploy.sh", "app serve --db-password 'swordfish' --verbose"),
    ("app/run.py", 'subprocess.run("tool --api-key=swordfish sync", shell=True)'),
    ("README.md", "Start it with `app --password=swordfish`"),
    ("app/build.gradle", "            storePassword 'swordfish'"),  # Android's signing config
    ("firmware/wifi.ino", '#define WIFI_PASSWORD "swordfish"'),
    ("src/app.clj", '{:db {:password "swordfish"}}'),
    ("Makefile", "DB_PASSWORD ?= swordfish"),
    ("src/main/resources/application.yml", "    password: ${DB_PASSWORD:swordfish}"),  # Spring's default
    ("docker-compose.yml", "      POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:-swordfish}"),
    # Commands that take a password, in a script, a CI step or a document.
    ("deploy.sh", 'echo "swordfish" | docker login -u ci --password-stdin registry.example.com'),
    ("deploy.sh", "echo 'swordfish' | sudo -S apt-get update"),
    ("provision.sh", 'echo "deploy:swordfish" | chpasswd'),
    ("deploy.sh", "az login --service-principal -u http://app -p swordfish --tenant t"),
    ("deploy.sh", "htpasswd -b -c /etc/nginx/.htpasswd admin swordfish"),
    ("deploy.sh", "htpasswd -nb admin swordfish > .htpasswd"),
    ("certs.sh", "openssl pkcs12 -export -in cert.pem -passout pass:swordfish -out cert.p12"),
    ("build.sh", "keytool -genkeypair -alias app -keystore app.jks -storepass swordfish"),
    ("ops.sh", "redis-cli -h cache -a swordfish ping"),
    ("db.sh", 'sqlcmd -S db -U sa -P swordfish -Q "SELECT 1"'),
    ("ldap.sh", 'ldapsearch -x -D "cn=admin,dc=example,dc=org" -w swordfish'),
    ("share.sh", "smbclient //srv/share -U admin%swordfish"),
    ("pack.sh", "7z a -pswordfish backup.7z data"),
    ("pack.sh", "zip -P swordfish backup.zip data"),
    ("keys.sh", 'ssh-keygen -t ed25519 -N "swordfish" -f deploy_key'),
    ("mq.sh", "rabbitmqctl add_user app swordfish"),
    ("map.bat", "net use Z: \\\\srv\\share /user:admin swordfish"),
    ("ci.sh", "npm config set //registry.npmjs.org/:_authToken swordfish"),
    ("decrypt.sh", "gpg --batch --passphrase swordfish -d secrets.gpg"),  # after another flag
    # Headers given as a call's arguments or an f-string, signing keys, logins and data source names.
    ("client.go", 'req.Header.Set("Authorization", "Bearer swordfish")'),
    ("Client.java", 'conn.setRequestProperty("Authorization", "Basic swordfish");'),
    ("client.py", 'session.headers.update({"Authorization": f"Bearer swordfish"})'),
    ("client.js", 'xhr.setRequestHeader("X-Auth-Token", "swordfish");'),
    ("auth.js", "const token = jwt.sign({ sub: user.id }, 'swordfish', { expiresIn: '1h' });"),
    ("auth.py", 'token = jwt.encode({"sub": "42", "iat": 1371720939}, "swordfish", algorithm="HS256")'),
    ("Db.java", 'Connection c = DriverManager.getConnection(url, "app", "swordfish");'),
    ("main.go", 'db, err := sql.Open("mysql", "app:swordfish@tcp(db:3306)/app")'),
    ("Mail.cs", 'client.Credentials = new NetworkCredential("app", "swordfish");'),
    ("directory.py", 'conn.simple_bind_s("cn=admin,dc=example,dc=org", "swordfish")'),
    ("deploy.ps1", '$pw = ConvertTo-SecureString "swordfish" -AsPlainText -Force'),
    ("deploy.ps1", '$pw = ConvertTo-SecureString -String "swordfish" -AsPlainText -Force'),
    ("db/init.sql", "ALTER USER 'root'@'localhost' IDENTIFIED WITH mysql_native_password BY 'swordfish';"),
    ("db/init.sql", "GRANT ALL ON *.* TO 'app'@'%' IDENTIFIED BY 'swordfish';"),
    ("db/init.sql", "SET PASSWORD FOR 'app'@'%' = PASSWORD('swordfish');"),
    ("mail.go", 'auth := smtp.PlainAuth("", "me@example.com", "swordfish", "smtp.example.com")'),
    ("Mail.java", 'return new PasswordAuthentication("me@example.com", "swordfish");'),
    ("mq.py", 'creds = pika.PlainCredentials("guest", "swordfish")'),
    ("S3.java", 'AwsBasicCredentials.create(accessKeyId, "swordfish")'),
    ("app.py", 'keyring.set_password("deploy", "me", "swordfish")'),
    ("app.py", 'ftp = FTP("ftp.example.com", "admin", "swordfish")'),
    ("backup.bat", "schtasks /Create /TN backup /TR backup.bat /RU admin /RP swordfish"),
    ("ops.sh", "mongo admin -u root -p swordfish"),
    ("ops.sh", "influx -username admin -password swordfish"),
    ("config.py", 'JWT_KEY = "swordfish"'),
    # A sentence that gives one: quoted, or a word of letters and digits.
    ("docs/setup.md", "The staging password is 'swordfish', ask ops for the other."),
    ("docs/setup.md", "Log in as admin; the password is swordfish42."),
    ("docs/setup.md", "API key: swordfish42"),
    # A credential's fallback beside the variable that overrides it.
    ("src/config.js", "const secret = process.env.JWT_SECRET || 'swordfish';"),
    ("src/config.ts", "const secret = process.env.JWT_SECRET ?? 'swordfish';"),
    ("app/config.py", 'API_KEY = os.environ.get("API_KEY") or "swordfish"'),
    ("config/initializers/app.rb", "password = ENV.fetch('DB_PASSWORD') { 'swordfish' }"),
    ("config/database.yml", '  password: <%= ENV["DB_PASSWORD"] || "swordfish" %>'),
    ("config/secrets.rb", "ENV.fetch('SECRET_KEY_BASE', 'swordfish')"),  # Rails' secret_key_base
    ("src/config.rs", 'let secret = env::var("JWT_SECRET").unwrap_or("swordfish".to_string());'),
    ("src/config.rs", 'let secret = env::var("JWT_SECRET").unwrap_or_else(|_| "swordfish".into());'),
    # Frameworks' and servers' own places.
    ("Program.cs", 'builder.Configuration["Jwt:Key"] = "swordfish";'),
    ("appsettings.json", '  "Jwt": { "Key": "swordfish", "Issuer": "app" },'),
    ("wp-config.php", "define('SECURE_AUTH_SALT', 'swordfish');"),
    ("sites/default/settings.php", "$settings['hash_salt'] = 'swordfish';"),
    ("nginx.conf", 'proxy_set_header Authorization "Basic swordfish";'),
    ("haproxy.cfg", "  user admin insecure-password swordfish"),
    ("redis.conf", "requirepass swordfish"),
    ("wpa_supplicant.conf", '  psk="swordfish"'),
    ("firmware/main.cpp", 'WiFi.begin("home", "swordfish");'),
    # Setting one from the command line.
    ("ci.sh", 'gh secret set DEPLOY_TOKEN --body "swordfish"'),
    ("ci.sh", "az keyvault secret set --vault-name v --name db --value swordfish"),
    ("ci.sh", "aws configure set aws_secret_access_key swordfish"),
    ("ci.sh", "git config --global github.token swordfish"),
    ("env.fish", "set -gx API_TOKEN swordfish"),
    ("setenv.bat", 'setx API_TOKEN "swordfish"'),
    (
        "app/db.py",
        'conn = pymysql.connect("db", "app", "swordfish", "app")',
    ),  # positional: host, user, password
    ("auth.json", '{"github-oauth": {"github.com": "swordfish"}}'),  # Composer's, a token under its host
    ("app/build.gradle", 'buildConfigField "String", "API_KEY", "\\"swordfish\\""'),  # Android's
    ("docker-compose.yml", '    command: ["redis-server", "--requirepass", "swordfish"]'),  # exec form
    ("app/azure.py", 'headers = {"Ocp-Apim-Subscription-Key": "swordfish"}'),
    # A setter, or a builder's step, named for a credential.
    ("src/main/java/Db.java", 'dataSource.setPassword("swordfish");'),
    ("src/main/java/Client.java", 'Client.builder().apiKey("swordfish").build();'),
    ("client.go", 'client := github.NewClient(nil).WithAuthToken("swordfish")'),
    ("app/client.py", 'client.set_token("swordfish")'),
    ("src/mail.js", 'sgMail.setApiKey("swordfish");'),
    ("src/Mail.php", "$mail->setPassword('swordfish');"),
    ("app/mailer.rb", "Net::SMTP.start('smtp.example.com', 25, 'example.com', 'app', 'swordfish', :plain)"),
    (".github/workflows/ci.yml", "      - run: mvn sonar:sonar -Dsonar.login=swordfish"),
    ("sonar-project.properties", "sonar.login=swordfish"),
    # Quotes escaped inside a string: a command, a JSON body.
    ("app/backup.py", 'run("mysqldump --password=\\"swordfish\\" app")'),
    (
        "README.md",
        'curl -d "{\\"user\\": \\"admin\\", \\"password\\": \\"swordfish\\"}" https://example.com/login',
    ),
    ("test/api.test.js", "const body = '{\\'password\\': \\'swordfish\\'}';"),
    ("deploy.sh", 'ssh db "redis-cli -a \\"swordfish\\" ping"'),
    ("docker-compose.yml", '    command: sh -c "app --api-key=\\"swordfish\\""'),
    # Inside a value a rule rejected: `env = "..."` is first read as a quoted value of a name `env`.
    ("deploy.py", 'env = "DB_PASSWORD=\\"swordfish\\""'),
    ("app/config.py", 'label = "password: \\"swordfish\\""'),
    # The variables psql and sshpass read a password from.
    ("backup.sh", "PGPASSWORD=swordfish pg_dump -U app app > dump.sql"),
    ("deploy.py", "cmd = 'PGPASSWORD=\"swordfish\" psql -U app'"),
    ("deploy.sh", "SSHPASS=swordfish sshpass -e ssh deploy@host"),
    # A name run together, read as DB_PASSWORD is.
    ("deploy.sh", "export DBPASSWORD=swordfish"),
    ("app/settings.py", 'rootpassword = "swordfish"'),
    ("package.json", '  "db_password": "1.0-swordfish",'),  # begins as a version, then a word a person chose
]


@pytest.mark.parametrize(
    ("path", "line"), CREDENTIALS, ids=[f"{path}: {line.strip()}" for path, line in CREDENTIALS]
)
@pytest.mark.parametrize("marker", ["+", "-"])
def test_a_literal_under_a_credential_name_is_redacted_in_any_syntax(path, line, marker):
    value = "dev" if '"dev"' in line else "swordfish"
    text = f"Update settings\n\ndiff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n{marker}{line}\n"
    redacted, counts = redact(text)
    assert value not in redacted.split("@@")[-1], redacted
    assert sum(counts.values()) == 1


# Code is not a literal, and neither is a reference, a template, a type or nothing at all.
NOT_CREDENTIALS = [
    ("app/forms.py", "password = forms.CharField()"),
    ("app/nlp.py", "token = tokenizer(text)"),
    ("app/nlp.py", 'pad_token = "<pad>"'),
    ("app/nlp.py", 'eos_token = "EOS"'),
    ("app/settings.py", 'secret = os.environ["SECRET"]'),
    ("app/settings.py", "password = request.form.password"),
    ("app/settings.py", 'auth = "Basic %s" % encoded'),
    ("app/settings.py", "def login(user, password: str = None):"),
    ("app/cli.py", "password = getpass()"),
    ("app/api.py", "api_key: str = ''"),
    ("app/api.py", "password_hash = bcrypt(password)"),
    ("src/client.js", "fetch(url, { credentials: 'include' })"),
    (".env", "SECRET_KEY=${SECRET_KEY}"),
    (".env", "DB_PASSWORD="),
    (".env", "DB_PASSWORD_FILE=/run/secrets/db"),
    ("config/settings.yaml", "password: {{ vault_db_password }}"),
    ("config/settings.yaml", "password:"),
    ("config/settings.yaml", "auth: true"),
    (".github/workflows/ci.yml", "      id-token: write"),
    (".github/workflows/ci.yml", "          token: ${{ secrets.GITHUB_TOKEN }}"),
    (".github/workflows/ci.yml", "    secrets: inherit"),
    ("deploy.sh", 'export TOKEN="$(gh auth token)"'),
    ("deploy.sh", "PASSWORD=$1"),
    ("Dockerfile", "ARG NPM_TOKEN"),
    ("docs/api.rst", "   :param password: the user's password"),
    ("docs/auth.md", "requests.get(url, auth=auth)"),
    ("docs/auth.md", "Session(token=self.token)"),
    ("config/settings.yaml", "password: changeme"),
    ("docker-entrypoint.sh", "find /etc/mysql/ -name '*.cnf' -print0"),
    ("docker-entrypoint.sh", 'mysql -uroot -p"$MYSQL_ROOT_PASSWORD" app'),
    ("docker-entrypoint.sh", "mysql -u root -p app"),
    ("deploy.sh", "docker login -u ci --password-stdin registry.example.com"),
    ("docs/api.md", "curl -u <user>:<password> https://example.com"),
    ("docs/api.md", "curl -k -u admin:password https://example.com"),
    ("k8s/pod.yaml", '        - {"name": "PORT", "value": "8080"}'),
    ("Web.config", '    <add key="Theme" value="dark" />'),
    ("app/forms.py", 'field("password", "Your password")'),
    ("app/settings.py", 'os.environ.get("DB_PASSWORD", "")'),
    ("tests/test_auth.py", "r = get(httpbin('basic-auth', 'user', 'pass'), auth=auth)"),
    ("tests/test_auth.py", "auth = ('digest', 'auth', 'user', 'pass')"),
    ("app/client.py", "requests.get(url, auth=HTTPBasicAuth(user, password))"),
    ("docs/auth.md", ">>> requests.get(url, auth=('user', 'pass'))"),
    ("app/ui.css", ".sk-fading-circle-container-abcdef { margin: 0 }"),
    ("app/hub.py", "path = hf_hub_download(repo_id, filename)"),
    ("src/db.ts", "const client = new Client({ password: `${process.env.DB_PASSWORD}` })"),
    ("docs/auth.md", "The `auth=` argument wins over `netrc`"),
    ("app/settings.py", 'password: str = os.environ["DB_PASSWORD"]'),
    ("app/settings.py", 'token: str = Field(default="", env="TOKEN")'),
    ("app/auth.py", 'def login(user: str, password: str = "") -> bool:'),
    ("app/queue.py", '    The work queue is identified by "name".'),
    ("README.md", "Add the --no-root-password flag for the tests"),
    ("deploy.sh", 'app serve --password "$DB_PASSWORD"'),
    ("deploy.sh", "app serve --password-file /run/secrets/db --token-ttl 3600"),
    ("app/auth.py", 'raise InvalidPassword("try again")'),
    ("app/models.rb", "validates :password, presence: true"),
    ("src/log.c", 'printf("password %s", masked);'),
    ("deploy.sh", 'echo "$DOCKER_PASSWORD" | docker login -u ci --password-stdin'),
    ("deploy.sh", "echo 'building' | sudo tee /var/log/build.log"),
    ("deploy.sh", "htpasswd -c /etc/nginx/.htpasswd admin"),  # asks for it
    ("certs.sh", "openssl pkcs12 -export -passout env:P12_PASSWORD -out cert.p12"),
    ("certs.sh", "openssl rsa -in key.pem -passin file:pass.txt"),
    ("build.sh", "keytool -list -keystore app.jks -storepass:env STORE_PASSWORD"),
    ("build.sh", 'keytool -list -keystore app.jks -storepass "$STORE_PASSWORD"'),
    ("ops.sh", 'redis-cli -a "$REDIS_PASSWORD" ping'),
    ("keys.sh", 'ssh-keygen -t ed25519 -N "" -f deploy_key'),
    ("auth.py", "jwt.encode(payload, key, algorithm='HS256')"),
    ("auth.py", 'jwt.decode(token, options={"verify_signature": False})'),
    ("auth.py", 'jwt.encode({"sub": "42", "iat": 1371720939}, SECRET_KEY)'),
    ("client.go", 'req.Header.Set("Authorization", "Bearer "+token)'),
    ("sms.py", 'client = Client("AC0123456789abcdef0123456789abcdef", auth_token)'),
    ("deploy.ps1", "$pw = Read-Host -AsSecureString"),
    ("deploy.ps1", "$pw = ConvertTo-SecureString $env:DEPLOY_PASSWORD -AsPlainText -Force"),
    ("db/init.sql", "GRANT SELECT ON app.* TO 'reader'@'%';"),
    ("app.py", 'ftp = FTP("ftp.example.com", user, password)'),
    ("mail.go", 'auth := smtp.PlainAuth("", from, password, host)'),
    ("ops.sh", "mongo admin -u root -p"),  # asks for it
    ("mq.py", "creds = pika.PlainCredentials(user, password)"),
    ("README.md", "The password is required and the token is 32 bytes long."),
    ("README.md", "The secret is stored in Vault."),
    ("bin/tool", "token = arguments[0]"),  # a script without a suffix reads as prose
    ("src/config.js", "const secret = process.env.JWT_SECRET || defaults.secret;"),
    ("src/config.js", "const port = process.env.PORT || '8080';"),
    ("app/config.py", 'DEBUG = os.environ.get("DEBUG") or "false"'),
    ("src/config.rs", 'let port = env::var("PORT").unwrap_or("8080".to_string());'),
    ("firmware/main.cpp", "WiFi.begin(ssid, password);"),
    ("redis.conf", "# requirepass foobared"),  # a comment: redis.conf's own example
    ("appsettings.json", '  "Jwt": { "Issuer": "app", "Audience": "app" },'),
    ("src/flask/sessions.py", '    salt = "cookie-session"'),  # itsdangerous' salt: a namespace, not a secret
    ("ci.sh", 'gh secret set DEPLOY_TOKEN --body "$DEPLOY_TOKEN"'),
    ("ci.sh", "git config --global user.name deploy"),
    ("env.fish", "set -gx EDITOR vim"),
    ("app/db.py", "conn = pymysql.connect(host, user, password, db)"),
    ("auth.json", '{"github-oauth": {}, "http-basic": {}}'),
    ("app/build.gradle", 'buildConfigField "String", "API_URL", "\\"https://api.example.com\\""'),
    ("ios/App/Info.plist", "<key>CFBundleName</key><string>App</string>"),
    ("docker-compose.yml", '    command: ["redis-server", "--appendonly", "yes"]'),
    ("docker-compose.yml", '    command: ["app", "--password-file", "/run/secrets/db"]'),
    ("app/vault.py", 'value = secrets.get_secret("prod/db")'),  # a lookup by name
    ("app/auth.py", 'digest = auth.hash_password("abc123")'),
    ("app/auth.py", "user.set_password(password)"),
    ("app/cache.js", 'cache.set_key("user:1")'),
    (
        "pages/smbclient.md",
        "`smbclient {{//서버/공유}} --user {{사용자명%비밀번호}}`",
    ),  # tldr's placeholders, in Korean
    ("Makefile", "DB_PASSWORD != cat /run/secrets/db"),
    ("docker-compose.yml", "      POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?set it in .env}"),
    ("docker-compose.yml", "      PORT: ${PORT:-8080}"),
    # a dependency named for a credential, pinned to a version: a package, not a password
    ("package.json", '    "basic-auth": "^2.0.1",'),
    ("package.json", '    "pbkdf2-password": "1.2.1",'),
    ("package.json", '    "basic-auth": "2.1.0-beta.1",'),
    ("Cargo.toml", 'http-auth = "0.1.8"'),
    ("lib/request.js", "    auth.password = auth.pass;"),  # a member read, not a connection string's value
]


@pytest.mark.parametrize(
    ("path", "line"), NOT_CREDENTIALS, ids=[f"{path}: {line.strip()}" for path, line in NOT_CREDENTIALS]
)
def test_code_references_and_placeholders_under_a_credential_name_stay(path, line):
    text = f"diff --git a/{path} b/{path}\n@@ -1 +1 @@\n+{line}\n"
    assert redact(text) == (text, {})


@pytest.mark.parametrize(
    "pair",
    [
        "   - name: DB_PASSWORD\n+    value: swordfish\n",  # Kubernetes' env, the value changed
        '+  - name: "API_TOKEN"\n+    value: "swordfish"\n',
        '+        "name": "DB_PASSWORD",\n+        "value": "swordfish"\n',  # an ECS task definition
        "+\t<key>API_TOKEN</key>\n+\t<string>swordfish</string>\n",  # a property list (iOS, macOS)
    ],
)
def test_a_credential_named_on_one_line_and_given_on_the_next_is_redacted(pair):
    text = f"diff --git a/deploy.yaml b/deploy.yaml\n@@ -1,2 +1,2 @@\n{pair}"
    redacted, counts = redact(text)
    assert "swordfish" not in redacted and counts == {"named_value": 1}
    port = text.replace("DB_PASSWORD", "PORT").replace("API_TOKEN", "PORT")
    assert redact(port) == (port, {})  # a name that is no credential: its value stays


@pytest.mark.parametrize(
    ("path", "lines"),
    [
        ("infra/variables.tf", 'variable "db_password" {\n+  type = string\n+  default = "swordfish"\n+}'),
        ("chart/values.yaml", "  password: |\n+    swordfish"),  # a block scalar
    ],
)
def test_a_credential_whose_value_is_on_a_line_below_its_name_is_redacted(path, lines):
    text = f"diff --git a/{path} b/{path}\n@@ -1,3 +1,3 @@\n+{lines}\n"
    redacted, counts = redact(text)
    assert "swordfish" not in redacted and sum(counts.values()) == 1
    other = text.replace("db_password", "region").replace("password:", "banner:")
    assert redact(other) == (other, {})  # a name that is no credential: its value stays


def test_the_message_is_prose_and_each_file_its_own_syntax():
    text = (
        "Rotate DB_PASSWORD=hunter2hunter\n\nThe token: was wrong\n\n"
        "diff --git a/app.py b/app.py\n@@ -1 +1 @@\n+password = new_password\n"
        "diff --git a/.env b/.env\n@@ -1 +1 @@\n+password = new_password\n"
        "\nCommit message:\npassword = new_password\n"
    )
    redacted, counts = redact(text)
    assert "hunter2hunter" not in redacted and "The token: was wrong" in redacted  # `key: value` is prose
    assert "+password = new_password\ndiff --git a/.env" in redacted  # code: an expression
    assert "+password = <REDACTED:unquoted_secret>\n" in redacted  # configuration: a literal
    assert redacted.endswith("Commit message:\npassword = new_password\n")  # the message again: prose
    assert counts == {"unquoted_secret": 2}


@pytest.mark.parametrize(
    ("path", "syntax"),
    [(".env.local", Syntax.CONFIG), ("deploy/values.yaml", Syntax.CONFIG), ("Dockerfile.dev", Syntax.DOCKERFILE),
     ("app.py", Syntax.CODE), ("README.md", Syntax.PROSE), ("LICENSE", Syntax.PROSE), ("home/.netrc", Syntax.NETRC),
     ("Makefile", Syntax.CONFIG), ("web/.npmrc", Syntax.CONFIG)],
)  # fmt: skip
def test_the_syntax_comes_from_the_file_name(path, syntax):
    assert syntax_of(path) is syntax


@pytest.mark.parametrize(
    ("hint", "start"),
    [
        ("AKIA", ("AKIA", True)),
        (r"\.login\(", (".login(", True)),
        (r"auth['\"]?\]?[ \t]*[:=]", ("auth", False)),
        ("pass(?:wd|word)", ("pass", False)),
        ("keys?", ("key", False)),  # the `s` is optional: not part of what every match holds
        (r"key\d", ("key", False)),
        ("--[a-z]*token", ("--", False)),
    ],
)
def test_a_hints_literal_start_is_what_every_match_of_it_begins_with(hint, start):
    assert _literal_start(hint) == start


def test_one_pass_over_a_batch_finds_each_hint_where_a_scan_per_hint_finds_it():
    """The automaton (one pass, every rule's hints) against `re.search` of each hint in each text, on the
    texts these tests redact or leave, joined as redact_all joins a batch."""
    lines = [line for _, line in CREDENTIALS + NOT_CREDENTIALS] + _PIECES + [CONFIG_WITH_SECRETS, "İ AKIA"]
    texts = ["\n".join(lines[i : i + 7]) for i in range(0, len(lines), 7)] + [""]
    encoded = [text.encode() for text in texts]
    joined = b"\0".join(encoded)
    starts = [0]
    for data in encoded:
        starts.append(starts[-1] + len(data) + 1)
    found = _hint_index().texts_holding(joined, joined.lower(), starts)
    for rule in RULES:
        for hint in rule.hints:
            expected = {
                index
                for index, data in enumerate(encoded)
                if re.search(hint.encode(), data.lower() if rule.ignores_case else data)
            }
            assert found.get((rule.ignores_case, hint), set()) == expected, (rule.name, hint)
    assert sum(map(len, found.values())) > 100  # the batch holds hints of most rules
