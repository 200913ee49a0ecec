// The chat page: conversations, streaming, stop/continue/regenerate/edit, settings, images.
import {ApiError, getJSON, streamChat} from "./api.js";
import * as attach from "./attach.js";
import {copyCode, renderMarkdown} from "./markdown.js";
import {closeSidebar, initLayout} from "./layout.js";
import * as store from "./store.js";
import {initSettings, openSettings} from "./settings.js";

const $ = (id) => document.getElementById(id);
const log = $("log"), prompt = $("prompt"), sendBtn = $("send"), stopBtn = $("stop");

const state = store.loadState();
const ui = {
  busy: false,           // a reply is streaming
  controller: null,      // its AbortController
  error: null,           // the last refusal, shown under the conversation (never stored)
  stick: true,           // auto-scroll follows the answer unless the user scrolled up
  models: [],
  apiKey: store.loadApiKey(),
  settings: store.loadSettings(),
  editing: -1,           // the user message being edited
};

// --- conversations -----------------------------------------------------------------------
function current() {
  let conv = state.conversations.find((c) => c.id === state.current);
  if (!conv) {
    conv = state.conversations[0];
    if (!conv) {
      conv = store.newConversation();
      state.conversations.unshift(conv);
    }
    state.current = conv.id;
  }
  return conv;
}

let saveTimer = 0;
function save(now = true) {
  if (now) {
    clearTimeout(saveTimer);
    saveTimer = 0;
    if (!store.saveState(state)) {  // saved without the images' data
      setStatus("browser storage full: images are kept only until this page closes");
    }
  } else if (!saveTimer) {
    saveTimer = setTimeout(() => save(true), 400);
  }
}

function renderList() {
  const list = $("conv-list");
  current();  // there is always one
  list.replaceChildren();
  for (const c of state.conversations) {
    const li = document.createElement("li");
    li.className = c.id === state.current ? "conv active" : "conv";
    li.dataset.id = c.id;
    const open = button(c.title, "conv-open", () => selectConversation(c.id));
    open.title = c.title;
    if (c.id === state.current) open.setAttribute("aria-current", "true");
    const rename = button("✎", "conv-rename", () => renameConversation(c.id), "Rename conversation");
    const del = button("✕", "conv-delete", () => deleteConversation(c.id), "Delete conversation");
    li.append(open, rename, del);
    list.append(li);
  }
  $("title").textContent = current().title;
}

function selectConversation(id) {
  if (ui.busy) stop();
  state.current = id;
  ui.error = null;
  ui.editing = -1;
  save();
  closeSidebar();
  renderAll();
  prompt.focus();
}

function newChat() {
  const conv = current();
  if (conv.messages.length === 0) { closeSidebar(); prompt.focus(); return; }
  const c = store.newConversation();
  state.conversations.unshift(c);
  selectConversation(c.id);
}

function renameConversation(id) {
  const c = state.conversations.find((x) => x.id === id);
  const t = window.prompt("Rename the conversation", c.title);
  if (t === null || !t.trim()) return;
  c.title = t.trim().slice(0, 200);
  save();
  renderList();
}

function deleteConversation(id) {
  const c = state.conversations.find((x) => x.id === id);
  if (!window.confirm(`Delete "${c.title}"?`)) return;
  if (ui.busy && id === state.current) stop();
  state.conversations = state.conversations.filter((x) => x.id !== id);
  if (state.current === id) state.current = null;
  save();
  renderAll();
}

