"""Built-in catalog providers: weather (Open-Meteo, OpenWeatherMap).

A working example of the provider contract (``docs/plugins.md`` § Providers):

* Open-Meteo is free for non-commercial use with no key at all, so its GETs are declared
  ``platform_auth: "anonymous"``: with ``TREG_ANONYMOUS_PROVIDERS=open-meteo`` any team can call them
  keyless and free. Its other APIs live on other hosts, declared as approved ``catalog_hosts``.
* OpenWeatherMap takes its key in the ``appid`` query parameter (a ``query`` binding).

Prices are the platform tier's examples (what a deployment charges per call on its own key), not the
providers' list prices; a deployment that resells differently ships its own plugin.
"""

from __future__ import annotations

from treg import hookimpl

_UNITS = [
    {"name": "temperature_unit", "in": "query", "enum": ["celsius", "fahrenheit"]},
    {"name": "wind_speed_unit", "in": "query", "enum": ["kmh", "ms", "mph", "kn"]},
    {"name": "precipitation_unit", "in": "query", "enum": ["mm", "inch"]},
    {"name": "timeformat", "in": "query", "enum": ["iso8601", "unixtime"]},
]
# latitude/longitude also take comma-separated lists (several locations at once): no numeric type
_WHERE = [
    {"name": "latitude", "in": "query", "required": True, "description": "WGS84 latitude(s), comma-separated"},
    {"name": "longitude", "in": "query", "required": True, "description": "WGS84 longitude(s), comma-separated"},
]
_FREE = {"per_call_micro": 0}

OPEN_METEO = {
    "id": "open-meteo",
    "name": "Open-Meteo",
    "description": "Open-source weather API: free for non-commercial use without a key (CC BY 4.0 data).",
    "docs_url": "https://open-meteo.com/en/docs",
    "base_url": "https://api.open-meteo.com/v1",
    # the free API takes no key; commercial customers use customer-*.open-meteo.com with an apikey
    "auth": [],
    "catalog_hosts": [
        "https://geocoding-api.open-meteo.com/v1",
        "https://archive-api.open-meteo.com/v1",
        "https://air-quality-api.open-meteo.com/v1",
    ],
    # the free tier's fair-use ceiling is 600 calls a minute
    "rate_limit": {"limit": 600, "window_s": 60},
    "endpoints": [
        {
            "id": "open-meteo.forecast",
            "method": "GET",
            "path": "/forecast",
            "description": "Weather forecast (up to 16 days) for coordinates: hourly, daily and current variables.",
            "docs_url": "https://open-meteo.com/en/docs",
            "params": _WHERE + [
                {"name": "hourly", "in": "query", "description": "comma-separated variables, e.g. temperature_2m"},
                {"name": "daily", "in": "query", "description": "comma-separated daily aggregations"},
                {"name": "current", "in": "query", "description": "comma-separated current-condition variables"},
                {"name": "timezone", "in": "query", "description": "tz database name, or auto"},
                {"name": "past_days", "in": "query", "type": "integer"},
                {"name": "forecast_days", "in": "query", "type": "integer"},
                {"name": "start_date", "in": "query", "description": "yyyy-mm-dd"},
                {"name": "end_date", "in": "query", "description": "yyyy-mm-dd"},
                {"name": "models", "in": "query"},
                {"name": "cell_selection", "in": "query", "enum": ["land", "sea", "nearest"]},
            ] + _UNITS,
            "price": _FREE,
            "capability": "weather.forecast",
            "platform_auth": "anonymous",
        },
        {
            "id": "open-meteo.geocoding.search",
            "method": "GET",
            "host": "https://geocoding-api.open-meteo.com/v1",
            "path": "/search",
            "description": "Find places by name or postal code: coordinates, elevation, time zone, country.",
            "docs_url": "https://open-meteo.com/en/docs/geocoding-api",
            "params": [
                {"name": "name", "in": "query", "required": True},
                {"name": "count", "in": "query", "type": "integer", "description": "1 to 100 results"},
                {"name": "language", "in": "query", "description": "lower-case language code, e.g. en"},
                {"name": "countryCode", "in": "query", "description": "ISO 3166-1 alpha-2 filter"},
                {"name": "format", "in": "query", "enum": ["json", "protobuf"]},
            ],
            "price": _FREE,
            "capability": "geo.geocode",
            "platform_auth": "anonymous",
            # every parameter is known: an unknown one is a caller's typo, refused before it is relayed
            "strict_query": True,
        },
        {
            "id": "open-meteo.archive",
            "method": "GET",
            "host": "https://archive-api.open-meteo.com/v1",
            "path": "/archive",
            "description": "Historical weather (reanalysis) for coordinates between two dates.",
            "docs_url": "https://open-meteo.com/en/docs/historical-weather-api",
            "params": _WHERE + [
                {"name": "start_date", "in": "query", "required": True, "description": "yyyy-mm-dd"},
                {"name": "end_date", "in": "query", "required": True, "description": "yyyy-mm-dd"},
                {"name": "hourly", "in": "query"},
                {"name": "daily", "in": "query"},
                {"name": "timezone", "in": "query"},
            ] + _UNITS,
            "price": _FREE,
            "capability": "weather.history",
            "platform_auth": "anonymous",
        },
        {
            "id": "open-meteo.air-quality",
            "method": "GET",
            "host": "https://air-quality-api.open-meteo.com/v1",
            "path": "/air-quality",
            "description": "Air quality forecast (pollutants, pollen, AQI) for coordinates.",
            "docs_url": "https://open-meteo.com/en/docs/air-quality-api",
            "params": _WHERE + [
                {"name": "hourly", "in": "query"},
                {"name": "current", "in": "query"},
                {"name": "domains", "in": "query", "enum": ["auto", "cams_europe", "cams_global"]},
                {"name": "timezone", "in": "query"},
                {"name": "past_days", "in": "query", "type": "integer"},
                {"name": "forecast_days", "in": "query", "type": "integer"},
                {"name": "timeformat", "in": "query", "enum": ["iso8601", "unixtime"]},
            ],
            "price": _FREE,
            "capability": "air.quality",
            "platform_auth": "anonymous",
        },
    ],
}

