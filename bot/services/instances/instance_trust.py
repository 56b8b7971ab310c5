"""Trusting what a registration claims: where it may dial, how often one person may try, and
whether the platform's record of a provider id is this machine.

- **Addresses.** A registration's host is resolved once (:func:`resolve`); the addresses found
  are what is checked and dialled, so no second lookup can point the dial elsewhere. From Slack
  every address must lie in ``GPUBOT_INSTANCE_NETWORKS`` (``Settings.instance_networks``;
  ``public`` stands for the public addresses, the default): loopback, private, link-local (the
  cloud metadata addresses 169.254.169.254 and fd00:ec2::254 among them), shared (100.64.0.0/10),
  reserved, unspecified and multicast addresses are refused before any dial unless listed. The
  refusal is one message whatever the port's state. The console is not limited (``local`` and
  loopback are normal there).
- **Dial failures** are one generic message for members (:func:`generic_dial_failure`); the
  reason goes to the log and to admins.
- **Attempts.** A person may have at most ``ATTEMPTS`` registrations that dialled and did not
  end in a registration within ``WINDOW_S`` (:class:`AttemptLimiter`). The limiter is in-process
  (one per store the runtime uses): the bot runs as one process, the limit only has to slow a
  scan down, and it must not write to the store (a refused call changes nothing there). A
  restart forgets it; it tracks at most ``MAX_PEOPLE`` people.
- **Provider ids.** :func:`prove_platform` asks the platform for the id's record
  (``Provider.get``, outside any transaction) and accepts it only when the platform's address
  resolves to the address being dialled and its SSH port is the one being dialled.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from bot.errors import (
    GpubotError,
    NotAuthorized,
    NotFound,
    ProviderNotFound,
    Unreachable,
    UsageError,
)
from bot.i18n import t
from bot.notify import Notice
from bot.providers.base import Provider, ProviderInstance
from bot.providers.names import platform_name
from bot.runtime import Runtime
from bot.services.access import Caller, is_admin
from bot.services.instances.lookup import echo

log = logging.getLogger(__name__)

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Registrations one person may have dial and fail within WINDOW_S seconds.
ATTEMPTS = 8
#: Registrations one person may have under way at once (each dials a machine).
IN_FLIGHT = 8
WINDOW_S = 600
#: People the limiter remembers at most (the longest quiet are forgotten first).
MAX_PEOPLE = 10_000
#: The word in GPUBOT_INSTANCE_NETWORKS for every public address.
PUBLIC = "public"


@dataclass(frozen=True)
class Resolved:
    """A host as typed and the addresses it resolved to, in the resolver's order (an address
    literal resolves to itself)."""

    host: str
    addresses: tuple[str, ...]


def resolve(host: str, port: int) -> Resolved:
    """Resolve ``host`` once (TCP). Raises Unreachable when it does not resolve."""
    literal = _literal(host)
    if literal is not None:
        return Resolved(host, (str(literal),))
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise Unreachable(
            t("cannot resolve {host!r}: {strerror}", host=echo(host), strerror=str(exc))
        ) from exc
    found: list[str] = []
    for info in infos:
        address = str(info[4][0]).split("%", 1)[0]
        if address not in found:
            found.append(address)
    if not found:
        raise Unreachable(t("cannot resolve {host!r}: {strerror}", host=echo(host), strerror="-"))
    return Resolved(host, tuple(found))


def check_addresses(networks: Sequence[str], resolved: Resolved) -> None:
    """Raise NotAuthorized unless every address ``resolved`` holds is one ``networks`` (the
    setting's items: CIDRs and ``public``) allows. One message whatever the address."""
    allowed = [ipaddress.ip_network(n) for n in networks if n != PUBLIC]
    public = PUBLIC in networks
    for text in resolved.addresses:
        address = ipaddress.ip_address(text)
        if not _allowed(address, allowed, public=public):
            raise NotAuthorized(
                t(
                    "{host} is not an address the bot registers instances at from Slack.",
                    host=echo(resolved.host),
                ),
                hint=t(
                    "Register the instance at its public address; an admin can list a private "
                    "network in GPUBOT_INSTANCE_NETWORKS."
                ),
            )


def is_public(address: IpAddress) -> bool:
    """Whether ``address`` is a public unicast address (not loopback, private, link-local,
    shared, reserved, unspecified or multicast; an IPv4-mapped IPv6 address as its IPv4)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not (
        address.is_multicast
        or address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_reserved
        or address.is_unspecified
    )


def generic_dial_failure(address: str) -> Unreachable:
    """What a member hears of any failure to dial ``address`` (closed, filtered, not SSH, a key
    refused): the same words whatever happened."""
    return Unreachable(
        t(
            "The bot could not set up {address}: no SSH server it can use answered there.",
            address=echo(address),
        ),
        hint=t(
            "Check the address and port, that sshd runs there and that it takes the bot's key; "
            "an admin can read the reason in the bot's log."
        ),
    )


def dial_failure(rt: Runtime, caller: Caller, address: str, exc: GpubotError) -> GpubotError:
    """``exc`` for an admin, the generic failure for anyone else; logged either way."""
    log.info("registration by %s of %s failed: %s", caller.user_id, address, exc.message)
    if rt.console or is_admin(rt, caller):
        return exc
    return generic_dial_failure(address)


# --- what the ops channel hears ---------------------------------------------------------------


@dataclass(frozen=True)
class PlatformUnlisted(Notice):
    """For the ops channel: reconcile cannot list ``provider``'s instances (since ``since``,
    naive UTC); ``answer`` is what the platform answered (its error, credentials masked)."""

    provider: str
    answer: str
    since: datetime
    timezone: str


@dataclass(frozen=True)
class PlatformListedAgain(Notice):
    """For the ops channel: ``provider`` lists its instances again (it could not since
    ``since``, naive UTC, until ``now``)."""

    provider: str
    since: datetime
    now: datetime
    timezone: str


@dataclass(frozen=True)
class Adopted(Notice):
    """For the ops channel: ``by`` (a Slack user ID) took over ``provider``'s instance
    ``provider_id`` as ``name``; ``platform_name`` and ``tags`` are what the platform calls it
    and labels it with."""

    by: str
    name: str
    provider: str
    provider_id: str
    platform_name: str | None
    tags: tuple[tuple[str, str], ...]


# --- attempts -------------------------------------------------------------------------------


class AttemptLimiter:
    """Registration attempts per person: those that failed (could not resolve or dial, or an
    address refused) in a sliding window of the runtime's clock, and those under way now.

    :meth:`take` counts an attempt under way before it dials (raises when the person is at
    either limit); :meth:`settle` ends it, remembered as a failure or forgotten. Thread-safe,
    bounded."""

    def __init__(
        self,
        *,
        limit: int | None = None,
        window_s: int = WINDOW_S,
        max_people: int = MAX_PEOPLE,
        in_flight_limit: int = IN_FLIGHT,
    ) -> None:
        self.limit = ATTEMPTS if limit is None else limit
        self.window = timedelta(seconds=window_s)
        self.max_people = max_people
        self.in_flight_limit = in_flight_limit
        self._lock = threading.Lock()
        self._by_person: OrderedDict[str, deque[datetime]] = OrderedDict()
        self._in_flight: dict[str, int] = {}

    def take(self, person: str, now: datetime) -> None:
        """Count an attempt by ``person`` under way from ``now``. Raises NotAuthorized when
        too many of theirs failed lately, or too many are under way."""
        with self._lock:
            failures = self._by_person.pop(person, None) or deque()
            while failures and failures[0] <= now - self.window:
                failures.popleft()
            self._by_person[person] = failures
            while len(self._by_person) > self.max_people:
                self._by_person.popitem(last=False)
            if len(failures) >= self.limit:
                wait = failures[0] + self.window - now
                raise NotAuthorized(
                    t(
                        "Too many registrations that failed; try again in {minutes} min.",
                        minutes=max(1, -(-int(wait.total_seconds()) // 60)),
                    ),
                    hint=t("An admin can register it for you."),
                )
            under_way = self._in_flight.get(person, 0)
            if under_way >= self.in_flight_limit:
                raise NotAuthorized(
                    t(
                        "{n} of your registrations are still under way; try again when one "
                        "has finished.",
                        n=under_way,
                    ),
                    hint=t("Each one answers when it is done."),
                )
            self._in_flight[person] = under_way + 1

    def settle(self, person: str, at: datetime, *, failed: bool) -> None:
        """End the attempt ``person`` took at ``at``: remembered in the window when it
        ``failed`` (what a scan of the network runs into), else forgotten."""
        with self._lock:
            left = self._in_flight.get(person, 0) - 1
            if left > 0:
                self._in_flight[person] = left
            else:
                self._in_flight.pop(person, None)
            if failed:
                failures = self._by_person.pop(person, None) or deque()
                failures.append(at)
                self._by_person[person] = failures
                while len(self._by_person) > self.max_people:
                    self._by_person.popitem(last=False)


_LIMITERS: weakref.WeakKeyDictionary[object, AttemptLimiter] = weakref.WeakKeyDictionary()
_LIMITERS_LOCK = threading.Lock()


def limiter(rt: Runtime) -> AttemptLimiter:
    """The runtime's limiter (one per store: every runtime of one bot shares it)."""
    with _LIMITERS_LOCK:
        found = _LIMITERS.get(rt.db)
        if found is None:
            found = _LIMITERS[rt.db] = AttemptLimiter()
        return found


