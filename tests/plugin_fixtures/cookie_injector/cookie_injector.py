"""A plugin adding an injector for a new location: ``cookie`` (sets one cookie of the Cookie header)."""

import re

from treg import hookimpl

_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


class CookieInjector:
    location = "cookie"
    needs_json_body = False

    def validate(self, binding):
        if not _NAME.match(binding.name):
            raise ValueError(f"cookie name {binding.name!r} is not a valid cookie name")

    def inject(self, request, binding, value):
        kept = [c.strip() for c in request.headers.get("Cookie", "").split(";")
                if c.strip() and c.strip().partition("=")[0] != binding.name]
        request.headers["Cookie"] = "; ".join(kept + [f"{binding.name}={binding.render(value)}"])


@hookimpl
def treg_register_injectors():
    return [CookieInjector()]
