// The settings dialog: system prompt, sampling parameters (empty: not sent), API key.
import {PARAMS} from "./store.js";

const dialog = () => document.getElementById("settings");
const form = () => document.getElementById("settings-form");
// the /props names of the defaults shown as placeholders
const DEFAULT_NAME = {repetition_penalty: "repeat_penalty"};

export function openSettings(ui) {
  const f = form();
  f.elements.system.value = ui.settings.system || "";
  for (const k of PARAMS) {
    const input = f.elements[k];
    const v = ui.settings[k];
    input.value = v === undefined || v === null ? "" : String(v);
    const d = (ui.defaults || {})[DEFAULT_NAME[k] || k];
    if (d !== undefined && d !== null) input.placeholder = String(d);
  }
  f.elements.apiKey.value = ui.apiKey || "";
  dialog().returnValue = "";
  dialog().showModal();
  f.elements.system.focus();
}

export function initSettings(ui, {onSave}) {
  const d = dialog(), f = form();
  document.getElementById("settings-reset").addEventListener("click", () => {
    for (const k of PARAMS) f.elements[k].value = "";
  });
  // saved on the form's submit (before the dialog closes), not on its close event: close is
  // queued as a task, and a message sent at once after Save could go out with the old settings
  f.addEventListener("submit", (ev) => {
    if (!ev.submitter || ev.submitter.value !== "save") return;
    const settings = {model: ui.settings.model, system: f.elements.system.value};
    for (const k of PARAMS) {
      const v = f.elements[k].value.trim();
      if (v !== "" && Number.isFinite(Number(v))) settings[k] = Number(v);
    }
    onSave(settings, f.elements.apiKey.value.trim());
  });
  d.addEventListener("close", () => {
    if (d.returnValue === "save") document.getElementById("prompt").focus();
  });
  // Enter in a field saves (the form's own default would be its first button: Cancel)
  f.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && ev.target.tagName === "INPUT" && !ev.isComposing) {
      ev.preventDefault();
      f.requestSubmit(document.getElementById("settings-save"));
    }
  });
}
