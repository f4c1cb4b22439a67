// The SIA page: a chat with a persona (streamed over the chat route's Server-Sent Events) beside the inspector
// of the identity's state. Plain JavaScript, no dependencies: it speaks the same HTTP API as any client.
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

function samplingFields() {
  const out = {};
  for (const [id, parse] of [["max_tokens", parseInt], ["temperature", parseFloat], ["top_p", parseFloat], ["top_k", parseInt], ["seed", parseInt]]) {
    const raw = $(id).value.trim();
    if (raw !== "") out[id] = parse(raw, 10);
  }
  return out;
}

// --- the conversation ------------------------------------------------------------------------------------------

function bubble(kind, text, meta = "") {
  const li = document.createElement("li");
  li.className = kind;
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  const small = document.createElement("span");
  small.className = "meta";
  small.textContent = meta;
  li.append(body, small);
  $("transcript").append(li);
  li.scrollIntoView({ block: "nearest" });
  return li;
}

function turnMeta(t) {
  return `turn ${t.turn ?? t.index} · shock ${t.shock.toFixed(2)} · version ${t.state_version ?? t.version_after} · ${t.finish_reason}`;
}

function* sseEvents(buffer) {
  // yields [event, data] for each complete event in buffer.text, leaving the rest there
  let end;
  while ((end = buffer.text.indexOf("\n\n")) >= 0) {
    const raw = buffer.text.slice(0, end);
    buffer.text = buffer.text.slice(end + 2);
    let event = "message";
    const data = [];
    for (const line of raw.split("\n")) {
      if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
    }
    yield [event, JSON.parse(data.join("\n"))];
  }
}

