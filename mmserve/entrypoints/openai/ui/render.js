// DOM building for the chat log. Every string a user or a model wrote goes in as text
// (textContent), never as HTML.

export function el(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else if (name === "data") Object.assign(node.dataset, value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

// How each source of usage.mm_inputs reads on the page; all but "encoded" did no vision work.
const SOURCES = {
  encoded: ["encoded", "encoded"],
  encoder_store: ["cached", "loaded from the encoder store"],
  encoder_cache: ["cached", "cached: encoder cache"],
  prefix_cache: ["cached", "cached: prefix cache (KV reused)"],
  not_computed: ["skipped", "not computed"],
};

// An image, or a video showing its first frame (muted, never autoplayed; `playable` adds the
// controls that play it).
function thumbnail(item, { size = "", playable = false } = {}) {
  const cls = size ? `thumb ${size}` : "thumb";
  if (item.kind !== "video") return el("img", { src: item.url, alt: item.name, class: cls });
  const video = el("video", { src: item.url, title: item.name, class: cls, preload: "metadata" });
  video.muted = true;
  video.controls = playable;
  return video;
}

export function userTurn(text, attached) {
  const thumbs = attached.map((item) => thumbnail(item, { playable: true }));
  return el("li", { class: "turn user" }, [
    el("div", { class: "role", text: "You" }),
    el("div", { class: "images" }, thumbs),
    el("div", { class: "text", text }),
  ]);
}

export function assistantTurn(model) {
  const text = el("div", { class: "text pending" });
  const stats = el("div", { class: "stats" });
  const node = el("li", { class: "turn assistant" }, [
    el("div", { class: "role", text: model }),
    text,
    stats,
  ]);
  return { node, text, stats };
}

function stat(name, label) {
  return el("span", { class: "stat", data: { stat: name }, text: label });
}

function seconds(s) {
  return s < 1 ? `${Math.round(1000 * s)} ms` : `${s.toFixed(2)} s`;
}

// A video's frame groups or an image's crops: "; 4 pieces" when all came one way, else
// "; 4 pieces: 3 encoded, 1 cached: encoder cache".
function piecesLabel(pieces) {
  const counts = Object.entries(pieces || {});
  const total = counts.reduce((sum, [, n]) => sum + n, 0);
  if (total < 2) return "";
  if (counts.length < 2) return `; ${total} pieces`;
  const words = (source) => (Object.hasOwn(SOURCES, source) ? SOURCES[source][1] : source);
  const parts = counts.map(([source, n]) => `${n} ${words(source)}`);
  return `; ${total} pieces: ${parts.join(", ")}`;
}

// One turn's numbers: tokens from the usage object, times measured here; `media` are the
// request's images and videos in the order sent (the conversation's, earlier turns' included).
export function renderStats(root, usage, timing, media) {
  root.replaceChildren();
  if (usage) {
    const cached = usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0;
    root.append(stat("prompt_tokens", `prompt ${usage.prompt_tokens} tokens`));
    root.append(stat("cached_tokens", `cached ${cached}`));
  }
  if (timing.ttft !== null) root.append(stat("ttft", `TTFT ${seconds(timing.ttft)}`));
  if (timing.tokensPerSecond !== null) {
    root.append(stat("tps", `${timing.tokensPerSecond.toFixed(1)} tokens/s`));
  }
  const inputs = (usage && usage.mm_inputs) || [];
  if (!inputs.length) return;
  const list = el("ul", { class: "media" });
  const sent = {
    image: media.filter((item) => item.kind !== "video"),
    video: media.filter((item) => item.kind === "video"),
  };
  for (const input of inputs) {
    const known = Object.hasOwn(SOURCES, input.source);
    const [kind, words] = known ? SOURCES[input.source] : ["skipped", String(input.source)];
    const item = (sent[input.type] || [])[input.index];
    const tokens = `${input.tokens} tokens${piecesLabel(input.pieces)}`;
    const label = `${input.type} ${input.index + 1}: ${words} (${tokens})`;
    const row = el("li", { class: `media-item ${kind}`, data: { source: input.source } });
    if (item) row.append(thumbnail(item, { size: "small" }));
    row.append(el("span", { text: label }));
    list.append(row);
  }
  root.append(list);
}

export function attachmentChip(item, onRemove) {
  const remove = el("button", { type: "button", class: "remove", title: "remove", text: "x" });
  remove.addEventListener("click", onRemove);
  const state = item.state ? [el("span", { class: `state ${item.state}`, text: item.state })] : [];
  return el("div", { class: "chip", data: { state: item.state || "" } }, [
    thumbnail(item),
    el("span", { class: "name", text: item.name }),
    ...state,
    remove,
  ]);
}
