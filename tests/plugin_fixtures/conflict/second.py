"""The other of two plugins claiming the same new location ``cookie``."""

from treg import hookimpl


class SecondCookie:
    location = "cookie"
    needs_json_body = False

    def validate(self, binding):
        pass

    def inject(self, request, binding, value):
        request.headers["Cookie"] = f"{binding.name}={binding.render(value)}"


@hookimpl
def treg_register_injectors():
    return [SecondCookie()]
