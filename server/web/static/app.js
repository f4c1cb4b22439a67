// The SIA page, part 4 of 4 (after api.js, chat.js, inspector.js): wiring the page's controls, and the start.
"use strict";

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
