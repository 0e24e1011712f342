// The new-batch form: a JSONL file (picked or dropped), the endpoint and the completion window; the file
// is uploaded (large ones through the Uploads API), the batch created, and its page opened.
import { SINGLE_REQUEST_BYTES, idempotencyKey, json, uploadFile } from "./api.js";
import { h } from "./dom.js";

const ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"];
const WINDOWS = ["24h", "1h", "48h", "168h"];

const select = (id, values) => h("select", { id, name: id }, values.map((value) => h("option", { value }, value)));

/** Show the form in `main`; returns its (empty) cleanup. */
export function showCreate({ main, fail, go, say }) {
  let dropped = null;
  const input = h("input", { id: "file", name: "file", type: "file", accept: ".jsonl,.ndjson,application/jsonl,text/plain" });
  const chosen = h("p", { id: "chosen", class: "sub", "aria-live": "polite" }, "No file chosen.");
  const zone = h(
    "div",
    { class: "drop", id: "drop-zone" },
    h("label", { for: "file" }, "Input file (JSONL, one request per line)"),
    input,
    h("p", { class: "sub" }, "…or drop the file here."),
    chosen,
  );
  const endpoint = select("endpoint", ENDPOINTS);
  const window_ = select("completion-window", WINDOWS);
  const name = h("input", { id: "batch-name-input", name: "name", type: "text", maxlength: 256, autocomplete: "off" });
  const submit = h("button", { type: "submit", id: "create" }, "Create batch");
  const status = h("p", { id: "create-status", role: "status" });
  const form = h(
    "form",
    { class: "card", id: "new-batch", "aria-labelledby": "new-title", novalidate: true },
    h("h1", { id: "new-title" }, "New batch"),
    zone,
    h("label", { for: "endpoint" }, "Endpoint"),
    endpoint,
    h("label", { for: "completion-window" }, "Completion window"),
    window_,
    h("label", { for: "batch-name-input" }, "Name (optional)"),
    name,
    submit,
    status,
  );
  const picked = () => dropped ?? input.files[0] ?? null;
  const showChosen = () => {
    const file = picked();
    chosen.textContent = file ? `${file.name}, ${file.size} bytes${file.size > SINGLE_REQUEST_BYTES ? " (sent in parts)" : ""}` : "No file chosen.";
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
      status.textContent = `Uploading ${file.name}…`;
      const uploaded = await uploadFile(file, (sent, total) => {
        status.textContent = `Uploading ${file.name}: ${sent} of ${total} bytes…`;
      });
      status.textContent = "Creating the batch…";
      const body = { input_file_id: uploaded.id, endpoint: endpoint.value, completion_window: window_.value };
      if (name.value.trim()) body.name = name.value.trim();
      const batch = await json("batches", { method: "POST", body, headers: { "Idempotency-Key": idempotencyKey() } });
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
