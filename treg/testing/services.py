"""``open_services(dsn, settings)``: treg's domain services on a real database with no HTTP in front (the
money and idempotency suites drive them directly), built by the one factory the server uses."""

from __future__ import annotations

from treg.context import Services
from treg.factory import build_services
from treg.infra.db import Database
from treg.settings import Settings


async def open_services(dsn: str, settings: Settings, *, maxsize: int = 10) -> Services:
    """The services of a treg on ``dsn`` with the plugins its settings load (every registry collected
    once, as the server does: treg/startup.py); close with ``await svc.db.close()``."""
    db = await Database(dsn, minsize=1, maxsize=maxsize, timeout=30.0).open()
    return build_services(settings, db)
