"""Replay protection for Slack's signed HTTP requests.

Slack signs each request with ``X-Slack-Signature`` over its timestamp and body, and Bolt accepts
a signature for five minutes either side of its timestamp. Within that window a captured request
could be sent again; :class:`ReplayGuard` remembers the signatures already accepted so that the
same request never runs its listener twice.

A replay is answered ``200`` with an empty body and its listener does not run: an empty 200 is
what Slack expects of a request it need not send again, so nothing keeps retrying it, and the
sender learns nothing. Slack's own retries (``X-Slack-Retry-Num``) are new requests with a new
timestamp and signature, so they are not replays here. Requests without a signature (Socket
Mode, which Bolt does not verify) pass untouched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from slack_bolt import BoltRequest, BoltResponse
from slack_bolt.middleware import Middleware

log = logging.getLogger(__name__)

#: How far a request's timestamp may be from now for Bolt to accept its signature (seconds).
SIGNATURE_WINDOW_S = 5 * 60
#: How much longer than the window a signature is remembered (clock skew, slow requests).
MARGIN_S = 60
#: The most signatures remembered; past it the oldest are forgotten first.
MAX_ENTRIES = 100_000


class ReplayGuard(Middleware):
    """A Bolt middleware that lets each verified signature through once.

    Register it after Bolt's request verification (``app.use`` does), so that only requests
    with a valid signature are remembered. Memory is bounded: an entry is dropped once its
    request's window plus :data:`MARGIN_S` has passed, and beyond ``max_entries`` the oldest
    go first. Safe to use from many threads at once."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        max_entries: int = MAX_ENTRIES,
        window_s: float = SIGNATURE_WINDOW_S,
        margin_s: float = MARGIN_S,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._clock = clock
        self._max_entries = max_entries
        self._keep_s = window_s + margin_s
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)

    def first_time(self, signature: str, timestamp: str | None) -> bool:
        """Remember ``signature``; True when it was not already remembered (and unexpired).

        ``timestamp`` is the request's ``X-Slack-Request-Timestamp``; the signature is kept
        until that time (or now, when later) plus the window and the margin."""
        now = self._clock()
        try:
            stamp = float(timestamp) if timestamp is not None else now
        except ValueError:
            stamp = now
        with self._lock:
            self._drop_expired(now)
            expires_at = self._seen.get(signature)
            if expires_at is not None and expires_at > now:
                return False
            self._seen.pop(signature, None)
            self._seen[signature] = max(stamp, now) + self._keep_s
            while len(self._seen) > self._max_entries:
                self._seen.popitem(last=False)
            return True

    def process(
        self,
        *,
        req: BoltRequest,
        resp: BoltResponse,
        next: Callable[[], BoltResponse],
    ) -> BoltResponse | None:
        """Answer a replayed signature with an empty 200; anything else goes on."""
        signature = _header(req, "x-slack-signature")
        if not signature or self.first_time(signature, _header(req, "x-slack-request-timestamp")):
            return next()
        log.warning(
            "a signed request was sent again (timestamp %s); answered without running it",
            _header(req, "x-slack-request-timestamp"),
        )
        return BoltResponse(status=200, body="")

    def _drop_expired(self, now: float) -> None:
        # Entries are in the order they were accepted; expiries follow it closely enough that
        # dropping from the front keeps memory near the live set (lookups check expiry anyway).
        while self._seen:
            oldest, expires_at = next(iter(self._seen.items()))
            if expires_at > now:
                return
            del self._seen[oldest]


def _header(req: BoltRequest, name: str) -> str | None:
    values = req.headers.get(name)
    return values[0] if values else None
