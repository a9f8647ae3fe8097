// The playground: a chat with images and videos over /v1/chat/completions (streamed), per-turn
// numbers from the usage object, and the live cache panel. The whole conversation is sent each turn,
// as any OpenAI client does: the server's caches are what make the repeat cheap. An attached image
// is encoded at once (/v1/mm/encode) while the person types; turns then name it by its handle
// (mmserve://...), and send its bytes again only if the server no longer has it.

import { Api } from "./api.js";
import { startMetricsPanel } from "./metrics.js";
import { assistantTurn, attachmentChip, renderStats, userTurn } from "./render.js";

const $ = (id) => document.getElementById(id);
const api = new Api();
// media: the conversation's images and videos in the order sent; pending: for the next message
// urls: handle -> the image's data URL, to send the bytes instead if a handle is refused
const chat = { messages: [], media: [], pending: [], controller: null, urls: new Map() };

function notice(message) {
  $("notice").textContent = message || "";
  $("notice").classList.toggle("hidden", !message);
}

async function loadModels() {
  const select = $("model");
  try {
    const names = await api.models();
    const chosen = select.value;
    select.replaceChildren(...names.map((name) => new Option(name, name)));
    if (names.includes(chosen)) select.value = chosen;
    notice("");
  } catch (err) {
    if (err.status === 401) {
      $("key-field").classList.remove("hidden");
      notice(api.key ? "The API key was refused." : "This server needs an API key.");
      $("api-key").focus();
    } else {
      notice(`Cannot list models: ${err.message}`);
    }
  }
}

function showAttachments() {
  const chips = chat.pending.map((item, i) =>
    attachmentChip(item, () => {
      chat.pending.splice(i, 1);
      showAttachments();
    }),
  );
  $("attachments").replaceChildren(...chips);
}

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function mediaKind(file) {
  if (file.type.startsWith("image/")) return "image";
  return file.type.startsWith("video/") ? "video" : null;
}

async function addFiles(files) {
  const media = [...files].filter(mediaKind);
  for (const file of media) {
    const kind = mediaKind(file);
    const name = file.name || `pasted ${kind}`;
    const item = { kind, name, url: await readAsDataURL(file), state: null };
    if (kind === "image" && $("model").value) item.encoding = encodeAhead(item);
    chat.pending.push(item);
  }
  showAttachments();
  return media.length;
}

// Encode while the person types; a failure only means the turn sends the bytes.
async function encodeAhead(item) {
  item.state = "encoding";
  try {
    const encoded = await api.encodeImage($("model").value, item.url);
    item.handle = encoded.handle;
    item.state = "cached";
    chat.urls.set(encoded.handle, item.url);
  } catch (_) {
    item.state = null;
  }
  showAttachments();
}

function contentPart(item) {
  if (item.kind === "video") return { type: "video_url", video_url: { url: item.url } };
  const url = item.handle ? `mmserve://${item.handle}` : item.url;
  return { type: "image_url", image_url: { url } };
}

// The conversation with every handle replaced by its image's bytes (a refused or expired
// handle: the server lost the embedding, or prepares several images differently).
function withBytes(messages) {
  for (const message of messages) {
    if (!Array.isArray(message.content)) continue;
    for (const part of message.content) {
      const url = part.image_url && part.image_url.url;
      if (url && url.startsWith("mmserve://")) part.image_url.url = chat.urls.get(url.slice(10));
    }
  }
}

function number(id) {
  const value = $(id).value.trim();
  return value === "" ? undefined : Number(value);
}

