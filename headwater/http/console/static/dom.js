// Building the page: every value from the API goes in as text (append of a string, or
// textContent), never as markup.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "value") el.value = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

/** A table of `rows` (arrays of cells: text or nodes); `numeric` names right-aligned columns. */
export function table(headers, rows, { numeric = [], id, empty = "none" } = {}) {
  const head = h("tr", {}, headers.map((t) => h("th", { class: numeric.includes(t) ? "num" : null }, t)));
  const body = rows.map((cells) =>
    h("tr", {}, cells.map((c, i) => h("td", { class: numeric.includes(headers[i]) ? "num" : null }, c))),
  );
  if (!rows.length) body.push(h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, empty)));
  return h("table", { id }, h("thead", {}, head), h("tbody", {}, body));
}

export function link(hash, text) {
  return h("a", { href: hash }, text);
}

export function figure(label, value, id) {
  return h("div", { class: "figure", id }, h("b", {}, value), label);
}

export function field(label, input) {
  return h("label", {}, label, input);
}

export function time(ms) {
  return ms === null || ms === undefined ? "" : new Date(ms).toISOString().replace("T", " ").replace("Z", "");
}

/** epoch ms from digits or a date the browser parses (ISO 8601, "2026-11-28 04:00"). */
export function timeMs(text) {
  if (/^\d+$/.test(text)) return Number(text);
  const ms = Date.parse(text);
  if (Number.isNaN(ms)) throw new Error(`time: give epoch ms or a date such as 2026-11-28T04:00:00Z, got "${text}"`);
  return ms;
}

export function num(n) {
  return n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US");
}

export function bytesText(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function showError(err) {
  const box = document.getElementById("error");
  box.textContent = err ? `${err.name || "Error"}: ${err.message}` : "";
  box.hidden = !err;
}

export function showNotice(text) {
  const box = document.getElementById("notice");
  box.textContent = text || "";
  box.hidden = !text;
}

/** Run `fn` (an async action of a button or form); its error goes to the banner. */
export async function act(fn) {
  showError(null);
  showNotice(null);
  try {
    await fn();
  } catch (e) {
    showError(e);
  }
}

/** The bytes of an API value: text (UTF-8) or base64 when `encoding` says so. */
export function bytesOf(value, encoding) {
  if (encoding === "base64") return Uint8Array.from(atob(value), (c) => c.charCodeAt(0));
  return new TextEncoder().encode(value);
}

/** A value shown as text, base64 or hex; binary asked as text is shown as base64, marked. */
export function render(value, encoding, view) {
  if (value === undefined || value === null) return "";
  if (view === "text") return encoding === "base64" ? `(binary, base64) ${value}` : value;
  const bytes = bytesOf(value, encoding);
  if (view === "hex") return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s);
}

export function propsText(props) {
  return Object.entries(props || {}).map(([k, v]) => `${k}=${v}`).join("\n");
}

/** "k=v" lines as an object; an error naming the bad line. */
export function parseProps(text) {
  const out = {};
  for (const line of text.split("\n").map((l) => l.trim()).filter(Boolean)) {
    const at = line.indexOf("=");
    if (at <= 0) throw new Error(`properties: write one key=value a line, got "${line}"`);
    out[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  return out;
}

/** Offer `text` as a file download (the browser saves it as `name`). */
export function download(name, text, type) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = h("a", { href: url, download: name, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}
