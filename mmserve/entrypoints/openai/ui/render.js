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

export function userTurn(text, images) {
  const thumbs = images.map((image) => el("img", { src: image.url, alt: image.name, class: "thumb" }));
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

// One turn's numbers: tokens from the usage object, times measured here; `images` are the
// request's images in prompt order (the conversation's, earlier turns' included).
export function renderStats(root, usage, timing, images) {
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
  const media = (usage && usage.mm_inputs) || [];
  if (!media.length) return;
  const list = el("ul", { class: "media" });
  const counters = { image: 0, video: 0 };
  for (const input of media) {
    const known = Object.hasOwn(SOURCES, input.source);
    const [kind, words] = known ? SOURCES[input.source] : ["skipped", String(input.source)];
    const image = input.type === "image" ? images[counters.image] : null;
    counters[input.type] += 1;
    const label = `${input.type} ${input.index + 1}: ${words} (${input.tokens} tokens)`;
    const row = el("li", { class: `media-item ${kind}`, data: { source: input.source } });
    if (image) row.append(el("img", { src: image.url, alt: image.name, class: "thumb small" }));
    row.append(el("span", { text: label }));
    list.append(row);
  }
  root.append(list);
}

export function attachmentChip(image, onRemove) {
  const remove = el("button", { type: "button", class: "remove", title: "remove", text: "x" });
  remove.addEventListener("click", onRemove);
  return el("div", { class: "chip" }, [
    el("img", { src: image.url, alt: image.name, class: "thumb" }),
    el("span", { class: "name", text: image.name }),
    remove,
  ]);
}
