"""The SSRF guard: a webhook reaches only public addresses, unless the deployment allows others.

A tenant names the URL, so without a guard a webhook could make the workers call the cloud's metadata
service (169.254.169.254), the database, or anything else on the private network. A URL is checked when
an endpoint is created or changed (its host resolved, every address it resolves to checked), and again
at every delivery, where the addresses checked are the ones connected to: `GuardedResolver` is the
connector's resolver, so a name that resolved to a public address at creation and to a private one
now (DNS rebinding) is refused without a packet sent to it.

Refused: every address that is not globally routable (`ipaddress`' `is_global`: loopback, private,
link-local and so the metadata address, carrier-grade NAT, reserved, unspecified) and multicast, IPv4
addresses mapped into IPv6 judged as IPv4. `MEMSTORE_WEBHOOK_ALLOWED_HOSTS` lists exceptions: a host
name as written in URLs, or an address / CIDR the resolved address falls in.

Resolution goes through `resolve` (module-level, so tests can stub it: no test sends a packet outside
the loopback range).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

RESOLVE_TIMEOUT_S = 5.0


class BlockedAddressError(Exception):
    """The URL names or resolves to an address webhooks may not reach, or does not resolve."""


async def system_resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to, by the system's resolver."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


# Replaced by tests (see the module's docstring).
resolve: Callable[[str, int], Awaitable[list[str]]] = system_resolve


@dataclass(frozen=True)
class AddressPolicy:
    """What may be reached: public addresses, and the deployment's exceptions."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()

    @classmethod
    def of(cls, allowed: Sequence[str]) -> AddressPolicy:
        hosts: set[str] = set()
        networks: list[Network] = []
        for entry in allowed:
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                hosts.add(entry.strip().lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def allows_host(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.hosts

    def allows_address(self, address: str) -> bool:
        ip: IPAddress = ipaddress.ip_address(address.split("%", 1)[0])
        if any(ip in network for network in self.networks):
            return True
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
            if any(ip in network for network in self.networks):
                return True
        return ip.is_global and not ip.is_multicast

    def check_addresses(self, host: str, addresses: Sequence[str]) -> None:
        if not addresses:
            raise BlockedAddressError(f"{host} does not resolve to any address")
        if self.allows_host(host):
            return
        for address in addresses:
            if not self.allows_address(address):
                raise BlockedAddressError(
                    f"{host} resolves to {address}, a loopback, private, link-local or metadata address "
                    "(allowed only by MEMSTORE_WEBHOOK_ALLOWED_HOSTS)"
                )


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        raise BlockedAddressError("the URL names no host")
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


async def check_url(url: str, policy: AddressPolicy) -> None:
    """Refuse `url` (BlockedAddressError) unless every address its host resolves to may be reached."""
    host, port = _host_port(url)
    literal = _literal(host)
    if literal is not None:
        policy.check_addresses(host, [literal])
        return
    if policy.allows_host(host):
        return
    try:
        async with asyncio.timeout(RESOLVE_TIMEOUT_S):
            addresses = await resolve(host, port)
    except (OSError, TimeoutError) as exc:
        raise BlockedAddressError(f"{host} does not resolve: {exc}") from exc
    policy.check_addresses(host, addresses)


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver for webhook deliveries: resolves through `resolve` and answers only the
    addresses the policy allows, so the connection goes to an address that was checked.
    (An IP literal in the URL never reaches a resolver: `check_url` is asked first for those.)"""

    def __init__(self, policy: AddressPolicy) -> None:
        self.policy = policy

    async def resolve(self, host: str, port: int = 0, family: Any = socket.AF_INET) -> list[ResolveResult]:
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                addresses = await resolve(host, port)
        except (OSError, TimeoutError) as exc:
            raise BlockedAddressError(f"{host} does not resolve: {exc}") from exc
        self.policy.check_addresses(host, addresses)
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        return None


def check_literal(url: str, policy: AddressPolicy) -> None:
    """At delivery: an IP literal in the URL is checked here (a name is, by `GuardedResolver`)."""
    host, _ = _host_port(url)
    literal = _literal(host)
    if literal is not None:
        policy.check_addresses(host, [literal])
