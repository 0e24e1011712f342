// The console's entry: hash routes (#/, #/?limit=N, #/new, #/batches/<id>), sign in and out, the message
// line.
import { ApiError, clearKey, getKey, json, setKey } from "./api.js";
import { showBatch } from "./batch.js";
import { showCreate } from "./create.js";
import { h } from "./dom.js";
import { showList } from "./list.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const banner = document.getElementById("message");
let leave = null; // the shown view's cleanup: stops its refreshing

/** Show `text` as the page's one-line message (empty: hide it). */
function say(text) {
  banner.textContent = text;
  banner.hidden = !text;
}

/** Go to `hash` (e.g. "#/new"), showing its view even when it is the current one. */
function go(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

/** What a view does with an error: a rejected key signs out, anything else is the message line. */
function fail(error) {
  if (error instanceof ApiError && error.status === 401) {
    clearKey();
    route();
  }
  say(error instanceof ApiError ? error.message : `Unexpected error: ${error}`);
}

function signIn() {
  const input = h("input", {
    id: "api-key", name: "api-key", type: "password", autocomplete: "off", spellcheck: "false", required: true,
  });
  const button = h("button", { type: "submit" }, "Sign in");
  const form = h(
    "form",
    { class: "card sign-in", "aria-labelledby": "sign-in-title", novalidate: true },
    h("h1", { id: "sign-in-title" }, "Sign in"),
    h("p", {}, "Your API key is kept in this browser tab only, until you sign out or close the tab."),
    h("label", { for: "api-key" }, "API key"),
    input,
    button,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!key) return say("Enter your API key.");
    button.disabled = true;
    try {
      await json("batches?limit=1", { key });
    } catch (error) {
      say(error.message);
      input.select();
      return;
    } finally {
      button.disabled = false;
    }
    setKey(key);
    input.value = "";
    route(); // the view the address names (a batch's page stays one after signing in)
  });
  main.append(form);
  input.focus();
}

function route() {
  leave?.();
  leave = null;
  main.replaceChildren();
  const signedIn = Boolean(getKey());
  nav.hidden = !signedIn;
  if (!signedIn) return signIn();
  say("");
  const [path, query] = (location.hash.replace(/^#/, "") || "/").split("?");
  const view = { main, fail, go, say, options: new URLSearchParams(query ?? "") };
  if (path.startsWith("/batches/")) leave = showBatch(view, decodeURIComponent(path.slice("/batches/".length)));
  else if (path === "/new") leave = showCreate(view);
  else leave = showList(view);
  main.focus({ preventScroll: true });
}

document.getElementById("sign-out").addEventListener("click", () => {
  clearKey();
  say("Signed out.");
  leave?.();
  leave = null;
  main.replaceChildren();
  nav.hidden = true;
  signIn();
});
window.addEventListener("hashchange", route);
route();
