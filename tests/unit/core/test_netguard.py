"""Webhook addresses: public ones only (loopback when told), and URLs logged without secrets."""

from __future__ import annotations

import ipaddress

import pytest

from batchinfer.core.netguard import ForbiddenAddress, check_url, forbidden, safe_url


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # the EC2 metadata service
        "169.254.170.2",  # the ECS task metadata service
        "100.64.0.1",  # carrier-grade NAT
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fd00:ec2::254",  # the EC2 metadata service over IPv6
        "fe80::1",
        "::ffff:169.254.169.254",  # IPv4 mapped into IPv6
    ],
)
def test_addresses_only_the_deployment_reaches_are_forbidden(address: str) -> None:
    assert forbidden(ipaddress.ip_address(address)) is True


@pytest.mark.parametrize("address", ["93.184.215.14", "2606:4700::6810:85e5", "::ffff:8.8.8.8"])
def test_public_addresses_are_not(address: str) -> None:
    assert forbidden(ipaddress.ip_address(address)) is False


def test_loopback_only_is_allowed_when_told() -> None:
    assert [
        forbidden(ipaddress.ip_address(a), allow_loopback=True) for a in ("127.0.0.1", "::1", "10.0.0.1")
    ] == [
        False,
        False,
        True,
    ]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://169.254.169.254/latest/meta-data", "webhook host 169.254.169.254 is not a public address"),
        ("https://[::1]:8443/hook", "webhook host ::1 is not a public address"),
        ("http://127.0.0.1:9/hook", "webhook host 127.0.0.1 is not a public address"),
        ("http://LOCALHOST./hook", "webhook host localhost is loopback"),
        ("http://api.localhost/hook", "webhook host api.localhost is loopback"),
        # IPv4's older spellings, which getaddrinfo and many HTTP clients read as addresses
        ("http://0x7f000001:8765/hook", "webhook host 0x7f000001 is not a public address"),
        ("http://127.1/hook", "webhook host 127.1 is not a public address"),
        ("http://0251.0376.0251.0376/x", "webhook host 0251.0376.0251.0376 is not a public address"),
        ("http://2852039166/x", "webhook host 2852039166 is not a public address"),
    ],
)
def test_a_url_naming_a_forbidden_host_is_refused(url: str, message: str) -> None:
    with pytest.raises(ForbiddenAddress) as error:
        check_url(url)
    assert str(error.value) == message


def test_names_and_allowed_loopback_pass_the_url_check() -> None:
    check_url("https://hooks.example.com/batchinfer")
    check_url("http://127.0.0.1:9/hook", allow_loopback=True)
    check_url("http://localhost:9/hook", allow_loopback=True)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:pw@hooks.example.com:8443/in?token=s3cret#x", "https://hooks.example.com:8443/in"),
        ("http://[2606:4700::1]/hook?sig=1", "http://[2606:4700::1]/hook"),
        ("http://hooks.example.com:notaport/x", "http://hooks.example.com/x"),
    ],
)
def test_a_url_is_shown_without_query_nor_credentials(url: str, shown: str) -> None:
    assert safe_url(url) == shown
