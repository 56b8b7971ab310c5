"""The address policy, its setting and the attempt limiter, as plain values."""

from __future__ import annotations

import ipaddress
from datetime import datetime, timedelta

import pytest

from bot.errors import ConfigError, NotAuthorized
from bot.services import instance_trust
from bot.services.instance_trust import AttemptLimiter, Resolved
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


def test_the_limiter_counts_a_window_refunds_and_stays_bounded() -> None:
    limiter = AttemptLimiter(limit=2, window_s=600, max_people=3)
    limiter.take("U1", T0)
    limiter.take("U1", T0 + timedelta(minutes=1))
    with pytest.raises(NotAuthorized, match="try again in 9 min"):
        limiter.take("U1", T0 + timedelta(minutes=1))
    limiter.refund("U1", T0)  # that one ended in a registration
    limiter.take("U1", T0 + timedelta(minutes=2))
    with pytest.raises(NotAuthorized):
        limiter.take("U1", T0 + timedelta(minutes=2))
    limiter.take("U1", T0 + timedelta(minutes=11, seconds=1))  # the oldest left the window
    for person in ("U2", "U3", "U4", "U5"):
        limiter.take(person, T0)
    assert len(limiter._by_person) == 3  # the longest quiet were forgotten
