// The server's HTTP API as the page uses it: the OpenAI endpoints and /v1/mm/encode on this
// origin, the API key
// (held in this page's memory only: no storage another page of the origin could read), and
// the chat stream parsed from server-sent events.

export class ApiError extends Error {
  constructor(status, message, code = null) {
    super(message);
    this.status = typeof status === "number" ? status : 0;
    this.code = typeof code === "string" ? code : typeof status === "string" ? status : null;
  }
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`;
  let code = null;
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) message = body.error.message;
    if (body && body.error) code = body.error.code;
  } catch (_) {
    // not JSON: keep the status line
  }
  return new ApiError(response.status, message, code);
}

export class Api {
  constructor() {
    this.key = "";
  }

  setKey(key) {
    this.key = key;
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

  // Encodes one image ahead of the turn that sends it (/v1/mm/encode): its handle and tokens.
  async encodeImage(model, url) {
    const response = await fetch("/v1/mm/encode", {
      method: "POST",
      headers: this.headers({ "Content-Type": "application/json" }),
      body: JSON.stringify({ model, content: [{ type: "image_url", image_url: { url } }] }),
    });
    if (!response.ok) throw await errorOf(response);
    return (await response.json()).items[0];
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
      if (done) throw new ApiError(0, "the stream ended before the reply was complete");
      buffered += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        const block = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        const data = block
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(5).trim())
          .join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        const event = JSON.parse(data);
        if (event.error) throw new ApiError(event.error.code, event.error.message);
        yield event;
      }
    }
  }
}
