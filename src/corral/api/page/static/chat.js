// The chat playground: streams an answer from /v1/chat/completions; Stop aborts the request
// (the server frees the slot when the connection closes); tokens/s and TTFT after each answer.
// For a model that hears (its `audio`), a recording goes with the next message as an
// `input_audio` part: a file attached, or the microphone through MediaRecorder (WebM/Opus);
// the server sniffs the format.
(function () {
  "use strict";
  const C = window.corral;
  const el = C.el;
  const $ = (id) => document.getElementById(id);
  let history = []; // [{role, content}]
  let controller = null;
  let audio = null; // {data: base64, name} to send with the next message
  let recorder = null;

  function hears(id) {
    const m = C.models.find((x) => x.id === id);
    return !!(m && m.audio);
  }

  function showAudio() {
    const on = hears($("chat-model").value);
    document.querySelectorAll(".audio-only").forEach((n) => { n.hidden = !on; });
    if (!on) audio = null;
    $("chat-audio").textContent = audio ? "audio: " + audio.name : "";
  }

  function setAudio(blob, name) {
    const r = new FileReader();
    r.onload = () => {
      audio = { data: String(r.result).split(",")[1] || "", name: name };
      showAudio();
    };
    r.readAsDataURL(blob);
  }

  async function record() {
    if (recorder) { recorder.stop(); return; }
    let stream;
    try {
      stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    } catch (e) {
      $("chat-audio").textContent = "microphone: " + e.message;
      return;
    }
    const parts = [];
    recorder = new MediaRecorder(stream);
    recorder.ondataavailable = (e) => { if (e.data.size) parts.push(e.data); };
    recorder.onstop = () => {
      stream.getTracks().forEach((t) => t.stop());
      recorder = null;
      $("chat-record").textContent = "Record";
      setAudio(new Blob(parts, { type: parts.length ? parts[0].type : "audio/webm" }), "recording");
    };
    recorder.start();
    $("chat-record").textContent = "Stop recording";
    $("chat-audio").textContent = "recording…";
  }

  C.updateChatModels = function () {
    const sel = $("chat-model");
    const keep = sel.value;
    const usable = C.models.filter((m) => !(m.settings && m.settings.embedding) && m.status && m.status.value !== "downloading");
    const ids = usable.map((m) => m.id);
    if (ids.length === sel.options.length && ids.every((id, i) => sel.options[i].value === id)) return;
    sel.replaceChildren(...usable.map((m) => el("option", { value: m.id }, m.id)));
    const loaded = usable.find((m) => m.status.value === "loaded");
    const dflt = usable.find((m) => (m.aliases || []).includes("default"));
    sel.value = ids.includes(keep) ? keep : (loaded || dflt || usable[0] || {}).id || "";
    showAudio();
  };

  function bubble(role, text) {
    const b = el("div", { class: "msg " + role, "data-role": role }, el("span", { class: "text" }, text));
    $("chat-log").append(b);
    $("chat-log").scrollTop = $("chat-log").scrollHeight;
    return b;
  }

  function setBusy(busy) {
    $("chat-send").disabled = busy;
    $("chat-stop").disabled = !busy;
  }

  async function send() {
    const text = $("chat-input").value;
    const model = $("chat-model").value;
    if ((!text.trim() && !audio) || !model || controller) return;
    $("chat-input").value = "";
    if (audio) {
      history.push({ role: "user", content: [{ type: "input_audio", input_audio: { data: audio.data } },
                                             { type: "text", text: text }] });
      bubble("user", "[" + audio.name + "] " + text);
      audio = null;
      showAudio();
    } else {
      history.push({ role: "user", content: text });
      bubble("user", text);
    }
    const out = bubble("assistant streaming", "");
    const span = out.querySelector(".text");
    const messages = [];
    const sys = $("chat-system").value.trim();
    if (sys) messages.push({ role: "system", content: sys });
    messages.push(...history);
    const body = { model: model, messages: messages, stream: true, stream_options: { include_usage: true } };
    const temp = parseFloat($("chat-temperature").value), maxTok = parseInt($("chat-max-tokens").value, 10);
    if (isFinite(temp)) body.temperature = temp;
    if (isFinite(maxTok) && maxTok > 0) body.max_tokens = maxTok;
    controller = new AbortController();
    setBusy(true);
    $("chat-stats").textContent = "";
    const t0 = performance.now();
    let tFirst = null, answer = "", usage = null, chunks = 0, outcome = "done", finish = null;
    try {
      const r = await C.api("POST", "/v1/chat/completions", body, { raw: true, signal: controller.signal });
      if (!r.ok) {
        let m = "HTTP " + r.status;
        try { const j = await r.json(); m = (j.error && j.error.message) || m; } catch (e) { /* not JSON */ }
        throw new Error(m);
      }
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      read: for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const line = buf.slice(0, cut).split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("");
          buf = buf.slice(cut + 2);
          if (!line) continue;
          if (line === "[DONE]") break read;
          const j = JSON.parse(line);
          if (j.error) throw new Error(j.error.message || "the server reported an error");
          if (j.usage) usage = j.usage;
          const ch = j.choices && j.choices[0];
          if (ch && ch.finish_reason) finish = ch.finish_reason;
          const piece = ch && ch.delta && ch.delta.content;
          if (piece) {
            if (tFirst === null) tFirst = performance.now();
            chunks++;
            answer += piece;
            span.textContent = answer;
            $("chat-log").scrollTop = $("chat-log").scrollHeight;
          }
        }
      }
    } catch (e) {
      if (e.name === "AbortError") outcome = "stopped";
      else { outcome = "error"; out.classList.add("error"); span.textContent = (answer ? answer + "\n\n" : "") + "error: " + e.message; }
    } finally {
      controller = null;
      setBusy(false);
      out.classList.remove("streaming");
    }
    const tEnd = performance.now();
    if (answer) history.push({ role: "assistant", content: answer });
    const n = usage ? usage.completion_tokens : chunks;
    const parts = [];
    if (outcome === "stopped") parts.push("stopped");
    if (finish && outcome === "done") parts.push(finish === "length" ? "max tokens reached" : "finished (" + finish + ")");
    if (tFirst !== null) {
      parts.push(n + " tokens");
      const gen = (tEnd - tFirst) / 1000;
      if (n > 1 && gen > 0) parts.push(((n - 1) / gen).toFixed(1) + " tokens/s");
      parts.push("TTFT " + Math.round(tFirst - t0) + " ms");
    }
    const meta = parts.join(" · ");
    out.append(el("span", { class: "meta" }, meta));
    $("chat-stats").textContent = meta;
    out.dataset.outcome = outcome;
  }

  document.addEventListener("DOMContentLoaded", function () {
    $("chat-form").addEventListener("submit", (e) => { e.preventDefault(); send(); });
    $("chat-input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
    });
    $("chat-stop").addEventListener("click", () => { if (controller) controller.abort(); });
    $("chat-model").addEventListener("change", showAudio);
    $("chat-attach").addEventListener("click", () => $("chat-audio-file").click());
    $("chat-audio-file").addEventListener("change", (e) => {
      const f = e.target.files && e.target.files[0];
      if (f) setAudio(f, f.name);
      e.target.value = "";
    });
    $("chat-record").addEventListener("click", record);
    $("chat-clear").addEventListener("click", () => {
      if (controller) controller.abort();
      history = [];
      audio = null;
      showAudio();
      $("chat-log").replaceChildren();
      $("chat-stats").textContent = "";
    });
    setBusy(false);
  });
})();