function requestBody() {
  const system = $("system").value.trim();
  const messages = system ? [{ role: "system", content: system }, ...chat.messages] : chat.messages;
  return {
    model: $("model").value,
    messages,
    temperature: number("temperature"),
    top_p: number("top-p"),
    max_tokens: number("max-tokens"),
    seed: number("seed"),
  };
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

async function send() {
  const text = $("prompt").value.trim();
  if (chat.controller || (!text && !chat.pending.length)) return;
  if (!$("model").value) {
    notice("No model to send to: the model list has not loaded.");
    return;
  }
  const messages = chat.messages; // this conversation's ("New chat" starts another)
  const attached = chat.pending.splice(0);
  showAttachments();
  $("prompt").value = "";
  const started = performance.now();
  await Promise.all(attached.map((item) => item.encoding)); // usually done while typing
  const parts = attached.map(contentPart);
  if (text) parts.push({ type: "text", text });
  messages.push({ role: "user", content: attached.length ? parts : text });
  chat.media.push(...attached);
  const asked = userTurn(text, attached);
  const reply = assistantTurn($("model").value);
  $("log").append(asked, reply.node);
  reply.node.scrollIntoView({ block: "end" });

  chat.controller = new AbortController();
  setBusy(true);
  const timing = { ttft: null, tokensPerSecond: null };
  let answer = "";
  let usage = null;
  let firstAt = null;
  let endAt = null;
  const requestMedia = [...chat.media];
  try {
    for await (const event of streamWithBytesOnRefusal(chat.controller.signal)) {
      endAt = performance.now();
      if (event.usage) usage = event.usage;
      const delta = event.choices && event.choices[0] ? event.choices[0].delta : null;
      if (delta && delta.content) {
        if (firstAt === null) {
          firstAt = endAt;
          timing.ttft = (firstAt - started) / 1000;
        }
        answer += delta.content;
        reply.text.textContent = answer;
      }
    }
    messages.push({ role: "assistant", content: answer });
  } catch (err) {
    if (err.name === "AbortError") {
      messages.push({ role: "assistant", content: answer });
    } else {
      messages.pop(); // not answered: the next message is sent without it
      if (messages === chat.messages) {
        chat.media.splice(chat.media.length - attached.length);
        restoreComposer(text, attached);
      }
      asked.classList.add("failed");
      reply.node.classList.add("error");
      reply.text.textContent = `Error: ${err.message}`;
      if (err.status === 401) loadModels();
    }
  } finally {
    chat.controller = null;
    setBusy(false);
  }
  // decode rate: the tokens after the first over the time from the first to the last event
  const completion = usage ? usage.completion_tokens : 0;
  if (completion > 1 && firstAt !== null && endAt - firstAt >= 1) {
    timing.tokensPerSecond = ((completion - 1) * 1000) / (endAt - firstAt);
  }
  reply.text.classList.remove("pending");
  renderStats(reply.stats, usage, timing, requestMedia);
  reply.node.dataset.done = "true";
  refreshMetrics();
}

// The turn's stream; if a handle is refused before anything streamed, once more with bytes.
async function* streamWithBytesOnRefusal(signal) {
  try {
    yield* api.chatStream(requestBody(), signal);
  } catch (err) {
    if (!(err.code || "").startsWith("media_handle")) throw err;
    withBytes(chat.messages);
    yield* api.chatStream(requestBody(), signal);
  }
}

function restoreComposer(text, attached) {
  if (!$("prompt").value) $("prompt").value = text;
  chat.pending.unshift(...attached);
  showAttachments();
}

function newChat() {
  if (chat.controller) chat.controller.abort();
  chat.messages = [];
  chat.media = [];
  chat.urls = new Map();
  $("log").replaceChildren();
}

function wireInputs() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  $("stop").addEventListener("click", () => chat.controller && chat.controller.abort());
  $("new-chat").addEventListener("click", newChat);
  $("file-input").addEventListener("change", async (event) => {
    await addFiles(event.target.files);
    event.target.value = "";
  });
  // only file drags are taken over: dropping text into the prompt works as usual
  const carriesFiles = (event) => [...event.dataTransfer.types].includes("Files");
  document.addEventListener("dragover", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    document.body.classList.add("dragging");
  });
  document.addEventListener("dragleave", () => document.body.classList.remove("dragging"));
  document.addEventListener("drop", (event) => {
    document.body.classList.remove("dragging");
    if (!carriesFiles(event)) return;
    event.preventDefault();
    addFiles(event.dataTransfer.files);
  });
  document.addEventListener("paste", (event) => {
    const clipboard = event.clipboardData;
    const files = clipboard ? [...clipboard.files] : [];
    if (!files.some(mediaKind)) return;
    if (!clipboard.getData("text/plain")) event.preventDefault(); // text pastes as usual
    addFiles(files);
  });
  $("api-key").addEventListener("change", () => {
    api.setKey($("api-key").value.trim());
    loadModels();
    refreshMetrics();
  });
}

wireInputs();
const refreshMetrics = startMetricsPanel(api, $("metrics"), $("metrics-state"));
loadModels();
