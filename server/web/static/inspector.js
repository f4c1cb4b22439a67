// The SIA page, part 3 of 4 (after api.js, chat.js): the inspector of the identity's state: its plots, turns, imprint, versions, diff, rollback, reset and counterfactual.
"use strict";

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

const NOT_KEPT = "(text not kept)"; // a turn or a span whose words the service did not keep (privacy mode)

function fillTurns(turns) {
  const rows = [...turns].reverse().map((t) => {
    const tr = document.createElement("tr");
    tr.append(cell(String(t.index)), cell(t.message ?? NOT_KEPT, "text"), cell(t.reply ?? NOT_KEPT, "text"), cell(t.shock.toFixed(2)), cell(`${t.version_before}→${t.version_after}`));
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

function fillImprint(imprint) {
  const rows = imprint.data.map((s) => {
    const tr = document.createElement("tr");
    const actions = document.createElement("td");
    const words = s.text === null ? `span ${s.index} (turn ${s.turn})` : `"${s.text}"`;
    actions.append(actionButton("Forget", () => forget(s.index), `Forget ${words}`));
    tr.append(cell(String(s.turn)), cell(s.kind), cell(s.score.toFixed(2)), cell(s.text ?? NOT_KEPT, "text"), actions);
    tr.dataset.index = String(s.index);
    return tr;
  });
  $("imprint").tBodies[0].replaceChildren(...rows);
  $("imprint-text").textContent = imprint.data.length
    ? `${imprint.data.length} span${imprint.data.length === 1 ? "" : "s"}, ${imprint.used} of ${imprint.capacity} tokens. Forget removes one as a new version.`
    : `Nothing imprinted yet (room for ${imprint.capacity} tokens): a clause that surprises the identity is kept in the user's own words.`;
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
  for (const id of ["summary", "figures", "turns-box", "imprint-box"]) $(id).hidden = true;
  $("versions").tBodies[0].replaceChildren();
  $("imprint").tBodies[0].replaceChildren();
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
  const keepsImprint = detail.imprint_capacity > 0; // a model without one (the native model) has nothing to list
  const [history, turns, imprint] = await Promise.all([
    api("GET", identityPath("/history")),
    api("GET", identityPath("/turns", { limit: MAX_LISTED_TURNS, offset: Math.max(0, detail.turns - MAX_LISTED_TURNS) })),
    keepsImprint ? api("GET", identityPath("/imprint")) : null,
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
  if (imprint) fillImprint(imprint);
  if (page.role !== "user") fillVersions(history);
  $("inspector-empty").hidden = true;
  for (const id of ["summary", "figures", "turns-box"]) $(id).hidden = false;
  $("imprint-box").hidden = !imprint;
  if (transcript) {
    $("transcript").replaceChildren();
    for (const t of turns.data.slice(-50)) {
      bubble("user", t.message ?? NOT_KEPT);
      bubble("bot", t.reply ?? NOT_KEPT, turnMeta(t));
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
    const words = (spans) => spans.map((s) => (s.text === null ? `turn ${s.turn} (text not kept)` : `"${s.text}"`)).join(", ");
    const imprint = document.createElement("p");
    const { added, removed } = d.imprint;
    imprint.textContent = added.length || removed.length
      ? `Imprint: ${added.length} spans added${added.length ? ` (${words(added)})` : ""}, ${removed.length} removed${removed.length ? ` (${words(removed)})` : ""}.`
      : "Imprint: unchanged.";
    box.replaceChildren(table, imprint);
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

async function forget(index) {
  // a user key forgets its own words through /v1/.../identity/imprint; an admin key through /admin (identityPath)
  try {
    const out = await api("DELETE", identityPath(`/imprint/${index}`));
    const undo = page.role === "user" ? "an admin's roll back undoes it" : "roll back to undo";
    showStatus(`Forgot span ${index} of the imprint: now version ${out.state_version} (${undo}).`, "info");
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