# --- provider ids ---------------------------------------------------------------------------


def prove_platform(
    provider: Provider, provider_id: str, resolved: Resolved, port: int
) -> ProviderInstance | None:
    """The platform's record of ``provider_id`` when it is the machine at ``resolved``:``port``
    (its address resolves to one of ``resolved``'s and its SSH port is ``port``); None for a
    platform with no API to ask. Calls the platform: never inside a transaction.

    Raises NotFound (the platform does not know the id), Conflict (the platform puts it
    elsewhere, or reports no address), ProviderError (the platform could not be asked)."""
    if not provider.capabilities.can_list:
        return None
    try:
        seen = provider.get(provider_id)
    except ProviderNotFound as exc:
        raise NotFound(
            t(
                "{provider} does not know an instance {id!r}.",
                provider=platform_name(provider.name),
                id=echo(provider_id),
            ),
            hint=t("Copy the id from the platform's console."),
        ) from exc
    if not seen.host:
        raise UsageError(
            t(
                "{provider} reports no address for {id} (it is {state}); the bot registers a "
                "platform's instance only at the address the platform gives it.",
                provider=platform_name(provider.name),
                id=echo(provider_id),
                state=echo(seen.raw_state or seen.state, 40),
            ),
            hint=t("Register it once it runs (start it on the platform first)."),
        )
    platform_addresses = _platform_addresses(seen.host, seen.ssh_port)
    if seen.ssh_port != port or not platform_addresses & set(resolved.addresses):
        shown = _host_port(seen.host, seen.ssh_port)
        raise UsageError(
            t(
                "{provider} reports instance {id} at {platform_address}, not at {address}: "
                "it is another machine.",
                provider=platform_name(provider.name),
                id=echo(provider_id),
                platform_address=echo(shown),
                address=echo(_shown(resolved, port)),
            ),
            hint=t(
                "Give the platform's address of that instance, or the id of the instance at this "
                "address."
            ),
        )
    return seen


