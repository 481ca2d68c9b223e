"""RFC 8288's ``Link`` grammar as treg splits it before rewriting each URL (treg/link_grammar.py): commas
inside a URI reference or a quoted parameter do not split a link, and a value that is not the grammar is
None (dropped by the caller, never guessed at)."""

import pytest

from treg.link_grammar import link_values


@pytest.mark.parametrize("value, links", [
    ('<https://a/r?page=2>; rel="next", <https://a/r?page=5>; rel="last"',
     [("https://a/r?page=2", '; rel="next"'), ("https://a/r?page=5", '; rel="last"')]),
    ('<https://x/a,b>; rel=next; title="a, b; c"', [("https://x/a,b", '; rel=next; title="a, b; c"')]),
    ('<a>; title="q\\"uote, still"', [("a", '; title="q\\"uote, still"')]),
    (" , <a>,<b> ; x", [("a", ""), ("b", " ; x")]),
    ("<a>; title*=UTF-8''%e2%82%ac ; rel = next", [("a", "; title*=UTF-8''%e2%82%ac ; rel = next")]),
    ("", []),
])
def test_link_values_are_split_as_the_grammar_says(value, links):
    assert link_values(value) == links


@pytest.mark.parametrize("value", [
    "https://x/2; rel=next",  # no angle brackets
    '<https://x/2>; rel="next',  # an unterminated quoted-string
    "<https://x/2>; rel=next junk",  # text after a parameter
    "<https://x/2",  # an unterminated reference
    "<a>; =b",  # a parameter without a name
    "<a> <b>",  # two links without a comma
])
def test_a_value_outside_the_grammar_is_none(value):
    assert link_values(value) is None
