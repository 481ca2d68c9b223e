"""Money: integer micro-USD balances, holds closed exactly once, limits (docs/money.md; the reaper that
releases holds a crash left open is ``treg/reaper.py``).

The call pipeline uses only these names; each opens its own short transaction and none may be called
while an upstream is in flight.
"""

from treg.money.holds import (HELD, RELEASED, SETTLED, Close, Closed, Hold, get_hold, hold_state, place_hold, release,
                              settle)
from treg.money.ledger import MICRO_PER_USD, Balance, balance, grant, grant_by_slug, list_grants, usd_to_micro
from treg.money.limits import check_tag

__all__ = ["HELD", "RELEASED", "SETTLED", "Close", "Closed", "Hold", "get_hold", "hold_state", "place_hold", "release", "settle",
           "MICRO_PER_USD", "Balance", "balance", "grant", "grant_by_slug", "list_grants", "usd_to_micro",
           "check_tag"]
