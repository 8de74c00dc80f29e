// The message browser: a partition from an offset, a message by id, the messages with a key,
// a partition or the queue from a time; a tag filter; values as text, base64 or hex; export
// of what is shown as JSON or CSV; and a form to produce a test message.

import { get, post, seg, query } from "../api.js";
import { h, table, link, field, time, timeMs, act, render as showValue, propsText, parseProps, download, showNotice } from "../dom.js";
import { toJson, toCsv } from "../export.js";

const MODES = ["offset", "id", "key", "time"];

async function fetchRecords(queue, p) {
  const by = p.get("by") || "offset";
  const max = p.get("max") || "50";
  const tags = p.get("tag") || "";
  const q = seg(queue);
  if (by === "offset") {
    const doc = await get(`/queues/${q}/partitions/${p.get("p") || 0}/messages${query({ offset: p.get("offset"), max, tags })}`);
    return { records: doc.records, next: doc.next_offset };
  }
  if (by === "time") {
    const ms = timeMs(p.get("time") || "0");
    const doc = await get(`/queues/${q}/messages${query({ start_time_ms: ms, partitions: p.get("p"), max, tags })}`);
    return { records: doc.records };
  }
  let records;
  if (by === "id") {
    if (!p.get("id")) throw new Error("id: give a message id, such as 00000005-00000000-0000000000000000");
    records = [await get(`/queues/${q}/messages/${seg(p.get("id"))}`)];
  } else if (by === "key") {
    records = (await get(`/queues/${q}/messages${query({ key: p.get("key") || "", max })}`)).records;
  } else {
    throw new Error(`by must be one of ${MODES.join(", ")}, got "${by}"`);
  }
  // the lookups by id and key take no tag filter: it is applied here
  return { records: tags ? records.filter((r) => tags.split(",").includes(r.tag)) : records };
}

function searchForm(queue, p, queues) {
  const input = (name, attrs = {}) => h("input", { name, value: p.get(name) || "", ...attrs });
  const queueIn = h("input", { name: "queue", value: queue || "", list: "queue-names", required: true });
  const datalist = h("datalist", { id: "queue-names" }, queues.map((n) => h("option", { value: n })));
  const by = h("select", { name: "by" }, MODES.map((m) => h("option", { value: m, selected: (p.get("by") || "offset") === m }, m)));
  const view = h("select", { name: "view" }, ["text", "base64", "hex"].map((v) => h("option", { value: v, selected: (p.get("view") || "text") === v }, v)));
  const fields = {
    p: input("p", { type: "number", min: 0, placeholder: "0" }), offset: input("offset", { type: "number", min: 0, placeholder: "first" }),
    id: input("id", { size: 36 }), key: input("key"), time: input("time", { placeholder: "epoch ms or ISO date" }),
    tag: input("tag", { placeholder: "any" }), max: input("max", { type: "number", min: 1, max: 10000, placeholder: "50" }),
  };
  const submit = (ev) => {
    ev.preventDefault();
    const out = new URLSearchParams({ by: by.value, view: view.value });
    for (const [k, el] of Object.entries(fields)) if (el.value !== "") out.set(k, el.value);
    location.hash = `#/browse/${seg(queueIn.value.trim())}?${out}`;
  };
  return h("form", { id: "browse-form", onsubmit: submit },
    field("queue", queueIn), datalist, field("by", by), field("partition", fields.p), field("offset", fields.offset),
    field("id", fields.id), field("key", fields.key), field("time", fields.time), field("tag", fields.tag),
    field("max", fields.max), field("value as", view), h("button", { type: "submit" }, "Show"));
}

function recordTable(records, view) {
  return table(["partition", "offset", "id", "time (UTC)", "key", "tag", "properties", "value"],
    records.map((r) => [r.partition, r.offset, r.id, time(r.timestamp_ms), showValue(r.key, r.key_encoding, view),
      r.tag || "", h("span", { class: "pre" }, propsText(r.properties)), h("span", { class: "value" }, showValue(r.value, r.encoding, view))]),
    { numeric: ["partition", "offset"], id: "records", empty: "no messages here" });
}

function exportButtons(queue, p, records) {
  const base = `${queue}-${p.get("by") || "offset"}-${p.get("p") || 0}-${p.get("offset") || p.get("key") || p.get("time") || p.get("id") || "0"}`
    .replace(/[^A-Za-z0-9._-]+/g, "_");
  return h("p", {},
    h("button", { id: "export-json", class: "secondary", onclick: () => download(`${base}.json`, toJson(records), "application/json") }, "Export JSON"),
    h("button", { id: "export-csv", class: "secondary", onclick: () => download(`${base}.csv`, toCsv(records), "text/csv") }, "Export CSV"));
}

function produceForm(queue, ctx) {
  const value = h("textarea", { name: "value", placeholder: "the message" });
  const encoding = h("select", { name: "encoding" }, h("option", { value: "utf-8" }, "text"), h("option", { value: "base64" }, "base64"));
  const key = h("input", { name: "key" });
  const tag = h("input", { name: "tag" });
  const partition = h("input", { name: "partition", type: "number", min: 0, placeholder: "by key" });
  const props = h("textarea", { name: "properties", placeholder: "key=value, one a line" });
  const result = h("p", { id: "produce-result" });
  const submit = (ev) => {
    ev.preventDefault();
    act(async () => {
      const msg = { value: value.value, encoding: encoding.value, properties: parseProps(props.value) };
      if (key.value) msg.key = key.value;
      if (tag.value) msg.tag = tag.value;
      if (partition.value !== "") msg.partition = Number(partition.value);
      const r = (await post(`/queues/${seg(queue)}/messages`, msg)).results[0];
      result.replaceChildren(`produced to partition ${r.partition} at offset ${r.offset} (id ${r.id}) `,
        link(`#/browse/${seg(queue)}?by=offset&p=${r.partition}&offset=${r.offset}`, "show it"));
      showNotice(`produced ${r.id}`);
    });
  };
  return h("form", { id: "produce-form", onsubmit: submit },
    h("h2", {}, `Produce a test message to ${queue}`),
    field("value", value), field("value is", encoding), field("key", key), field("tag", tag), field("partition", partition),
    field("properties", props), h("button", { type: "submit" }, "Produce"), result);
}

export async function render(where, ctx) {
  const queue = where.args[0];
  const p = where.params;
  const names = (await get("/queues")).queues.map((q) => q.name);
  const parts = [h("h1", {}, queue ? `Messages of ${queue}` : "Messages"), searchForm(queue, p, names)];
  if (!queue) {
    parts.push(h("p", { class: "muted" }, "Choose a queue: ", names.map((n) => [link(`#/browse/${seg(n)}`, n), " "])));
    return h("section", {}, parts);
  }
  const { records, next } = await fetchRecords(queue, p);
  parts.push(exportButtons(queue, p, records), recordTable(records, p.get("view") || "text"));
  if (next !== undefined && next !== null && records.length) {
    const more = new URLSearchParams(p);
    more.set("offset", next);
    parts.push(h("p", {}, link(`#/browse/${seg(queue)}?${more}`, `next from offset ${next} →`)));
  }
  parts.push(produceForm(queue, ctx));
  return h("section", {}, parts);
}
