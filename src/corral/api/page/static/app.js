// corral's page: API key, the live event stream, the data routes. No framework, no build.
// The other scripts (models.js, downloads.js, chat.js) hang their parts on window.corral.
(function () {
  "use strict";
  const KEY_STORE = "corral.apiKey";
  const C = (window.corral = window.corral || {});
  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ helpers
  C.el = function el(tag, attrs, ...children) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") n.className = v;
      else if (k === "text") n.textContent = v;
      else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
      else if (k === "dataset") Object.assign(n.dataset, v);
      else n.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      n.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return n;
  };
  C.bytes = function (n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0, v = Number(n);
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : 1)) + " " + units[i];
  };
  C.duration = function (s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + " s";
    const m = Math.floor(s / 60), r = s % 60;
    if (m < 60) return m + " min " + String(r).padStart(2, "0") + " s";
    return Math.floor(m / 60) + " h " + String(m % 60).padStart(2, "0") + " min";
  };
  C.ids = (id) => encodeURIComponent(id);

  // ------------------------------------------------------------------ API key
  C.key = () => localStorage.getItem(KEY_STORE) || "";
  class AuthError extends Error {}
  C.AuthError = AuthError;

  function showKeyPanel(message, bad) {
    const panel = $("key-panel"), msg = $("key-message");
    msg.textContent = message;
    msg.classList.toggle("bad", !!bad);
    panel.hidden = false;
    $("key-input").value = "";
    $("key-input").focus();
  }
  C.authFailed = function () {
    setConn("API key needed", "bad");
    if (C.key()) showKeyPanel("The API key was refused (401): wrong key. Enter the server's key.", true);
    else showKeyPanel("This server needs an API key.", false);
  };

  C.headers = function (extra) {
    const h = Object.assign({}, extra || {});
    const k = C.key();
    if (k) h["Authorization"] = "Bearer " + k;
    return h;
  };

  // fetch + JSON with the key; throws Error(message) on an error body, AuthError on 401.
  C.api = async function (method, path, body, opts) {
    const init = { method: method, headers: C.headers(), signal: opts && opts.signal };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    if (r.status === 401) { C.authFailed(); throw new AuthError("wrong or missing API key"); }
    if (opts && opts.raw) return r;
    let data = null;
    try { data = await r.json(); } catch (e) { data = null; }
    if (!r.ok) {
      const m = data && data.error && data.error.message ? data.error.message : "HTTP " + r.status;
      const err = new Error(m);
      err.status = r.status;
      throw err;
    }
    return data;
  };

  // ------------------------------------------------------------------ connection pill
  function setConn(text, kind) {
    const p = $("conn");
    p.textContent = text;
    p.className = "pill " + (kind === "ok" ? "pill-ok" : kind === "bad" ? "pill-bad" : "pill-wait");
  }
  C.setConn = setConn;

  // ------------------------------------------------------------------ events (fetch, not EventSource)
  let eventsAbort = null;
  let eventsGeneration = 0;
  async function runEvents() {
    const gen = ++eventsGeneration;
    if (eventsAbort) eventsAbort.abort();
    let backoff = 1000;
    while (gen === eventsGeneration) {
      const ctl = (eventsAbort = new AbortController());
      try {
        const r = await fetch("/models/events", { headers: C.headers(), signal: ctl.signal, cache: "no-store" });
        if (r.status === 401) { C.authFailed(); return; }
        if (!r.ok || !r.body) throw new Error("HTTP " + r.status);
        setConn("live", "ok");
        backoff = 1000;
        C.refreshModels();
        const reader = r.body.getReader();
        const dec = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, cut);
            buf = buf.slice(cut + 2);
            const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
            if (!data) continue;
            try { onEvent(JSON.parse(data)); } catch (e) { console.warn("bad event", e); }
          }
        }
        throw new Error("the server closed the event stream");
      } catch (e) {
        if (gen !== eventsGeneration) return;
        setConn("reconnecting…", "wait");
        await new Promise((res) => setTimeout(res, backoff));
        backoff = Math.min(backoff * 2, 10000);
      }
    }
  }

  function onEvent(ev) {
    const name = ev.event;
    if (name && name.startsWith("download_") && C.onDownloadEvent) C.onDownloadEvent(ev);
    if (name === "download_progress") { if (C.renderModels) C.renderModels(); return; }
    C.refreshModels();
  }

  // ------------------------------------------------------------------ models (GET /models on events)
  C.models = [];
  let refreshTimer = null, refreshing = false, again = false;
  C.refreshModels = function () {
    if (refreshTimer) return;
    refreshTimer = setTimeout(doRefresh, 60);
  };
  async function doRefresh() {
    refreshTimer = null;
    if (refreshing) { again = true; return; }
    refreshing = true;
    try {
      const data = await C.api("GET", "/models");
      C.models = data.data || [];
      $("models-error").hidden = true;
      if (C.renderModels) C.renderModels();
      if (C.updateChatModels) C.updateChatModels();
      if (C.syncDownloads) C.syncDownloads(C.models);
    } catch (e) {
      if (!(e instanceof AuthError)) { $("models-error").textContent = "Could not list models: " + e.message; $("models-error").hidden = false; }
    } finally {
      refreshing = false;
      if (again) { again = false; C.refreshModels(); }
    }
  }

  // ------------------------------------------------------------------ live numbers (GET /stats)
  C.stats = { models: {}, interval_s: 2 };
  async function pollStats() {
    if (document.visibilityState === "visible" && $("key-panel").hidden) {
      try {
        C.stats = await C.api("GET", "/stats");
        if (C.renderCharts) C.renderCharts();
      } catch (e) { /* shown by the models panel / key panel */ }
    }
    setTimeout(pollStats, Math.max(1000, (C.stats.interval_s || 2) * 1000));
  }

  // ------------------------------------------------------------------ boot
  function start() {
    runEvents();
  }
  document.addEventListener("DOMContentLoaded", function () {
    $("key-form").addEventListener("submit", function (e) {
      e.preventDefault();
      const v = $("key-input").value.trim();
      if (v) localStorage.setItem(KEY_STORE, v); else localStorage.removeItem(KEY_STORE);
      $("key-panel").hidden = true;
      start();
      if (C.refreshKeys) C.refreshKeys();
    });
    $("key-button").addEventListener("click", () => showKeyPanel(C.key() ? "Change the API key." : "Set an API key.", false));
    $("key-cancel").addEventListener("click", () => { $("key-panel").hidden = true; });
    start();
    pollStats();
  });
})();
