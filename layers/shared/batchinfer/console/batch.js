// A batch's page: status, timestamps, progress with rates and ETA (read again every REFRESH_MS while the
// batch runs, stopping when it ends), counts and usage, validation errors, downloads, and Cancel.
import { download, downloadDone, json } from "./api.js";
import { h } from "./dom.js";
import { CANCELLABLE, TERMINAL, duration, progressBar, rate, speed, statusBadge, when } from "./format.js";

const REFRESH_MS = 1000;
// While these last, the answers committed so far can be read (GET /v1/batches/{id}/output).
const RUNNING = new Set(["in_progress", "finalizing", "cancelling"]);
const TIMES = [
  ["Created", "created_at"], ["In progress", "in_progress_at"], ["Finalizing", "finalizing_at"],
  ["Completed", "completed_at"], ["Failed", "failed_at"], ["Expired", "expired_at"],
  ["Cancelling", "cancelling_at"], ["Cancelled", "cancelled_at"], ["Expires", "expires_at"],
];

const pairs = (rows) => rows.flatMap(([term, value]) => [h("dt", {}, term), h("dd", {}, value)]);

function summary(batch, now) {
  const { requests, tokens, eta } = speed(batch, now);
  return h(
    "dl",
    { class: "facts", id: "summary" },
    pairs([
      ["Status", statusBadge(batch.status, "status")],
      ["Progress", progressBar(batch, "progress")],
      ["Failed", h("span", { id: "failed" }, String(batch.request_counts?.failed ?? 0))],
      ["Requests/s", h("span", { id: "requests-per-second" }, rate(requests))],
      ["Output tokens/s", h("span", { id: "tokens-per-second" }, rate(tokens))],
      ["ETA", h("span", { id: "eta" }, eta === null ? "—" : duration(eta))],
      ["Endpoint", h("code", {}, batch.endpoint)],
      ["Model", batch.model ?? "—"],
      ["Completion window", batch.completion_window],
    ]),
  );
}

function details(batch) {
  const counts = batch.request_counts ?? {};
  const usage = batch.usage ?? {};
  const table = (id, caption, rows) =>
    h("table", { class: "numbers", id }, h("caption", {}, caption),
      h("tbody", {}, rows.map(([name, value]) => h("tr", {}, h("th", { scope: "row" }, name), h("td", {}, String(value ?? 0))))));
  return h(
    "div",
    { class: "columns" },
    h("section", { "aria-labelledby": "times-title" }, h("h2", { id: "times-title" }, "Timeline"),
      h("dl", { class: "facts", id: "timestamps" }, pairs(TIMES.filter(([, key]) => batch[key]).map(([term, key]) => [term, when(batch[key])])))),
    table("counts", "Requests", [["Total", counts.total], ["Completed", counts.completed], ["Failed", counts.failed]]),
    table("usage", "Usage (tokens)", [
      ["Input", usage.input_tokens], ["Cached input", usage.input_tokens_details?.cached_tokens],
      ["Output", usage.output_tokens], ["Total", usage.total_tokens],
    ]),
  );
}

function validationErrors(batch) {
  const errors = batch.errors?.data ?? [];
  if (!errors.length) return null;
  return h(
    "section",
    { "aria-labelledby": "errors-title" },
    h("h2", { id: "errors-title" }, "Validation errors"),
    h("table", { class: "errors", id: "validation-errors" },
      h("thead", {}, h("tr", {}, ["Line", "Code", "Message"].map((name) => h("th", { scope: "col" }, name)))),
      h("tbody", {}, errors.map((error) => h("tr", {},
        h("td", { "data-label": "Line" }, error.line ?? "—"),
        h("td", { "data-label": "Code" }, h("code", {}, error.code)),
        h("td", { "data-label": "Message" }, error.message))))),
  );
}

