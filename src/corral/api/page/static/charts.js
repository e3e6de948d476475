// Tiny sparkline charts on <canvas>: no library. window.corralCharts.draw(canvas, values, opts)
(function () {
  "use strict";
  function cssVar(name, fallback) {
    const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return v || fallback;
  }
  function draw(canvas, values, opts) {
    opts = opts || {};
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(10, canvas.clientWidth), h = Math.max(10, canvas.clientHeight);
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext("2d");
    if (!ctx) return;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    const n = values.length;
    if (n === 0) return;
    let max = opts.max || 0;
    for (const v of values) if (v > max) max = v;
    if (max <= 0) max = 1;
    const slots = Math.max(n, opts.capacity || n);
    const step = slots > 1 ? w / (slots - 1) : w;
    const x0 = w - (n - 1) * step;
    const y = (v) => h - 2 - (v / max) * (h - 4);
    const color = cssVar(opts.color || "--c1", "#1f6f5c");
    ctx.beginPath();
    ctx.moveTo(x0, h);
    values.forEach((v, i) => ctx.lineTo(x0 + i * step, y(v)));
    ctx.lineTo(x0 + (n - 1) * step, h);
    ctx.closePath();
    ctx.globalAlpha = 0.18;
    ctx.fillStyle = color;
    ctx.fill();
    ctx.globalAlpha = 1;
    ctx.beginPath();
    values.forEach((v, i) => (i ? ctx.lineTo : ctx.moveTo).call(ctx, x0 + i * step, y(v)));
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.5;
    ctx.stroke();
  }
  window.corralCharts = { draw: draw };
})();
