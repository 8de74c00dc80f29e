// Consumer groups: members, which partitions each holds, committed offsets and lag per
// partition; an offset reset always shows its dry run first, and executing applies exactly
// the offsets the dry run showed (so a queue that moved meanwhile cannot change the plan).

import { get, post, seg } from "../api.js";
import { h, table, link, field, num, timeMs, act, showNotice } from "../dom.js";

// a shared group is shown on its own page, one a queue
function groupLink(g) {
  if (g.mode !== "shared") return link(`#/groups/${seg(g.group)}`, g.group);
  return h("span", {}, g.group, " (", g.queues.map((q, i) => [i ? ", " : "", link(`#/shared/${seg(g.group)}/${seg(q)}`, q)]), ")");
}

async function list() {
  const doc = await get("/groups");
  return h("section", {},
    h("h1", {}, "Consumer groups"),
    table(["group", "state", "mode", "members", "generation", "queues"],
      doc.groups.map((g) => [groupLink(g), g.state, g.mode || "—", g.members, g.generation, g.queues.join(", ")]),
      { numeric: ["members", "generation"], id: "groups", empty: "no groups yet" }));
}

function owners(group) {
  const out = {}; // "queue/partition" -> member id
  for (const m of group.members) {
    for (const [q, parts] of Object.entries(m.assignment || {})) for (const p of parts) out[`${q}/${p}`] = m.member_id;
  }
  return out;
}

async function lagTable(group, queue, owner) {
  const info = await get(`/queues/${seg(queue)}`);
  const committed = (group.offsets || {})[queue] || {};
  let total = 0;
  const rows = info.partitions.map((p) => {
    const c = committed[String(p.partition)];
    const lag = p.end_offset - (c ?? p.start_offset);
    total += lag;
    return [p.partition, owner[`${queue}/${p.partition}`] || "—", c === undefined ? "—" : num(c), num(p.end_offset), num(lag)];
  });
  return h("div", {},
    h("h2", {}, `${queue}: lag ${num(total)}`),
    table(["partition", "member", "committed", "end offset", "lag"], rows,
      { numeric: ["partition", "committed", "end offset", "lag"], id: `lag-${queue}` }));
}

function resetForm(name, queues, ctx) {
  const queue = h("select", { name: "queue" }, queues.map((q) => h("option", { value: q }, q)));
  const to = h("select", { name: "to" }, ["earliest", "latest", "time"].map((t) => h("option", { value: t }, t)));
  const timeIn = h("input", { name: "time_ms", placeholder: "epoch ms or ISO date" });
  const plan = h("div", { id: "reset-plan" });
  const execute = h("button", { id: "reset-execute", class: "danger", disabled: true }, "Execute reset");
  let planned = null;
  const dryRun = (ev) => {
    ev.preventDefault();
    act(async () => {
      // a time goes as ISO-8601: a bare number would be an offset (as in 'group reset --to')
      const target = to.value === "time" ? new Date(timeMs(timeIn.value.trim())).toISOString() : to.value;
      const doc = await post(`/groups/${seg(name)}/reset`, { queue: queue.value, to: target, dry_run: true });
      planned = { queue: queue.value, offsets: Object.fromEntries(doc.offsets.map((r) => [r.partition, r.after])) };
      plan.replaceChildren(h("p", {}, `Dry run: ${name} on ${queue.value} would move to`),
        table(["partition", "committed now", "after reset"], doc.offsets.map((r) => [r.partition, r.before ?? "—", r.after]),
          { numeric: ["partition", "committed now", "after reset"], id: "reset-dry-run" }));
      execute.disabled = false;
    });
  };
  execute.addEventListener("click", (ev) => {
    ev.preventDefault();
    act(async () => {
      const doc = await post(`/groups/${seg(name)}/reset`, { ...planned, dry_run: false });
      execute.disabled = true;
      showNotice(`reset ${name} on ${doc.queue}: ${doc.offsets.map((r) => `${r.partition}→${r.after}`).join(", ")}`);
      ctx.refresh();
    });
  });
  for (const el of [queue, to, timeIn]) el.addEventListener("change", () => { execute.disabled = true; plan.replaceChildren(); });
  return h("form", { id: "reset-form", onsubmit: dryRun },
    h("h2", {}, "Reset offsets"),
    h("p", { class: "muted" }, "The group must have no members. The dry run shows the plan; executing commits it."),
    field("queue", queue), field("to", to), field("time", timeIn), h("button", { type: "submit", id: "reset-dry" }, "Dry run"),
    execute, plan);
}

async function detail(name, ctx) {
  const group = await get(`/groups/${seg(name)}`);
  const queues = [...new Set([...group.members.flatMap((m) => m.queues), ...Object.keys(group.offsets || {})])].sort();
  const owner = owners(group);
  const members = table(["member", "client", "state", "assignment", "heartbeat age (ms)"],
    group.members.map((m) => [m.member_id, m.client_id, m.state,
      Object.entries(m.assignment || {}).map(([q, ps]) => `${q}: ${ps.join(", ")}`).join("; "), num(m.heartbeat_age_ms)]),
    { id: "members", empty: "no members" });
  return h("section", {},
    h("h1", {}, `Group ${group.group}`),
    h("p", {}, `state ${group.state} · mode ${group.mode || "—"} · strategy ${group.strategy || "—"} · generation ${group.generation}`),
    h("h2", {}, "Members"), members,
    await Promise.all(queues.map((q) => lagTable(group, q, owner))),
    resetForm(name, queues, ctx));
}

export async function render(where, ctx) {
  return where.args.length ? detail(where.args[0], ctx) : list();
}
