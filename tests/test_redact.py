"""Redaction of captured request bodies (specproxy/core/redact.py): key patterns at any depth and in any case, the
allow-list replay needs, form / query-string / other text bodies, credential shapes, and the depth bound."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from specproxy.core.redact import (
    KEPT_FIELDS,
    MAX_DEPTH,
    REDACTED,
    TEXT_CAPTURE_CHARS,
    TOO_DEEP,
    capture_body,
    is_secret_key,
    redact_values,
)

SECRET = "s3cr3t-VALUE-0042"


@pytest.mark.parametrize(
    "name",
    [
        "api_key",
        "openai_api_key",
        "OPENAI_API_KEY",
        "apiKey",
        "x-api-key",
        "token",
        "access_token",
        "refresh_token",
        "id_token",
        "secret",
        "client_secret",
        "password",
        "db_passwd",
        "pwd",
        "auth",
        "Authorization",
        "proxy_authorization",
        "bearer",
        "credentials",
        "cookie",
        "Set-Cookie",
        "session",
        "session_id",
        "cache_salt",  # vLLM: "should be random, protected from access by 3rd parties"
        # words in every spelling of a key: snake_case, kebab-case, camelCase, capitals, digits, dots and brackets
        "session_token",
        "sessionToken",
        "X-Session-Token",
        "APIKey",
        "XApiKey",
        "api_key2",
        "auth.bearer",
        "auth[password]",
        "signing_key",
        "secretKey",
        "aws_secret_access_key",
        "new_password",
        "passwordConfirmation",
        "pass",
        "passphrase",
        "oauth",
        "jwt",
        "keys",
        "WWW-Authenticate",
        "csrf_token",
        "refresh_tokens",  # plural after a word that makes it a credential
        "accessTokens",
        # one word gluing a secret to its qualifier
        "apikey",
        "APIKEY",
        "xapikey",
        "accesstoken",
        "csrftoken",
        "clientsecret",
        "dbpassword",
        "privatekey",
        "passkey",
        "JSESSIONID",
    ],
)
def test_secret_names_in_any_case(name: str) -> None:
    assert is_secret_key(name)
    assert capture_body({name: SECRET}) == {name: REDACTED}


@pytest.mark.parametrize(
    "name",
    [
        # a secret word inside another word is not that word
        "author",
        "authors",
        "authorName",
        "authority",
        "keyword",
        "keywords",
        "monkey",
        "turkey",
        "hotkey",
        "tokenizer",
        "secretary",
        "bypass",
        "passage",
        "basalt",
        # token counts and ids are what records are about: never redacted, listed or not
        "tokens",
        "num_tokens",
        "n_tokens",
        "maxTokens",
        "MAX_TOKENS",
        "maxtokens",
        "valid_tokens",
        "output_tokens_count",
        "eos_token_id",
        "pad_token_id",
        "bad_token_ids",
        "token_count",
    ],
)
def test_words_inside_other_words_and_token_counts_are_kept(name: str) -> None:
    assert not is_secret_key(name)
    body = {name: SECRET, "nested": [{name: 12}]}
    assert capture_body(body) == body
    assert capture_body(f"{name}=x1&n=1") == f"{name}=x1&n=1"  # a form body, by the same rule


def test_usage_and_count_fields_survive_by_the_word_rule_alone() -> None:
    """Not only because they are listed: every count and id of KEPT_FIELDS but one keeps its value by the word rule."""
    from specproxy.core.redact import _secret_words

    assert [k for k in sorted(KEPT_FIELDS) if _secret_words(k)] == ["prompt_cache_key"]


def test_a_long_key_is_matched_without_the_cache() -> None:
    long = "x" * 10_000 + "_api_key"
    assert is_secret_key(long) and not is_secret_key("x" * 10_000 + "_tokens")
    assert capture_body({long: SECRET}) == {long: REDACTED}


@pytest.mark.parametrize("name", sorted(KEPT_FIELDS))
def test_allow_listed_fields_keep_their_values(name: str) -> None:
    body = {name: 512, "nested": {name: [1, 2]}}
    assert capture_body(body) == body


def test_a_full_vllm_request_survives_for_replay() -> None:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "def f():\n    return 1"}],
        "max_tokens": 64,
        "max_completion_tokens": 64,
        "top_k": 20,
        "top_p": 0.9,
        "min_p": 0.0,
        "logit_bias": {"50256": -100},
        "stop_token_ids": [2],
        "allowed_token_ids": [1, 2, 3],
        "bad_words": ["x"],
        "min_tokens": 1,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": True,
        "include_stop_str_in_output": False,
        "truncate_prompt_tokens": 1024,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "add_special_tokens": False,
        "prompt_cache_key": "tenant-7",
        "user": "u-1",
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "chat_template_kwargs": {"enable_thinking": False},
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "sampling_params": {"max_new_tokens": 10},
    }
    assert capture_body(body) == body


def test_secrets_at_any_depth_and_whole_values() -> None:
    body = {
        "model": "m",
        "auth": {"bearer": SECRET, "user": "bob"},
        "metadata": {"tenant": {"credentials": [SECRET, {"x": SECRET}]}, "note": "kept"},
        "extra": [{"deep": [{"Session": 12345}]}],
        "Cookie": SECRET,
    }
    got = capture_body(body)
    assert SECRET not in orjson.dumps(got).decode()
    assert got["auth"] == REDACTED  # the whole object: "user" beside the bearer is part of the credential
    assert got["metadata"] == {"tenant": {"credentials": REDACTED}, "note": "kept"}
    assert got["extra"] == [{"deep": [{"Session": REDACTED}]}]


def test_null_and_booleans_under_secret_names_carry_nothing_and_stay() -> None:
    body = {"api_key": None, "use_auth": True, "session": False}
    assert capture_body(body) == body


def test_tool_schema_property_names_are_names_not_secrets() -> None:
    schema = {
        "type": "object",
        "properties": {
            "token": {"type": "string", "description": "the user's token"},
            "author": {"type": "string"},
            "password_policy": True,
        },
        "required": ["token", "author"],
    }
    body = {
        "tools": [{"type": "function", "function": {"name": "login", "parameters": schema}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }
    assert capture_body(body) == body
    # a property map holding a value rather than a schema is still redacted
    assert capture_body({"properties": {"token": SECRET}}) == {"properties": {"token": REDACTED}}


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("my key is sk-proj-Ab3dEf6hIj9kLm2nOp5q, use it", "sk-proj-Ab3dEf6hIj9kLm2nOp5q"),
        ("sk-ant-api03-abcdefghij0123456789", "sk-ant-api03-abcdefghij0123456789"),
        ("curl -H 'Authorization: Bearer abc123def456ghi'", "abc123def456ghi"),
        ("BEARER ABCDEF123456", "ABCDEF123456"),
        ("ghp_" + "a1" * 18, "ghp_" + "a1" * 18),
        ("github_pat_" + "A1_" * 10, "github_pat_" + "A1_" * 10),
        ("aws AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE"),
        ("AIza" + "B2" * 17 + "c", "AIza" + "B2" * 17 + "c"),
        ("xoxb-1234567890-abcdef", "xoxb-1234567890-abcdef"),
        ("hf_" + "Zq9" * 11, "hf_" + "Zq9" * 11),
        ("sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "dozjg"),
        ("DSN postgres://app:hunter2pw@db:5432/x", "hunter2pw"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----", "b3BlbnNzaC1rZXk"),
        ("Authorization: Basic " + base64.b64encode(b"admin:pa55").decode(), "YWRtaW46cGE1NQ"),
    ],
)
def test_credential_shapes_in_any_string(text: str, secret: str) -> None:
    assert secret not in redact_values(text)
    assert REDACTED in redact_values(text)
    got = capture_body({"messages": [{"role": "user", "content": text}]})
    assert secret not in got["messages"][0]["content"]


@pytest.mark.parametrize(
    "text",
    [
        "the bearer instruments were sold",  # no digit: prose
        "Basic understanding of sk-learn",  # not base64 of user:password; too short for a key
        "task-0123456789abcdefghij",  # "sk-" inside a word
        "see https://example.com/a:b@c",  # no userinfo before the host
        "max_tokens=512 and top_k=20",
        "スペキュレイティブデコーディング sk-",
    ],
)
def test_prose_and_settings_are_not_credentials(text: str) -> None:
    assert redact_values(text) == text


@pytest.mark.parametrize(
    ("body", "kept"),
    [
        ("api_key=" + SECRET + "&model=m&max_tokens=5", "model=m&max_tokens=5"),
        ("?token=" + SECRET + "&top_k=3", "top_k=3"),
        ("auth.bearer=" + SECRET + "&n=1", "n=1"),
        ("auth%5Bpassword%5D=" + SECRET + "&n=1", "n=1"),  # URL-encoded key auth[password]
        ("note=Bearer%20abc123def456&n=1", "n=1"),  # a credential-shaped value under any key
    ],
)
def test_form_and_query_string_bodies(body: str, kept: str) -> None:
    got = capture_body(body)
    assert SECRET not in got and "abc123def456" not in got
    assert got.endswith(kept) and REDACTED in got


@pytest.mark.parametrize(
    "body",
    [
        '{"model": "m", "api_key": "' + SECRET + '", "max_tokens": 5',  # JSON cut short
        '{"model": "m", "auth": {"user": "bob", "pass": "' + SECRET + '"}, "max_tokens": 5}}',  # invalid JSON
        "model: m\npassword: " + SECRET + "\nmax_tokens: 5",
        "Authorization: Token " + SECRET + "\nmax_tokens=5",
        "x = 1; secret = '" + SECRET + "'; max_tokens=5",
        '--b\r\nContent-Disposition: form-data; name="api_key"\r\n\r\n' + SECRET + "\r\n--b\r\n"
        'Content-Disposition: form-data; name="max_tokens"\r\n\r\n5\r\n--b--\r\n',
    ],
)
def test_other_text_bodies_by_key_pattern(body: str) -> None:
    got = capture_body(body)
    assert SECRET not in got
    assert "max_tokens" in got and "5" in got


def test_text_bodies_are_cut_and_a_secret_at_the_cut_is_still_replaced() -> None:
    head = "x" * (TEXT_CAPTURE_CHARS - 10) + " "
    got = capture_body(head + "sk-proj-0123456789abcdefghij" + "y" * 100_000)
    assert len(got) < TEXT_CAPTURE_CHARS + 100 and got.endswith("more characters]")
    assert "sk-proj" not in got


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 300, 1_000])
def test_a_body_too_deep_is_a_placeholder_without_recursion(depth: int) -> None:
    body: Any = "leaf"
    for i in range(depth):
        body = [body] if i % 2 else {"a": body}
    assert capture_body({"model": "m", "x": body}) == TOO_DEEP
    # the placeholder is what a record can always serialise
    assert orjson.loads(orjson.dumps({"request": TOO_DEEP})) == {"request": TOO_DEEP}


def test_a_body_at_the_depth_bound_is_kept_and_serialisable() -> None:
    body: Any = {"api_key": SECRET}
    for _ in range(MAX_DEPTH - 1):
        body = [body]
    got = capture_body(body)
    assert got != TOO_DEEP and SECRET not in orjson.dumps({"record": {"request": got}}).decode()


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 2_000 + "1" + "}" * 2_000])
def test_text_too_deep_for_the_json_parser_is_a_placeholder(text: str) -> None:
    assert capture_body(text) == TOO_DEEP


def test_capture_is_idempotent_so_replays_record_what_they_sent() -> None:
    body = {"api_key": SECRET, "messages": [{"role": "user", "content": "Bearer abc123def456"}], "max_tokens": 3}
    once = capture_body(body)
    assert capture_body(once) == once
