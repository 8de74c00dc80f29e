// Queues: each queue's partitions, messages and rate; create, delete (confirmed), truncate.
// Per-queue bytes are not in the describe answer, so the page shows the store's total bytes
// (from /v1/status) beside the per-queue message counts.

import { get, post, del, seg } from "../api.js";
import { h, table, link, field, figure, num, bytesText, time, act, showNotice } from "../dom.js";

const RATE_READING_MS = 3000;
// the last reading of each queue's end offsets: {t_ms, ends: {partition: end}}
const readings = new Map();

function messages(q) {
  return q.partitions.reduce((n, p) => n + (p.end_offset - p.start_offset), 0);
}

/** msgs/s since the previous reading (null before there are two), then keep this one. */
function rate(q, nowMs) {
  const before = readings.get(q.name);
  const ends = Object.fromEntries(q.partitions.map((p) => [p.partition, p.end_offset]));
  if (before && nowMs - before.t_ms < 1000) return before.rates;
  const rates = { total: null };
  if (before) {
    const dt = (nowMs - before.t_ms) / 1000;
    let total = 0;
    for (const [p, end] of Object.entries(ends)) {
      rates[p] = Math.max(0, end - (before.ends[p] ?? end)) / dt;
      total += rates[p];
    }
    rates.total = total;
  }
  readings.set(q.name, { t_ms: nowMs, ends, rates });
  return rates;
}

const rateText = (r) => (r === null || r === undefined ? "measuring…" : r.toFixed(1));

function createForm(ctx) {
  const name = h("input", { name: "name", required: true, placeholder: "orders" });
  const parts = h("input", { name: "partitions", type: "number", min: 1, value: "1" });
  const ttl = h("input", { name: "ttl_s", type: "number", min: 1, placeholder: "7 days" });
  const submit = (ev) => {
    ev.preventDefault();
    act(async () => {
      const body = { name: name.value.trim(), partitions: Number(parts.value || 1) };
      if (ttl.value) body.ttl_s = Number(ttl.value);
      await post("/queues", body);
      showNotice(`created queue ${body.name}`);
      ctx.refresh();
    });
  };
  return h("form", { id: "create-queue", onsubmit: submit },
    field("name", name), field("partitions", parts), field("TTL (s)", ttl), h("button", { type: "submit" }, "Create queue"));
}

export function deleteButton(name, ctx, after) {
  return h("button", { class: "danger", "data-delete": name, onclick: () => act(async () => {
    if (!window.confirm(`Delete queue ${name} and all its messages? This cannot be undone.`)) return;
    await del(`/queues/${seg(name)}`);
    showNotice(`deleted queue ${name}`);
    if (after) location.hash = after; else ctx.refresh();
  }) }, "Delete");
}

function queueRows(list, nowMs, ctx) {
  return list.map((q) => {
    const r = rate(q, nowMs);
    return [
      link(`#/queues/${seg(q.name)}`, q.name), q.partitions.length, num(messages(q)),
      h("span", { "data-rate": q.name }, rateText(r.total)),
      q.config.ttl_s === null ? "forever" : `${q.config.ttl_s} s`, q.enabled ? "yes" : "disabled",
      h("span", {}, link(`#/browse/${seg(q.name)}`, "browse"), " ", deleteButton(q.name, ctx)),
    ];
  });
}

async function list(ctx) {
  const [doc, status] = await Promise.all([get("/queues"), get("/status")]);
  const headers = ["queue", "partitions", "messages", "msgs/s", "TTL", "enabled", ""];
  const numeric = ["partitions", "messages", "msgs/s"];
  const tableOf = (queues) => table(headers, queueRows(queues, Date.now(), ctx), { numeric, id: "queues", empty: "no queues yet" });
  const holder = h("div", {}, tableOf(doc.queues));
  ctx.every(RATE_READING_MS, async () => holder.replaceChildren(tableOf((await get("/queues")).queues)));
  return h("section", {},
    h("h1", {}, "Queues"),
    h("div", { class: "figures" },
      figure("queues", num(doc.queues.length)),
      figure("messages", num(doc.queues.reduce((n, q) => n + messages(q), 0))),
      figure("bytes stored (all queues)", bytesText(status.bytes))),
    holder,
    h("p", { class: "muted" }, `Rates are computed here from readings of the end offsets ${RATE_READING_MS / 1000} s apart.`),
    createForm(ctx));
}

async function detail(name, ctx) {
  const q = await get(`/queues/${seg(name)}`);
  const partTable = (info) => {
    const r = rate(info, Date.now());
    return table(["partition", "start offset", "end offset", "messages", "msgs/s", ""],
      info.partitions.map((p) => [p.partition, num(p.start_offset), num(p.end_offset), num(p.end_offset - p.start_offset),
        rateText(r[p.partition]), link(`#/browse/${seg(name)}?by=offset&p=${p.partition}&offset=${p.start_offset}`, "browse")]),
      { numeric: ["partition", "start offset", "end offset", "messages", "msgs/s"], id: "partitions" });
  };
  const holder = h("div", {}, partTable(q));
  ctx.every(RATE_READING_MS, async () => holder.replaceChildren(partTable(await get(`/queues/${seg(name)}`))));
  const truncate = h("button", { class: "secondary", onclick: () => act(async () => {
    if (!window.confirm(`Drop every message of ${name}? The queue stays.`)) return;
    await post(`/queues/${seg(name)}/truncate`);
    showNotice(`truncated ${name}`);
    ctx.refresh();
  }) }, "Truncate");
  const settings = Object.entries(q.config.settings || {}).map(([k, v]) => `${k}=${v}`).join(", ") || "none";
  return h("section", {},
    h("h1", {}, `Queue ${q.name}`),
    table(["id", "created", "TTL", "flush", "largest message", "settings", "enabled"],
      [[q.queue_id, time(q.created_ms), q.config.ttl_s === null ? "forever" : `${q.config.ttl_s} s`,
        q.config.flush || "default", bytesText(q.config.message_bytes_max), settings, q.enabled ? "yes" : "disabled"]]),
    h("h2", {}, "Partitions"), holder,
    h("p", {}, link(`#/browse/${seg(name)}`, "Browse messages"), " ", truncate, deleteButton(name, ctx, "#/queues")));
}

export async function render(where, ctx) {
  return where.args.length ? detail(where.args[0], ctx) : list(ctx);
}
