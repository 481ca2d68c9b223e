"""A plugin overriding the built-in ``header`` location (the built-in is trylast, so this one wins).

It injects like the built-in and also stamps ``X-Injected-By: loud_header``, and it refuses one header
name the built-in accepts (``X-Refused-By-Loud``), so a test can tell which injector ran.
"""

from treg import hookimpl


class LoudHeaderInjector:
    location = "header"
    needs_json_body = False

    def validate(self, binding):
        if binding.name.lower() == "x-refused-by-loud":
            raise ValueError("loud_header refuses X-Refused-By-Loud")

    def inject(self, request, binding, value):
        request.headers[binding.name] = binding.render(value)
        request.headers["X-Injected-By"] = "loud_header"


@hookimpl
def treg_register_injectors():
    return [LoudHeaderInjector()]
