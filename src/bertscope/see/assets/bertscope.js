/* bertscope attention explorer: head view, model view, matrix view.
 *
 * Hand-written vanilla JavaScript, no dependencies. Works from a file (the numbers are in the
 * page, quantised, deflated and base64-encoded) or against `bertscope serve` (the numbers are
 * fetched on demand, one layer and the chosen heads at a time).
 *
 * Matrices are row-major Float32Arrays: M[i * n + j] is the attention from unit i (a query)
 * to unit j (a key). Units are sub-tokens or words; word level follows Clark et al. 2019:
 * attention to a word sums over its sub-tokens, attention from a word averages over them.
 */
(function () {
  "use strict";

  const ROW = 18;          // head view: pixels per token row
  const COL_W = 132;       // head view: width of a token column
  const GAP = 230;         // head view: width of the band the lines cross
  const THUMB = 72;        // model view: largest thumbnail resolution (cells are pooled above it)

  const $ = (id) => document.getElementById(id);
  const cfg = JSON.parse($("bertscope-config").textContent);
  let meta = null;
  let source = null;
  const state = {
    view: "head", layer: 0, heads: [0], mode: "heads", level: "word", hideSpecial: false,
    focus: null,       // pinned focus {panel, side: "left"|"right", index}
    hover: null,       // transient focus, same shape
    modelText: 0,      // model view: 0 = text A, 1 = text B, "diff" = A - B
  };
  let renderGen = 0;

  function headColor(h) {
    return `hsl(${Math.round((h * 137.508 + 210) % 360)}, 68%, 44%)`;
  }

  function fmt(x) { return (Math.round(x * 10000) / 10000).toFixed(4); }

  function showError(msg) {
    const el = $("bs-error");
    el.textContent = msg;
    el.hidden = !msg;
  }

  // ---------------------------------------------------------------- data sources

  function decodeBase64(b64) {
    if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(b64);
    const bin = atob(b64);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  async function inflate(bytes) {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser cannot inflate the report's data (it needs DecompressionStream: " +
        "Chrome 80+, Firefox 113+, Safari 16.4+)");
    }
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  /** The numbers embedded in the file: uint16 multiples of 1/scale, as two byte planes. */
  class FileSource {
    constructor(m, planes) {
      const n = m.data.count;
      const q = new Uint16Array(n);
      for (let i = 0; i < n; i++) q[i] = planes[i] | (planes[n + i] << 8);
      this.q = q;
      this.scale = m.data.scale;
      this.layout = m.data.layout;
      this.H = m.heads;
    }
    static async load(m) {
      const raw = await inflate(decodeBase64($("bertscope-blob").textContent.trim()));
      return new FileSource(m, raw);
    }
    /** Token-level matrices of text t: kind "attn" (one per head) or "rollout" (head ignored). */
    async matrices(t, kind, layer, heads) {
      const T = meta.texts[t].tokens.length;
      const inv = 1 / this.scale;
      return heads.map((h) => {
        const slot = kind === "attn" ? layer * this.H + h : layer;
        const base = this.layout[t][kind] + slot * T * T;
        const out = new Float32Array(T * T);
        for (let i = 0; i < T * T; i++) out[i] = this.q[base + i] * inv;
        return out;
      });
    }
  }

  function decodeFloat32(b64) {
    const bytes = decodeBase64(b64);
    return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  }

  /** The numbers computed by `bertscope serve`, fetched per layer and head, cached. */
  class ServerSource {
    constructor(texts) {
      this.texts = texts;
      this.cache = new Map();  // "kind:layer:head" -> Promise of [matrix per text]
    }
    async matrices(t, kind, layer, heads) {
      const hs = kind === "attn" ? heads : [-1];
      const missing = hs.filter((h) => !this.cache.has(`${kind}:${layer}:${h}`));
      if (missing.length) {
        const req = fetch("api/attention", {
          method: "POST", headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ text: this.texts[0], text_b: this.texts[1] || null, layer,
            heads: kind === "attn" ? missing : [], kind }),
        }).then(async (r) => {
          const body = await r.json().catch(() => ({}));
          if (!r.ok) throw new Error(body.detail || `the server answered ${r.status}`);
          return body;
        });
        missing.forEach((h) => {
          const p = req.then((body) => body.matrices
            .filter((x) => x.head === h)
            .sort((a, b) => a.text - b.text)
            .map((x) => decodeFloat32(x.data)));
          p.catch(() => this.cache.delete(`${kind}:${layer}:${h}`));
          this.cache.set(`${kind}:${layer}:${h}`, p);
        });
      }
      const got = await Promise.all(hs.map((h) => this.cache.get(`${kind}:${layer}:${h}`)));
      return got.map((perText) => perText[t]);
    }
  }

  // ---------------------------------------------------------------- matrices for display

  /** The units of text t at the current level: labels, special flags, token -> unit map. */
  function units(t) {
    const x = meta.texts[t];
    if (state.level === "word") return { labels: x.words, special: x.word_special, map: x.token_words };
    return { labels: x.tokens, special: x.special, map: null };
  }

  /** Token (T, T) -> word (W, W): sum over a word's sub-tokens as keys, mean as queries. */
  function toWords(M, T, map, W) {
    const out = new Float32Array(W * W);
    const count = new Float32Array(W);
    for (let i = 0; i < T; i++) count[map[i]] += 1;
    for (let i = 0; i < T; i++) {
      const r = map[i] * W, row = i * T;
      for (let j = 0; j < T; j++) out[r + map[j]] += M[row + j];
    }
    for (let a = 0; a < W; a++) {
      if (count[a] > 1) for (let b = 0; b < W; b++) out[a * W + b] /= count[a];
    }
    return out;
  }

  /** Token matrix of text t -> what is shown: {n, M, keep (unit indices), labels, special}. */
  function project(t, M) {
    const T = meta.texts[t].tokens.length;
    const u = units(t);
    let full = M;
    if (u.map) full = toWords(M, T, u.map, u.labels.length);
    const N = u.labels.length;
    const keep = [];
    for (let i = 0; i < N; i++) if (!(state.hideSpecial && u.special[i])) keep.push(i);
    const n = keep.length;
    let out = full;
    if (n !== N) {
      out = new Float32Array(n * n);
      for (let a = 0; a < n; a++) for (let b = 0; b < n; b++) out[a * n + b] = full[keep[a] * N + keep[b]];
    }
    return { n, M: out, keep, labels: keep.map((i) => u.labels[i]), special: keep.map((i) => u.special[i]) };
  }

  /** What the current settings show for text t at a layer: [{key, name, color, M (token level)}]. */
  async function layerMatrices(t, layer) {
    const H = meta.heads;
    if (state.mode === "rollout") {
      const [M] = await source.matrices(t, "rollout", layer, [0]);
      return [{ key: "rollout", name: "rollout", color: "#2456c9", M }];
    }
    if (state.mode === "mean") {
      const all = await source.matrices(t, "attn", layer, [...Array(H).keys()]);
      const M = new Float32Array(all[0].length);
      for (const A of all) for (let i = 0; i < M.length; i++) M[i] += A[i];
      for (let i = 0; i < M.length; i++) M[i] /= H;
      return [{ key: "mean", name: "mean", color: "#2456c9", M }];
    }
    const ms = await source.matrices(t, "attn", layer, state.heads);
    return state.heads.map((h, k) => ({ key: String(h), name: `head ${h}`, color: headColor(h), M: ms[k] }));
  }

  function meanOf(list) {
    if (list.length === 1) return list[0];
    const M = new Float32Array(list[0].length);
    for (const A of list) for (let i = 0; i < M.length; i++) M[i] += A[i];
    for (let i = 0; i < M.length; i++) M[i] /= list.length;
    return M;
  }

  function describe() {
    const L = `layer ${state.layer}`;
    if (state.mode === "rollout") return `rollout through layers 0–${state.layer}`;
    if (state.mode === "mean") return `${L}, mean over ${meta.heads} heads`;
    return `${L}, head${state.heads.length > 1 ? "s" : ""} ${state.heads.join(", ")}`;
  }

  // ---------------------------------------------------------------- head view

  function tokenDiv(label, side, index, special, top) {
    const d = document.createElement("div");
    d.className = `bs-tok bs-${side}` + (special ? " bs-special" : "");
    d.style.top = `${top}px`;
    d.style.width = `${COL_W}px`;
    d.textContent = label;
    d.title = label;
    d.dataset.side = side;
    d.dataset.i = String(index);
    return d;
  }

  function setupCanvas(canvas, w, h) {
    const dpr = Math.min(2, window.devicePixelRatio || 1);
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    canvas.style.width = `${w}px`;
    canvas.style.height = `${h}px`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }

  async function renderHeadView(gen) {
    const root = $("bs-head-view");
    const texts = meta.texts.map((_, t) => t);
    const per = await Promise.all(texts.map((t) => layerMatrices(t, state.layer)));
    if (gen !== renderGen) return;
    root.textContent = "";
    const panels = document.createElement("div");
    panels.className = "bs-panels";
    root.appendChild(panels);
    texts.forEach((t) => {
      const shown = per[t].map((m) => ({ ...m, P: project(t, m.M) }));
      const { n, labels, special, keep } = shown[0].P;
      const panel = document.createElement("div");
      panel.className = "bs-panel";
      panel.dataset.panel = String(t);
      panel.dataset.layer = String(state.layer);
      panel.dataset.heads = shown.map((m) => m.key).join(",");
      const h3 = document.createElement("h3");
      h3.innerHTML = meta.texts.length > 1 ? `<span class="bs-tag">${"AB"[t]}</span> ` : "";
      h3.appendChild(document.createTextNode(describe()));
      panel.appendChild(h3);
      const hv = document.createElement("div");
      hv.className = "bs-hv";
      hv.style.width = `${2 * COL_W + GAP}px`;
      hv.style.height = `${n * ROW}px`;
      const canvas = document.createElement("canvas");
      canvas.className = "bs-lines";
      canvas.style.left = `${COL_W}px`;
      hv.appendChild(canvas);
      const left = document.createElement("div"), right = document.createElement("div");
      left.className = "bs-col";
      right.className = "bs-col";
      right.style.left = `${COL_W + GAP}px`;
      for (let a = 0; a < n; a++) {
        left.appendChild(tokenDiv(labels[a], "left", keep[a], special[a], a * ROW));
        right.appendChild(tokenDiv(labels[a], "right", keep[a], special[a], a * ROW));
      }
      hv.append(left, right);
      panel.appendChild(hv);
      const readout = document.createElement("div");
      readout.className = "bs-readout";
      panel.appendChild(readout);
      panels.appendChild(panel);

      const ctx = setupCanvas(canvas, GAP, n * ROW);
      const draw = () => drawLines(t, ctx, shown, n, keep, hv, readout);
      panel._draw = draw;
      draw();
      hv.addEventListener("mouseover", (e) => {
        const d = e.target.closest(".bs-tok");
        if (!d) return;
        state.hover = { panel: t, side: d.dataset.side, index: Number(d.dataset.i) };
        draw();
      });
      hv.addEventListener("mouseleave", () => { state.hover = null; draw(); });
      hv.addEventListener("click", (e) => {
        const d = e.target.closest(".bs-tok");
        if (!d) return;
        const f = { panel: t, side: d.dataset.side, index: Number(d.dataset.i) };
        const same = state.focus && state.focus.panel === t && state.focus.side === f.side && state.focus.index === f.index;
        state.focus = same ? null : f;
        state.hover = null;
        redrawHeadPanels();
      });
    });
  }

  function redrawHeadPanels() {
    document.querySelectorAll("#bs-head-view .bs-panel").forEach((p) => p._draw && p._draw());
  }

  function drawLines(t, ctx, shown, n, keep, hv, readout) {
    const focus = (state.hover && state.hover.panel === t) ? state.hover
      : (state.focus && state.focus.panel === t ? state.focus : null);
    const pos = focus ? keep.indexOf(focus.index) : -1;
    const f = pos >= 0 ? focus : null;
    ctx.clearRect(0, 0, GAP, n * ROW);
    const minW = f ? 0.001 : (n > 64 ? 0.01 : 0.002);
    ctx.lineWidth = 1.6;
    for (const m of shown) {
      ctx.strokeStyle = m.color;
      const M = m.P.M;
      for (let a = 0; a < n; a++) {
        if (f && f.side === "left" && a !== pos) continue;
        for (let b = 0; b < n; b++) {
          if (f && f.side === "right" && b !== pos) continue;
          const w = M[a * n + b];
          if (w < minW) continue;
          ctx.globalAlpha = Math.min(1, w);
          ctx.beginPath();
          ctx.moveTo(0, a * ROW + ROW / 2);
          ctx.lineTo(GAP, b * ROW + ROW / 2);
          ctx.stroke();
        }
      }
    }
    ctx.globalAlpha = 1;
    // highlight the focused token and shade the other side by weight (first matrix shown)
    hv.querySelectorAll(".bs-tok").forEach((d) => {
      d.classList.toggle("bs-pinned", !!(state.focus && state.focus.panel === t &&
        state.focus.side === d.dataset.side && state.focus.index === Number(d.dataset.i)));
      d.classList.remove("bs-focus");
      d.style.background = "";
    });
    readout.textContent = "";
    if (!f) {
      readout.innerHTML = '<span class="bs-note">Hover a token to focus its lines; click it to pin the numbers.</span>';
      return;
    }
    const side = f.side === "left" ? ".bs-left" : ".bs-right";
    const other = f.side === "left" ? ".bs-right" : ".bs-left";
    hv.querySelector(`${side}[data-i="${f.index}"]`)?.classList.add("bs-focus");
    const mean = meanOf(shown.map((m) => m.P.M));
    const wmax = Math.max(1e-9, ...Array.from({ length: n }, (_, k) => f.side === "left" ? mean[pos * n + k] : mean[k * n + pos]));
    hv.querySelectorAll(other).forEach((d, k) => {
      const w = f.side === "left" ? mean[pos * n + k] : mean[k * n + pos];
      d.style.background = `rgba(36, 86, 201, ${(0.35 * w / wmax).toFixed(3)})`;
    });
    // the numbers: one column per matrix shown
    const table = document.createElement("table");
    table.className = "bs-values";
    const cap = document.createElement("caption");
    const lab = shown[0].P.labels[pos];
    cap.textContent = f.side === "left" ? `attention from “${lab}” to each ${state.level}` : `attention to “${lab}” from each ${state.level}`;
    table.appendChild(cap);
    const head = document.createElement("tr");
    head.innerHTML = `<th>${f.side === "left" ? "to" : "from"}</th>`;
    shown.forEach((m) => {
      const th = document.createElement("th");
      th.textContent = m.name;
      th.style.color = m.color;
      head.appendChild(th);
    });
    table.appendChild(head);
    for (let k = 0; k < n; k++) {
      const tr = document.createElement("tr");
      const td0 = document.createElement("td");
      td0.textContent = shown[0].P.labels[k];
      tr.appendChild(td0);
      shown.forEach((m) => {
        const w = f.side === "left" ? m.P.M[pos * n + k] : m.P.M[k * n + pos];
        const td = document.createElement("td");
        td.className = "bs-val";
        td.dataset.from = String(f.side === "left" ? f.index : keep[k]);
        td.dataset.to = String(f.side === "left" ? keep[k] : f.index);
        td.dataset.head = m.key;
        td.dataset.value = String(w);
        td.textContent = fmt(w);
        if (shown.length === 1) {
          const bar = document.createElement("span");
          bar.className = "bs-bar";
          bar.style.width = `${Math.round(60 * w)}px`;
          td.appendChild(bar);
        }
        tr.appendChild(td);
      });
      table.appendChild(tr);
    }
    readout.appendChild(table);
  }

  // ---------------------------------------------------------------- colours

  function seqColor(v) {  // 0..1 -> white .. deep blue
    const a = Math.max(0, Math.min(1, v));
    return [Math.round(255 - a * (255 - 14)), Math.round(255 - a * (255 - 52)), Math.round(255 - a * (255 - 130))];
  }

  function divColor(v) {  // -1..1 -> red .. white .. blue (A - B: blue where A attends more)
    const a = Math.max(-1, Math.min(1, v));
    if (a >= 0) return seqColor(a);
    const b = -a;
    return [Math.round(255 - b * (255 - 178)), Math.round(255 - b * (255 - 24)), Math.round(255 - b * (255 - 43))];
  }

  function maxOf(M) {
    let m = 1e-9;
    for (let i = 0; i < M.length; i++) if (M[i] > m) m = M[i];
    return m;
  }

  function maxAbs(M) {
    let m = 0;
    for (let i = 0; i < M.length; i++) { const x = Math.abs(M[i]); if (x > m) m = x; }
    return m || 1;
  }

  // ---------------------------------------------------------------- matrix view

  function diffOf(PA, PB) {
    if (PA.n !== PB.n) return null;
    const M = new Float32Array(PA.M.length);
    for (let i = 0; i < M.length; i++) M[i] = PA.M[i] - PB.M[i];
    const labels = PA.labels.map((l, k) => (l === PB.labels[k] ? l : `${l} | ${PB.labels[k]}`));
    return { n: PA.n, M, keep: PA.keep, labels, special: PA.special };
  }

  async function renderMatrixView(gen) {
    const root = $("bs-matrix-view");
    const per = await Promise.all(meta.texts.map((_, t) => layerMatrices(t, state.layer)));
    if (gen !== renderGen) return;
    root.textContent = "";
    const panels = document.createElement("div");
    panels.className = "bs-panels";
    root.appendChild(panels);
    const P = per.map((list, t) => project(t, meanOf(list.map((m) => m.M))));
    const what = describe() + (state.mode === "heads" && state.heads.length > 1 ? " (their mean)" : "");
    P.forEach((p, t) => panels.appendChild(matrixPanel(p, meta.texts.length > 1 ? `${"AB"[t]}: ${what}` : what, false, String(t))));
    if (P.length === 2) {
      const d = diffOf(P[0], P[1]);
      if (d) panels.appendChild(matrixPanel(d, `A − B: ${what}`, true, "diff"));
      else {
        const note = document.createElement("div");
        note.className = "bs-panel bs-note";
        note.textContent = `No difference: the texts have ${P[0].n} and ${P[1].n} ${state.level}s at this level.`;
        panels.appendChild(note);
      }
    }
  }

  function matrixPanel(p, title, diverging, key) {
    const { n, M, labels } = p;
    const panel = document.createElement("div");
    panel.className = "bs-panel bs-matrix";
    panel.dataset.panel = key;
    const h3 = document.createElement("h3");
    h3.textContent = title;
    panel.appendChild(h3);
    const cell = Math.max(2, Math.min(26, Math.floor(560 / Math.max(1, n))));
    const showLabels = cell >= 9;
    const probe = document.createElement("canvas").getContext("2d");
    probe.font = "12px ui-monospace, Menlo, Consolas, monospace";
    const lw = showLabels ? Math.min(120, 8 + Math.max(...labels.map((l) => probe.measureText(l).width))) : 0;
    const W = lw + n * cell + 2, H = lw + n * cell + 2;
    const wrap = document.createElement("div");
    wrap.className = "bs-matrix-wrap";
    const canvas = document.createElement("canvas");
    wrap.appendChild(canvas);
    panel.appendChild(wrap);
    const ctx = setupCanvas(canvas, W, H);
    const vmax = diverging ? maxAbs(M) : maxOf(M);
    for (let a = 0; a < n; a++) {
      for (let b = 0; b < n; b++) {
        const v = M[a * n + b] / vmax;
        const [r, g, bl] = diverging ? divColor(v) : seqColor(v);
        ctx.fillStyle = `rgb(${r},${g},${bl})`;
        ctx.fillRect(lw + b * cell, lw + a * cell, cell, cell);
      }
    }
    ctx.strokeStyle = "#d0d5dd";
    ctx.strokeRect(lw + 0.5, lw + 0.5, n * cell, n * cell);
    if (showLabels) {
      ctx.fillStyle = "#1d2330";
      ctx.font = probe.font;
      ctx.textBaseline = "middle";
      ctx.textAlign = "right";
      for (let a = 0; a < n; a++) ctx.fillText(labels[a], lw - 4, lw + a * cell + cell / 2, lw - 6);
      for (let b = 0; b < n; b++) {
        ctx.save();
        ctx.translate(lw + b * cell + cell / 2, lw - 4);
        ctx.rotate(-Math.PI / 2);
        ctx.textAlign = "left";
        ctx.fillText(labels[b], 0, 0, lw - 6);
        ctx.restore();
      }
    }
    const legend = document.createElement("div");
    legend.className = "bs-legend";
    legend.textContent = diverging
      ? `rows attend to columns; blue: A attends more, red: B attends more (±${fmt(vmax)} at full colour)`
      : `rows (from) attend to columns (to); darkest = ${fmt(vmax)}`;
    panel.appendChild(legend);
    const out = document.createElement("div");
    out.className = "bs-mreadout";
    out.textContent = "Point at a cell for its exact value.";
    panel.appendChild(out);
    const tip = $("bs-tip");
    canvas.addEventListener("mousemove", (e) => {
      const r = canvas.getBoundingClientRect();
      const b = Math.floor((e.clientX - r.left - lw) / cell), a = Math.floor((e.clientY - r.top - lw) / cell);
      if (a < 0 || b < 0 || a >= n || b >= n) { tip.hidden = true; return; }
      const w = M[a * n + b];
      const text = `${labels[a]} → ${labels[b]}: ${fmt(w)}`;
      out.textContent = text;
      out.dataset.from = String(p.keep[a]);
      out.dataset.to = String(p.keep[b]);
      out.dataset.value = String(w);
      tip.textContent = text;
      tip.style.left = `${e.clientX + 14}px`;
      tip.style.top = `${e.clientY + 12}px`;
      tip.hidden = false;
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
    return panel;
  }

  // ---------------------------------------------------------------- model view

  function paintThumb(canvas, p, diverging) {
    const { n, M } = p;
    const s = Math.min(n, THUMB);
    canvas.width = s;
    canvas.height = s;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(s, s);
    const pooled = new Float32Array(s * s);
    for (let a = 0; a < n; a++) {  // max-pool cells into s x s pixels, keeping the sign for A - B
      const pa = Math.floor(a * s / n);
      for (let b = 0; b < n; b++) {
        const k = pa * s + Math.floor(b * s / n), v = M[a * n + b];
        if (Math.abs(v) > Math.abs(pooled[k])) pooled[k] = v;
      }
    }
    const vmax = diverging ? maxAbs(pooled) : maxOf(pooled);
    for (let k = 0; k < s * s; k++) {
      const c = diverging ? divColor(pooled[k] / vmax) : seqColor(pooled[k] / vmax);
      img.data[4 * k] = c[0]; img.data[4 * k + 1] = c[1]; img.data[4 * k + 2] = c[2]; img.data[4 * k + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  }

  async function renderModelView(gen) {
    const root = $("bs-model-view");
    root.textContent = "";
    const N = meta.layers, H = meta.heads;
    if (meta.texts.length > 1) {
      const seg = document.createElement("div");
      seg.className = "bs-segment";
      [[0, "A"], [1, "B"], ["diff", "A − B"]].forEach(([v, label]) => {
        const b = document.createElement("button");
        b.type = "button";
        b.textContent = label;
        b.setAttribute("aria-pressed", String(state.modelText === v));
        b.addEventListener("click", () => { state.modelText = v; render(); });
        seg.appendChild(b);
      });
      root.appendChild(seg);
    }
    const note = document.createElement("div");
    note.className = "bs-note";
    note.textContent = "Every layer × head (rows × columns), then the mean over heads and the rollout. Click one to open it in the head view.";
    root.appendChild(note);
    const table = document.createElement("table");
    table.className = "bs-model-grid";
    const hr = document.createElement("tr");
    hr.innerHTML = "<th></th>" + [...Array(H).keys()].map((h) => `<th>head ${h}</th>`).join("") + "<th>mean</th><th>rollout</th>";
    table.appendChild(hr);
    root.appendChild(table);
    const which = state.modelText;
    const textsNeeded = which === "diff" ? [0, 1] : [which];
    for (let l = 0; l < N; l++) {
      const tr = document.createElement("tr");
      tr.innerHTML = `<th>layer ${l}</th>`;
      table.appendChild(tr);
      const perText = await Promise.all(textsNeeded.map(async (t) => {
        const heads = await source.matrices(t, "attn", l, [...Array(H).keys()]);
        const [roll] = await source.matrices(t, "rollout", l, [0]);
        return [...heads, meanOf(heads), roll].map((M) => project(t, M));
      }));
      if (gen !== renderGen) return;
      for (let k = 0; k < H + 2; k++) {
        let p = perText[0][k];
        if (which === "diff") p = diffOf(perText[0][k], perText[1][k]);
        const td = document.createElement("td");
        if (!p) { td.textContent = "–"; tr.appendChild(td); continue; }
        const c = document.createElement("canvas");
        c.className = "bs-thumb";
        c.dataset.layer = String(l);
        c.dataset.head = k < H ? String(k) : (k === H ? "mean" : "rollout");
        c.title = k < H ? `layer ${l}, head ${k}` : (k === H ? `layer ${l}, mean over heads` : `rollout through layer ${l}`);
        paintThumb(c, p, which === "diff");
        c.addEventListener("click", () => {
          state.layer = l;
          if (k < H) { state.mode = "heads"; state.heads = [k]; } else state.mode = k === H ? "mean" : "rollout";
          state.view = "head";
          state.focus = null;
          syncControls();
          render();
        });
        td.appendChild(c);
        tr.appendChild(td);
      }
      await new Promise((r) => requestAnimationFrame(() => r()));
    }
  }

  // ---------------------------------------------------------------- controls

  function buildControls() {
    const layer = $("bs-layer");
    layer.textContent = "";
    for (let l = 0; l < meta.layers; l++) layer.add(new Option(String(l), String(l)));
    const heads = $("bs-heads");
    heads.textContent = "";
    for (let h = 0; h < meta.heads; h++) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "bs-head";
      b.textContent = String(h);
      b.dataset.head = String(h);
      b.style.setProperty("--hc", headColor(h));
      b.title = `head ${h} (click: only this head; shift/ctrl-click: add or remove it)`;
      heads.appendChild(b);
    }
    $("bs-model").textContent = `${meta.model} · ${meta.layers} layers × ${meta.heads} heads`;
    const texts = $("bs-texts");
    texts.textContent = "";
    meta.texts.forEach((x, t) => {
      const d = document.createElement("div");
      d.innerHTML = meta.texts.length > 1 ? `<b>${"AB"[t]}</b>` : "";
      d.appendChild(document.createTextNode(x.text + (x.truncated ? "  (truncated to fit the model)" : "")));
      texts.appendChild(d);
    });
    $("bs-controls").hidden = false;
    syncControls();
  }

  function syncControls() {
    $("bs-layer").value = String(state.layer);
    $("bs-mode").value = state.mode;
    $("bs-level").value = state.level;
    $("bs-hide-special").checked = state.hideSpecial;
    document.querySelectorAll(".bs-tab").forEach((b) => b.setAttribute("aria-selected", String(b.dataset.view === state.view)));
    document.querySelectorAll(".bs-head").forEach((b) => b.setAttribute("aria-pressed", String(state.heads.includes(Number(b.dataset.head)))));
    $("bs-heads").classList.toggle("bs-disabled", state.mode !== "heads");
    ["head", "model", "matrix"].forEach((v) => { $(`bs-${v}-view`).hidden = v !== state.view; });
    const hints = {
      head: "Lines join each token (left) to the tokens it attends to (right); opacity = attention weight, one colour per head. Hover a token to focus its lines; click to pin the exact numbers.",
      model: "Thumbnails of every attention map; the darkest cell of each is its largest weight.",
      matrix: "Row = the token attending, column = the token attended to. Several heads selected: their mean.",
    };
    $("bs-hint").textContent = hints[state.view];
  }

  function wireControls() {
    document.querySelectorAll(".bs-tab").forEach((b) => b.addEventListener("click", () => { state.view = b.dataset.view; syncControls(); render(); }));
    $("bs-layer").addEventListener("change", (e) => { state.layer = Number(e.target.value); render(); });
    $("bs-mode").addEventListener("change", (e) => { state.mode = e.target.value; syncControls(); render(); });
    $("bs-level").addEventListener("change", (e) => { state.level = e.target.value; state.focus = null; render(); });
    $("bs-hide-special").addEventListener("change", (e) => { state.hideSpecial = e.target.checked; render(); });
    $("bs-heads").addEventListener("click", (e) => {
      const b = e.target.closest(".bs-head");
      if (!b) return;
      const h = Number(b.dataset.head);
      if (e.shiftKey || e.ctrlKey || e.metaKey) {
        const i = state.heads.indexOf(h);
        if (i >= 0 && state.heads.length > 1) state.heads.splice(i, 1);
        else if (i < 0) state.heads = [...state.heads, h].sort((x, y) => x - y);
      } else state.heads = [h];
      state.mode = "heads";
      syncControls();
      render();
    });
    $("bs-heads-all").addEventListener("click", () => {
      state.heads = [...Array(meta.heads).keys()];
      state.mode = "heads";
      syncControls();
      render();
    });
  }

  async function render() {
    if (!meta || !source) return;
    const gen = ++renderGen;
    document.documentElement.dataset.rendered = "0";
    try {
      if (state.view === "head") await renderHeadView(gen);
      else if (state.view === "matrix") await renderMatrixView(gen);
      else await renderModelView(gen);
      if (gen === renderGen) {
        document.documentElement.dataset.rendered = "1";
        showError("");
      }
    } catch (err) {
      showError(String(err.message || err));
    }
  }

  async function start(m, src) {
    meta = m;
    source = src;
    state.layer = Math.min(state.layer, meta.layers - 1);
    state.heads = state.heads.filter((h) => h < meta.heads);
    if (!state.heads.length) state.heads = [0];
    state.focus = null;
    buildControls();
    await render();
    document.documentElement.dataset.ready = "1";
  }

  function startServer() {
    const form = $("bs-form");
    form.hidden = false;
    wireControls();
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const text = $("bs-text").value, textB = $("bs-text-b").value.trim() ? $("bs-text-b").value : null;
      const status = $("bs-form-status");
      status.textContent = "computing…";
      document.documentElement.dataset.ready = "0";
      try {
        const r = await fetch("api/analyze", {
          method: "POST", headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ text, text_b: textB }),
        });
        const body = await r.json().catch(() => ({}));
        if (!r.ok) throw new Error(body.detail || `the server answered ${r.status}`);
        status.textContent = "";
        showError("");
        await start(body, new ServerSource(textB === null ? [text] : [text, textB]));
      } catch (err) {
        status.textContent = "";
        showError(String(err.message || err));
        document.documentElement.dataset.ready = "error";
      }
    });
    document.documentElement.dataset.ready = "form";
  }

  async function startFile() {
    wireControls();
    try {
      await start(cfg.meta, await FileSource.load(cfg.meta));
    } catch (err) {
      showError(String(err.message || err));
      document.documentElement.dataset.ready = "error";
    }
  }

  window.bertscope = { state, render, get meta() { return meta; } };
  if (cfg.mode === "server") startServer();
  else startFile();
})();
