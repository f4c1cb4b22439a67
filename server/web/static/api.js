// The SIA page, part 1 of 4 (api.js, chat.js, inspector.js, app.js: classic scripts run in that order, sharing one
// global scope): the page's state, talking to the service, access (development mode, a user or an admin key) and the
// paths of the identity being looked at. Plain JavaScript, no dependencies: it speaks the HTTP API as any client.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_SLOT = "sia.key"; // sessionStorage: the key lives as long as this tab, never longer
const MAX_PLOTTED_VERSIONS = 40;
const MAX_LISTED_TURNS = 200;

const page = {
  key: sessionStorage.getItem(KEY_SLOT) || "",
  role: null, // "dev" (no key exists), "admin" or "user"
  persona: "",
  user: "",
  selfStates: new Map(), // state sha256 -> self state: a state's numbers never change
  about: new Map(), // persona -> description (admin keys and development mode read them)
  streaming: null, // the AbortController of the reply being streamed
  current: null, // the identity's detail as last read
  reads: 0, // counts the inspector's reads and the messages sent: a read that is overtaken draws nothing
};

class ApiError extends Error {
  constructor(status, code, message, retryAfter) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

// --- talking to the service ----------------------------------------------------------------------------------

function headers(json) {
  const h = {};
  if (page.key) h.Authorization = `Bearer ${page.key}`;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

async function failure(response) {
  let message = "";
  let code = "";
  try {
    const body = await response.json();
    message = body?.error?.message ?? "";
    code = body?.error?.code ?? "";
  } catch {
    // not the service's error shape (a proxy's page, say): the status alone is reported
  }
  return new ApiError(response.status, code, message, response.headers.get("Retry-After"));
}

async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) throw await failure(response);
  return response.status === 204 ? null : response.json();
}

function readable(err) {
  if (!(err instanceof ApiError)) return `The service could not be reached (${err.message}).`;
  const wait = err.retryAfter ? ` in ${err.retryAfter} s` : " in a moment";
  const detail = err.message ? ` (${err.message})` : "";
  switch (err.status) {
    case 401:
      return err.code === "invalid_api_key"
        ? "That API key is not valid: it is unknown or was revoked."
        : "This service needs an API key.";
    case 403:
      return err.code === "admin_only"
        ? "This needs an admin key: a user key chats and reads its own identity only."
        : "This key belongs to another user: it may only chat as, and read the identity of, its own user.";
    case 404:
      return `Not found${detail}.`;
    case 409:
      return err.code === "identity_busy"
        ? `The identity is busy with another turn; try again${wait}.`
        : `That conflicts with what exists${detail}.`;
    case 413:
      return "The request is larger than the service accepts; send a shorter message.";
    case 422:
      return `The service refused the request${detail}.`;
    case 429:
      return `Too many requests; try again${wait}.`;
    case 503:
      return `The service is unavailable right now${detail}; try again${wait}.`;
    default:
      return `The service answered ${err.status}${detail}.`;
  }
}

function showStatus(text, kind = "error") {
  const box = $("status");
  box.textContent = text;
  box.className = kind === "error" ? "status" : "status info";
  box.hidden = !text;
}

function report(err) {
  showStatus(readable(err));
  if (err instanceof ApiError && err.status === 401) askForKey(readable(err));
}

// --- access: development mode, or a user or admin key ------------------------------------------------------------

async function detectAccess() {
  try {
    const models = await api("GET", "/v1/models");
    fillPersonas(models.data.map((m) => m.id));
  } catch (err) {
    page.role = null;
    $("access-mode").textContent = "no access";
    $("key-open").hidden = false;
    report(err);
    return false;
  }
  page.about = new Map();
  try {
    const personas = await api("GET", "/admin/personas"); // in development mode, or with an admin key
    page.role = page.key ? "admin" : "dev";
    for (const p of personas.data) page.about.set(p.name, p.description);
  } catch (err) {
    if (!(err instanceof ApiError && err.status === 403)) throw err;
    page.role = "user";
  }
  const words = { dev: "development mode: no key needed", admin: "admin key", user: "user key: your own identity" };
  $("access-mode").textContent = words[page.role];
  $("key-open").hidden = page.role === "dev";
  $("key-forget").hidden = !page.key;
  if (page.role === "user" && $("user").value === "you") $("user").value = "";
  $("user").required = page.role !== "user";
  $("user").placeholder = page.role === "user" ? "the key's own user" : "";
  $("admin-tools").hidden = page.role === "user";
  $("user-note").hidden = page.role !== "user";
  return true;
}

function fillPersonas(names) {
  const select = $("persona");
  const chosen = select.value || (names.includes("sia") ? "sia" : names[0]);
  select.replaceChildren(...names.map((n) => new Option(n, n, false, n === chosen)));
}

function askForKey(reason) {
  $("key-error").textContent = page.key ? reason : "";
  const dialog = $("key-dialog");
  if (!dialog.open) dialog.showModal();
  $("key").focus();
}

async function useKey(event) {
  event.preventDefault();
  page.key = $("key").value.trim();
  sessionStorage.setItem(KEY_SLOT, page.key);
  $("key-error").textContent = "";
  try {
    if (await detectAccess()) {
      $("key-dialog").close();
      $("key").value = "";
      showStatus("");
      await openIdentity();
    }
  } catch (err) {
    report(err);
  }
}

function forgetKey() {
  page.key = "";
  sessionStorage.removeItem(KEY_SLOT);
  location.reload();
}

// --- paths of the identity being looked at ---------------------------------------------------------------------

const enc = encodeURIComponent;

function identityPath(suffix = "", query = {}) {
  const params = new URLSearchParams(query);
  if (page.role === "user") {
    if (page.user) params.set("user", page.user);
    const q = params.toString();
    return `/v1/personas/${enc(page.persona)}/identity${suffix}${q ? `?${q}` : ""}`;
  }
  const q = params.toString();
  return `/admin/personas/${enc(page.persona)}/identities/${enc(page.user)}${suffix}${q ? `?${q}` : ""}`;
}

// what is not JSON goes as typed: the service answers 422 with what it expected, shown like any refused turn
function jsonOrText(raw) {
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

function samplingFields() {
  const out = {};
  const fields = [
    ["max_tokens", parseInt], ["temperature", parseFloat], ["top_p", parseFloat], ["top_k", parseInt],
    ["repetition_penalty", parseFloat], ["no_repeat_ngram", parseInt], ["frequency_penalty", parseFloat],
    ["presence_penalty", parseFloat], ["logit_bias", jsonOrText], ["max_sentences", parseInt],
    ["max_words", parseInt], ["wind_down", parseInt], ["recall_temperature", parseFloat], ["address", (raw) => raw], ["seed", parseInt],
  ];
  for (const [id, parse] of fields) {
    const raw = $(id).value.trim();
    if (raw !== "") out[id] = parse(raw, 10);
  }
  for (const id of ["logit_bias_once", "lowercase", "exclaim"]) {
    if ($(id).value !== "") out[id] = $(id).value === "true";
  }
  return out;
}
