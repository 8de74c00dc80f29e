// The console's router: the page named by the URL's hash (#/page/arg?param=...), so every
// view can be bookmarked, rendered into <main>; an error of the API shows in the banner.

import { showError, showNotice, h } from "./dom.js";
import * as queues from "./pages/queues.js";
import * as browse from "./pages/browse.js";
import * as groups from "./pages/groups.js";
import * as shared from "./pages/shared.js";
import * as misc from "./pages/misc.js";

const PAGES = {
  queues: queues.render,
  browse: browse.render,
  groups: groups.render,
  shared: shared.render,
  subscriptions: misc.subscriptions,
  delays: misc.delays,
  brokers: misc.brokers,
};

let timers = [];
let generation = 0;

export function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const at = raw.indexOf("?");
  const path = at < 0 ? raw : raw.slice(0, at);
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || "queues", args: parts.slice(1), params: new URLSearchParams(at < 0 ? "" : raw.slice(at + 1)) };
}

async function route(keepNotice = false) {
  for (const t of timers) clearInterval(t);
  timers = [];
  const mine = ++generation;
  const where = parseHash();
  const view = document.getElementById("view");
  document.body.dataset.ready = "0";
  document.body.dataset.page = where.page;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === where.page);
  showError(null);
  if (!keepNotice) showNotice(null);
  const ctx = {
    // a refresh loop that ends when the operator leaves the page
    every(ms, fn) { timers.push(setInterval(() => { if (mine === generation) fn().catch(showError); }, ms)); },
    current: () => mine === generation,
    refresh: () => route(true),
  };
  const page = PAGES[where.page];
  try {
    if (!page) throw new Error(`no page ${where.page}: use the bar above`);
    const content = await page(where, ctx);
    if (mine !== generation) return;
    view.replaceChildren(content);
  } catch (e) {
    if (mine !== generation) return;
    view.replaceChildren(h("p", { class: "muted" }, "This page could not be shown."));
    showError(e);
  }
  document.body.dataset.ready = "1";
}

window.addEventListener("hashchange", () => route(false));
route();
