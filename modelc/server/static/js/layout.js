// The page's theme (light or dark: the stored choice, else the system's) and the phone
// layout's conversation list (behind the ☰ button).
import * as store from "./store.js";

const $ = (id) => document.getElementById(id);

function applyTheme(theme) {
  document.documentElement.dataset.theme = theme;
  $("hljs-light").disabled = theme === "dark";
  $("hljs-dark").disabled = theme !== "dark";
  $("theme").setAttribute("aria-pressed", String(theme === "dark"));
}

export function closeSidebar() {
  document.body.classList.remove("side-open");
  $("menu").setAttribute("aria-expanded", "false");
  $("scrim").hidden = true;
}

export function initLayout() {
  $("menu").addEventListener("click", () => {
    const open = !document.body.classList.contains("side-open");
    document.body.classList.toggle("side-open", open);
    $("menu").setAttribute("aria-expanded", String(open));
    $("scrim").hidden = !open;
  });
  $("scrim").addEventListener("click", closeSidebar);
  $("theme").addEventListener("click", () => {
    const t = document.documentElement.dataset.theme === "dark" ? "light" : "dark";
    store.saveTheme(t);
    applyTheme(t);
  });
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", (ev) => {
    if (!store.loadTheme()) applyTheme(ev.matches ? "dark" : "light");
  });
  applyTheme(document.documentElement.dataset.theme || "light");
}