// The files a batch offers: [id of the button, label, file id or null, presigned URL or null, name].
function files(batch) {
  const own = (target) => (target ?? "file") === "file";
  return [
    ["download-output", "output", own(batch.output_target) ? batch.output_file_id : null, batch.output_file_url, "output"],
    ["download-error", "errors", own(batch.output_target) ? batch.error_file_id : null, batch.error_file_url, "error"],
    ["download-input", "input", own(batch.input_source) ? batch.input_file_id : null, null, "input"],
  ].filter(([, , fileId, url]) => fileId || url);
}

// The confirmation a cancel asks for; closes with returnValue "cancel" or "keep".
function cancelDialog() {
  const dialog = h(
    "dialog",
    { id: "confirm-cancel", "aria-labelledby": "confirm-title" },
    h("h2", { id: "confirm-title" }, "Cancel this batch?"),
    h("p", {}, "Requests that have not run yet will not run; the answers already given are kept."),
  );
  const close = (value) => () => dialog.close(value);
  dialog.append(h("div", { class: "actions" },
    h("button", { type: "button", id: "confirm-cancel-no", onclick: close("keep") }, "Keep it running"),
    h("button", { type: "button", id: "confirm-cancel-yes", class: "danger", onclick: close("cancel") }, "Cancel batch")));
  return dialog;
}

// The batch's buttons: a download per file it offers (fetched with the key, or its presigned URL), the
// answers done so far while it runs, and Cancel while it can be cancelled.
function actionButtons(batch, dialog, fail) {
  const buttons = files(batch).map(([button, label, fileId, url, kind]) =>
    fileId
      ? h("button", { type: "button", id: button, onclick: () => download(fileId, `${batch.id}_${kind}.jsonl`).catch(fail) }, `Download ${label}`)
      : h("a", { id: button, class: "button", href: url, rel: "noreferrer" }, `Download ${label}`));
  if (RUNNING.has(batch.status)) {
    buttons.push(h("button", { type: "button", id: "download-done", onclick: () => downloadDone(batch.id, `${batch.id}_partial_output.jsonl`).catch(fail) }, "Download what is done"));
  }
  if (CANCELLABLE.has(batch.status)) {
    buttons.push(h("button", { type: "button", id: "cancel", class: "danger", onclick: () => dialog.showModal() }, "Cancel batch"));
  }
  return buttons;
}

/** Show batch `id` in `main`; returns the cleanup that stops its refreshing. */
export function showBatch({ main, fail, say }, id) {
  let timer = null;
  let stopped = false;
  let shownActions = "";
  const live = h("div", { id: "batch" });
  const actions = h("div", { class: "actions", id: "actions" });
  const dialog = cancelDialog();
  main.append(
    h("p", { class: "back" }, h("a", { href: "#/" }, "← Batches")),
    h("h1", {}, "Batch ", h("code", { id: "batch-id" }, id)),
    live,
    actions,
    dialog,
  );

  function render(batch) {
    const title = batch.name ? h("p", { class: "sub", id: "batch-name" }, batch.name) : null;
    live.replaceChildren(...[title, summary(batch, Date.now() / 1000), details(batch), validationErrors(batch)].filter(Boolean));
    const buttons = actionButtons(batch, dialog, fail);
    const signature = buttons.map((button) => button.id).join(" ");
    if (signature !== shownActions) { // else the buttons (and the focus on one) stay as they are
      shownActions = signature;
      actions.replaceChildren(...buttons);
    }
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      const batch = await json(`batches/${encodeURIComponent(id)}`);
      if (stopped) return;
      render(batch);
      if (!TERMINAL.has(batch.status)) timer = setTimeout(refresh, REFRESH_MS);
    } catch (error) {
      if (!stopped) fail(error);
    }
  }

  dialog.addEventListener("close", async () => {
    if (dialog.returnValue !== "cancel") return;
    dialog.returnValue = "";
    try {
      const batch = await json(`batches/${encodeURIComponent(id)}/cancel`, { method: "POST" });
      say(`Batch ${batch.id} is ${batch.status.replaceAll("_", " ")}.`);
      if (!stopped) refresh();
    } catch (error) {
      fail(error);
    }
  });
  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
