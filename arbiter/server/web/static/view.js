// kube-arbiter web view: live counts from /view/events, and the sign-in form.
"use strict";

function cells() {
  // queue name -> {waiting, admitted, share} elements on this page
  const found = new Map();
  for (const row of document.querySelectorAll("[data-q]")) {
    const parts = {};
    for (const cell of row.querySelectorAll("[data-k]")) parts[cell.dataset.k] = cell;
    found.set(row.dataset.q, parts);
  }
  return found;
}

function follow() {
  const url = document.body.dataset.events;
  const live = document.getElementById("live");
  if (!url || !window.EventSource) return;
  const shown = cells();
  if (shown.size === 0) return;
  const source = new EventSource(url);
  source.onopen = () => { live.textContent = "●"; live.classList.add("on"); };
  source.onerror = () => { live.textContent = "○"; live.classList.remove("on"); };
  source.onmessage = (event) => {
    const message = JSON.parse(event.data);
    for (const [name, [waiting, admitted, share]] of Object.entries(message.queues || {})) {
      const parts = shown.get(name);
      if (!parts) continue;
      set(parts.waiting, String(waiting));
      set(parts.admitted, String(admitted));
      set(parts.share, (100 * share).toFixed(1) + "%");
    }
  };
}

function set(cell, text) {
  if (!cell || cell.textContent === text) return;
  cell.textContent = text;
  cell.classList.remove("changed");
  void cell.offsetWidth;  // restart the highlight
  cell.classList.add("changed");
}

function signIn() {
  const form = document.getElementById("login");
  if (!form) return;
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const token = form.elements.token.value.trim();
    const secure = location.protocol === "https:" ? "; Secure" : "";
    document.cookie = "arbiter-view-token=" + encodeURIComponent(token) +
      "; path=/view/; SameSite=Strict" + secure;
    location.reload();
  });
}

document.addEventListener("DOMContentLoaded", () => { signIn(); follow(); });
