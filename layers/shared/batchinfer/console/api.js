// The console's calls to the service's OpenAI-dialect API (/v1, beside /console/ on the same origin).
// The key lives in this tab's sessionStorage only and travels as `Authorization: Bearer`, never in a URL.

const KEY = "batchinfer.apiKey";
// Requests up to this size go in one POST /v1/files; larger files through the Uploads API in parts of
// PART_BYTES (a request reaches the function base64-encoded, within Lambda's 6 MB).
export const SINGLE_REQUEST_BYTES = 4 * 1024 * 1024;
const PART_BYTES = 4 * 1024 * 1024;
const base = new URL("../v1/", document.baseURI);

export const getKey = () => sessionStorage.getItem(KEY);
export const setKey = (key) => sessionStorage.setItem(KEY, key);
export const clearKey = () => sessionStorage.removeItem(KEY);

/** An error answer of the API: `status` (0: no answer), one-line `message`, `code` when it gave one. */
export class ApiError extends Error {
  constructor(status, message, code = null) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// One line from any error body the service gives: OpenAI's {"error": {message, code}}, Anthropic's
// {"type": "error", "error": {type, message}} or the gateway's {"message"}.
async function errorOf(response) {
  let message = `The service answered HTTP ${response.status}.`;
  let code = null;
  try {
    const body = await response.json();
    const error = body.error ?? body;
    if (typeof error.message === "string" && error.message) message = error.message;
    code = error.code ?? error.type ?? null;
  } catch {
    // not JSON: the status line says enough
  }
  return new ApiError(response.status, message.split("\n")[0], code);
}

/** `fetch` of `path` (relative to /v1/) with the key; the Response, or throws `ApiError`. */
export async function call(path, { method = "GET", body, headers = {}, key = getKey() } = {}) {
  const init = { method, headers: { Authorization: `Bearer ${key}`, ...headers }, cache: "no-store" };
  if (body instanceof FormData) init.body = body;
  else if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(new URL(path, base), init);
  } catch {
    throw new ApiError(0, "The service could not be reached: check the connection, then retry.", "unreachable");
  }
  if (!response.ok) throw await errorOf(response);
  return response;
}

/** The JSON body of `call(path, options)`. */
export async function json(path, options) {
  return (await call(path, options)).json();
}

/** Save file `fileId`'s bytes as `filename`: fetched with the key, handed to the browser as a Blob. */
export async function download(fileId, filename) {
  save(await (await call(`files/${encodeURIComponent(fileId)}/content`)).blob(), filename);
}

/**
 * Save the answers batch `batchId` has committed so far as `filename`: GET /v1/batches/{id}/output read
 * page after page (`after` from X-Batchinfer-Next-After while X-Batchinfer-More is "true"), in input
 * order, each line as the final output.jsonl will have it.
 */
export async function downloadDone(batchId, filename) {
  const pages = [];
  for (let after = 0, more = true; more; ) {
    const response = await call(`batches/${encodeURIComponent(batchId)}/output?after=${after}`);
    pages.push(await response.blob());
    after = Number(response.headers.get("X-Batchinfer-Next-After"));
    more = response.headers.get("X-Batchinfer-More") === "true";
  }
  save(new Blob(pages, { type: "application/jsonl" }), filename);
}

// Hand `blob` to the browser as a download named `filename` (a link cannot carry the key's header).
function save(blob, filename) {
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = filename;
  link.hidden = true;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

/** A random Idempotency-Key (crypto.randomUUID needs a secure context; getRandomValues does not). */
export function idempotencyKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
}

/**
 * Upload `file` as a `batch` File: one POST /v1/files, or above SINGLE_REQUEST_BYTES an Upload in parts,
 * then completed. `onProgress(sentBytes, totalBytes)` after each part. Resolves to the File object.
 */
export async function uploadFile(file, onProgress = () => {}) {
  if (file.size <= SINGLE_REQUEST_BYTES) {
    const form = new FormData();
    form.append("purpose", "batch");
    form.append("file", file, file.name);
    return json("files", { method: "POST", body: form });
  }
  const upload = await json("uploads", {
    method: "POST",
    body: { filename: file.name, purpose: "batch", bytes: file.size, mime_type: "application/jsonl" },
  });
  const partIds = [];
  for (let start = 0; start < file.size; start += PART_BYTES) {
    const form = new FormData();
    form.append("data", file.slice(start, start + PART_BYTES), file.name);
    partIds.push((await json(`uploads/${upload.id}/parts`, { method: "POST", body: form })).id);
    onProgress(Math.min(start + PART_BYTES, file.size), file.size);
  }
  const done = await json(`uploads/${upload.id}/complete`, { method: "POST", body: { part_ids: partIds } });
  return done.file;
}
