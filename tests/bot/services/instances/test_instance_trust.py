"""The address policy, its setting and the attempt limiter, as plain values."""

from __future__ import annotations

import ipaddress
from datetime import datetime, timedelta

import pytest

from bot.errors import ConfigError, NotAuthorized
from bot.services.instances import instance_trust
from bot.services.instances.instance_trust import AttemptLimiter, Resolved
from bot.settings import Settings

T0 = datetime(2026, 12, 4, 12, 0)


@pytest.mark.parametrize(
    "address",
    [
        "169.254.169.254",  # the cloud metadata service (AWS, GCP, Azure)
        "fd00:ec2::254",  # AWS's IPv6 metadata service
        "127.0.0.1",
        "::1",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "100.64.0.1",  # shared address space (carrier-grade NAT)
        "0.0.0.0",
        "::",
        "224.0.0.1",
        "239.1.2.3",
        "ff02::1",
        "240.0.0.1",
        "255.255.255.255",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",  # IPv4-mapped loopback
        "::ffff:169.254.169.254",
        "198.51.100.7",  # documentation ranges are not public either
    ],
)
def test_addresses_that_are_not_public(address: str) -> None:
    assert not instance_trust.is_public(ipaddress.ip_address(address))
    with pytest.raises(NotAuthorized, match="not an address the bot registers instances at"):
        instance_trust.check_addresses(("public",), Resolved(address, (address,)))


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "9.9.9.9"])
def test_public_addresses_are_allowed_by_default(address: str) -> None:
    assert instance_trust.is_public(ipaddress.ip_address(address))
    instance_trust.check_addresses(Settings().instance_networks, Resolved(address, (address,)))


def test_a_listed_network_is_allowed_and_only_it() -> None:
    networks = Settings(instance_networks=("10.20.0.0/16",)).instance_networks
    instance_trust.check_addresses(networks, Resolved("10.20.3.4", ("10.20.3.4",)))
    instance_trust.check_addresses(networks, Resolved("m", ("::ffff:10.20.3.4",)))
    for outside in ("10.21.0.1", "8.8.8.8"):  # without public, public addresses are not listed
        with pytest.raises(NotAuthorized):
            instance_trust.check_addresses(networks, Resolved(outside, (outside,)))


def test_every_address_a_name_resolves_to_must_be_allowed() -> None:
    resolved = Resolved("both.example", ("8.8.8.8", "169.254.169.254"))
    with pytest.raises(NotAuthorized, match=r"both\.example is not an address"):
        instance_trust.check_addresses(("public",), resolved)


def test_a_name_is_resolved_once_to_every_address() -> None:
    assert instance_trust.resolve("127.0.0.1", 22) == Resolved("127.0.0.1", ("127.0.0.1",))
    assert "127.0.0.1" in instance_trust.resolve("localhost", 22).addresses


def test_the_setting_reads_cidrs_and_public_and_refuses_anything_else() -> None:
    env = {"GPUBOT_INSTANCE_NETWORKS": " public, 10.0.0.1/8 ,fd00::/8,,"}
    assert Settings.from_env(env).instance_networks == ("public", "10.0.0.0/8", "fd00::/8")
    assert Settings.from_env({}).instance_networks == ("public",)
    for bad in ("10.0.0.0/33", "everything", "10.0.0.0/8;rm"):
        with pytest.raises(ConfigError, match="GPUBOT_INSTANCE_NETWORKS"):
            Settings.from_env({"GPUBOT_INSTANCE_NETWORKS": bad})
    with pytest.raises(ConfigError, match="lists no network"):
        Settings(instance_networks=(" ",))


def test_the_limiter_counts_failures_in_a_window_and_stays_bounded() -> None:
    limiter = AttemptLimiter(limit=2, window_s=600, max_people=3)
    for minute in (0, 1):
        limiter.take("U1", T0 + timedelta(minutes=minute))
        limiter.settle("U1", T0 + timedelta(minutes=minute), failed=True)
    with pytest.raises(NotAuthorized, match="try again in 9 min"):
        limiter.take("U1", T0 + timedelta(minutes=1))
    limiter.take("U1", T0 + timedelta(minutes=10, seconds=1))  # the oldest left the window
    limiter.settle("U1", T0 + timedelta(minutes=10, seconds=1), failed=False)  # registered
    limiter.take("U1", T0 + timedelta(minutes=11, seconds=1))  # both failures left it
    for person in ("U2", "U3", "U4", "U5"):
        limiter.take(person, T0)
        limiter.settle(person, T0, failed=True)
    assert len(limiter._by_person) == 3  # the longest quiet were forgotten


def test_registrations_under_way_are_not_failures_but_are_bounded() -> None:
    limiter = AttemptLimiter(limit=2, window_s=600, in_flight_limit=3)
    for _ in range(3):  # three under way at once: none has failed
        limiter.take("U1", T0)
    with pytest.raises(NotAuthorized, match="3 of your registrations are still under way"):
        limiter.take("U1", T0)
    for _ in range(3):
        limiter.settle("U1", T0, failed=False)
    for _ in range(3):  # all three registered: a fourth and more go on
        limiter.take("U1", T0 + timedelta(seconds=1))
