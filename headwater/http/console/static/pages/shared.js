// Shared groups: leases in flight, retries and dead letters per partition; the dead letters
// of <queue>.dlq, each re-driven by producing its value, key, tag and properties (without
// the dlq.* ones) back to its source queue.

import { get, post, seg, query } from "../api.js";
import { h, table, link, field, num, time, act, render as showValue, propsText, showNotice } from "../dom.js";

const DLQ_SUFFIX = ".dlq";

/** The shared groups (each on its queues) and the dead-letter queues. */
async function index() {
  const [queues, groups] = await Promise.all([get("/queues"), get("/groups")]);
  const dlqs = queues.queues.filter((q) => q.name.endsWith(DLQ_SUFFIX));
  const shared = groups.groups.filter((g) => g.mode === "shared")
    .flatMap((g) => g.queues.map((q) => [link(`#/shared/${seg(g.group)}/${seg(q)}`, g.group), q, g.state]));
  const rows = await Promise.all(dlqs.map(async (q) => {
    const source = q.name.slice(0, -DLQ_SUFFIX.length);
    const letters = (await get(`/queues/${seg(q.name)}/messages${query({ max: 1000 })}`)).records;
    const groups = [...new Set(letters.map((r) => (r.properties || {})["dlq.group"]).filter(Boolean))].sort();
    const total = q.partitions.reduce((n, p) => n + p.end_offset - p.start_offset, 0);
    return [q.name, source, num(total), h("span", {}, groups.map((g) => [link(`#/shared/${seg(g)}/${seg(source)}`, g), " "]))];
  }));
  const group = h("input", { name: "group", required: true });
  const queue = h("input", { name: "queue", required: true });
  const open = (ev) => { ev.preventDefault(); location.hash = `#/shared/${seg(group.value.trim())}/${seg(queue.value.trim())}`; };
  return h("section", {},
    h("h1", {}, "Shared groups"),
    table(["group", "queue", "state"], shared, { id: "shared-groups", empty: "no shared groups yet" }),
    h("form", { id: "shared-open", onsubmit: open }, field("group", group), field("queue", queue), h("button", { type: "submit" }, "Show")),
    h("h2", {}, "Dead-letter queues"),
    table(["dead-letter queue", "source queue", "dead letters", "groups"], rows, { numeric: ["dead letters"], id: "dlqs", empty: "no dead letters anywhere" }));
}

function redriveMessage(letter, source) {
  const props = Object.fromEntries(Object.entries(letter.properties || {}).filter(([k]) => !k.startsWith("dlq.")));
  props.redriven_from = letter.id;
  const msg = { value: letter.value, properties: props };
  if (letter.encoding) msg.encoding = letter.encoding;
  if (letter.key !== undefined) msg.key = letter.key;
  if (letter.key_encoding) msg.key_encoding = letter.key_encoding;
  if (letter.tag !== undefined) msg.tag = letter.tag;
  return msg;
}

function redriveButton(letter, result) {
  const source = (letter.properties || {})["dlq.source_queue"];
  return h("button", { class: "secondary", "data-redrive": letter.id, disabled: !source, onclick: () => act(async () => {
    const r = (await post(`/queues/${seg(source)}/messages`, redriveMessage(letter, source))).results[0];
    const where = `#/browse/${seg(source)}?by=offset&p=${r.partition}&offset=${r.offset}`;
    result.replaceChildren(`re-drove ${letter.id} to ${source} partition ${r.partition} offset ${r.offset} (id ${r.id}) `, link(where, "show it"));
    showNotice(`re-drove ${letter.id} to ${source} as ${r.id}`);
  }) }, "Re-drive");
}

async function deadLetters(doc, group) {
  let letters = [];
  try {
    letters = (await get(`/queues/${seg(doc.dead_letter_queue)}/messages${query({ max: 1000 })}`)).records;
  } catch (e) {
    if (e.name !== "QueueNotFoundError") throw e; // none yet: the DLQ is made by the first
  }
  letters = letters.filter((r) => (r.properties || {})["dlq.group"] === group);
  const result = h("p", { id: "redrive-result" });
  const rows = letters.map((r) => {
    const p = r.properties || {};
    return [r.offset, p["dlq.source_id"] || "", p["dlq.reason"] || "", p["dlq.attempts"] || "", time(r.timestamp_ms), r.key ? showValue(r.key, r.key_encoding, "text") : "",
      r.tag || "", propsText(Object.fromEntries(Object.entries(p).filter(([k]) => !k.startsWith("dlq.")))),
      h("span", { class: "value" }, showValue(r.value, r.encoding, "text")), redriveButton(r, result)];
  });
  return h("div", {},
    h("h2", {}, `Dead letters (${doc.dead_letter_queue})`),
    table(["offset", "source id", "reason", "attempts", "dead since", "key", "tag", "properties", "value", ""], rows,
      { numeric: ["offset", "attempts"], id: "dead-letters", empty: "no dead letters" }),
    result);
}

async function detail(group, queue) {
  const doc = await get(`/shared/${seg(group)}/queues/${seg(queue)}`);
  const sum = (f) => doc.partitions.reduce((n, p) => n + p[f], 0);
  const s = doc.settings;
  return h("section", {},
    h("h1", {}, `Shared group ${doc.group} on ${doc.queue}`),
    h("p", {}, `in flight ${num(sum("leased"))} · awaiting retry ${num(sum("awaiting_retry"))} · dead-lettered ${num(sum("dead_lettered"))}`),
    h("p", { class: "muted" }, `max attempts ${s.max_attempts} · backoff ${s.backoff_ms} ms ×${s.backoff_multiplier} (at most ${s.backoff_max_ms} ms) · in flight at most ${s.in_flight_max}`),
    table(["partition", "start", "end", "committed", "delivered", "in flight", "awaiting retry", "acked ahead", "dead-lettered", "members", "next lease deadline"],
      doc.partitions.map((p) => [p.partition, num(p.start_offset), num(p.end_offset), num(p.committed_offset), num(p.delivered_offset), num(p.leased),
        num(p.awaiting_retry), num(p.acked_ahead), num(p.dead_lettered), Object.entries(p.members).map(([m, n]) => `${m}: ${n}`).join(", "),
        time(p.next_lease_deadline_ms)]),
      { numeric: ["partition", "start", "end", "committed", "delivered", "in flight", "awaiting retry", "acked ahead", "dead-lettered"], id: "shared-partitions" }),
    await deadLetters(doc, group));
}

export async function render(where) {
  return where.args.length >= 2 ? detail(where.args[0], where.args[1]) : index();
}
