// The new-batch form: a JSONL file (picked or dropped), the endpoint and the completion window; the file
// is uploaded (large ones through the Uploads API), the batch created, and its page opened.
import { SINGLE_REQUEST_BYTES, idempotencyKey, json, uploadFile } from "./api.js";
import { h } from "./dom.js";

const ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"];
const WINDOWS = ["24h", "1h", "48h", "168h"];

const select = (id, values) => h("select", { id, name: id }, values.map((value) => h("option", { value }, value)));

// The form's elements, by name.
function newBatchForm() {
  const parts = {
    input: h("input", { id: "file", name: "file", type: "file", accept: ".jsonl,.ndjson,application/jsonl,text/plain" }),
    chosen: h("p", { id: "chosen", class: "sub", "aria-live": "polite" }, "No file chosen."),
    endpoint: select("endpoint", ENDPOINTS),
    window: select("completion-window", WINDOWS),
    name: h("input", { id: "batch-name-input", name: "name", type: "text", maxlength: 256, autocomplete: "off" }),
    submit: h("button", { type: "submit", id: "create" }, "Create batch"),
    status: h("p", { id: "create-status", role: "status" }),
  };
  parts.zone = h(
    "div",
    { class: "drop", id: "drop-zone" },
    h("label", { for: "file" }, "Input file (JSONL, one request per line)"),
    parts.input,
    h("p", { class: "sub" }, "…or drop the file here."),
    parts.chosen,
  );
  parts.form = h(
    "form",
    { class: "card", id: "new-batch", "aria-labelledby": "new-title", novalidate: true },
    h("h1", { id: "new-title" }, "New batch"),
    parts.zone,
    h("label", { for: "endpoint" }, "Endpoint"),
    parts.endpoint,
    h("label", { for: "completion-window" }, "Completion window"),
    parts.window,
    h("label", { for: "batch-name-input" }, "Name (optional)"),
    parts.name,
    parts.submit,
    parts.status,
  );
  return parts;
}

// Upload `file`, create its batch from the form's choices; the Batch object.
async function createBatch(file, { endpoint, window, name, status }) {
  status.textContent = `Uploading ${file.name}…`;
  const uploaded = await uploadFile(file, (sent, total) => {
    status.textContent = `Uploading ${file.name}: ${sent} of ${total} bytes…`;
  });
  status.textContent = "Creating the batch…";
  const body = { input_file_id: uploaded.id, endpoint: endpoint.value, completion_window: window.value };
  if (name.value.trim()) body.name = name.value.trim();
  return json("batches", { method: "POST", body, headers: { "Idempotency-Key": idempotencyKey() } });
}

/** Show the form in `main`; returns its (empty) cleanup. */
export function showCreate({ main, fail, go, say }) {
  let dropped = null;
  const parts = newBatchForm();
  const { input, chosen, zone, form, submit, status } = parts;
  const picked = () => dropped ?? input.files[0] ?? null;
  const showChosen = () => {
    const file = picked();
    const how = file && file.size > SINGLE_REQUEST_BYTES ? " (sent in parts)" : "";
    chosen.textContent = file ? `${file.name}, ${file.size} bytes${how}` : "No file chosen.";
  };
  input.addEventListener("change", () => {
    dropped = null;
    showChosen();
  });
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    dropped = event.dataTransfer?.files?.[0] ?? dropped;
    showChosen();
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const file = picked();
    if (!file) return say("Choose or drop a JSONL file first.");
    submit.disabled = true;
    try {
      const batch = await createBatch(file, parts);
      go(`#/batches/${encodeURIComponent(batch.id)}`);
    } catch (error) {
      status.textContent = "";
      fail(error);
    } finally {
      submit.disabled = false;
    }
  });
  main.append(form);
  return () => {};
}
