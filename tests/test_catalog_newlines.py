"""A trailing newline is not a valid id, capability or path: ``re.match`` with ``$`` lets "acme\\n" in
(``$`` matches before a final newline), so every catalog pattern is applied with ``fullmatch``."""

from __future__ import annotations

import pytest

from treg.testing import catalog_problems as problems_of, endpoint_row as get_ep


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(id="acme\n"), "id"),
    (lambda d: get_ep(d).update(capability="items.lookup\n"), "capability"),
    (lambda d: get_ep(d).update(path="/items/{item_id}\n"), "path"),
    (lambda d: d.update(base_url="https://api.acme.example/v1\n"), "base_url"),
])
def test_a_trailing_newline_is_refused(mutate, field):
    found = problems_of(mutate)
    assert found, "the row with a trailing newline was accepted"
    assert any(field in str(p) for p in found), found
