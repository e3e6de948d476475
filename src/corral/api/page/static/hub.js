// The "Find a model" panel: search the Hub (GET /hub/search), open a repo (GET /hub/repo), each
// quantization's fit on this server (GET /hub/fit, one at a time), one click pulls it (POST
// /models/pull) and the downloads panel follows it. And the fit estimate on a model card
// (GET /models/fit), asked for once per model while it is not loaded.
(function () {
  "use strict";
  const C = window.corral;
  const el = C.el;
  const $ = (id) => document.getElementById(id);
  const MAX_QUERY = 200;
  let searchCtl = null, repoCtl = null;

  const VERDICT = { gpu: "fits on the GPU", partial: "partly offloaded", host: "host RAM only", none: "does not fit" };
  C.fitBadge = function (fit) {
    if (!fit) return el("span", { class: "fit fit-wait" }, "checking fit…");
    if (fit.error) return el("span", { class: "fit fit-error", title: fit.error }, "fit unknown");
    return el("span", { class: "fit fit-" + fit.verdict, "data-verdict": fit.verdict, title: fit.summary },
      VERDICT[fit.verdict] || fit.verdict);
  };

  function date(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return isNaN(d) ? "–" : d.toISOString().slice(0, 10);
  }
  function count(n) {
    n = Number(n || 0);
    return n >= 1e6 ? (n / 1e6).toFixed(1) + "M" : n >= 1e3 ? (n / 1e3).toFixed(1) + "k" : String(n);
  }
  function showError(box, message) {
    box.textContent = message;
    box.hidden = false;
  }

  async function search(text) {
    const box = $("hub-results"), err = $("hub-error");
    err.hidden = true;
    if (text.length > MAX_QUERY) { showError(err, "The search text is too long (at most " + MAX_QUERY + " characters)."); return; }
    if (searchCtl) searchCtl.abort();
    const ctl = (searchCtl = new AbortController());
    box.replaceChildren(el("p", { class: "muted small" }, "Searching the Hub…"));
    $("hub-repo").hidden = true;
    try {
      const r = await C.api("GET", "/hub/search?q=" + encodeURIComponent(text), undefined, { signal: ctl.signal });
      const hits = r.data || [];
      box.replaceChildren(hits.length ? el("ul", { class: "hub-list" }, hits.map(hit))
        : el("p", { class: "muted small" }, "No GGUF repositories match “" + text + "”."));
    } catch (e) {
      if (ctl.signal.aborted || e instanceof C.AuthError) return;
      box.replaceChildren();
      showError(err, "Search failed: " + e.message);
    }
  }

  function hit(h) {
    return el("li", { class: "hub-hit", "data-repo": h.id },
      el("button", { type: "button", class: "linkish hub-open", onclick: () => openRepo(h.id) }, h.id),
      el("span", { class: "hub-facts small muted" },
        el("span", { title: "downloads (30 days)" }, "↓ " + count(h.downloads)),
        el("span", { title: "likes" }, "♥ " + count(h.likes)),
        el("span", { title: "last updated" }, date(h.updated)),
        el("span", { class: "hub-license" }, h.license || "no license given"),
        h.projector ? el("span", { class: "pill hub-projector", title: "has a projector (image or audio input)" }, "vision/audio") : null,
        el("span", {}, h.gguf_files + " GGUF files")));
  }

  async function openRepo(repo) {
    const panel = $("hub-repo"), err = $("hub-error");
    err.hidden = true;
    if (repoCtl) repoCtl.abort();
    const ctl = (repoCtl = new AbortController());
    panel.hidden = false;
    $("hub-repo-title").textContent = repo;
    const body = $("hub-quants");
    body.replaceChildren(el("p", { class: "muted small" }, "Listing its files…"));
    try {
      const r = await C.api("GET", "/hub/repo?repo=" + encodeURIComponent(repo), undefined, { signal: ctl.signal });
      const notes = [];
      if (r.truncated) notes.push("This repository has more files than are listed (the first " + r.files + ").");
      if (!r.quants.length) notes.push("No GGUF model files here.");
      const rows = r.quants.map((q) => quantRow(repo, q));
      body.replaceChildren(
        ...notes.map((n) => el("p", { class: "hint" }, n)),
        r.quants.length ? el("div", { class: "table-wrap" }, el("table", { class: "quants" },
          el("thead", {}, el("tr", {}, el("th", {}, "Quantization"), el("th", {}, "Size"), el("th", {}, "Fit on this server"), el("th", {}, ""))),
          el("tbody", {}, rows.map((x) => x.tr)))) : null);
      $("hub-repo-title").focus();
      for (const x of rows) {  // one header read at a time: a repo of 30 quantizations does not ask 30 at once
        if (ctl.signal.aborted) return;
        await x.fit(ctl.signal);
      }
    } catch (e) {
      if (ctl.signal.aborted || e instanceof C.AuthError) return;
      body.replaceChildren();
      showError(err, "Could not open " + repo + ": " + e.message);
    }
  }

  function quantRow(repo, q) {
    const fitCell = el("td", { class: "fit-cell" }, C.fitBadge(null));
    const pullBtn = q.source
      ? el("button", { type: "button", class: "small", title: "pull " + q.source }, "Pull")
      : el("span", { class: "muted small", title: "split models are not pulled yet: merge the parts with llama-gguf-split and put the file in the models dir" }, "split: not pullable yet");
    if (q.source) pullBtn.addEventListener("click", () => pull(q, pullBtn));
    const what = el("td", {},
      el("strong", {}, q.tag),
      q.split ? el("span", { class: "pill", title: q.files.join("\n") }, "split, " + q.files.length + " parts") : null,
      q.projector ? el("div", { class: "model-sub mono" }, "+ " + q.projector + " (" + C.bytes(q.projector_size) + ")") : null);
    const tr = el("tr", { "data-tag": q.tag, "data-file": q.files[0] }, what, el("td", { class: "num" }, C.bytes(q.size)), fitCell, el("td", {}, pullBtn));
    async function fit(signal) {
      let f;
      try {
        f = await C.api("GET", "/hub/fit?repo=" + encodeURIComponent(repo) + "&file=" + encodeURIComponent(q.files[0]) +
          (q.projector ? "&projector=" + encodeURIComponent(q.projector) : ""), undefined, { signal: signal });
      } catch (e) {
        if (signal.aborted || e instanceof C.AuthError) return;
        f = { error: e.message };
      }
      fitCell.replaceChildren(C.fitBadge(f), el("div", { class: "model-sub fit-summary" }, f.error || f.summary));
    }
    return { tr: tr, fit: fit };
  }

  async function pull(q, btn) {
    btn.disabled = true;
    const err = $("hub-error");
    err.hidden = true;
    try {
      const r = await C.api("POST", "/models/pull", { model: q.source });
      if (C.trackPull) C.trackPull(r, q.source);
      btn.textContent = "Pulling";
    } catch (e) {
      btn.disabled = false;
      if (!(e instanceof C.AuthError)) showError(err, "Pull failed: " + e.message);
    }
  }

  // ------------------------------------------------------------------ model cards: fit before load
  const cardFits = new Map(); // model id -> estimate (or {error}), asked once
  C.cardFit = function (m) {
    if (m.status && m.status.value !== "unloaded") return null;
    const have = cardFits.get(m.id);
    if (have === undefined) {
      cardFits.set(m.id, null);
      C.api("GET", "/models/fit?model=" + encodeURIComponent(m.id))
        .then((f) => cardFits.set(m.id, f), (e) => cardFits.set(m.id, { error: e.message }))
        .then(() => { if (C.renderModels) C.renderModels(); });
    }
    const f = cardFits.get(m.id);
    return el("div", { class: "card-fit model-sub" }, C.fitBadge(f), f && !f.error ? " " + f.summary : "");
  };

  document.addEventListener("DOMContentLoaded", function () {
    $("hub-form").addEventListener("submit", function (e) {
      e.preventDefault();
      const text = $("hub-q").value.trim();
      if (text) search(text);
    });
    $("hub-close").addEventListener("click", () => { $("hub-repo").hidden = true; if (repoCtl) repoCtl.abort(); $("hub-q").focus(); });
  });
})();
