"""Where media may come from (SSRF policy): ``MediaFetchPolicy`` and the address rules.

An address is refused when it is (or, through IPv4-mapped, NAT64, 6to4 or Teredo forms,
reaches) a loopback, private, link-local, multicast, reserved, shared or otherwise non-global
address, unless an allowed network opts it in; cloud metadata addresses are refused always.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mmserve.multimodal.media.limits import MAX_IMAGE_BYTES, MAX_VIDEO_BYTES

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
MediaKind = Literal["image", "video"]

#: Cloud instance-metadata endpoints (AWS/GCP/Azure, ECS, AWS time, Alibaba, Oracle, Azure
#: WireServer, AWS IPv6):
#: refused always, even inside ``allowed_networks``.
CLOUD_METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    map(ipaddress.ip_address, ("169.254.169.254", "169.254.170.2", "169.254.169.123",
                               "100.100.100.200", "192.0.0.192", "168.63.129.16",
                               "fd00:ec2::254", "fd00:ec2::23"))
)  # fmt: skip
_SHARED_ADDRESS_SPACE = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NON_PUBLIC = ("loopback", "unspecified", "link_local", "multicast", "private", "reserved",
               "site_local")  # fmt: skip


@dataclass(frozen=True)
class MediaFetchPolicy:
    """What the server may fetch media from, and within which limits.

    ``max_bytes`` / ``max_data_url_bytes`` bound an image, ``max_video_bytes`` a video (any
    source). Invariants (``__post_init__``): limits and timeouts are positive;
    ``allowed_domains`` is None or a frozenset of lowercase names without trailing dot;
    ``allowed_networks`` is a tuple of networks (CIDR strings are parsed);
    ``allowed_local_path`` is None, a bool or a Path.
    """

    allowed_domains: frozenset[str] | None = None
    allowed_networks: tuple[IPNetwork, ...] = ()
    allowed_local_path: Path | bool | None = None
    max_bytes: int = MAX_IMAGE_BYTES
    max_data_url_bytes: int = MAX_IMAGE_BYTES
    max_video_bytes: int = MAX_VIDEO_BYTES
    max_redirects: int = 3
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    total_timeout_s: float = 20.0
    max_concurrent_fetches: int = 16

    def __post_init__(self) -> None:
        counts = ("max_bytes", "max_data_url_bytes", "max_video_bytes", "max_concurrent_fetches")
        for name in (*counts, "max_redirects"):
            value, low = getattr(self, name), 0 if name == "max_redirects" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        for name in ("connect_timeout_s", "read_timeout_s", "total_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        domains = self.allowed_domains
        if domains is not None:
            if isinstance(domains, str) or not all(isinstance(d, str) and d for d in domains):
                raise ValueError(f"allowed_domains must be a set of host names, got {domains!r}")
            normalized = frozenset(d.strip().lower().removesuffix(".") for d in domains)
            object.__setattr__(self, "allowed_domains", normalized)
        networks = tuple(
            n if isinstance(n, IPNetwork) else self.parse_networks([n])[0]
            for n in self.allowed_networks
        )
        object.__setattr__(self, "allowed_networks", networks)
        local = self.allowed_local_path
        if isinstance(local, str):
            object.__setattr__(self, "allowed_local_path", Path(local))
        elif not (local is None or isinstance(local, (bool, Path))):
            raise ValueError(f"allowed_local_path must be None, a bool or a directory: {local!r}")

    @staticmethod
    def parse_networks(specs: str | Iterable[str]) -> tuple[IPNetwork, ...]:
        """CIDR strings ("10.0.0.0/8", "fd00::/8", or one comma-separated string) -> networks."""
        if isinstance(specs, str):
            specs = specs.replace(",", " ").split()
        networks = []
        for spec in specs:
            try:
                networks.append(ipaddress.ip_network(str(spec).strip(), strict=True))
            except ValueError:
                raise ValueError(f"invalid network in allowed networks: {spec!r}") from None
        return tuple(networks)

    def byte_limit(self, kind: MediaKind, data_url: bool = False) -> int:
        """The most bytes one medium of ``kind`` may have (from a data URL: ``data_url``)."""
        if kind == "video":
            return self.max_video_bytes
        return self.max_data_url_bytes if data_url else self.max_bytes


def _reached_addresses(ip: IPAddress) -> list[IPAddress]:
    """The addresses a connection to ``ip`` really reaches (embedded IPv4 unwrapped)."""
    if isinstance(ip, ipaddress.IPv4Address):
        return [ip]
    ip = ipaddress.IPv6Address(int(ip))  # drop any %scope so set lookups work
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip in _NAT64:  # the NAT64 gateway translates to the IPv4 inside: only that counts
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.sixtofour is not None:
        return [ip, ip.sixtofour]
    return [ip, ip.teredo[1]] if ip.teredo is not None else [ip]


def address_refusal(ip: IPAddress, policy: MediaFetchPolicy) -> str | None:
    """None if the policy allows connecting to ip, else a reason for the server log."""
    reached = _reached_addresses(ip)
    if any(addr in CLOUD_METADATA_ADDRESSES for addr in reached):
        return f"{ip} is a cloud metadata address"
    for addr in reached:
        if any(addr in net for net in policy.allowed_networks):
            continue
        kind = next((k for k in _NON_PUBLIC if getattr(addr, f"is_{k}", False)), None)
        if kind is None and addr in _SHARED_ADDRESS_SPACE:
            kind = "shared address space"
        if kind is None and not addr.is_global:
            kind = "not global"
        if kind is not None:
            return f"{ip} is {kind.replace('_', '-')}" + (f" (as {addr})" if addr != ip else "")
    return None