function exportAll() {
  const blob = new Blob([store.exportJSON(state.conversations)], {type: "application/json"});
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `modelc-chat-${new Date().toISOString().slice(0, 10)}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

async function importFile(file) {
  try {
    const convs = store.importJSON(await file.text());
    state.conversations = state.conversations.filter((c) => c.messages.length);  // unused ones
    state.conversations.unshift(...convs);
    selectConversation(convs[0].id);
    setStatus(`imported ${convs.length} conversation${convs.length > 1 ? "s" : ""}`);
  } catch (e) {
    setStatus("import failed: " + e.message);
  }
}

// --- rendering ---------------------------------------------------------------------------
function button(text, cls, onClick, label) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = cls;
  b.textContent = text;
  if (label) { b.setAttribute("aria-label", label); b.title = label; }
  b.addEventListener("click", onClick);
  return b;
}

function setStatus(text) { $("status").textContent = text; }

function statsText(st) {
  if (!st) return "";
  const parts = [];
  if (st.completion_tokens != null) parts.push(`${st.completion_tokens} tokens`);
  if (st.tps) parts.push(`${st.tps.toFixed(1)} tokens/s`);
  if (st.prompt_tokens != null) parts.push(`prompt ${st.prompt_tokens} tokens`);
  return parts.join(" · ");
}

function renderMessage(conv, i) {
  const s = conv.messages[i], a = store.alt(s);
  const div = document.createElement("div");
  div.className = `msg ${s.role}`;
  div.dataset.index = String(i);
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = s.role === "user" ? "You" : s.role === "assistant" ? "Assistant" : "System";
  const body = document.createElement("div");
  body.className = "body";
  div.append(who, ...(a.images && a.images.length ? [attach.gallery(a.images)] : []), body);
  if (ui.editing === i) {
    const ta = document.createElement("textarea");
    ta.className = "edit-box";
    ta.value = a.content;
    ta.setAttribute("aria-label", "Edit message");
    ta.rows = Math.min(10, a.content.split("\n").length + 1);
    ta.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); editSend(i, ta.value); }
      if (ev.key === "Escape") { ev.stopPropagation(); ui.editing = -1; renderLog(); }
    });
    body.append(ta,
      button("Send", "edit-send", () => editSend(i, ta.value)),
      button("Cancel", "edit-cancel", () => { ui.editing = -1; renderLog(); }));
    setTimeout(() => ta.focus(), 0);
    return div;
  }
  fillBody(body, s.role, a.content, a.reasoning);
  const meta = document.createElement("div");
  meta.className = "meta";
  if (s.alts.length > 1) {
    const nav = document.createElement("span");
    nav.className = "nav";
    const pos = document.createElement("span");
    pos.className = "pos";
    pos.textContent = `${s.cur + 1}/${s.alts.length}`;
    const prev = button("‹", "prev", () => navigate(i, -1), "Previous version");
    const next = button("›", "next", () => navigate(i, 1), "Next version");
    prev.disabled = ui.busy || s.cur === 0;
    next.disabled = ui.busy || s.cur === s.alts.length - 1;
    nav.append(prev, pos, next);
    meta.append(nav);
  }
  if (s.role === "assistant") {
    const stats = document.createElement("span");
    stats.className = "stats";
    stats.textContent = statsText(a.stats);
    meta.append(stats);
    const last = i === conv.messages.length - 1;
    if (last && (a.finish === "length" || a.finish === "cancelled")) {
      const note = document.createElement("span");
      note.className = "note finish-" + a.finish;
      note.textContent = a.finish === "length" ? "stopped at max tokens — continue?"
        : "request cancelled";
      meta.append(note, button("Continue", "continue", () => continueReply()));
    }
    meta.append(button("Regenerate", "regenerate", () => regenerate(i), "Regenerate this reply"));
  } else if (s.role === "user") {
    meta.append(button("Edit", "edit", () => { ui.editing = i; renderLog(); }, "Edit and resend"));
  }
  for (const b of meta.querySelectorAll(".regenerate, .edit, .continue")) b.disabled = ui.busy;
  div.append(meta);
  return div;
}

function fillBody(body, role, content, reasoning = "") {
  if (role === "assistant") renderMarkdown(body, content, reasoning);
  else body.textContent = content;  // the user's words, verbatim (no markup)
}

function renderLog() {
  const conv = current();
  const nodes = conv.messages.map((_, i) => renderMessage(conv, i));
  if (ui.error) {
    const e = document.createElement("div");
    e.className = "error";
    e.setAttribute("role", "alert");
    e.textContent = "error: " + ui.error;
    nodes.push(e);
  }
  if (!conv.messages.length && !ui.error) {
    const e = document.createElement("div");
    e.className = "empty muted";
    e.textContent = "Start a conversation: type below. It is kept in this browser.";
    nodes.push(e);
  }
  log.replaceChildren(...nodes);
  follow();
}

function renderAll() {
  renderList();
  renderLog();
  sendBtn.disabled = ui.busy;
  stopBtn.hidden = !ui.busy;
}

function follow() {
  if (ui.stick) log.scrollTop = log.scrollHeight;
}

// --- generation --------------------------------------------------------------------------
function requestBody(messages) {
  // return_progress: prompt-processing progress (not a sampling setting: defaults apply)
  const body = {messages, stream: true, stream_options: {include_usage: true},
    return_progress: true};
  const st = ui.settings;
  if (st.system && st.system.trim()) body.messages = [{role: "system", content: st.system}, ...messages];
  for (const k of store.PARAMS) {
    const v = st[k];
    if (v !== undefined && v !== null && v !== "") body[k] = Number(v);
  }
  if (ui.models.length > 1 && st.model) body.model = st.model;
  return body;
}

/**
 * Stream a reply into slot i (an assistant slot whose shown version is being written;
 * its content is the prefix the model continues). `snapshot` is the conversation before
 * this action: a refusal restores it, so a refused message never stays in the history.
 */
async function generate(conv, i, snapshot, refusedText = "", refusedImages = []) {
  const a = store.alt(conv.messages[i]);
  const messages = store.history(conv, i);
  if (a.content) messages.push({role: "assistant", content: a.content});  // continue it
  else delete a.reasoning;  // a fresh start (or a reply cut while thinking): a new trace
  ui.busy = true;
  ui.error = null;
  ui.stick = true;
  ui.controller = new AbortController();
  document.body.dataset.state = "streaming";
  delete a.finish;
  renderAll();
  const msgEl = log.querySelector(`.msg[data-index="${i}"]`);
  const body = msgEl.querySelector(".body");
  msgEl.classList.add("streaming");
  setStatus("processing prompt…");
  const t0 = performance.now();
  let tFirst = 0, pending = false, thinking = false, answering = false;
  const paint = () => {
    pending = false;
    fillBody(body, "assistant", a.content, a.reasoning);
    follow();
  };
  try {
    const r = await streamChat(requestBody(messages), {
      apiKey: ui.apiKey,
      signal: ui.controller.signal,
      onFirst: () => { tFirst = performance.now(); },
      onProgress: (p) => {
        if (!tFirst) setStatus(`processing prompt… ${p.processed}/${p.total} tokens`);
      },
      onDelta: (piece) => {
        if (!answering) { answering = true; setStatus("generating…"); }
        a.content += piece;
        if (!pending) { pending = true; requestAnimationFrame(paint); }
        save(false);
      },
      onReasoning: (piece) => {
        if (!thinking) { thinking = true; setStatus("thinking…"); }
        a.reasoning = (a.reasoning || "") + piece;  // kept with the reply (not sent back)
        if (!pending) { pending = true; requestAnimationFrame(paint); }
        save(false);
      },
    });
    const tEnd = performance.now();
    a.finish = r.finish || "stop";
    const u = r.usage || {};
    const n = u.completion_tokens;
    let tps = r.timings && r.timings.predicted_per_second;
    if (!tps && n > 1 && tFirst && tEnd > tFirst) tps = ((n - 1) * 1000) / (tEnd - tFirst);
    a.stats = {completion_tokens: n, prompt_tokens: u.prompt_tokens, tps: tps || null,
      ttft_ms: tFirst ? Math.round(tFirst - t0) : null};
    document.body.dataset.state = "done";
    setStatus("");
  } catch (e) {
    if (e.name === "AbortError") {
      a.finish = "cancelled";
      document.body.dataset.state = "cancelled";
      setStatus("request cancelled");
    } else {
      // refused: the conversation goes back to what it was before this message
      conv.messages = JSON.parse(snapshot);
      ui.error = e.message || String(e);
      document.body.dataset.state = "error";
      setStatus("");
      if (refusedText && !prompt.value) prompt.value = refusedText;
      if (refusedImages.length) attach.restore(refusedImages);
      if (e instanceof ApiError && e.status === 401) showKeyBanner();
    }
  } finally {
    ui.busy = false;
    ui.controller = null;
    conv.updated = Date.now();
    save();
    renderAll();
    prompt.focus();
  }
}

function send(text, images = []) {
  if (ui.busy || (!text.trim() && !images.length)) return;
  const conv = current();
  const snapshot = JSON.stringify(conv.messages);
  if (!conv.messages.length) conv.title = text.trim() ? store.titleFrom(text) : "Image";
  const user = store.slot("user", text, images.length ? {images} : {});
  conv.messages.push(user, store.slot("assistant", ""));
  generate(conv, conv.messages.length - 1, snapshot, text, images);
}

function stop() {
  if (ui.controller) ui.controller.abort();
}

function continueReply() {
  if (ui.busy) return;
  const conv = current();
  generate(conv, conv.messages.length - 1, JSON.stringify(conv.messages));
}

function regenerate(i) {
  if (ui.busy) return;
  const conv = current();
  const snapshot = JSON.stringify(conv.messages);
  store.branch(conv, i, {content: ""});
  generate(conv, i, snapshot);
}

function editSend(i, text) {
  if (ui.busy || !text.trim()) return;
  const conv = current();
  const snapshot = JSON.stringify(conv.messages);
  ui.editing = -1;
  const images = store.alt(conv.messages[i]).images;  // an edit changes the words only
  store.branch(conv, i, images ? {content: text, images} : {content: text});
  conv.messages.push(store.slot("assistant", ""));
  generate(conv, i + 1, snapshot);
}

function navigate(i, step) {
  if (ui.busy) return;
  const conv = current();
  store.switchAlt(conv, i, conv.messages[i].cur + step);
  save();
  renderLog();
}

// --- the server: models, defaults, API key -----------------------------------------------
function showKeyBanner() {
  $("key-banner").hidden = false;
  $("key-input").focus();
}

async function loadServerInfo() {
  try {
    const j = await getJSON("v1/models", ui.apiKey);
    $("key-banner").hidden = true;
    ui.models = (j.data || []).map((m) => m.id);
    const pick = $("model-pick"), sel = $("model-select");
    pick.hidden = ui.models.length < 2;
    sel.replaceChildren(...ui.models.map((id) => new Option(id, id)));
    if (!ui.models.includes(ui.settings.model)) ui.settings.model = ui.models[0] || "";
    sel.value = ui.settings.model;
    $("model").textContent = "model: " + (ui.settings.model || "?");
  } catch (e) {
    $("model").textContent = "model: ?";
    if (e instanceof ApiError && e.status === 401) showKeyBanner();
    else setStatus("could not list the models: " + e.message);
    return;
  }
  try {
    const q = ui.models.length > 1 ? "?model=" + encodeURIComponent(ui.settings.model) : "";
    const p = await getJSON("props" + q, ui.apiKey);
    ui.defaults = (p.default_generation_settings && p.default_generation_settings.params) || {};
    attach.setVision(Boolean(p.modalities && p.modalities.vision));
  } catch {
    ui.defaults = {};
    attach.setVision(null);
  }
}

function setApiKey(key) {
  ui.apiKey = key.trim();
  store.saveApiKey(ui.apiKey);
  return loadServerInfo();
}

// --- wiring ------------------------------------------------------------------------------
function autosize() {
  prompt.style.height = "auto";
  prompt.style.height = Math.min(prompt.scrollHeight, window.innerHeight * 0.4) + "px";
}

$("composer").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  await attach.settled();  // images still being read go with this message
  const text = prompt.value;
  if (ui.busy || (!text.trim() && !attach.count())) return;
  prompt.value = "";
  autosize();
  send(text, attach.take());
});
prompt.addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    $("composer").requestSubmit();
  }
});
prompt.addEventListener("input", autosize);
stopBtn.addEventListener("click", () => { stop(); prompt.focus(); });
document.addEventListener("keydown", (ev) => {
  if (ev.key === "Escape" && ui.busy) { ev.preventDefault(); stop(); }
});
log.addEventListener("scroll", () => {
  ui.stick = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
});
log.addEventListener("click", (ev) => {
  const b = ev.target.closest("button.copy");
  if (b) copyCode(b);
});
$("new-chat").addEventListener("click", newChat);
$("export").addEventListener("click", exportAll);
$("import").addEventListener("change", (ev) => {
  const f = ev.target.files[0];
  if (f) importFile(f);
  ev.target.value = "";
});
$("key-banner").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  await setApiKey($("key-input").value);
  $("key-input").value = "";
  prompt.focus();
});
$("model-select").addEventListener("change", (ev) => {
  ui.settings.model = ev.target.value;
  store.saveSettings(ui.settings);
  $("model").textContent = "model: " + ui.settings.model;
  loadServerInfo();
});
$("settings-btn").addEventListener("click", () => openSettings(ui));
attach.initAttach({setStatus});
initLayout();
initSettings(ui, {
  onSave: (settings, apiKey) => {
    ui.settings = settings;
    store.saveSettings(settings);
    if (apiKey !== ui.apiKey) setApiKey(apiKey);
  },
});

renderAll();
document.body.dataset.state = "idle";
loadServerInfo().finally(() => { document.body.dataset.ready = "1"; });
prompt.focus();
// ?q=... sends a message on load (links, tests)
const q = new URLSearchParams(location.search).get("q");
if (q) send(q);
