"""Which database treg uses: ``TREG_DATABASE_URL``, else the embedded server under ``$TREG_HOME/pg``."""

from __future__ import annotations

from treg.infra import embedded_pg
from treg.settings import Settings


def resolve_dsn(settings: Settings, *, start_embedded: bool = True) -> str:
    if settings.database_url is not None:
        return settings.database_url.reveal()
    server = embedded_pg.start(settings.pg_dir)
    return server.ensure_database()
