// The SIA page, part 2 of 4 (after api.js): the conversation, streamed over the chat route's Server-Sent Events.
"use strict";

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
