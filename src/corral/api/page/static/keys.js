// The "Keys and usage" panel: keys (GET /keys, create with POST /keys: the secret shown once,
// revoke with DELETE /keys/{name}), usage per key and model over a window (GET /usage?since=)
// as a table and a chart of tokens per day, and who is running and queued now (GET /usage/now).
// A key without the admin scope sees its own usage only (the server decides; GET /keys is 403).
(function () {
  "use strict";
  const C = window.corral;
  const el = C.el;
  const $ = (id) => document.getElementById(id);

  function showError(message) {
    const box = $("keys-error");
    box.textContent = message;
    box.hidden = !message;
  }
  function limits(k) {
    return ["rpm", "tpm", "tpd", "concurrency", "queue"].filter((f) => k[f] !== null && k[f] !== undefined)
      .map((f) => f + " " + k[f]).join(", ") || "none";
  }
  function when(epoch) {
    if (!epoch) return "not since start";
    return C.duration(Date.now() / 1000 - epoch) + " ago";
  }

  // ------------------------------------------------------------------ keys
  async function loadKeys() {
    const box = $("keys-list");
    try {
      const r = await C.api("GET", "/keys");
      $("keys-admin").hidden = false;
      $("keys-own").hidden = true;
      $("key-create").hidden = !r.keys_file;
      $("keys-nofile").hidden = !!r.keys_file;
      box.replaceChildren(el("div", { class: "table-wrap" }, el("table", { class: "keys-table" },
        el("thead", {}, el("tr", {}, ["Name", "Scopes", "Models", "Limits", "Created", "Last used", ""].map((h) => el("th", {}, h)))),
        el("tbody", {}, r.data.map(keyRow)))));
    } catch (e) {
      if (e instanceof C.AuthError) return;
      if (e.status === 403) { // an infer or manage key: its own usage only
        $("keys-admin").hidden = true;
        $("keys-own").hidden = false;
        return;
      }
      showError("Could not list the keys: " + e.message);
    }
  }

  function keyRow(k) {
    const revoke = k.editable === false ? el("span", { class: "muted small" }, "--api-key")
      : el("button", { type: "button", class: "small danger", "aria-label": "revoke key " + k.name, onclick: () => revokeKey(k.name) }, "Revoke");
    return el("tr", { "data-key": k.name },
      el("td", {}, el("strong", {}, k.name), k.prefix ? el("div", { class: "model-sub mono" }, k.prefix + "…") : null),
      el("td", {}, (k.scopes || []).join(", ")),
      el("td", {}, (k.models || []).length ? k.models.join(", ") : "every model"),
      el("td", {}, limits(k)),
      el("td", { class: "num" }, (k.created || "–").slice(0, 10)),
      el("td", { class: "num" }, when(k.last_used)),
      el("td", {}, revoke));
  }

  async function revokeKey(name) {
    if (!window.confirm("Revoke key " + name + "? Requests with it are refused from now on.")) return;
    showError("");
    try {
      await C.api("DELETE", "/keys/" + encodeURIComponent(name));
      loadKeys();
    } catch (e) { if (!(e instanceof C.AuthError)) showError("Revoke failed: " + e.message); }
  }

  async function createKey(ev) {
    ev.preventDefault();
    showError("");
    const f = ev.target;
    const body = { name: f.elements["key-name"].value.trim(),
      scopes: [...f.querySelectorAll("input[name=key-scope]:checked")].map((x) => x.value),
      models: f.elements["key-models"].value.split(",").map((s) => s.trim()).filter(Boolean) };
    for (const lim of ["rpm", "tpm", "tpd", "concurrency", "queue"]) {
      const v = f.elements["key-" + lim].value.trim();
      if (v !== "") body[lim] = Number(v);
    }
    try {
      const r = await C.api("POST", "/keys", body);
      f.reset();
      const box = $("key-secret");
      box.replaceChildren(
        el("p", {}, el("strong", {}, "Key " + r.name + " created."), " Its secret is shown this once: copy it now."),
        el("input", { id: "key-secret-value", class: "mono", readonly: true, value: r.secret, "aria-label": "the new key's secret" }),
        el("button", { type: "button", class: "small ghost", onclick: () => { box.hidden = true; box.replaceChildren(); } }, "Done"));
      box.hidden = false;
      $("key-secret-value").select();
      loadKeys();
    } catch (e) { if (!(e instanceof C.AuthError)) showError("Create failed: " + e.message); }
  }

  // ------------------------------------------------------------------ usage
  const COLS = [["requests", "Requests"], ["prompt_tokens", "Prompt"], ["completion_tokens", "Generated"],
    ["cached_tokens", "Cached"], ["queue_ms", "Queue s"], ["limited", "429s"], ["unavailable", "503s"]];

  function since(days) {
    const d = new Date(Date.now() - (days - 1) * 86400000);
    return d.toISOString().slice(0, 10);
  }

  async function loadUsage() {
    const days = Number($("usage-window").value || 7);
    let rows;
    try {
      rows = (await C.api("GET", "/usage?since=" + since(days))).data || [];
    } catch (e) {
      if (!(e instanceof C.AuthError)) showError("Could not read the usage: " + e.message);
      return;
    }
    const by = new Map();
    for (const r of rows) {
      const k = r.key + "\u0000" + r.model;
      const acc = by.get(k) || { key: r.key, model: r.model };
      for (const [f] of COLS) acc[f] = (acc[f] || 0) + (r[f] || 0);
      by.set(k, acc);
    }
    const list = [...by.values()].sort((a, b) => (b.prompt_tokens + b.completion_tokens) - (a.prompt_tokens + a.completion_tokens));
    $("usage-table").replaceChildren(list.length ? el("div", { class: "table-wrap" }, el("table", { class: "usage-table" },
      el("thead", {}, el("tr", {}, el("th", {}, "Key"), el("th", {}, "Model"), COLS.map(([, h]) => el("th", { class: "num" }, h)))),
      el("tbody", {}, list.map((r) => el("tr", { "data-key": r.key, "data-model": r.model }, el("td", {}, r.key), el("td", { class: "mono small" }, r.model),
        COLS.map(([f]) => el("td", { class: "num", "data-col": f }, f === "queue_ms" ? (r[f] / 1000).toFixed(1) : String(r[f])))))))) :
      el("p", { class: "muted small" }, "No usage in this window."));
    chart(rows, days);
  }

  // tokens (prompt + generated) per day, one column a day: divs, so it follows the theme
  function chart(rows, days) {
    const per = new Map();
    for (let i = days - 1; i >= 0; i--) per.set(new Date(Date.now() - i * 86400000).toISOString().slice(0, 10), 0);
    for (const r of rows) if (per.has(r.day)) per.set(r.day, per.get(r.day) + r.prompt_tokens + r.completion_tokens);
    const max = Math.max(1, ...per.values());
    const total = [...per.values()].reduce((a, b) => a + b, 0);
    $("usage-chart").replaceChildren(el("div", { class: "bars", role: "img", "aria-label": "tokens per day: " + total + " in " + days + " days" },
      [...per.entries()].map(([day, v]) => {
        const bar = el("div", { class: "bar", title: day + ": " + v + " tokens" }, el("div", {}));
        bar.firstChild.style.height = (100 * v / max).toFixed(1) + "%";
        return bar;
      })), el("div", { class: "model-sub" }, total + " tokens in " + days + (days === 1 ? " day" : " days")));
  }

  async function loadNow() {
    try {
      const rows = (await C.api("GET", "/usage/now")).data || [];
      $("usage-now").replaceChildren(rows.length ? el("ul", { class: "now-list" }, rows.map((r) =>
        el("li", { "data-key": r.key }, el("strong", {}, r.key), " · ", el("span", { class: "mono" }, r.model),
          " · running " + r.running + " · queued " + r.queued)))
        : el("p", { class: "muted small" }, "Nobody is running or queued now."));
    } catch (e) { /* shown by the other parts */ }
  }

  function refresh() {
    loadKeys();
    loadUsage();
    loadNow();
  }
  C.refreshKeys = refresh;

  document.addEventListener("DOMContentLoaded", function () {
    $("key-create").addEventListener("submit", createKey);
    $("usage-window").addEventListener("change", loadUsage);
    $("usage-refresh").addEventListener("click", refresh);
    refresh();
    setInterval(function () {
      if (document.visibilityState === "visible" && $("key-panel").hidden) loadNow();
    }, 3000);
  });
})();
