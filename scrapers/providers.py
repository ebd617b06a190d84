"""Tokens that say whose they are by their form: the prefix (and shape) a provider gives every token of a
kind, so that one is a secret under any name, in a list, in a sentence, pasted alone.

One row a form: the rule's name (what `.scrape.redactions` counts) and the token as a regex. The forms are
those the providers document and that gitleaks' and trufflehog's rule catalogues check for; a form whose
prefix is a common word, or that needs a name beside it to be told from an identifier, is not here (the
credential-named rules of `scrapers.secrets` read those).
"""

from __future__ import annotations

PROVIDER_TOKENS: tuple[tuple[str, str] | tuple[str, str, tuple[str, ...]], ...] = (
    ("docker_hub_token", r"dckr_(?:pat|oat)_[A-Za-z0-9_\-]{24,}"),
    ("grafana_token", r"glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}"),
    ("grafana_cloud_token", r"glc_[A-Za-z0-9+/]{32,400}={0,3}"),
    ("grafana_api_key", r"eyJrIjoi[A-Za-z0-9]{70,400}={0,3}"),
    (
        "new_relic_key",
        r"NR(?:AK|II|AA)-[A-Za-z0-9\-]{27,32}|NRJS-[a-f0-9]{19}",
        ("NRAK-", "NRII-", "NRAA-", "NRJS-"),
    ),
    ("groq_key", r"gsk_[A-Za-z0-9]{48,56}"),
    ("heroku_token", r"HRKU-AA[A-Za-z0-9_\-]{50,64}"),
    (
        "teams_webhook",
        r"https://[A-Za-z0-9\-]+\.webhook\.office\.com/webhookb2/[A-Za-z0-9\-]+@[A-Za-z0-9\-]+"
        r"/IncomingWebhook/[A-Za-z0-9]+/[A-Za-z0-9\-]+",
        (r"\.webhook\.office\.com/",),
    ),
    ("atlassian_token", r"ATATT3[A-Za-z0-9_\-=]{150,}"),
    ("linear_key", r"lin_api_[A-Za-z0-9]{40}"),
    ("notion_token", r"ntn_[0-9]{11}[A-Za-z0-9]{35}|secret_[A-Za-z0-9]{43}(?![A-Za-z0-9_])"),
    ("pulumi_token", r"pul-[a-f0-9]{40}"),
    ("doppler_token", r"dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40,44}"),
    ("planetscale_token", r"pscale_(?:tkn|pw|oauth)_[A-Za-z0-9_=.\-]{32,64}"),
    ("rubygems_key", r"rubygems_[a-f0-9]{48}"),
    ("age_secret_key", r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}"),
    ("tailscale_key", r"tskey-(?:auth|api|client|scim|webhook)-[A-Za-z0-9]+-[A-Za-z0-9]+"),
    ("google_oauth_secret", r"GOCSPX-[A-Za-z0-9_\-]{28}"),
    ("google_oauth_token", r"ya29\.[A-Za-z0-9_\-]{30,}|1//0[A-Za-z0-9_\-]{40,}"),
    ("supabase_token", r"sbp_[a-f0-9]{40}|sb_secret_[A-Za-z0-9_\-]{30,}"),
    ("replicate_token", r"r8_[A-Za-z0-9]{37}"),
    ("perplexity_key", r"pplx-[A-Za-z0-9]{48}"),
    ("xai_key", r"xai-[A-Za-z0-9]{80}"),
    ("langsmith_key", r"lsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}"),
    ("pinecone_key", r"pcsk_[A-Za-z0-9_]{50,}"),
    ("brevo_key", r"xkeysib-[a-f0-9]{64}-[A-Za-z0-9]{16}"),
    ("sendinblue_smtp_key", r"xsmtpsib-[a-f0-9]{64}-[A-Za-z0-9]{16}"),
    ("dynatrace_token", r"dt0c01\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{64}"),
    ("terraform_cloud_token", r"[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_=\-]{60,70}", (r"\.atlasv1\.",)),
    ("buildkite_token", r"bkua_[a-f0-9]{40}"),
    ("alibaba_key", r"LTAI[A-Za-z0-9]{20}"),
    ("mapbox_secret_token", r"sk\.eyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]{20,}"),
    ("facebook_token", r"EAA[CM][A-Za-z0-9]{90,}"),
    ("twitter_bearer_token", r"A{22}[A-Za-z0-9%]{80,110}", ("A" * 22,)),
    (
        "gitlab_token",
        r"gl(?:cbt-[A-Za-z0-9]{1,5}_|ffct-|ft-|imt-|agent-|oas-|soat-)[A-Za-z0-9_\-]{20,64}|GR1348941[A-Za-z0-9_\-]{20}",
        ("glcbt-", "glffct-", "glft-", "glimt-", "glagent-", "gloas-", "glsoat-", "GR1348941"),
    ),
    (
        "slack_app_token",
        r"xapp-\d-[A-Z0-9]+-\d+-[a-z0-9]+|xoxe(?:\.xox[bp])?-\d-[A-Z0-9]{140,}",
        ("xapp-", "xoxe"),
    ),
    (
        "stripe_key",
        r"[sr]k_(?:test|prod)_[A-Za-z0-9]{20,99}",
        ("sk_test_", "rk_test_", "sk_prod_", "rk_prod_"),
    ),
    ("fly_token", r"fo1_[A-Za-z0-9_\-]{43}|fm[12][ar]?_[A-Za-z0-9+/]{100,}={0,3}", ("fo1_", "fm1", "fm2")),
    ("sourcegraph_token", r"sgp_(?:[a-fA-F0-9]{16}|local)_[a-fA-F0-9]{40}|sgp_[a-fA-F0-9]{40}"),
    ("render_key", r"rnd_[A-Za-z0-9]{32}"),
    ("prefect_key", r"pnu_[A-Za-z0-9]{36}"),
    ("octopus_key", r"API-[A-Z0-9]{26}"),
    ("azure_client_secret", r"[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.\-]{31,34}", ("Q~",)),
    ("artifactory_key", r"AKCp[A-Za-z0-9]{69}|cmVmdGtu[A-Za-z0-9]{56}"),
    ("shippo_token", r"shippo_(?:live|test)_[a-fA-F0-9]{40}"),
    ("easypost_key", r"EZ[AT]K[A-Za-z0-9]{54}", ("EZAK", "EZTK")),
    ("scaleway_key", r"SCW[A-Z0-9]{17}"),
    ("cloudflare_origin_ca_key", r"v1\.0-[a-f0-9]{24}-[a-f0-9]{146}"),
    ("clojars_token", r"CLOJARS_[A-Za-z0-9]{60}"),
    ("okta_token", r"(?<=SSWS )00[A-Za-z0-9_=\-]{40}", ("SSWS 00",)),
    (
        "onepassword_token",
        r"ops_eyJ[A-Za-z0-9+/]{250,}={0,3}|A3-[A-Z0-9]{6}-(?:[A-Z0-9]{11}|[A-Z0-9]{6}-[A-Z0-9]{5})-[A-Z0-9]{5}-[A-Z0-9]{5}-[A-Z0-9]{5}",
    ),
    ("huggingface_token", r"api_org_[A-Za-z]{34}"),
    ("duffel_token", r"duffel_(?:test|live)_[A-Za-z0-9_=\-]{43}"),
    ("flutterwave_key", r"FLWSECK(?:_TEST)?-[a-h0-9]{32}-X"),
    ("frameio_token", r"fio-u-[A-Za-z0-9_=\-]{64}"),
    ("infracost_token", r"ico-[A-Za-z0-9]{32}"),
    ("readme_key", r"rdme_[a-z0-9]{70}"),
    ("scalingo_token", r"tk-us-[A-Za-z0-9_\-]{48}"),
    ("typeform_token", r"tfp_[A-Za-z0-9_.=\-]{59}"),
    ("openshift_token", r"sha256~[A-Za-z0-9_\-]{43}"),
    ("maxmind_key", r"[A-Za-z0-9]{6}_[A-Za-z0-9]{29}_mmk", ("_mmk",)),
    ("intra42_secret", r"s-s4t2(?:ud|af)-[a-f0-9]{64}"),
    ("adobe_secret", r"p8e-[A-Za-z0-9]{32}"),
    (
        "harness_key",
        r"(?:pat|sat)\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9]{24}\.[A-Za-z0-9]{20}",
        (r"pat\.", r"sat\."),
    ),
    (
        "airtable_token",
        r"pat[A-Za-z0-9]{14}\.[a-f0-9]{64}",
        (r"p(?:at)[A-Za-z0-9]{14}\.",),
    ),
    ("clickhouse_secret", r"4b1d[A-Za-z0-9]{38}"),
    ("bedrock_key", r"ABSK[A-Za-z0-9+/]{109,269}={0,2}"),
    ("dropbox_token", r"sl\.[A-Za-z0-9_=\-]{130,}"),
    ("square_token", r"EAAA[A-Za-z0-9_\-]{60}"),
    ("anthropic_key", r"sk-ant-admin01-[A-Za-z0-9_\-]{90,}"),
    ("gitlab_session", r"(?<=_gitlab_session=)[0-9a-z]{32}", ("_gitlab_session=",)),
    ("cerebras_key", r"csk-[a-z0-9]{48}"),
    ("deepseek_key", r"sk-[a-f0-9]{32}(?![A-Za-z0-9])"),
)
"""(rule, the token's form[, its hints]). Each form is read between word boundaries (`scrapers.secrets`); its
hints (regexes that each begin with a literal, as a `Rule`'s do) are the literal each alternative begins
with, unless the row gives them: where a form begins with a class or a short literal."""
