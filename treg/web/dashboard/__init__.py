"""The dashboard (``/ui/``): server-rendered pages over the same management functions as the API.

aiohttp only here, at the edge; every page calls treg/membership.py, tools.py, secrets_store.py,
deny_rules.py, calls.py, treg/money/ and treg/catalog/ exactly as treg/web/api.py does, so a form
is validated by the code that validates a JSON body. Sessions and CSRF: treg/ui_sessions.py and
docs/dashboard.md. Templates and static files: the top-level ``templates/`` folder, installed as the
``treg.templates`` package (setup.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web

from treg.keys import SETTINGS
from treg.origin import path_prefix
from treg.web.dashboard import connections, hub, pages, tryit
from treg.web.dashboard.base import STATIC_FILES


def templates_dir() -> Path:
    """``templates/``: in a wheel it is the package ``treg.templates`` (setup.py maps the top-level folder
    there); in a checkout (an editable install) the folder beside ``treg/``."""
    spec = importlib.util.find_spec("treg.templates")
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parent
    return Path(__file__).resolve().parents[3] / "templates"


def setup(app: web.Application) -> None:
    folder = templates_dir()
    env = aiohttp_jinja2.setup(app, loader=jinja2.FileSystemLoader(str(folder)), autoescape=True,
                               undefined=jinja2.StrictUndefined)
    # every link, form action and script path of every page starts with treg's own path prefix
    env.globals["root"] = path_prefix(app[SETTINGS])
    static = folder / "static"
    for name, ctype in STATIC_FILES.items():
        app.router.add_get(f"/ui/static/{name}", _static(static / name, ctype))
    app.router.add_routes(tryit.routes)
    app.router.add_routes(connections.routes)
    app.router.add_routes(hub.routes)
    app.router.add_routes(pages.routes)  # its last route answers any other /ui/ path with a 404 page


def _static(path: Path, content_type: str):
    async def serve(request: web.Request) -> web.Response:
        # read per request (two small files): an edited stylesheet shows without a restart
        return web.Response(body=path.read_bytes(), content_type=content_type,
                            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
    return serve
