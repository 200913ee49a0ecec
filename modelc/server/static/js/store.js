// Conversations kept in the browser (localStorage), and the page's settings.
//
// A conversation is {id, title, created, updated, messages: [slot]}. A slot is one turn:
// {role, cur, alts: [{content, images, reasoning, finish, stats, tail}]}: its versions (an
// edited user message, a regenerated reply), `cur` the one shown. Switching versions
// stashes the turns after the slot in the old version's `tail` and brings back the new
// one's. `images`: a user message's attached images as data URLs (attach.js), `null` for
// one the browser had no room to keep.

const KEY = "modelc.chat.v1";
const SETTINGS = "modelc.chat.settings";
const API_KEY = "modelc.chat.apiKey";
const THEME = "modelc.chat.theme";

export const PARAMS = [
  "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_tokens", "seed",
];

function read(key, fallback) {
  try {
    const v = localStorage.getItem(key);
    return v === null ? fallback : JSON.parse(v);
  } catch {
    return fallback;
  }
}

function write(key, value, replacer = undefined) {
  try {
    if (value === null || value === undefined) localStorage.removeItem(key);
    else localStorage.setItem(key, JSON.stringify(value, replacer));
    return true;
  } catch (e) {
    console.warn("modelc chat: could not save", key, e);
    return false;
  }
}

export const uid = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);

export function newConversation() {
  const now = Date.now();
  return {id: uid(), title: "New chat", created: now, updated: now, messages: []};
}

export function slot(role, content, extra = {}) {
  return {role, cur: 0, alts: [{content, ...extra}]};
}

export const alt = (s) => s.alts[s.cur];

/** Add a version to slot i and show it; the turns after i are kept with the old version. */
export function branch(conv, i, version) {
  const s = conv.messages[i];
  alt(s).tail = conv.messages.splice(i + 1);
  s.alts.push(version);
  s.cur = s.alts.length - 1;
}

/** Show version k of slot i (with the turns that followed it). */
export function switchAlt(conv, i, k) {
  const s = conv.messages[i];
  if (k < 0 || k >= s.alts.length || k === s.cur) return;
  alt(s).tail = conv.messages.splice(i + 1);
  s.cur = k;
  conv.messages.push(...(alt(s).tail || []));
  delete alt(s).tail;
}

/** The messages sent to the model: shown versions, empty (cancelled) replies left out;
 * a reply's thinking trace stays in the page (templates drop earlier turns' traces). */
export function history(conv, upto = conv.messages.length) {
  return conv.messages
    .slice(0, upto)
    .map((s) => ({role: s.role, content: content(alt(s))}))
    .filter((m) => !(m.role === "assistant" && m.content === ""));
}

/** A version's content as sent: its text, or its images (OpenAI `image_url` parts) then
 * its text. */
function content(a) {
  const images = (a.images || []).filter(Boolean);
  if (!images.length) return a.content;
  const parts = images.map((url) => ({type: "image_url", image_url: {url}}));
  return a.content ? [...parts, {type: "text", text: a.content}] : parts;
}

export function loadState() {
  const s = read(KEY, null);
  if (s && Array.isArray(s.conversations)) return s;
  return {conversations: [], current: null};
}

/** Save the conversations; false when they do not fit the browser's storage with their
 * images: then they are saved without the images' data (this session still shows them). */
export function saveState(s) {
  if (write(KEY, s)) return true;
  write(KEY, s, (k, v) => (k === "images" && Array.isArray(v) ? v.map(() => null) : v));
  return false;
}
export const loadSettings = () => ({system: "", ...read(SETTINGS, {})});
export const saveSettings = (s) => write(SETTINGS, s);
export const loadApiKey = () => read(API_KEY, "") || "";
export const saveApiKey = (k) => write(API_KEY, k || null);
export const loadTheme = () => read(THEME, null);
export const saveTheme = (t) => {
  // stored raw (the inline script in chat.html reads it before the modules load)
  try {
    localStorage.setItem(THEME, t);
  } catch { /* private mode */ }
};

// --- export / import ---------------------------------------------------------------------
export function exportJSON(conversations) {
  return JSON.stringify({format: "modelc-chat", version: 1, conversations}, null, 2);
}

function validStats(st) {
  const out = {};
  for (const k of ["completion_tokens", "prompt_tokens", "tps", "ttft_ms"]) {
    if (typeof st[k] === "number" && Number.isFinite(st[k])) out[k] = st[k];
  }
  return out;
}

function validImages(images) {
  if (!Array.isArray(images)) return {};
  const ok = images.filter((u) => typeof u === "string" && u.startsWith("data:image/"));
  return ok.length ? {images: ok} : {};
}

function validSlot(s) {
  if (!s || typeof s !== "object" || !["user", "assistant", "system"].includes(s.role)) return null;
  if (Array.isArray(s.alts)) {
    const alts = s.alts.filter((a) => a && typeof a.content === "string").map((a) => ({
      content: a.content,
      ...(validImages(a.images)),
      ...(typeof a.reasoning === "string" && a.reasoning ? {reasoning: a.reasoning} : {}),
      ...(typeof a.finish === "string" ? {finish: a.finish} : {}),
      ...(a.stats && typeof a.stats === "object" ? {stats: validStats(a.stats)} : {}),
      ...(Array.isArray(a.tail) ? {tail: a.tail.map(validSlot).filter(Boolean)} : {}),
    }));
    if (!alts.length) return null;
    const cur = Number.isInteger(s.cur) && s.cur >= 0 && s.cur < alts.length ? s.cur : 0;
    return {role: s.role, cur, alts};
  }
  if (typeof s.content === "string") return slot(s.role, s.content);  // an OpenAI message
  return null;
}

function validConversation(c) {
  const msgs = Array.isArray(c) ? c : c && Array.isArray(c.messages) ? c.messages : null;
  if (!msgs) return null;
  const conv = newConversation();
  if (!Array.isArray(c) && typeof c.title === "string" && c.title) conv.title = c.title.slice(0, 200);
  conv.messages = msgs.map(validSlot).filter(Boolean);
  if (conv.title === "New chat") {
    const first = conv.messages.find((s) => s.role === "user");
    if (first) conv.title = titleFrom(alt(first).content);
  }
  return conv;
}

/** Conversations from an exported file, one conversation, or an OpenAI messages array. */
export function importJSON(text) {
  const data = JSON.parse(text);
  let items;
  if (data && Array.isArray(data.conversations)) items = data.conversations;
  else if (Array.isArray(data) && data.length && data.every((m) => m && "role" in m)) items = [data];
  else if (Array.isArray(data)) items = data;
  else items = [data];
  const out = items.map(validConversation).filter(Boolean);
  if (!out.length) throw new Error("no conversation found in the file");
  return out;
}

export function titleFrom(text) {
  const t = text.replace(/\s+/g, " ").trim();
  return t.length > 48 ? t.slice(0, 47) + "…" : t || "New chat";
}