async function send(message) {
  page.reads++; // a read still on its way would redraw the transcript without this message
  bubble("user", message);
  const reply = bubble("bot", "", "streaming…");
  reply.setAttribute("aria-busy", "true");
  const text = reply.querySelector(".text");
  const meta = reply.querySelector(".meta");
  const controller = new AbortController();
  page.streaming = controller;
  $("send").disabled = true;
  $("stop").disabled = false;
  showStatus("");
  const body = { message, stream: true, ...samplingFields() };
  if (page.user) body.user = page.user;
  let finished = false;
  let refused = false; // 401 or 403: reading the identity would be refused too
  let stopped = false;
  const turnsBefore = page.current?.turns ?? 0;
  try {
    const response = await fetch(`/v1/personas/${enc(page.persona)}/chat`, {
      method: "POST",
      headers: headers(true),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!response.ok) throw await failure(response);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    const buffer = { text: "" };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer.text += value;
      for (const [event, data] of sseEvents(buffer)) {
        if (event === "token") {
          text.textContent += data.text;
          reply.dataset.tokens = String(Number(reply.dataset.tokens || 0) + 1);
        } else if (event === "done") {
          text.textContent = data.reply;
          meta.textContent = turnMeta(data);
          reply.dataset.done = "true";
          finished = true;
        } else if (event === "error") {
          throw new ApiError(500, data?.error?.code ?? "", data?.error?.message ?? "");
        }
      }
    }
    if (!finished) throw new Error("the stream ended before the reply was complete");
  } catch (err) {
    reply.classList.add("failed");
    if (err.name === "AbortError") {
      stopped = true;
      meta.textContent = "stopping…";
    } else {
      meta.textContent = readable(err);
      refused = err instanceof ApiError && (err.status === 401 || err.status === 403);
      report(err);
    }
  } finally {
    reply.removeAttribute("aria-busy");
    page.streaming = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
  if (stopped) await settled(); // the service abandons the turn when it notices the closed stream
  if (finished || !refused) await refreshInspector(); // a turn changed the state, or a read was overtaken above
  if (stopped) {
    // a stop that reaches the service after its last token is too late: the turn was already kept
    const kept = (page.current?.turns ?? 0) > turnsBefore;
    meta.textContent = kept ? "stopped too late: the service had finished, and the turn was kept" : "stopped: the identity was not changed";
  }
}

async function settled() {
  // waits (5 s at most) until no turn holds the identity
  for (let i = 0; i < 50; i++) {
    try {
      if (!(await api("GET", identityPath())).busy) return;
    } catch {
      return; // no identity yet, or no access: nothing to wait for
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

// --- the inspector ------------------------------------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function svgEl(name, attrs) {
  const el = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

function drawSelfStates(versions) {
  // versions: [[version, self_state], ...] ascending
  const svg = $("self-plot");
  const W = 400;
  const H = 160;
  const dims = versions.length ? versions[0][1].length : 0;
  const peak = Math.max(1e-6, ...versions.flatMap(([, s]) => s.map(Math.abs)));
  const x = (i) => (versions.length > 1 ? (i / (versions.length - 1)) * (W - 8) + 4 : W / 2);
  const y = (v) => H / 2 - (v / peak) * (H / 2 - 6);
  const parts = [svgEl("line", { class: "axis", x1: 0, x2: W, y1: H / 2, y2: H / 2 })];
  for (let c = 0; c < dims; c++) {
    const points = versions.map(([, s], i) => `${x(i).toFixed(1)},${y(s[c]).toFixed(1)}`).join(" ");
    const line = svgEl(versions.length > 1 ? "polyline" : "circle", versions.length > 1
      ? { points, stroke: `hsl(${(c * 137) % 360} 65% 48%)` }
      : { cx: x(0), cy: y(versions[0][1][c]), r: 3, fill: `hsl(${(c * 137) % 360} 65% 48%)` });
    parts.push(line);
  }
  svg.replaceChildren(...parts);
  svg.dataset.points = String(versions.length);
  const span = versions.length ? `versions ${versions[0][0]} to ${versions[versions.length - 1][0]}` : "no versions";
  $("self-plot-text").textContent = `${dims} components over ${versions.length} retained versions (${span}); vertical scale ±${peak.toPrecision(2)}.`;
}

function drawHeatmap(detail) {
  const canvas = $("heatmap");
  const rows = detail.heads;
  const cols = rows.length ? rows[0].eigenvalues.length : 0;
  canvas.width = Math.max(cols, 1);
  canvas.height = Math.max(rows.length, 1);
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(canvas.width, canvas.height);
  const peak = Math.max(1e-9, ...rows.flatMap((h) => h.eigenvalues.map(Math.abs)));
  rows.forEach((head, r) => {
    head.eigenvalues.forEach((v, c) => {
      const t = Math.sqrt(Math.min(1, Math.abs(v) / peak)); // a square-root scale: small eigenvalues stay visible
      const [R, G, B] = v >= 0 ? [255, 255 * (1 - t), 255 * (1 - t)] : [255 * (1 - t), 255 * (1 - t), 255];
      image.data.set([R, G, B, 255], (r * canvas.width + c) * 4);
    });
  });
  ctx.putImageData(image, 0, 0);
  canvas.dataset.version = String(detail.state_version);
  const layers = new Set(rows.map((h) => h.layer)).size;
  const shape = `${layers} layers × ${rows.length / Math.max(layers, 1)} heads, ${cols} eigenvalues each`;
  const strongest = rows.reduce((a, b) => (b.trace_norm > a.trace_norm ? b : a), rows[0]);
  $("heatmap-text").textContent = !strongest || strongest.trace_norm === 0
    ? `${shape}: every trace is zero, so attention is that of a fresh identity.`
    : `${shape} (blue negative, red positive, square-root scale up to ±${peak.toPrecision(2)}).`
      + ` Largest ‖T‖: layer ${strongest.layer} head ${strongest.head}, ${strongest.trace_norm.toFixed(3)}.`;
}

function drawShocks(turns) {
  const svg = $("shock-plot");
  const W = 400;
  const H = 120;
  const peak = Math.max(1e-6, ...turns.map((t) => Math.abs(t.shock)));
  const width = turns.length ? W / turns.length : W;
  const parts = [svgEl("line", { class: "axis", x1: 0, x2: W, y1: H / 2, y2: H / 2 })];
  turns.forEach((t, i) => {
    const h = (Math.abs(t.shock) / peak) * (H / 2 - 4);
    const bar = svgEl("rect", {
      x: i * width + width * 0.15, width: Math.max(width * 0.7, 0.5), y: t.shock >= 0 ? H / 2 - h : H / 2, height: Math.max(h, 0.5),
      fill: t.shock >= 0 ? "#d1495b" : "#2e86de",
    });
    const title = svgEl("title", {});
    title.textContent = `turn ${t.index}: shock ${t.shock.toFixed(2)}`;
    bar.append(title);
    parts.push(bar);
  });
  svg.replaceChildren(...parts);
  svg.dataset.bars = String(turns.length);
  const last = turns[turns.length - 1];
  $("shock-plot-text").textContent = turns.length
    ? `${turns.length} turns; the last, turn ${last.index}, had shock ${last.shock.toFixed(2)} (red above the running mean, blue below).`
    : "No turns yet.";
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function fillTurns(turns) {
  const rows = [...turns].reverse().map((t) => {
    const tr = document.createElement("tr");
    tr.append(cell(String(t.index)), cell(t.message, "text"), cell(t.reply, "text"), cell(t.shock.toFixed(2)), cell(`${t.version_before}→${t.version_after}`));
    return tr;
  });
  $("turns").tBodies[0].replaceChildren(...rows);
}

function actionButton(label, onClick, name) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = "small";
  b.textContent = label;
  b.setAttribute("aria-label", name);
  b.addEventListener("click", onClick);
  return b;
}

function fillVersions(history) {
  const rows = history.data.map((v) => {
    const tr = document.createElement("tr");
    const actions = document.createElement("td");
    if (v.version === history.current) {
      tr.className = "current";
      actions.textContent = "current";
    } else {
      actions.append(
        actionButton("Diff", () => showDiff(v.version), `Diff version ${v.version} with the current version`),
        " ",
        actionButton("Roll back", () => rollback(v.version), `Roll back to version ${v.version}`),
      );
    }
    tr.append(cell(String(v.version)), cell(v.reason), actions);
    tr.dataset.version = String(v.version);
    return tr;
  });
  $("versions").tBodies[0].replaceChildren(...rows);
  const against = $("cf-against");
  const chosen = against.value;
  const options = [new Option("a fresh state (the persona's initial state)", "reset")];
  for (const v of history.data) if (v.version !== history.current) options.push(new Option(`version ${v.version} (${v.reason})`, String(v.version)));
  against.replaceChildren(...options);
  if ([...against.options].some((o) => o.value === chosen)) against.value = chosen;
}

async function selfStatesOver(history, detail) {
  // [[version, self state], ...] ascending, for the current and the newest retained versions
  const wanted = history.data.filter((v) => v.version !== detail.state_version).slice(0, MAX_PLOTTED_VERSIONS - 1);
  page.selfStates.set(detail.state_sha256, detail.self_state);
  await Promise.all(wanted.filter((v) => !page.selfStates.has(v.state_sha256)).map(async (v) => {
    try {
      page.selfStates.set(v.state_sha256, (await api("GET", identityPath("", { version: v.version }))).self_state);
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 404)) throw err; // pruned since the history was read
    }
  }));
  return [[detail.state_version, detail.state_sha256], ...wanted.map((v) => [v.version, v.state_sha256])]
    .filter(([, sha]) => page.selfStates.has(sha))
    .sort((a, b) => a[0] - b[0])
    .map(([version, sha]) => [version, page.selfStates.get(sha)]);
}

function showEmpty(text) {
  $("inspector-empty").textContent = text;
  $("inspector-empty").hidden = false;
  for (const id of ["summary", "figures", "turns-box"]) $(id).hidden = true;
  $("versions").tBodies[0].replaceChildren();
  page.current = null;
}

async function refreshInspector({ transcript = false } = {}) {
  const read = ++page.reads;
  let detail;
  try {
    detail = await api("GET", identityPath());
  } catch (err) {
    if (read !== page.reads) return;
    if (err instanceof ApiError && err.status === 404) {
      showEmpty("No identity yet: it is created by its first message.");
      if (transcript) $("transcript").replaceChildren();
      return;
    }
    showEmpty(readable(err));
    report(err);
    return;
  }
  if (read !== page.reads) return;
  if (page.role === "user" && !page.user) {
    page.user = detail.user; // the key's own user, now known
    $("user").value = detail.user;
  }
  const [history, turns] = await Promise.all([
    api("GET", identityPath("/history")),
    api("GET", identityPath("/turns", { limit: MAX_LISTED_TURNS, offset: Math.max(0, detail.turns - MAX_LISTED_TURNS) })),
  ]);
  const selfStates = await selfStatesOver(history, detail);
  if (read !== page.reads) return;
  page.current = detail;
  $("turn-count").textContent = String(detail.turns);
  $("version").textContent = String(detail.version);
  $("self-norm").textContent = detail.self_norm.toFixed(3);
  const last = turns.data[turns.data.length - 1];
  $("last-shock").textContent = last ? last.shock.toFixed(2) : "–";
  drawHeatmap(detail);
  drawShocks(turns.data);
  drawSelfStates(selfStates);
  fillTurns(turns.data);
  if (page.role !== "user") fillVersions(history);
  $("inspector-empty").hidden = true;
  for (const id of ["summary", "figures", "turns-box"]) $(id).hidden = false;
  if (transcript) {
    $("transcript").replaceChildren();
    for (const t of turns.data.slice(-50)) {
      bubble("user", t.message);
      bubble("bot", t.reply, turnMeta(t));
    }
  }
}

async function showDiff(version) {
  const box = $("diff");
  try {
    const d = await api("GET", identityPath("/diff", { a: version }));
    const table = document.createElement("table");
    const caption = document.createElement("caption");
    caption.textContent = `From version ${d.a} to ${d.b}: ‖Δs‖ = ${d.self_norm.toFixed(4)}, turns ${d.turns >= 0 ? "+" : ""}${d.turns}; ‖ΔT‖ per layer and head:`;
    table.append(caption);
    const head = document.createElement("tr");
    head.append(cell("layer"), ...d.trace_norm[0].map((_, h) => cell(`head ${h}`)));
    table.append(head);
    d.trace_norm.forEach((row, layer) => {
      const tr = document.createElement("tr");
      tr.append(cell(String(layer)), ...row.map((v) => cell(v.toFixed(4))));
      table.append(tr);
    });
    box.replaceChildren(table);
    box.hidden = false;
  } catch (err) {
    report(err);
  }
}

async function rollback(version) {
  try {
    const out = await api("POST", identityPath("/rollback"), { version });
    showStatus(`Rolled back to version ${version}: the identity is now at version ${out.version}.`, "info");
    $("diff").hidden = true;
    await refreshInspector();
  } catch (err) {
    report(err);
  }
}

async function reset() {
  try {
    const out = await api("POST", identityPath("/reset"));
    showStatus(`Reset to the persona's initial state: now version ${out.version} (roll back to undo).`, "info");
    $("diff").hidden = true;
    await refreshInspector();
  } catch (err) {
    report(err);
  }
}

function side(title, r) {
  const box = document.createElement("section");
  box.className = "side";
  const h = document.createElement("h4");
  h.textContent = title;
  const p = document.createElement("p");
  p.className = "reply";
  p.textContent = r.reply;
  const meta = document.createElement("small");
  meta.textContent = `shock ${r.shock.toFixed(2)} · NLL ${r.nll.toFixed(2)} · ${r.usage.completion_tokens} tokens · ${r.finish_reason}`;
  box.append(h, p, meta);
  return box;
}

async function counterfactual(event) {
  event.preventDefault();
  const against = $("cf-against").value;
  const body = { message: $("cf-message").value, ...samplingFields() };
  body.against = against === "reset" ? "reset" : { version: Number(against) };
  const box = $("cf-result");
  $("cf-run").disabled = true;
  try {
    const out = await api("POST", identityPath("/counterfactual"), body);
    const other = out.other.state_version === null ? "Fresh state" : `Version ${out.other.state_version}`;
    const note = document.createElement("p");
    note.className = "hint";
    note.textContent = `Same message, same seed (${out.seed}): ${out.same ? "both states gave the same reply" : "the states answer differently"}. Nothing was written.`;
    box.replaceChildren(side(`Current state (version ${out.current.state_version})`, out.current), side(other, out.other), note);
    note.style.gridColumn = "1 / -1";
    box.hidden = false;
  } catch (err) {
    report(err);
  } finally {
    $("cf-run").disabled = false;
  }
}

// --- wiring -------------------------------------------------------------------------------------------------------

async function openIdentity() {
  page.persona = $("persona").value;
  $("persona-about").textContent = page.about.get(page.persona) ?? "";
  page.user = $("user").value.trim();
  $("cf-result").hidden = true;
  $("diff").hidden = true;
  if (!page.persona) return;
  if (!page.user && page.role !== "user") {
    showEmpty("Enter a user id: each user has an identity of their own with each persona.");
    $("transcript").replaceChildren();
    return;
  }
  await refreshInspector({ transcript: true });
}

function wire() {
  $("who").addEventListener("submit", (e) => {
    e.preventDefault();
    showStatus("");
    openIdentity();
  });
  $("persona").addEventListener("change", () => openIdentity());
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const message = $("message").value;
    if (!message.trim() || page.streaming) return;
    if (page.persona !== $("persona").value || page.user !== $("user").value.trim()) {
      page.persona = $("persona").value;
      page.user = $("user").value.trim();
      $("transcript").replaceChildren();
    }
    $("message").value = "";
    send(message);
  });
  $("message").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    } else if (e.key === "Escape" && page.streaming) {
      page.streaming.abort();
    }
  });
  $("stop").addEventListener("click", () => page.streaming?.abort());
  $("reset").addEventListener("click", reset);
  $("counterfactual").addEventListener("submit", counterfactual);
  $("key-form").addEventListener("submit", useKey);
  $("key-cancel").addEventListener("click", () => $("key-dialog").close());
  $("key-open").addEventListener("click", () => askForKey(""));
  $("key-forget").addEventListener("click", forgetKey);
}

async function start() {
  wire();
  try {
    if (await detectAccess()) await openIdentity();
  } catch (err) {
    report(err);
  }
}

start();
