// How batch values are shown: statuses (colour and text), progress, times, rates.
import { h } from "./dom.js";

export const STATUSES = [
  "validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled",
];
export const TERMINAL = new Set(["completed", "failed", "expired", "cancelled"]);
// The statuses a cancel is accepted from (the API answers 409 from any other).
export const CANCELLABLE = new Set(["validating", "in_progress"]);

/** "in_progress" -> "in progress". */
export const statusText = (status) => status.replaceAll("_", " ");

/** A status badge: its colour comes from the class, its meaning from the text. */
export function statusBadge(status, id = null) {
  return h("span", { class: `status status-${status}`, id }, statusText(status));
}

/** Requests done (completed + failed) and the total of a batch. */
export function doneOf(batch) {
  const counts = batch.request_counts ?? { total: 0, completed: 0, failed: 0 };
  return { done: counts.completed + counts.failed, total: counts.total };
}

/** A labelled progress bar and its "done / total" text. */
export function progressBar(batch, id = null) {
  const { done, total } = doneOf(batch);
  const bar = h("progress", { max: Math.max(total, 1), value: done, "aria-label": `${done} of ${total} requests done` });
  return h("span", { class: "progress", id }, bar, h("span", { class: "count" }, `${done} / ${total}`));
}

/** Epoch seconds as "2026-12-03 23:40:01 UTC"; "—" for none. */
export function when(seconds) {
  if (!seconds) return "—";
  return new Date(seconds * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

/** A duration in seconds as "45 s", "3 min 05 s", "2 h 04 min". */
export function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

/** A rate with two significant decimals at most: 0.25, 3.1, 120. */
export function rate(value) {
  if (!Number.isFinite(value)) return "—";
  return value >= 100 ? String(Math.round(value)) : String(Number(value.toPrecision(2)));
}

// The moment a batch ended (the first terminal or finalizing timestamp), or null while it runs.
function endedAt(batch) {
  const ends = [batch.finalizing_at, batch.completed_at, batch.failed_at, batch.expired_at, batch.cancelled_at]
    .filter(Boolean);
  const ended = TERMINAL.has(batch.status) || batch.status === "finalizing";
  return ended && ends.length ? Math.min(...ends) : null;
}

/**
 * Requests/s and output tokens/s since the batch started running, and the ETA in seconds (null when
 * unknown or ended), at `now` (epoch seconds).
 */
export function speed(batch, now) {
  const started = batch.in_progress_at;
  const { done, total } = doneOf(batch);
  if (!started) return { requests: NaN, tokens: NaN, eta: null };
  const until = endedAt(batch) ?? now;
  const elapsed = Math.max(until - started, 1);
  const requests = done / elapsed;
  const tokens = (batch.usage?.output_tokens ?? 0) / elapsed;
  const running = batch.status === "in_progress";
  const eta = running && requests > 0 ? (total - done) / requests : null;
  return { requests, tokens, eta };
}
