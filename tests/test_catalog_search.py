"""Catalog search by words (treg.catalog.search), on the built-in catalog: pure, no I/O."""

from __future__ import annotations

import pytest

from treg import plugins
from treg.catalog.load import load_catalog
from treg.catalog.search import by_words, pointer, rank, search_url, words


@pytest.fixture(scope="module")
def registry():
    pm = plugins.create_manager()
    return load_catalog(pm, plugins.collect_injectors(pm))


def test_words_drop_noise_and_split_names():
    assert words("Get me the weather.forecast for Berlin, please") == ["weather", "forecast", "berlin"]
    assert words("https://api.weather.example/v1/forecast") == ["weather", "example", "forecast"]
    assert search_url("weather.forecast") == "/api/v1/catalog/endpoints?q=weather+forecast"


def test_rank_by_words_capability_and_prefixes(registry):
    ids = [ep.id for ep in rank(registry, "weather forecasts")]
    assert ids[:2] == ["open-meteo.forecast", "openweathermap.forecast"]  # both words, id/capability first
    assert "open-meteo.archive" in ids  # one word (weather) still matches, ranked after
    assert [ep.id for ep in rank(registry, capability="weather")] == [
        "open-meteo.archive", "open-meteo.forecast", "openweathermap.forecast", "openweathermap.weather.current",
        "treg.weather.forecast"]  # the routed endpoint of the capability two forecasts share (lifecycle.md)
    assert rank(registry, "zzzz qqqq") == []
    assert all(ep.is_live for ep in rank(registry, "edits completions", limit=50))  # retired never suggested


def test_by_words_needs_half_the_words_and_pointer_keeps_what_came_first(registry):
    assert by_words(registry, "weather.forecast")[:2] == ["open-meteo.forecast", "openweathermap.forecast"]
    assert by_words(registry, "berlin.bakery.weather.opening.times") == []  # 1 of 5 words: not a match
    p = pointer(registry, "weather.forecast", first=["/call/weather/<path>"])
    assert p["did_you_mean"][0] == "/call/weather/<path>" and "open-meteo.forecast" in p["did_you_mean"]
    assert "GET /api/v1/catalog/endpoints?q=weather+forecast" in p["hint"]
