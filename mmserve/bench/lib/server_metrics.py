"""mmserve's cache counters scraped from a server's Prometheus ``/metrics`` before and after
a ``bench serve`` run, as hit rates over the run."""

from __future__ import annotations

import httpx


async def scrape_metrics(client: httpx.AsyncClient, base_url: str) -> dict[str, float]:
    """Prometheus counters at ``<server root>/metrics`` (empty if the server has none)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    try:
        resp = await client.get(root + "/metrics")
    except httpx.HTTPError:
        return {}
    if resp.status_code != 200:
        return {}
    values = {}
    for line in resp.text.splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#"):
            try:
                values[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return values


def cache_rates(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Prefix / encoder hit rates and images encoded over the run (mmserve's counters)."""

    def d(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    if "mmserve_prefix_cache_queries_total" not in after:
        return {}
    lookups = d("mmserve_encoder_cache_hits_total") + d("mmserve_encoder_cache_misses_total")
    return {
        "prefix_hit_rate": d("mmserve_prefix_cache_hits_total")
        / max(d("mmserve_prefix_cache_queries_total"), 1),
        "encoder_hit_rate": d("mmserve_encoder_cache_hits_total") / max(lookups, 1),
        "images_encoded": d("mmserve_encoder_images_encoded_total"),
    }
