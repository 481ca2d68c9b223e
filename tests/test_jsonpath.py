"""The one JSON-path lookup shared by catalog prices, capacity signatures and metered evidence."""

from treg import jsonpath

DOC = {"usage": {"total_tokens": 7, "none": None}, "candidates": [{"finishReason": "STOP"}]}


def test_dig_follows_keys_and_indexes():
    assert jsonpath.dig(DOC, "usage.total_tokens") == 7
    assert jsonpath.dig(DOC, "candidates.0.finishReason") == "STOP"
    assert jsonpath.dig(DOC, jsonpath.parts("candidates[0].finishReason")) == "STOP"


def test_missing_is_the_callers_default_and_null_is_a_value():
    for path in ("usage.nope", "candidates.1", "candidates.x", "usage.total_tokens.deeper"):
        assert jsonpath.dig(DOC, path) is None
        assert jsonpath.dig(DOC, path, jsonpath.MISSING) is jsonpath.MISSING
    assert jsonpath.dig(DOC, "usage.none", jsonpath.MISSING) is None
