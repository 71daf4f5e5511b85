"""Which dict keys and names a holder path may print (``diagnose/names.py``): names from code are
shown, data is redacted to its length."""

from __future__ import annotations

import pytest

from memexporter.diagnose.names import attribute, shown, subscript


@pytest.mark.parametrize(
    "key",
    [
        "train",
        "val_loss",
        "layer_3",
        "0",
        "12",
        "tokens",
        "num_tokens",
        "input_ids",
        "query",
        "TransformerBlock",
        "key",
        ("block_" * 7)[:40],
    ],
)
def test_names_from_code_are_shown(key: str) -> None:
    assert shown(key) and subscript(key) == f"[{key!r}]"


@pytest.mark.parametrize(
    "key",
    [
        "sk-proj-Zq81hTfA0pLm4",  # an API key: not an identifier
        "sk_live_4eC39HqLyjWDarjtT1zdp7",  # an identifier, random-looking
        "a3f9c2e1b7d04f5a9e8c",  # a hex digest
        "ghp_" + "A" * 30,  # a long run
        "hf_token",
        "password",
        "db_passwd",
        "client_secret",
        "api_key",
        "AWS_ACCESS_KEY",
        "session_id",
        "user@example.com",
        "/home/alice/data.pt",
        "what is the capital of France?",
        "",
        "x" * 41,
        "größe",
        "123456789",
    ],
)
def test_data_and_secrets_are_redacted_to_their_length(key: str) -> None:
    assert not shown(key)
    assert subscript(key) == f"['<redacted {len(key)} chars>']"


def test_module_dicts_and_attributes_only_need_to_look_like_code() -> None:
    assert subscript("key", code=True) == "['key']" and subscript("api_key", code=True) == "['api_key']"
    assert subscript("sk-live-123", code=True) == "['<redacted 11 chars>']"
    assert attribute("recent_batches") == "recent_batches" and attribute("hf_token") == "hf_token"
    assert attribute("sk-live-1234") == "<redacted 12 chars>"
