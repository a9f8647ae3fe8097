// The live cache panel: polls /metrics (Prometheus text) and shows what the caches saved.

const POLL_MS = 2000;

// {sample name: value} of the unlabelled samples (mmserve's own metrics have no labels).
export function parseMetrics(text) {
  const samples = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)\s+(\S+)/.exec(line);
    if (match) samples[match[1]] = Number(match[2]);
  }
  return samples;
}

function ratio(part, whole) {
  return whole > 0 && Number.isFinite(part) ? `${((100 * part) / whole).toFixed(1)} %` : "-";
}

function count(value) {
  return Number.isFinite(value) ? Math.round(value).toLocaleString("en-US") : "-";
}

// The panel's values from the samples ("-" where the server does not export one).
export function panelValues(m) {
  const hits = m.mmserve_encoder_cache_hits_total;
  const misses = m.mmserve_encoder_cache_misses_total;
  const running = m.mmserve_num_requests_running;
  const waiting = m.mmserve_num_requests_waiting;
  return {
    encoder_hit_rate: hits === undefined ? "-" : ratio(hits, hits + misses),
    images_encoded: count(m.mmserve_encoder_images_encoded_total),
    embeddings_saved: count(m.mmserve_encoder_embeddings_from_cache_total),
    prefix_hit_rate: ratio(m.mmserve_prefix_cache_hits_total, m.mmserve_prefix_cache_queries_total),
    kv_usage: ratio(m.mmserve_kv_blocks_used, m.mmserve_kv_blocks_total),
    queue: running === undefined ? "-" : `${count(running)} / ${count(waiting)}`,
  };
}

export function startMetricsPanel(api, root, state) {
  async function refresh() {
    try {
      const values = panelValues(parseMetrics(await api.metricsText()));
      for (const cell of root.querySelectorAll("[data-metric]")) {
        cell.textContent = values[cell.dataset.metric];
      }
      state.textContent = "";
    } catch (err) {
      state.textContent = `(${err.message})`;
    }
  }
  refresh();
  setInterval(refresh, POLL_MS);
  return refresh;
}
