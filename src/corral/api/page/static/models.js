// The models panel: one card per model, kept across updates (so charts and focus survive).
(function () {
  "use strict";
  const C = window.corral;
  const el = C.el;
  const cards = new Map(); // id -> {root, body, charts, canvases}
  const pending = new Map(); // id -> action in flight
  const errors = new Map(); // id -> last action error
  const CHARTS = [["tokens_per_s", "tokens/s", "--c1"], ["queued", "queue", "--c2"], ["busy", "busy slots", "--c3"]];

  function statusOf(m) { return (m.status && m.status.value) || "unloaded"; }

  async function act(m, what) {
    const id = m.id;
    if (what === "delete" && !window.confirm("Delete " + id + " from disk?\n" + (m.path || ""))) return;
    pending.set(id, what);
    errors.delete(id);
    C.renderModels();
    try {
      if (what === "load") await C.api("POST", "/models/load", { model: id });
      else if (what === "unload") await C.api("POST", "/models/unload", { model: id });
      else if (what === "delete") await C.api("DELETE", "/models/" + C.ids(id) + "?force=false");
      else if (what === "cancel") {
        const p = m.status && m.status.progress;
        if (p && p.pull_id) await C.api("DELETE", "/models/pull/" + C.ids(p.pull_id));
        else await C.api("POST", "/models/unload", { model: id });
      }
    } catch (e) {
      if (!(e instanceof C.AuthError)) errors.set(id, what + " failed: " + e.message);
    } finally {
      pending.delete(id);
      C.refreshModels();
    }
  }

  function button(m, what, label, cls) {
    const busy = pending.get(m.id);
    return el("button", { type: "button", class: "small " + (cls || ""), "data-action": what,
      disabled: !!busy, onclick: () => act(m, what) }, busy === what ? label + "…" : label);
  }

  function instanceRows(m) {
    const shown = (m.instances || []).filter((i) => i.state !== "stopped" || i.reason);
    if (!shown.length) return null;
    return el("ul", { class: "instances" }, shown.map((i) => {
      const mem = i.memory || {};
      const facts = [
        ["pid", i.pid === null ? "–" : String(i.pid)],
        ["slots", slotsText(m.id, i)],
        // how many slots it got and why (n_parallel = "auto": from the memory left after the weights)
        ...(i.slots && i.slots.plan ? [["slot plan", i.slots.plan.reason]] : []),
        ["model", C.bytes(mem.model_bytes)], ["KV", C.bytes(mem.kv_bytes)], ["RSS", C.bytes(mem.rss_bytes)],
        ["threads", i.threads === null || i.threads === undefined ? "–" : String(i.threads)],
        ["restarts", String(i.restarts || 0)]];
      return el("li", { "data-instance": i.index, "data-state": i.state },
        el("b", {}, "#" + i.index), el("span", { class: "status " + instClass(i.state) }, i.state),
        facts.map(([k, v]) => el("span", { class: "fact", "data-fact": k }, el("span", { class: "k" }, k), " ",
          el("span", { class: "v" }, v))));
    }));
  }

  // slots busy/total: the last stats sample (every few seconds) is newer than GET /models
  function slotsText(id, i) {
    const s = C.stats.models && C.stats.models[id];
    const live = s && s.instances ? s.instances.find((x) => x.index === i.index && x.state === i.state) : null;
    const v = live || (i.slots ? { busy: i.slots.busy, total: i.slots.total } : null);
    return v ? v.busy + "/" + v.total : "–";
  }

  function instClass(state) {
    return { ready: "loaded", starting: "loading", stopping: "loading", failed: "failed" }[state] || "unloaded";
  }

  function failure(m) {
    const reasons = [];
    if (m.status && m.status.reason) reasons.push(m.status.reason);
    for (const i of m.instances || []) if (i.reason && !reasons.includes(i.reason)) reasons.push("#" + i.index + ": " + i.reason);
    if (!reasons.length) return null;
    const full = reasons.join("\n\n");
    const first = full.split("\n")[0];
    return el("div", {}, el("p", { class: "reason" }, first),
      full.includes("\n") ? el("details", {}, el("summary", {}, "log tail"), el("pre", { class: "log" }, full)) : null);
  }

  function progress(m) {
    const p = m.status && m.status.progress;
    if (!p) return null;
    const d = C.downloads && p.pull_id ? C.downloads.get(p.pull_id) : null;
    const done = d ? d.done : p.done, total = d ? d.total : p.total;
    const bar = el("div", { class: "progress" + (total ? "" : " indeterminate") }, el("div", {}));
    if (total) bar.firstChild.style.width = Math.min(100, (100 * done) / total).toFixed(1) + "%";
    return el("div", {}, bar, el("div", { class: "model-sub" },
      C.bytes(done) + (total ? " of " + C.bytes(total) + " (" + Math.floor((100 * done) / total) + "%)" : "")));
  }

  function fill(card, m) {
    const st = statusOf(m);
    const s = m.settings || {};
    const live = liveNumbers(m.id);
    card.root.className = "model st-" + st;
    // an adapter model id runs on its base's workers: the base's card loads and unloads them
    // a variant runs on the workers of the model it is a variant of: that card loads and unloads them
    const bits = [m.adapter ? "adapter " + m.adapter.id + " of " + m.adapter.base : "",
      m.variant_of ? "variant of " + m.variant_of : "", m.source || "",
      s.ctx_len ? "ctx " + s.ctx_len : "", s.n_parallel === "auto" ? "auto slots (at most " + s.n_parallel_max + ")" : s.n_parallel ? s.n_parallel + " slots" : "",
      s.instances > 1 ? s.instances + " instances" : "", m.memory_bytes ? C.bytes(m.memory_bytes) : "",
      s.ttl_s ? "ttl " + C.duration(s.ttl_s) : "", s.pinned ? "pinned" : "", s.embedding ? "embedding" : "", m.vision ? "vision" : "", m.audio ? "audio" : ""].filter(Boolean);
    const acts = [];
    if (!m.adapter && !m.variant_of) { // an adapter model or a variant has no load or unload of its own
      if (st === "unloaded" || st === "failed") acts.push(button(m, "load", "Load"));
      if (st === "loaded" || st === "loading") acts.push(button(m, "unload", "Unload", "ghost"));
      if (st === "downloading") acts.push(button(m, "cancel", "Cancel download", "danger"));
      if (m.source === "store" && st !== "downloading") acts.push(button(m, "delete", "Delete", "danger"));
    }
    const err = errors.get(m.id);
    card.body.replaceChildren(...[
      el("div", { class: "model-head" },
        el("h3", { class: "model-id" }, m.id),
        el("span", { class: "status " + st, "data-status": st }, st)),
      el("div", { class: "model-sub" }, (m.aliases && m.aliases.length ? "aka " + m.aliases.join(", ") + " · " : "") + bits.join(" · ")),
      live ? el("div", { class: "model-sub live" }, live) : null,
      !m.adapter && C.cardFit ? C.cardFit(m) : null,
      progress(m), st === "failed" || (m.instances || []).some((i) => i.reason) ? failure(m) : null,
      instanceRows(m),
      err ? el("p", { class: "error" }, err) : null,
      el("div", { class: "actions" }, acts)].filter(Boolean));
  }

  function liveNumbers(id) {
    const s = C.stats.models && C.stats.models[id];
    if (!s || !s.t.length) return "";
    const i = s.t.length - 1;
    if (!s.slots[i] && !s.queued[i]) return "";
    return "busy " + s.busy[i] + "/" + s.slots[i] + " · queue " + s.queued[i] + " · " + s.tokens_per_s[i].toFixed(1) + " tok/s";
  }

  function newCard(id) {
    const root = el("article", { class: "model", "data-model": id });
    const body = el("div", { class: "model-body" });
    const canvases = {};
    const charts = el("div", { class: "charts" }, CHARTS.map(([key, label]) => {
      const value = el("b", {}, "–");
      canvases[key] = { canvas: el("canvas", { "aria-label": label + " chart", role: "img" }), value: value };
      return el("div", { class: "chart" }, el("div", { class: "chart-label" }, el("span", {}, label), value), canvases[key].canvas);
    }));
    root.append(body, charts);
    return { root: root, body: body, charts: charts, canvases: canvases };
  }

  C.renderModels = function () {
    const box = document.getElementById("models");
    const models = C.models;
    document.getElementById("model-count").textContent = models.length ? "(" + models.length + ")" : "";
    if (!models.length) { box.replaceChildren(el("p", { class: "muted" }, "No models.")); cards.clear(); return; }
    const seen = new Set();
    const order = [];
    for (const m of models) {
      seen.add(m.id);
      let card = cards.get(m.id);
      if (!card) { card = newCard(m.id); cards.set(m.id, card); }
      fill(card, m);
      order.push(card.root);
    }
    for (const id of [...cards.keys()]) if (!seen.has(id)) cards.delete(id);
    if (box.children.length !== order.length || order.some((n, i) => box.children[i] !== n)) box.replaceChildren(...order);
    C.renderCharts();
  };

  C.renderCharts = function () {
    const all = C.stats.models || {};
    for (const [id, card] of cards) {
      const s = all[id];
      const used = !!s && s.slots.some((x) => x > 0);
      card.charts.hidden = !used;
      const cap = s ? Math.min(150, Math.max(30, s.t.length)) : 30;
      const m0 = C.models.find((x) => x.id === id);
      if (m0) for (const li of card.body.querySelectorAll(".instances li")) {
        const inst = (m0.instances || []).find((i) => String(i.index) === li.dataset.instance);
        const v = li.querySelector('[data-fact="slots"] .v');
        if (inst && v) v.textContent = slotsText(id, inst);
      }
      for (const [key, , color] of CHARTS) {
        const c = card.canvases[key];
        const values = s ? s[key] : [];
        const last = values.length ? values[values.length - 1] : null;
        c.value.textContent = last === null ? "–" : key === "tokens_per_s" ? last.toFixed(1) : key === "busy" && s ? last + "/" + s.slots[s.slots.length - 1] : String(last);
        const max = key === "busy" && s ? Math.max(1, ...s.slots) : key === "queued" ? 4 : 0;
        window.corralCharts.draw(c.canvas, values, { color: color, capacity: cap, max: max });
      }
      const m = C.models.find((x) => x.id === id);
      const live = card.body.querySelector(".live");
      const txt = liveNumbers(id);
      if (live && txt) live.textContent = txt; else if (m && (!!live !== !!txt)) fill(card, m);
    }
  };
})();