_OWM_UNITS = [
    {"name": "units", "in": "query", "enum": ["standard", "metric", "imperial"]},
    {"name": "lang", "in": "query"},
]

OPENWEATHERMAP = {
    "id": "openweathermap",
    "name": "OpenWeatherMap",
    "description": "Current weather and 5-day/3-hour forecasts; the key goes in the appid query parameter.",
    "docs_url": "https://openweathermap.org/api",
    "base_url": "https://api.openweathermap.org/data/2.5",
    "auth": [{"location": "query", "name": "appid"}],
    # the free plan allows 60 calls a minute
    "rate_limit": {"limit": 60, "window_s": 60},
    "endpoints": [
        {
            "id": "openweathermap.weather.current",
            "method": "GET",
            "path": "/weather",
            "description": "Current weather at coordinates (lat/lon) or for a city (q).",
            "docs_url": "https://openweathermap.org/current",
            "params": [
                {"name": "lat", "in": "query", "type": "number"},
                {"name": "lon", "in": "query", "type": "number"},
                {"name": "q", "in": "query", "description": "city name, state code and country code"},
                {"name": "mode", "in": "query", "enum": ["json", "xml", "html"]},
            ] + _OWM_UNITS,
            "price": {"per_call_micro": 150},
            "capability": "weather.current",
        },
        {
            "id": "openweathermap.forecast",
            "method": "GET",
            "path": "/forecast",
            "description": "5-day forecast in 3-hour steps at coordinates or for a city.",
            "docs_url": "https://openweathermap.org/forecast5",
            "params": [
                {"name": "lat", "in": "query", "type": "number"},
                {"name": "lon", "in": "query", "type": "number"},
                {"name": "q", "in": "query"},
                {"name": "cnt", "in": "query", "type": "integer", "description": "number of 3-hour steps"},
                {"name": "mode", "in": "query", "enum": ["json", "xml"]},
            ] + _OWM_UNITS,
            "price": {"per_call_micro": 150},
            "capability": "weather.forecast",
        },
    ],
}


@hookimpl
def treg_register_providers():
    return [OPEN_METEO, OPENWEATHERMAP]
