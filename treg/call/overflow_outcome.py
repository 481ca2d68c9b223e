"""What one aggregator attempt means for the call (contract: "An aggregator failure is data"), pure.

The pipeline's overflow child cycle calls :func:`judge` with the attempt's :class:`OverflowResult` and
acts on the :class:`Verdict`: relay and settle, or release the overflow hold, set the health mark, and
answer 503 ``provider_capacity`` (a second aggregator is never tried on the same call).

The overflow stage's pure half (``treg/call/overflow_stage.py``): it reads the vendor's answer through
treg's capacity signatures, so it sits above both ``treg/overflow/`` (which the catalog loader needs
below itself, for the aggregators its rows name) and ``treg/capacity/``.
"""

from __future__ import annotations

from dataclasses import dataclass

from treg.capacity.classify import BODY_HEAD_BYTES, Signal, classify
from treg.capacity.signatures import SignatureRegistry
from treg.overflow import aggregator as agg
from treg.overflow.store import aggregator_mark, vendor_mark


@dataclass(frozen=True)
class Verdict:
    #: relay the vendor's answer as the aggregator carried it, settling the overflow hold at ``charge_micro``
    serve: bool
    charge_micro: int = 0
    #: the health mark to set (``overflow:<name>`` or ``overflow:<name>:<provider>``), None: nothing
    mark: str | None = None
    mark_reason: str | None = None
    #: the aggregator refused this request: its words, for the 503's ``overflow_refused`` when the direct
    #: attempt was skipped (otherwise the vendor's direct answer stands)
    refused_message: str | None = None

    @property
    def refused(self) -> bool:
        return self.refused_message is not None


def judge(name: str, provider: str, endpoint: str | None, result: agg.OverflowResult,
          signatures: SignatureRegistry) -> Verdict:
    if result.failure == agg.REFUSED:
        return Verdict(serve=False, refused_message=result.message or f"{name} refused the request")
    if result.marks_aggregator:
        return Verdict(serve=False, mark=aggregator_mark(name), mark_reason=result.failure)
    if result.failure == agg.VENDOR_CAPACITY:
        return Verdict(serve=False, mark=vendor_mark(name, provider), mark_reason=agg.VENDOR_CAPACITY)
    status = result.vendor_status or 0
    if status >= 400:
        # the vendor answered through the aggregator: its own signatures say whether treg's account there is out
        signal = classify(signatures, provider, endpoint, status, {}, result.vendor_bytes()[:BODY_HEAD_BYTES])
        if isinstance(signal, Signal) and signal.strikes:
            return Verdict(serve=False, mark=vendor_mark(name, provider), mark_reason=signal.kind)
    return Verdict(serve=True, charge_micro=result.price_micro)
