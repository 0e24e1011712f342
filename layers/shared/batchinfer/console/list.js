// The batches list: newest first (the API's order), "More" pages by cursor, a status filter, and the
// first page read again every few seconds while a shown batch runs.
import { json } from "./api.js";
import { h } from "./dom.js";
import { STATUSES, TERMINAL, progressBar, statusBadge, statusText, when } from "./format.js";

// Batches a page, unless the address says another number from 1 to 100 (`#/?limit=50`).
const PAGE = 20;
const REFRESH_MS = 3000;
const COLUMNS = ["Batch", "Status", "Progress", "Failed", "Created (UTC)", "Endpoint", "Model"];

function row(batch) {
  const cells = [
    [h("a", { href: `#/batches/${encodeURIComponent(batch.id)}` }, batch.id), batch.name && h("div", { class: "sub" }, batch.name)],
    statusBadge(batch.status),
    progressBar(batch),
    String(batch.request_counts?.failed ?? 0),
    when(batch.created_at).replace(" UTC", ""),
    h("code", {}, batch.endpoint),
    batch.model ?? "—",
  ];
  return h("tr", { "data-id": batch.id }, cells.map((cell, index) => h("td", { "data-label": COLUMNS[index] }, cell)));
}

// The list's elements, by name, appended to `main`.
function listPage(main) {
  const parts = {
    filter: h(
      "select",
      { id: "status-filter" },
      h("option", { value: "" }, "any status"),
      STATUSES.map((status) => h("option", { value: status }, statusText(status))),
    ),
    body: h("tbody"),
    more: h("button", { type: "button", id: "more", hidden: true }, "More"),
    empty: h("p", { id: "empty", hidden: true }),
  };
  parts.table = h(
    "table",
    { class: "batches", id: "batches" },
    h("caption", { class: "visually-hidden" }, "Your batches, newest first"),
    h("thead", {}, h("tr", {}, COLUMNS.map((name) => h("th", { scope: "col" }, name)))),
    parts.body,
  );
  main.append(
    h("div", { class: "heading" }, h("h1", {}, "Batches"), h("a", { href: "#/new", class: "button" }, "New batch")),
    h("div", { class: "toolbar" }, h("label", { for: "status-filter" }, "Status"), parts.filter),
    h("div", { class: "table-wrap" }, parts.table),
    parts.empty,
    parts.more,
  );
  return parts;
}

// `batches` with fresh copies from `page` (the first page read again) and its new ones on top.
function merged(batches, page) {
  const fresh = new Map(page.data.map((batch) => [batch.id, batch]));
  const known = new Set(batches.map((batch) => batch.id));
  return [...page.data.filter((batch) => !known.has(batch.id)), ...batches.map((batch) => fresh.get(batch.id) ?? batch)];
}

/** Show the list in `main`; returns the cleanup that stops its refreshing. */
export function showList({ main, fail, options }) {
  const limit = Math.min(Math.max(Number.parseInt(options.get("limit"), 10) || PAGE, 1), 100);
  let batches = [];
  let cursor = null;
  let timer = null;
  let stopped = false;
  const { filter, body, more, empty, table } = listPage(main);

  function render() {
    const shown = batches.filter((batch) => !filter.value || batch.status === filter.value);
    body.replaceChildren(...shown.map(row));
    table.hidden = shown.length === 0;
    empty.hidden = shown.length > 0;
    empty.replaceChildren(
      ...(filter.value
        ? [`No ${statusText(filter.value)} batch among those loaded.`]
        : ["No batches yet. ", h("a", { href: "#/new" }, "Create one"), "."]),
    );
  }

  // Read `path`, then `apply` its page, show the list and plan the next refresh.
  async function read(path, apply) {
    try {
      const page = await json(path);
      if (stopped) return;
      apply(page);
      render();
      clearTimeout(timer);
      // While a loaded batch runs, the first page again: its batches updated, new ones on top.
      if (!batches.every((batch) => TERMINAL.has(batch.status))) {
        timer = setTimeout(() => read(`batches?limit=${limit}`, (fresh) => (batches = merged(batches, fresh))), REFRESH_MS);
      }
    } catch (error) {
      if (!stopped) fail(error);
    }
  }

  const load = () =>
    read(`batches?limit=${limit}${cursor ? `&after=${encodeURIComponent(cursor)}` : ""}`, (page) => {
      batches.push(...page.data);
      cursor = page.last_id ?? cursor;
      more.hidden = !page.has_more;
    });
  filter.addEventListener("change", render);
  more.addEventListener("click", load);
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
