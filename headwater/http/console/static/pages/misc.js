// Subscriptions (push subscribers and how far each got), delayed messages (the schedule,
// cancel by id) and brokers (the cluster's brokers and leaders, the broker's status).

import { get, del, seg } from "../api.js";
import { h, table, link, field, figure, num, time, bytesText, act, showNotice } from "../dom.js";

export async function subscriptions(where, ctx) {
  const subs = (await get("/subscribers")).subscribers;
  const queues = Object.fromEntries((await get("/queues")).queues.map((q) => [q.name, q]));
  const rows = subs.map((s) => {
    const info = queues[s.queue];
    const lag = info ? info.partitions.reduce((n, p) => n + p.end_offset - (s.checkpoints[String(p.partition)] ?? p.start_offset), 0) : null;
    const remove = h("button", { class: "danger", "data-delete-sub": `${s.queue}/${s.name}`, onclick: () => act(async () => {
      if (!window.confirm(`Delete subscriber ${s.name} of ${s.queue}?`)) return;
      await del(`/queues/${seg(s.queue)}/subscribers/${seg(s.name)}`);
      showNotice(`deleted subscriber ${s.name}`);
      ctx.refresh();
    }) }, "Delete");
    return [link(`#/queues/${seg(s.queue)}`, s.queue), s.name, s.partitions ? s.partitions.join(", ") : "all", s.tags ? s.tags.join(", ") : "all",
      time(s.created_ms), Object.entries(s.checkpoints).map(([p, o]) => `${p}: ${o}`).join(", "), num(lag), remove];
  });
  return h("section", {},
    h("h1", {}, "Subscriptions"),
    table(["queue", "subscriber", "partitions", "tags", "created (UTC)", "checkpoints", "behind", ""], rows,
      { numeric: ["behind"], id: "subscribers", empty: "no subscribers" }));
}

export async function delays(where, ctx) {
  const s = await get("/delays/stats");
  const id = h("input", { name: "id", size: 36, required: true, placeholder: "the delayed message's id" });
  const cancel = (ev) => {
    ev.preventDefault();
    act(async () => {
      const text = id.value.trim();
      await del(`/delays/${seg(text)}`);
      showNotice(`cancelled ${text}`);
      ctx.refresh();
    });
  };
  const ms = (v) => (v === null || v === undefined ? "—" : `${num(v)} ms`);
  return h("section", {},
    h("h1", {}, "Delayed messages"),
    h("div", { class: "figures" },
      figure("pending", num(s.pending_messages), "delay-pending"), figure("next due (UTC)", time(s.next_due_ms) || "—"),
      figure("delivered", num(s.delivered_total)), figure("cancelled", num(s.cancelled_total)),
      figure("lateness p99", ms(s.lateness_p99_ms)), figure("delivered/s", s.delivered_per_s.toFixed(1))),
    h("h2", {}, "Schedule"),
    table(["from (UTC)", "to (UTC)", "pending", "loaded"], s.buckets.map((b) => [time(b.start_ms), time(b.end_ms), num(b.pending_messages), b.loaded ? "yes" : "no"]),
      { numeric: ["pending"], id: "delay-buckets", empty: "nothing scheduled" }),
    h("form", { id: "cancel-delay", onsubmit: cancel }, field("message id", id), h("button", { type: "submit", class: "danger" }, "Cancel delivery")));
}

export async function brokers() {
  const [c, s] = await Promise.all([get("/cluster"), get("/status")]);
  const leaders = c.queues.flatMap((q) => q.partitions.map((p) => [q.name, p.partition, p.leader, p.leader_epoch, p.replicas.join(", ")]));
  return h("section", {},
    h("h1", {}, "Brokers"),
    h("p", {}, c.cluster_id ? `cluster ${c.cluster_id} · controller ${c.controller}` : "a broker alone (no cluster)"),
    table(["broker", "address", "epoch", "role"],
      c.brokers.map((b) => [b.broker_id, `${b.host}:${b.port}`, b.epoch, b.broker_id === c.controller && c.cluster_id ? "controller" : ""]),
      { id: "brokers" }),
    h("h2", {}, "This broker"),
    table(["version", "mode", "address", "uptime", "queues", "partitions", "stored", "segments", "connections", "memory (RSS)"],
      [[s.version, s.mode, s.address || "", `${Math.round(s.uptime_s)} s`, num(s.queues), num(s.partitions), bytesText(s.bytes),
        num(s.segments), num(s.connections), bytesText(s.memory_rss_bytes)]], { id: "status" }),
    h("h2", {}, "Partition leaders"),
    table(["queue", "partition", "leader", "leader epoch", "replicas"], leaders, { numeric: ["partition"], id: "leaders" }),
    c.moves.length ? h("p", {}, `${c.moves.length} partition move(s) under way`) : null);
}
