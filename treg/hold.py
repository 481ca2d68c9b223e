"""A money hold and its close as plain values (:class:`Hold`, :class:`Close`, :class:`Closed`, the states):
what the money statements (``treg/money/holds.py``), the settler that sends them off the answer's path
(``treg/money/settler.py``, ``Services.settler``), the reaper, the async jobs and the call pipeline hand
each other. Below the services, which name them in the settler's protocol.
"""

from __future__ import annotations

import datetime

from treg.frozen import frozen_value

HELD, SETTLED, RELEASED = "held", "settled", "released"


@frozen_value
class Hold:
    call_id: str
    org_id: str
    member_id: str | None
    tag: str | None
    amount_micro: int
    day: datetime.date
    expires_at: datetime.datetime
    #: the credit lease this hold was taken from in memory (treg/money/leases.py); None: a hold of its
    #: own, placed by its own statement
    lease_id: str | None = None

    def charge_for(self, observed_micro: int) -> int:
        """What ``settle(observed_micro)`` charges: the observed price, never more than the estimate."""
        return max(0, min(int(observed_micro), self.amount_micro))


@frozen_value
class Close:
    """One hold to close: ``settled`` at ``observed_micro`` (capped at the hold), or ``released``. A hold
    taken from a credit lease names it, and its amount (its row is written by the close)."""

    call_id: str
    state: str
    observed_micro: int = 0
    lease_id: str | None = None
    amount_micro: int = 0


@frozen_value
class Closed:
    """A hold this close closed (a hold already closed by someone else is not reported)."""

    call_id: str
    org_id: str
    state: str
    amount_micro: int
    charged_micro: int
