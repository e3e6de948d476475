// The downloads panel: start a pull, follow its events (progress, rate, ETA), cancel it.
(function () {
  "use strict";
  const C = window.corral;
  const el = C.el;
  const downloads = (C.downloads = new Map()); // pull_id -> {model, source, state, done, total, rate_bps, eta_s, reason}

  function upsert(pullId, fields) {
    const d = downloads.get(pullId) || { pull_id: pullId, state: "downloading", done: 0, total: null, rate_bps: 0, eta_s: null };
    Object.assign(d, fields);
    downloads.set(pullId, d);
    return d;
  }

  C.onDownloadEvent = function (ev) {
    const id = ev.pull_id;
    if (!id) return;
    const name = ev.event;
    if (name === "download_started") upsert(id, { model: ev.model, source: ev.source, total: ev.total, state: "downloading" });
    else if (name === "download_progress") upsert(id, { model: ev.model, done: ev.done, total: ev.total, rate_bps: ev.rate_bps, eta_s: ev.eta_s });
    else if (name === "download_finished") upsert(id, { model: ev.model, state: "finished", done: ev.size, total: ev.size, path: ev.path });
    else if (name === "download_failed") upsert(id, { model: ev.model, state: "failed", reason: ev.reason });
    else if (name === "download_cancelled") upsert(id, { model: ev.model, state: "cancelled", done: ev.done });
    render();
  };

  // Downloads already running when the page opened show up in GET /models.
  C.syncDownloads = function (models) {
    let changed = false;
    for (const m of models) {
      const p = m.status && m.status.value === "downloading" && m.status.progress;
      if (p && p.pull_id && !downloads.has(p.pull_id)) {
        upsert(p.pull_id, { model: m.id, source: m.source, done: p.done, total: p.total, rate_bps: p.rate_bps, eta_s: p.eta_s });
        changed = true;
      }
    }
    if (changed) render();
  };

  async function cancel(d) {
    d.cancelling = true;
    render();
    try { await C.api("DELETE", "/models/pull/" + C.ids(d.pull_id)); }
    catch (e) { if (!(e instanceof C.AuthError)) d.reason = "cancel failed: " + e.message; }
    d.cancelling = false;
    render();
  }

  function item(d) {
    const pct = d.total ? Math.min(100, (100 * d.done) / d.total) : null;
    const bar = el("div", { class: "progress" + (pct === null && d.state === "downloading" ? " indeterminate" : "") }, el("div", {}));
    bar.firstChild.style.width = (pct === null ? (d.state === "finished" ? 100 : 0) : pct).toFixed(1) + "%";
    let line;
    if (d.state === "downloading") {
      line = C.bytes(d.done) + (d.total ? " of " + C.bytes(d.total) + " · " + Math.floor(pct) + "%" : "") +
        " · " + C.bytes(d.rate_bps || 0) + "/s · ETA " + C.duration(d.eta_s);
    } else if (d.state === "finished") line = "done · " + C.bytes(d.total) + (d.path ? " · " + d.path : "");
    else if (d.state === "cancelled") line = "cancelled · " + C.bytes(d.done) + " kept (pull again to resume)";
    else line = "failed";
    return el("div", { class: "download " + d.state, "data-pull": d.pull_id, "data-state": d.state },
      el("div", { class: "row" },
        el("strong", { class: "download-id" }, d.model || d.source || d.pull_id),
        d.state === "downloading"
          ? el("button", { type: "button", class: "small danger", disabled: !!d.cancelling, onclick: () => cancel(d) }, d.cancelling ? "Cancelling…" : "Cancel")
          : el("span", { class: "status " + (d.state === "finished" ? "loaded" : d.state === "failed" ? "failed" : "unloaded") }, d.state)),
      d.source ? el("div", { class: "model-sub mono" }, d.source) : null,
      bar,
      el("div", { class: "model-sub dl-line" }, line),
      d.reason ? el("p", { class: "error dl-reason" }, d.reason) : null);
  }

  // A pull started here or by the search panel (hub.js): POST /models/pull's answer.
  C.trackPull = function (r, source) {
    const d = downloads.get(r.id) || upsert(r.id, { model: r.model, source: r.source || source, total: r.total, done: r.done || 0 });
    if (r.status === "failed") { d.state = "failed"; d.reason = r.reason; }
    render();
    return d;
  };

  function render() {
    const box = document.getElementById("downloads");
    const list = [...downloads.values()].reverse();
    box.replaceChildren(...(list.length ? list.map(item) : [el("p", { class: "muted small" }, "No downloads yet.")]));
  }

  document.addEventListener("DOMContentLoaded", function () {
    render();
    document.getElementById("pull-form").addEventListener("submit", async function (e) {
      e.preventDefault();
      const input = document.getElementById("pull-source"), btn = document.getElementById("pull-button");
      const errBox = document.getElementById("pull-error");
      const source = input.value.trim();
      if (!source) return;
      errBox.hidden = true;
      btn.disabled = true;
      try {
        const r = await C.api("POST", "/models/pull", { model: source });
        C.trackPull(r, source);
        input.value = "";
      } catch (err) {
        if (!(err instanceof C.AuthError)) { errBox.textContent = "Pull failed: " + err.message; errBox.hidden = false; }
      } finally { btn.disabled = false; }
    });
  });
})();
