// The server's HTTP API as the page uses it: the OpenAI endpoints on this origin, the API key
// (kept for the browser tab only), and the chat stream parsed from server-sent events.

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
  } catch (_) {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, message);
}

export class Api {
  constructor() {
    this.key = sessionStorage.getItem("mmserve-api-key") || "";
  }

  setKey(key) {
    this.key = key;
    sessionStorage.setItem("mmserve-api-key", key);
  }

  headers(extra = {}) {
    return this.key ? { ...extra, Authorization: `Bearer ${this.key}` } : extra;
  }

  async get(path) {
    const response = await fetch(path, { headers: this.headers() });
    if (!response.ok) throw await errorOf(response);
    return response;
  }

  async models() {
    const listing = await (await this.get("/v1/models")).json();
    return listing.data.map((card) => card.id);
  }

  async metricsText() {
    return (await this.get("/metrics")).text();
  }

  // Yields each parsed event of a streamed chat completion; an error event throws.
  async *chatStream(body, signal) {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: this.headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
      signal,
    });
    if (!response.ok) throw await errorOf(response);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        const block = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        for (const line of block.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") return;
          const event = JSON.parse(data);
          if (event.error) throw new ApiError(event.error.code || 500, event.error.message);
          yield event;
        }
      }
    }
  }
}