def check_platform_host_key(
    provider: Provider, seen: ProviderInstance | None, fingerprint: str | None
) -> None:
    """Where the platform reports the instance's host key fingerprint (``host_key_fingerprint``
    on its record), the key the machine presented must be it. Raises UsageError."""
    reported = getattr(seen, "host_key_fingerprint", None) if seen is not None else None
    if not isinstance(reported, str) or not reported or fingerprint is None:
        return
    if reported != fingerprint:
        raise UsageError(
            t(
                "{provider} reports the host key {reported} for {id}, but the machine presented "
                "{fingerprint}: it is another machine.",
                provider=platform_name(provider.name),
                reported=echo(reported),
                id=echo(seen.provider_id if seen is not None else ""),
                fingerprint=fingerprint,
            )
        )


def _platform_addresses(host: str, port: int) -> set[str]:
    try:
        return set(resolve(host, port).addresses)
    except Unreachable:
        return set()


def _shown(resolved: Resolved, port: int) -> str:
    return _host_port(resolved.addresses[0] if resolved.addresses else resolved.host, port)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _literal(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def _allowed(
    address: IpAddress,
    networks: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network],
    *,
    public: bool,
) -> bool:
    candidates: list[IpAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        candidates.append(address.ipv4_mapped)
    for candidate in candidates:
        if any(candidate.version == n.version and candidate in n for n in networks):
            return True
    return public and is_public(address)
