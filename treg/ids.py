"""Identifiers: a readable prefix and 128 random bits (``org_3f…``)."""

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"
