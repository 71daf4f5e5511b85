"""The selector (rules/selector.py): PromQL label matchers, checked before anything is rendered, then
written into every series the rules read; a bad one is a clear error, from the renderer and from
``memexporter rules --selector``. tests/integration/test_promtool.py checks that promtool parses
``GOOD_SELECTORS`` and refuses ``BAD_SELECTORS``. The rest of the rules: test_rules.py."""

from __future__ import annotations

import re

import pytest

from memexporter import rules
from tests.support.promql import metric_names
from tests.unit.rules.test_rules import OUT_OF_STEP, load

GOOD_SELECTORS = [
    'job="trainer"',
    'namespace="ml",job=~"trainer-.*"',
    " job = \"a\" , rank != '0' ,",
    "job=~`trainer-\\d+`",
    'job=~"trainer-\\\\d+"',
    'job="say \\"hi\\""',
    "job='it\\'s'",
    'job!~"", cluster="a"',
    'job="\\u00e9\\x41\\101"',
]
BAD_SELECTORS = [
    ("job=foo", 'the value of job must be a quoted string, e.g. job="foo"'),
    ('job="a" rank="0"', "matchers are separated by commas"),
    ('{job="a"}', "without braces"),
    ("job", "job must be followed by one of =~, !~, !=, ="),
    ('job=="a"', "'==' is not a matcher operator"),
    ('job="trainer', 'has no closing "'),
    ('job=~"trainer-\\d+"', "unknown escape sequence '\\\\d'"),
    ("job='a\\\"'", "unknown escape sequence"),
    ('job="a",,', "',' does not start with a label name"),
    ('1job="a"', "does not start with a label name"),
    ('__name__="up"', "__name__ is reserved"),
    ("", "it is empty"),
    ("  ", "it is empty"),
]


@pytest.mark.parametrize("preset", sorted(rules.PRESETS))
def test_every_series_carries_the_selector(preset: str) -> None:
    text = rules.render(preset, selector='job="trainer",cluster="a"')
    assert 'job="memexporter"' not in text
    for rule in load(text):
        for name in metric_names(rule["expr"]):
            if name.startswith("memexporter_") or ":" in name:
                assert re.search(re.escape(name) + r'\{[^}]*job="trainer",cluster="a"', rule["expr"]), (
                    f"{rule.get('record') or rule['alert']}: {name} without the selector"
                )


@pytest.mark.parametrize("selector", GOOD_SELECTORS)
def test_good_selectors_render_into_every_series(selector: str) -> None:
    text = rules.render(selector=selector)
    for rule in load(text):
        for name in metric_names(rule["expr"]):
            if name.startswith("memexporter_") or ":" in name:
                # Phase series put their own matcher first, so a trailing comma in the selector parses.
                assert (
                    name + "{" + selector + "}" in rule["expr"]
                    or name + "{" + OUT_OF_STEP + "," + selector + "}" in rule["expr"]
                ), f"{rule.get('record') or rule['alert']}: {name}"


@pytest.mark.parametrize(("selector", "why"), BAD_SELECTORS, ids=[s or "empty" for s, _ in BAD_SELECTORS])
def test_bad_selectors_are_a_clear_error(selector: str, why: str) -> None:
    with pytest.raises(ValueError) as info:
        rules.render(selector=selector)
    message = str(info.value)
    assert f"selector {selector!r} is not a PromQL label-matcher list" in message
    assert why in message


def test_cli_rejects_an_unquoted_selector(capsys: pytest.CaptureFixture[str]) -> None:
    from memexporter.cli import main

    # The operator's typo from issue 9: this used to render rules that promtool refuses.
    with pytest.raises(SystemExit) as info:
        main(["rules", "--selector", "job=foo"])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert 'the value of job must be a quoted string, e.g. job="foo"' in captured.err
    assert "error: memexporter:" not in captured.err  # argparse's "memexporter rules: error:" says it once
