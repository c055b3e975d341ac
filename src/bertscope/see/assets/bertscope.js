/* bertscope attention explorer: head view, model view, matrix view, query-key view.
 *
 * Hand-written vanilla JavaScript, no dependencies. Works from a file (the numbers are in the
 * page, quantised, deflated and base64-encoded) or against `bertscope serve` (the numbers are
 * fetched on demand, one layer and the chosen heads at a time).
 *
 * Matrices are row-major Float32Arrays: M[i * n + j] is the attention from unit i (a query)
 * to unit j (a key). Units are sub-tokens or words; word level follows Clark et al. 2019:
 * attention to a word sums over its sub-tokens, attention from a word averages over them.
 *
 * Where the numbers come from is decided in one section, "which matrices are drawn":
 * pickMatrices() gives the head, matrix and query-key views their matrices for a text at a layer,
 * layerMaps() the model view's whole row. Another measure than attention (state.measure: norm,
 * ALTI, ... when the page offers them, meta.measures) plugs in there: a per-layer measure has one
 * map per layer, so the head choices are switched off while it is shown.
 * Long work (all heads at 512 tokens, the model view) runs in slices of a few milliseconds
 * with yields between them, and says what it is doing in #bs-progress.
 */
(function () {
  "use strict";

  const ROW = 18;          // head view: pixels per token row
  const COL_W = 132;       // head view: width of a token column
  const GAP = 230;         // head view: width of the band the lines cross
  const MIN_GAP = 80;      // ... on a screen too narrow for both columns and GAP
  const MIN_COL = 96;      // ... and the token columns, narrower still
  const THUMB = 72;        // model view: largest thumbnail resolution (cells are pooled above it)
  const SLICE_MS = 25;     // longest stretch of work before the page gets the main thread back
  const MAX_CANVAS = 16000;  // largest canvas side drawn, in CSS pixels
  const FOCUS_LINES = 120;   // head view: most lines drawn per matrix for a focused token (the strongest)
  const SLICE_LINES = 400;   // head view: line segments drawn before the browser may paint
  const LINES_PER_TOKEN = 50;  // head view: a map not shared out by rows (norm) draws at most this many lines per token
  const ZOOMS = [2, 3, 4, 6, 8, 11, 14, 18, 22, 26, 32];  // matrix view cell sizes

  const $ = (id) => document.getElementById(id);
  const cfg = JSON.parse($("bertscope-config").textContent);  // {mode, meta, api: the server's API (server mode)}
  let meta = null;
  let source = null;
  const state = {
    view: "head", layer: 0, heads: [0], mode: "heads", level: "word", hideSpecial: false,
    measure: "attention",  // or one of meta.measures[].name
    scale: "shared",   // "shared": one colour scale for every panel; "panel": each its own
    span: null,        // [start, end) window of token positions, or null for every token
    focus: null,       // pinned focus {panel, side: "left"|"right", index}
    hover: null,       // transient focus, same shape
    modelText: 0,      // model view: 0 = text A, 1 = text B, "diff" = A - B
    zoom: null,        // matrix view cell size in pixels; null = fit
    qkText: 0,         // query-key view: which text
    qkQuery: null,     // query-key view: the query token (index), null = a sensible first
  };
  let renderGen = 0;
  // each head-view column's tab stop ("panel.side": the token index focused there last), kept
  // across the renders of one text
  let tokenStops = {};

  /** A head's colour: its hue, 68% saturated, 44% light, or darker where that is too light to
   * carry text: a pressed head's white number on it and its name in the readout's header, on
   * white, both at 4.5:1 or more (WCAG AA). At 44% the greens, cyans and orange were 2.35:1 to
   * 3.09:1 (heads 2, 4, 5, 7, 10); the blues, purples and reds keep their 44%. */
  const headColors = new Map();
  function headColor(h) {
    const hue = Math.round((h * 137.508 + 210) % 360);
    if (!headColors.has(hue)) {
      const lin = (x) => x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4;
      const onWhite = (l) => {  // the contrast of hsl(hue, 68%, l%) with white
        const a = 0.68 * Math.min(l, 100 - l) / 100;
        const [r, g, b] = [0, 8, 4].map((n) => { const k = (n + hue / 30) % 12;
          return l / 100 - a * Math.max(-1, Math.min(k - 3, 9 - k, 1)); });
        return 1.05 / (0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b) + 0.05);
      };
      let l = 44;
      while (onWhite(l) < 4.6) l -= 1;  // 4.6: a margin over 4.5 for the rounding to 8 bits
      headColors.set(hue, `hsl(${hue}, 68%, ${l}%)`);
    }
    return headColors.get(hue);
  }

  /** A weight as text: 3 decimals for the file's numbers (stored to within 1/2048), 4 when exact. */
  function fmt(x) {
    const d = source && source.exact ? 4 : 3;
    return (Math.round(x * 10 ** d) / 10 ** d).toFixed(d);
  }

  /** 2 -> "2nd", 3 -> "3rd", 11 -> "11th". */
  function ordinal(n) {
    const tens = n % 100, last = n % 10;
    const suffix = tens >= 11 && tens <= 13 ? "th" : last === 1 ? "st" : last === 2 ? "nd" : last === 3 ? "rd" : "th";
    return `${n}${suffix}`;
  }

  function fmtSigned(x, d = 3) { return (x >= 0 ? "+" : "−") + Math.abs(x).toFixed(d); }

  function showError(msg) {
    const el = $("bs-error");
    // the server's and the library's lines begin in lower case (they follow "bertscope: error:"
    // in a terminal); the page's own begin with a capital: one look, as a sentence ("text_b" and
    // the like are names, left as they are)
    el.textContent = msg.replace(/^[a-z]+\b/, (w) => w[0].toUpperCase() + w.slice(1));
    el.hidden = !msg;
    if (msg && el.scrollIntoView) el.scrollIntoView({ block: "nearest" });  // never below the fold
  }

  /** The sticky controls bar's height, as --bs-controls-h: sticky table headers and the pinned
   * readout sit below it, not under it (it is 2-3 rows tall on narrow screens). */
  let controlsObserved = false;
  function trackControlsHeight() {
    if (controlsObserved || typeof ResizeObserver !== "function") return;
    controlsObserved = true;
    const bar = $("bs-controls");
    const set = () => {
      const sticky = getComputedStyle(bar).position === "sticky";
      document.documentElement.style.setProperty("--bs-controls-h", `${sticky ? bar.offsetHeight : 0}px`);
    };
    new ResizeObserver(set).observe(bar);
    window.addEventListener("resize", set);
    set();
  }

  function setProgress(msg) { $("bs-progress").textContent = msg || ""; }

  /** Give the main thread back to the browser (input, painting), then continue. */
  function yieldNow() {
    if (window.scheduler && typeof window.scheduler.yield === "function") return window.scheduler.yield();
    return new Promise((r) => setTimeout(r, 0));
  }

  /** Resolve after the next frame has been painted. */
  function nextFrame() {
    return new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
  }

  /** Time-sliced loops: `await slicer.tick()` yields once the slice has run SLICE_MS. */
  function slicer() {
    let t0 = performance.now();
    return {
      async tick() {
        if (performance.now() - t0 > SLICE_MS) { await yieldNow(); t0 = performance.now(); }
      },
    };
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // ---------------------------------------------------------------- data sources

  function decodeBase64(b64) {
    if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(b64);
    const bin = atob(b64);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  /** Inflate deflated bytes (of a known inflated size) with the browser's DecompressionStream.
   * The input goes in in pieces with a yield between them: inflated in one go, 80 MB would hold
   * the main thread for most of a second. */
  async function inflate(bytes, size) {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("this browser cannot inflate the report's data (it needs DecompressionStream: " +
        "Chrome 80+, Firefox 113+, Safari 16.4+)");
    }
    const ds = new DecompressionStream("deflate");
    const writer = ds.writable.getWriter(), reader = ds.readable.getReader();
    const out = new Uint8Array(size);
    const pump = (async () => {
      let off = 0;
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return off;
        if (off + value.length > size) throw new Error("the report's data is larger than its header says");
        out.set(value, off);
        off += value.length;
      }
    })();
    const PIECE = 1 << 18;
    for (let i = 0; i < bytes.length; i += PIECE) {
      await writer.write(bytes.subarray(i, i + PIECE));
      await yieldNow();
    }
    await writer.close();
    const got = await pump;
    if (got !== size) throw new Error("the report's data is shorter than its header says");
    return out;
  }

  /** The numbers embedded in the file: uint16 multiples of 1/scale, as two byte planes;
   * queries, keys and values (when stored) as float32 in four byte planes. */
  class FileSource {
    constructor(m, planes) {
      const n = m.data.count;
      this.lo = planes.subarray(0, n);
      this.hi = planes.subarray(n, 2 * n);
      this.scale = m.data.scale;
      this.scales = m.data.scales || {};  // "m:NAME" -> that measure's own scale
      this.layout = m.data.layout;
      this.H = m.heads;
      this.exact = false;
      this.qkPlanes = null;
    }
    /** Whether the file holds the queries, keys and values (the query-key view needs them). */
    get hasQK() { return !!meta.qk; }
    static async load(m) {
      const raw = await inflate(decodeBase64($("bertscope-blob").textContent.trim()), 2 * m.data.count);
      return new FileSource(m, raw);
    }
    /** Token-level matrices of text t: kind "attn" (one per head), "rollout" (head ignored) or
     * "m:NAME", a measure (per head or per layer, as meta.measures says). */
    async matrices(t, kind, layer, heads) {
      const T = meta.texts[t].tokens.length;
      const inv = 1 / (this.scales[kind] || this.scale), lo = this.lo, hi = this.hi;
      const perHead = kind === "attn" || (measureInfo(kind.slice(2)) || {}).per_head;
      return heads.map((h) => {
        const slot = perHead ? layer * this.H + h : layer;
        const base = this.layout[t][kind] + slot * T * T;
        const out = new Float32Array(T * T);
        for (let i = 0; i < T * T; i++) out[i] = (lo[base + i] | (hi[base + i] << 8)) * inv;
        return out;
      });
    }
    /** q, k, v (T x D each, row-major) of text t, layer, head; null when the file has none. */
    async qk(t, layer, head) {
      const info = meta.qk && meta.qk.layout[t];
      if (!info) return null;
      if (!this.qkPlanes) this.qkPlanes = await inflate(decodeBase64($("bertscope-qk").textContent.trim()), 4 * meta.qk.count);
      const P = this.qkPlanes, n = meta.qk.count;
      const [, N, H, T, D] = info.shape;
      const bytes = new Uint8Array(4 * T * D);
      const get = (which) => {
        const base = info.offset + (((which * N + layer) * H + head) * T) * D;
        for (let i = 0; i < T * D; i++) {
          const at = base + i;
          bytes[4 * i] = P[at]; bytes[4 * i + 1] = P[n + at]; bytes[4 * i + 2] = P[2 * n + at]; bytes[4 * i + 3] = P[3 * n + at];
        }
        return new Float32Array(bytes.buffer.slice(0));  // a copy: bytes is reused
      };
      return { q: get(0), k: get(1), v: get(2), T, D };
    }
  }

  function decodeFloat32(b64) {
    const bytes = decodeBase64(b64);
    return new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  }

  /** An error that is the page's own doing: a request it no longer wants, aborted. Never shown. */
  const isAbort = (err) => !!err && err.name === "AbortError";

  async function postJSON(url, body, signal) {
    let r;
    try {
      r = await fetch(url, {
        method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body), signal,
      });
    } catch (err) {  // no answer at all: the browser says only "Failed to fetch"
      if (isAbort(err)) throw err;
      throw new Error(`the server at ${location.host} did not answer: is bertscope serve still running?`);
    }
    const out = await r.json().catch(() => ({}));
    if (!r.ok) {
      const d = out.detail;
      throw new Error(typeof d === "string" ? d : (Array.isArray(d) && d[0] && d[0].msg) || `the server answered ${r.status}`);
    }
    return out;
  }

  /** The numbers computed by `bertscope serve`, fetched per layer and head, cached.
   *
   * The server computes one request at a time, and a measure can take seconds (ALTI of 512
   * tokens). A request the page no longer wants is aborted, and the server drops it if it has
   * not begun: focus(measure) aborts those of every other measure, close() all of them. */
  class ServerSource {
    constructor(request) {
      this.request = request;  // {text, text_b, pair}
      this.exact = true;
      this.cache = new Map();  // "kind:layer:head" -> Promise of [matrix per text]
      this.pending = new Map();  // the measure asked for ("" for the weights, rollout, q/k) -> Set of AbortControllers
    }
    get hasQK() { return true; }  // the server computes them on request
    post(route, body, measure) {
      const ctl = new AbortController();
      if (!this.pending.has(measure)) this.pending.set(measure, new Set());
      this.pending.get(measure).add(ctl);
      const p = postJSON(cfg.api + route, body, ctl.signal);
      const done = () => this.pending.get(measure).delete(ctl);
      p.then(done, done);
      return p;
    }
    focus(measure) {  // the measure now shown (null: the attention weights)
      for (const [m, ctls] of this.pending) if (m && m !== measure) ctls.forEach((c) => c.abort());
    }
    close() {
      for (const ctls of this.pending.values()) ctls.forEach((c) => c.abort());
    }
    async matrices(t, kind, layer, heads) {
      const measure = kind.startsWith("m:") ? kind.slice(2) : null;
      const perHead = kind === "attn" || (measure && measureInfo(measure).per_head);
      const hs = perHead ? heads : [-1];
      const missing = hs.filter((h) => !this.cache.has(`${kind}:${layer}:${h}`));
      if (missing.length) {
        const body = measure ? { kind: "measure", measure } : { kind };
        const req = this.post("attention", { ...this.request, layer, heads: perHead ? missing : [], ...body }, measure || "");
        if (measure) {  // seconds for a long text (ALTI of 500 tokens): say what the wait is for
          const n = Math.max(...meta.texts.map((x) => x.tokens.length));
          setProgress(`computing ${measure} for ${n.toLocaleString()} tokens on the server…`);
        }
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
    async qk(t, layer, head) {
      const key = `qk:${t}:${layer}:${head}`;
      if (!this.cache.has(key)) {
        const p = this.post("qk", { ...this.request, which: t, layer, head }, "").then((b) => (
          { q: decodeFloat32(b.q), k: decodeFloat32(b.k), v: decodeFloat32(b.v), T: b.tokens, D: b.head_size }));
        p.catch(() => this.cache.delete(key));
        this.cache.set(key, p);
      }
      return this.cache.get(key);
    }
  }

  // ---------------------------------------------------------------- units, windows, alignment

  const unitCache = new Map();

  /** The units of text t at the current level: labels, special flags, token -> unit map, and
   * per unit its first and last token and its segment (0 = A, 1 = B of a sentence pair). */
  function units(t, level = state.level) {
    const key = `${t}:${level}`;
    if (unitCache.has(key)) return unitCache.get(key);
    const x = meta.texts[t];
    const T = x.tokens.length;
    let u;
    if (level === "word") {
      const W = x.words.length;
      const first = new Array(W).fill(T), last = new Array(W).fill(-1);
      x.token_words.forEach((w, i) => { first[w] = Math.min(first[w], i); last[w] = Math.max(last[w], i); });
      u = { labels: x.words, special: x.word_special, map: x.token_words, first, last };
    } else {
      const idx = [...Array(T).keys()];
      u = { labels: x.tokens, special: x.special, map: null, first: idx, last: idx };
    }
    u.segment = x.segments ? u.first.map((i) => x.segments[i]) : null;
    unitCache.set(key, u);
    return u;
  }

  /** The window of token positions shown for text t: [start, end). */
  function spanOf(t) {
    const T = meta.texts[t].tokens.length;
    if (!state.span) return [0, T];
    return [Math.min(state.span[0], T), Math.min(state.span[1], T)];
  }

  /** Unit indices of text t that the settings show (hidden [CLS]/[SEP] and the window applied). */
  function keptUnits(t) {
    const u = units(t);
    const [s, e] = spanOf(t);
    const keep = [];
    for (let i = 0; i < u.labels.length; i++) {
      if (state.hideSpecial && u.special[i]) continue;
      if (u.last[i] < s || u.first[i] >= e) continue;
      keep.push(i);
    }
    return keep;
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

  /** Token matrix of text t -> what is shown: {n, M, keep (unit indices), labels, special, segment}. */
  function project(t, M) {
    const T = meta.texts[t].tokens.length;
    const u = units(t);
    const full = u.map ? toWords(M, T, u.map, u.labels.length) : M;
    const N = u.labels.length;
    const keep = keptUnits(t);
    const n = keep.length;
    let out = full;
    if (n !== N) {
      out = new Float32Array(n * n);
      for (let a = 0; a < n; a++) {
        const r = keep[a] * N;
        for (let b = 0; b < n; b++) out[a * n + b] = full[r + keep[b]];
      }
    }
    return {
      t, n, M: out, keep, labels: keep.map((i) => u.labels[i]), special: keep.map((i) => u.special[i]),
      segment: u.segment ? keep.map((i) => u.segment[i]) : null,
    };
  }

  const alignCache = new Map();

  /** Word or sub-token alignment of texts A and B (difflib, computed by bertscope): a -> b, b -> a. */
  function alignment(level = state.level) {
    if (!meta.alignment) return null;
    if (alignCache.has(level)) return alignCache.get(level);
    const ab = new Map(), ba = new Map();
    for (const [i, j] of meta.alignment[level]) { ab.set(i, j); ba.set(j, i); }
    const out = { ab, ba, share: meta.alignment.share, minShare: meta.alignment.min_share,
      tooDifferent: meta.alignment.share < meta.alignment.min_share };
    alignCache.set(level, out);
    return out;
  }

  /** Unit u of text t's counterpart in the other text, or undefined when it has none. */
  function counterpart(t, u) {
    const al = alignment();
    if (!al) return undefined;
    return t === 0 ? al.ab.get(u) : al.ba.get(u);
  }

  // ---------------------------------------------------------------- which matrices are drawn

  /** What the current settings show for text t at a layer: [{key, name, color, M (token level)}].
   * The one place that decides which numbers the views draw. */
  async function pickMatrices(t, layer) {
    const H = meta.heads;
    const mi = measureInfo();
    if (mi) return inked(mi, await pickMeasure(t, layer, mi));
    if (state.mode === "rollout") {
      const [M] = await source.matrices(t, "rollout", layer, [0]);
      return [{ key: "rollout", name: "rollout", color: "#2456c9", M }];
    }
    if (state.mode === "mean") {
      const all = await source.matrices(t, "attn", layer, [...Array(H).keys()]);
      return [{ key: "mean", name: "mean", color: "#2456c9", M: meanOf(all) }];
    }
    const ms = await source.matrices(t, "attn", layer, state.heads);
    return state.heads.map((h, k) => ({ key: String(h), name: `head ${h}`, color: headColor(h), M: ms[k] }));
  }

  /** How close the stored numbers are, as text: within one step of 1/scale (the rounding of two
   * cumulative sums), ±0.0005 for weights (1/2048), more for a measure stored on a coarser scale
   * (norm's lengths past 32). */
  function storedTo() {
    const mi = measureInfo();
    const scale = (mi && source.scales && source.scales["m:" + mi.name]) || source.scale || 2048;
    const step = 1 / scale;
    return step < 0.001 ? step.toFixed(4) : step.toPrecision(2);
  }

  /** The measure shown instead of the attention weights: {name, per_head, share}, or null. */
  function measureInfo(name = state.measure) {
    if (!meta || !meta.measures || name === "attention") return null;
    return meta.measures.find((m) => m.name === name) || null;
  }

  async function pickMeasure(t, layer, mi) {
    const kind = "m:" + mi.name;
    if (!mi.per_head) {
      const [M] = await source.matrices(t, kind, layer, [0]);
      return [{ key: mi.name, name: mi.name, color: "#2456c9", M }];
    }
    if (state.mode !== "heads") {
      const all = await source.matrices(t, kind, layer, [...Array(meta.heads).keys()]);
      return [{ key: "mean", name: `${mi.name}, mean`, color: "#2456c9", M: meanOf(all) }];
    }
    const ms = await source.matrices(t, kind, layer, state.heads);
    return state.heads.map((h, k) => ({ key: String(h), name: `${mi.name}, head ${h}`, color: headColor(h), M: ms[k] }));
  }

  /** A measure whose rows are not shares (norm: vector lengths) is drawn relative to its largest
   * value in the layer: ink scales the lines' opacity; the numbers stay the measure's own. */
  function inked(mi, list) {
    if (mi.share) return list;
    const top = Math.max(1e-9, ...list.map((m) => maxOf(m.M)));
    return list.map((m) => ({ ...m, ink: 1 / top }));
  }

  /** The model view's columns for the current measure: {head (data-head), header, label(l), pick()}. */
  function modelColumns() {
    const H = meta.heads, mi = measureInfo();
    const cols = [];
    if (!mi || mi.per_head) {
      const what = mi ? `${mi.name}, ` : "";
      for (let h = 0; h < H; h++) {
        cols.push({ head: String(h), header: `head ${h}`, label: (l) => `${what}layer ${l}, head ${h}`,
          pick: () => { state.mode = "heads"; state.heads = [h]; } });
      }
      cols.push({ head: "mean", header: "mean", label: (l) => `${what}layer ${l}, mean over heads`,
        pick: () => { state.mode = "mean"; } });
    }
    if (!mi) {
      cols.push({ head: "rollout", header: "rollout", label: (l) => `rollout through layer ${l}`,
        pick: () => { state.mode = "rollout"; } });
    } else if (!mi.per_head) {
      cols.push({ head: mi.name, header: mi.name, label: (l) => `${mi.name}, layer ${l}`, pick: () => {} });
    }
    return cols;
  }

  /** Every map of one layer for the model view, one per modelColumns() entry (token level). */
  async function layerMaps(t, layer) {
    const mi = measureInfo();
    const kind = mi ? "m:" + mi.name : "attn";
    if (mi && !mi.per_head) return source.matrices(t, kind, layer, [0]);
    const heads = await source.matrices(t, kind, layer, [...Array(meta.heads).keys()]);
    if (mi) return [...heads, meanOf(heads)];
    const [roll] = await source.matrices(t, "rollout", layer, [0]);
    return [...heads, meanOf(heads), roll];
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
    const mi = measureInfo();
    if (mi && !mi.per_head) return `${mi.name}, ${L}`;
    if (mi && state.mode !== "heads") return `${mi.name}, ${L}, mean over ${meta.heads} heads`;
    if (mi) return `${mi.name}, ${L}, head${state.heads.length > 1 ? "s" : ""} ${state.heads.join(", ")}`;
    if (state.mode === "rollout") return `rollout through layers 0–${state.layer}`;
    if (state.mode === "mean") return `${L}, mean over ${meta.heads} heads`;
    return `${L}, head${state.heads.length > 1 ? "s" : ""} ${state.heads.join(", ")}`;
  }

  function windowNote() {
    const parts = [];
    if (state.span) parts.push(`tokens ${state.span[0]}–${state.span[1] - 1} only`);
    if (state.hideSpecial) parts.push("[CLS]/[SEP] hidden");
    return parts.length ? `${parts.join(", ")}; rows not renormalised (weight to hidden units is left out)` : "";
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
    let m = 0;
    for (let i = 0; i < M.length; i++) if (M[i] > m) m = M[i];
    return m;
  }

  function maxAbs(M) {
    let m = 0;
    for (let i = 0; i < M.length; i++) { const x = Math.abs(M[i]); if (x > m) m = x; }
    return m;
  }

  /** A colour bar with its scale written out: the legend of every coloured view. */
  function legend(vmax, diverging, text, eachOwn = false) {
    const box = el("div", "bs-legend");
    box.dataset.vmax = String(vmax);
    box.dataset.scale = state.scale;
    const bar = document.createElement("canvas");
    bar.className = "bs-legend-bar";
    bar.setAttribute("aria-hidden", "true");  // its ends and its text, beside it, say the scale
    bar.width = 120; bar.height = 10;
    const ctx = bar.getContext("2d");
    for (let x = 0; x < 120; x++) {
      const v = diverging ? (x / 119) * 2 - 1 : x / 119;
      const [r, g, b] = diverging ? divColor(v) : seqColor(v);
      ctx.fillStyle = `rgb(${r},${g},${b})`;
      ctx.fillRect(x, 0, 1, 10);
    }
    // eachOwn: one legend for panels that are each scaled to their own maximum
    const lo = el("span", "bs-legend-end", diverging ? (eachOwn ? "−its max" : fmtSigned(-vmax)) : "0");
    const hi = el("span", "bs-legend-end", eachOwn ? (diverging ? "+its max" : "its max") : (diverging ? fmtSigned(vmax) : fmt(vmax)));
    box.append(lo, bar, hi, el("span", "bs-legend-text", text));
    return box;
  }

  function scaleText(diverging, vmax, what) {
    const shared = state.scale === "shared";
    if (diverging) {
      return shared
        ? `A − B: blue where A attends more, red where B does; one scale for ${what}: full colour at ±${fmt(vmax)}`
        : `A − B, each panel scaled to its own largest difference: colours cannot be compared between panels`;
    }
    return shared
      ? `one scale for ${what}: white = 0, darkest = ${fmt(vmax)}`
      : `each panel scaled to its own largest weight: colours cannot be compared between panels`;
  }

  // ---------------------------------------------------------------- head view

  /** What the units are called: "word" or "sub-token" (the Units select's words). */
  function unitName() { return state.level === "word" ? "word" : "sub-token"; }

  function tokenDiv(label, side, index, special, top, width = COL_W) {
    const d = el("div", `bs-tok bs-${side}` + (special ? " bs-special" : ""), label);
    d.style.top = `${top}px`;
    d.style.width = `${width}px`;
    d.title = label;
    d.dataset.side = side;
    d.dataset.i = String(index);
    // keyboard: Tab reaches each column's first token, the arrows move along the column, focus
    // shows a token's lines, Enter or Space pins its numbers (one tab stop per column, not 512)
    d.setAttribute("role", "button");
    d.setAttribute("aria-pressed", "false");
    // the two columns hold the same words: the name says the side, and where ("the" is often twice)
    d.setAttribute("aria-label", `${side === "left" ? "from" : "to"} “${label}”, ${unitName()} ${index}`);
    return d;
  }

  /** Says a short text to a screen reader (a polite live region, out of sight). */
  function announce(text) {
    const box = $("bs-announce");
    // the same words again (a token pinned twice) are a change too: emptied first, then set
    if (box.textContent === text) box.textContent = "";
    box.textContent = text;
  }

  /** The readout of a token in words: its 3 strongest weights (the mean of several heads'), not
   * the whole table, which a screen reader would read for a minute. */
  function headSummary(view, side, index) {
    const { shown, n, keep } = view;
    const pos = keep.indexOf(index);
    if (pos < 0) return "";
    const weights = new Float32Array(n);
    for (const m of shown) {
      for (let k = 0; k < n; k++) weights[k] += (side === "left" ? m.P.M[pos * n + k] : m.P.M[k * n + pos]) / shown.length;
    }
    const labels = shown[0].P.labels;
    const top = [...weights.keys()].sort((a, b) => weights[b] - weights[a]).slice(0, 3);
    const what = shown.length > 1 ? (measureInfo() ? `${state.measure}, ` : "") + `mean of ${shown.length} heads`
      : shown[0].name;
    // the token's own name is not said again: a screen reader has just read it, with the focus
    const words = top.map((k) => `“${labels[k]}” ${fmt(weights[k])}`).join(", ");
    return `${what}: ${side === "left" ? "to" : "from"} ${words}`;
  }

  function setupCanvas(canvas, w, h, maxDpr = 2) {
    let dpr = Math.min(maxDpr, window.devicePixelRatio || 1);
    if (Math.max(w, h) * dpr > MAX_CANVAS) dpr = 1;
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    canvas.style.width = `${w}px`;
    canvas.style.height = `${h}px`;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return ctx;
  }

  /** Focus that applies to panel t: its own, or the other text's, carried over by the alignment. */
  function focusFor(t, f) {
    if (!f) return null;
    if (f.panel === t) return f;
    if (meta.texts.length !== 2) return null;
    const idx = counterpart(f.panel, f.index);
    return { panel: t, side: f.side, index: idx === undefined ? null : idx, linked: true, from: f };
  }

  /** Empty a view for a new picture, but for its heading: the page reads h1 (the page), h2 (the
   * view, out of sight: its tab says it), h3 (a panel). */
  function clearView(root) {
    root.textContent = "";
    root.appendChild(el("h2", "bs-sr", $(root.getAttribute("aria-labelledby")).textContent));
  }

  async function renderHeadView(gen) {
    const root = $("bs-head-view");
    const texts = meta.texts.map((_, t) => t);
    const per = await Promise.all(texts.map((t) => pickMatrices(t, state.layer)));
    if (gen !== renderGen) return;
    clearView(root);
    const panels = el("div", "bs-panels");
    root.appendChild(panels);
    const built = texts.map((t) => buildHeadPanel(t, per[t], panels));
    for (const p of built) {
      if (!(await p.drawBase(gen))) return;
    }
    redrawHeadPanels();
  }

  function buildHeadPanel(t, list, panels) {
    const shown = list.map((m) => ({ ...m, P: project(t, m.M) }));
    const { n, labels, special, keep, segment } = shown[0].P;
    const panel = el("div", "bs-panel");
    panel.dataset.panel = String(t);
    panel.dataset.layer = String(state.layer);
    panel.dataset.heads = shown.map((m) => m.key).join(",");
    const h3 = el("h3");
    if (meta.texts.length > 1) h3.appendChild(el("span", "bs-tag", "AB"[t] + " "));
    h3.appendChild(document.createTextNode(describe()));
    panel.appendChild(h3);
    const note = windowNote();
    if (note) panel.appendChild(el("div", "bs-note", note));
    const body = el("div", "bs-panel-body");
    const scroll = el("div", "bs-hv-scroll");
    const hv = el("div", "bs-hv");
    // the band narrows on a narrow screen, so both token columns stay in view (down to MIN_GAP),
    // and then the columns (down to MIN_COL: long words are cut with "…", whole in their title)
    const room = panels.clientWidth || Infinity;
    const colW = Math.round(Math.max(MIN_COL, Math.min(COL_W, (room - MIN_GAP - 8) / 2)));
    const gap = Math.round(Math.max(MIN_GAP, Math.min(GAP, room - 2 * colW - 8)));
    hv.style.width = `${2 * colW + gap}px`;
    hv.style.height = `${n * ROW}px`;
    const canvas = el("canvas", "bs-lines");
    canvas.style.left = `${colW}px`;
    hv.appendChild(canvas);
    const left = el("div", "bs-col"), right = el("div", "bs-col");
    right.style.left = `${colW + gap}px`;
    const tag = meta.texts.length > 1 ? `${"AB"[t]}: ` : "";
    left.setAttribute("role", "group");
    left.setAttribute("aria-label", `${tag}${unitName()}s attending (from)`);
    right.setAttribute("role", "group");
    right.setAttribute("aria-label", `${tag}${unitName()}s attended to (to)`);
    const two = meta.texts.length === 2;
    const leftDivs = [], rightDivs = [];
    for (let a = 0; a < n; a++) {
      for (const [col, side, list] of [[left, "left", leftDivs], [right, "right", rightDivs]]) {
        const d = tokenDiv(labels[a], side, keep[a], special[a], a * ROW, colW);
        // the column's tab stop: the token focused in it last, if still shown, else its first
        const stop = keep.includes(tokenStops[`${t}.${side}`]) ? tokenStops[`${t}.${side}`] : keep[0];
        d.tabIndex = keep[a] === stop ? 0 : -1;
        list.push(d);
        if (two && counterpart(t, keep[a]) === undefined) {  // [SEP] too: a pair's second has none in a text
          d.classList.add("bs-unmatched");
          d.title = `${labels[a]}: no counterpart in ${"BA"[t]} (left out of the A − B difference)`;
          d.setAttribute("aria-label", `${d.getAttribute("aria-label")}, no counterpart in ${"BA"[t]}`);
        }
        col.appendChild(d);
      }
    }
    hv.append(left, right);
    if (segment) {  // a sentence pair: draw where segment B begins
      const b = segment.indexOf(1);
      if (b > 0) {
        const line = el("div", "bs-segline");
        line.style.top = `${b * ROW}px`;
        line.title = "segment A above, segment B below";
        line.appendChild(el("span", "bs-seglabel", "B ↓"));
        hv.appendChild(line);
      }
    }
    scroll.appendChild(hv);
    body.appendChild(scroll);
    // The readout's size never follows what it shows (a note, or a table of n rows): it changes as
    // the pointer moves, and a box that grew or shrank with it moved the tokens under the pointer
    // (the other panel beside or below, or the lines below it on a narrow screen), so the focus
    // jumped to another token. Its height is room for the table, its width set by the CSS; the
    // table scrolls inside it where it needs more. Three heads or more: the wide box (bs-wide).
    const readout = el("div", "bs-readout" + (shown.length > 2 ? " bs-wide" : ""));
    readout.style.height = `min(78vh, ${72 + 23 * (n + 1)}px)`;
    body.appendChild(readout);
    panel.appendChild(body);
    panels.appendChild(panel);

    const ctx = setupCanvas(canvas, gap, Math.max(1, n * ROW));
    const view = { t, ctx, canvas, shown, n, keep, hv, readout, base: null, leftDivs, rightDivs, marked: [], gap };
    panel._draw = () => drawFocus(view);
    panel._view = view;
    hv.addEventListener("mouseover", (e) => {
      const d = e.target.closest(".bs-tok");
      if (!d) return;
      state.hover = { panel: t, side: d.dataset.side, index: Number(d.dataset.i) };
      redrawHeadPanels();
    });
    hv.addEventListener("mouseleave", () => { state.hover = null; redrawHeadPanels(); });
    hv.addEventListener("focusin", (e) => {
      const d = e.target.closest(".bs-tok");
      if (!d) return;
      // a roving tab stop: Tab and Shift+Tab come back to the token the user was on, not the first
      for (const x of d.dataset.side === "left" ? leftDivs : rightDivs) x.tabIndex = x === d ? 0 : -1;
      tokenStops[`${t}.${d.dataset.side}`] = Number(d.dataset.i);
      state.hover = { panel: t, side: d.dataset.side, index: Number(d.dataset.i) };
      redrawHeadPanels();
      announce(headSummary(view, d.dataset.side, Number(d.dataset.i)));  // the readout, in short
    });
    hv.addEventListener("focusout", (e) => {
      if (!hv.contains(e.relatedTarget)) { state.hover = null; redrawHeadPanels(); }
    });
    hv.addEventListener("keydown", (e) => {
      const d = e.target.closest(".bs-tok");
      if (!d) return;
      if (e.key === "Enter" || e.key === " ") {
        e.preventDefault();
        d.click();
      } else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
        const col = Array.from(hv.querySelectorAll(`.bs-tok.bs-${d.dataset.side}`));
        const next = col[col.indexOf(d) + (e.key === "ArrowDown" ? 1 : -1)];
        if (next) { e.preventDefault(); next.focus(); }
      } else if (e.key === "Home" || e.key === "End") {  // the column's first or last token
        const col = d.dataset.side === "left" ? leftDivs : rightDivs;
        e.preventDefault();
        col[e.key === "Home" ? 0 : col.length - 1].focus();
      } else if ((e.key === "ArrowLeft" || e.key === "ArrowRight") && !e.altKey) {
        // across to the other column, the same token (both columns show the same ones); Alt+Left
        // stays the browser's Back
        const other = { ArrowLeft: leftDivs, ArrowRight: rightDivs }[e.key];
        const next = other[(d.dataset.side === "left" ? leftDivs : rightDivs).indexOf(d)];
        if (next && next !== d) { e.preventDefault(); next.focus(); }
      }
    });
    hv.addEventListener("click", (e) => {
      const d = e.target.closest(".bs-tok");
      if (!d) return;
      const f = { panel: t, side: d.dataset.side, index: Number(d.dataset.i) };
      const cur = state.focus ? focusFor(t, state.focus) : null;
      const same = cur && cur.side === f.side && cur.index === f.index;
      state.focus = same ? null : f;
      state.hover = null;
      writeView();
      redrawHeadPanels();
      announce(same ? `unpinned “${d.textContent}”`
        : `pinned “${d.textContent}”, ${headSummary(view, f.side, f.index)}`);
    });
    return { drawBase: (gen) => drawBase(view, gen) };
  }

  /** The value (times ink) of the k-th strongest entry of M, or 0 when M has no more than k. */
  function strongest(M, ink, k) {
    if (M.length <= k) return 0;
    const v = Float32Array.from(M, (x) => x * ink).sort();  // ascending
    return v[v.length - k];
  }

  /** Every line of every matrix shown (no focus), time-sliced; the picture is kept for reuse.
   * Lines are grouped by opacity (64 levels) so each group is one stroke. Returns false if a
   * newer render took over. */
  async function drawBase(view, gen) {
    const { ctx, shown, n, gap } = view;
    const H = n * ROW;
    ctx.clearRect(0, 0, gap, H);
    ctx.lineWidth = 1.6;
    const base = n <= 64 ? 0.002 : (n <= 200 ? 0.01 : 0.02);  // fainter lines are invisible among many
    const slice = slicer();
    view.thinned = false;
    let drawn = 0;  // lines drawn, all matrices (the panel's data-lines)
    for (let k = 0; k < shown.length; k++) {
      const m = shown[k];
      if (shown.length > 1 || n > 150) setProgress(`drawing lines: ${m.name} (${k + 1} of ${shown.length})…`);
      ctx.strokeStyle = m.color;
      const M = m.P.M, ink = m.ink || 1;
      // A share (a row sums to 1) has at most 1/base lines per row above base; a map of lengths
      // (norm, drawn against its largest value) can have nearly all n² of them, seconds to draw and
      // a solid band to see: it keeps its LINES_PER_TOKEN·n strongest, and the panel says so.
      const minW = m.ink ? Math.max(base, strongest(M, ink, LINES_PER_TOKEN * n)) : base;
      if (minW > base) view.thinned = true;
      let paths = new Array(65).fill(null);
      const flush = () => {
        for (let b = 1; b <= 64; b++) {
          if (!paths[b]) continue;
          ctx.globalAlpha = b / 64;
          ctx.stroke(paths[b]);
        }
        paths = new Array(65).fill(null);
      };
      let segments = 0;
      for (let a = 0; a < n; a++) {
        const ya = a * ROW + ROW / 2, row = a * n;
        for (let b = 0; b < n; b++) {
          const w = M[row + b] * ink;
          if (w < minW) continue;
          segments++;
          drawn++;
          if (w < 1 / 64) {  // faint lines keep their exact opacity
            ctx.globalAlpha = w;
            ctx.beginPath(); ctx.moveTo(0, ya); ctx.lineTo(gap, b * ROW + ROW / 2); ctx.stroke();
            continue;
          }
          const bucket = Math.min(64, Math.ceil(w * 64));
          const p = paths[bucket] || (paths[bucket] = new Path2D());
          p.moveTo(0, ya);
          p.lineTo(gap, b * ROW + ROW / 2);
        }
        if (segments >= SLICE_LINES || (a & 15) === 15) {
          flush();
          // A canvas turns its strokes into pixels when the page is painted: wait for a frame
          // after every SLICE_LINES lines, so that work is spread over frames too.
          if (segments >= SLICE_LINES) { await nextFrame(); segments = 0; } else await slice.tick();
          if (gen !== renderGen) return false;
        }
      }
      flush();
    }
    ctx.globalAlpha = 1;
    setProgress("");
    view.hv.closest(".bs-panel").dataset.lines = String(drawn);
    if (view.thinned) {
      const body = view.hv.closest(".bs-panel-body");
      const per = shown.length > 1 ? " per head" : "";
      body.before(el("div", "bs-note bs-thinned", `lines: the ${(LINES_PER_TOKEN * n).toLocaleString()} strongest ` +
        `of ${(n * n).toLocaleString()}${per} (${state.measure}: lengths, not shares of a row); hover a token for its own`));
    }
    const copy = document.createElement("canvas");
    copy.width = view.canvas.width;
    copy.height = view.canvas.height;
    copy.getContext("2d").drawImage(view.canvas, 0, 0);
    view.base = copy;
    return true;
  }

  function redrawHeadPanels() {
    document.querySelectorAll("#bs-head-view .bs-panel").forEach((p) => p._draw && p._draw());
  }

  /** Redraw one panel for the current focus: its lines only, its numbers, the shading. */
  function drawFocus(view) {
    const { t, ctx, shown, n, keep, readout } = view;
    const f = focusFor(t, state.hover) || focusFor(t, state.focus);
    const pos = f && f.index !== null ? keep.indexOf(f.index) : -1;
    view.capped = false;
    ctx.save();
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, view.canvas.width, view.canvas.height);
    if (pos < 0 && view.base) ctx.drawImage(view.base, 0, 0);
    ctx.restore();
    if (pos >= 0) {
      // the focused token's lines: above 0.001, at most FOCUS_LINES per matrix (the strongest),
      // so that a long text's focus draws at once
      ctx.lineWidth = 1.6;
      for (const m of shown) {
        ctx.strokeStyle = m.color;
        const M = m.P.M, ink = m.ink || 1;
        let idx = [];
        for (let k = 0; k < n; k++) {
          if ((f.side === "left" ? M[pos * n + k] : M[k * n + pos]) * ink >= 0.001) idx.push(k);
        }
        if (idx.length > FOCUS_LINES) {
          const w = (k) => (f.side === "left" ? M[pos * n + k] : M[k * n + pos]);
          idx = idx.sort((x, y) => w(y) - w(x)).slice(0, FOCUS_LINES);
          view.capped = true;
        }
        for (const k of idx) {
          const w = (f.side === "left" ? M[pos * n + k] : M[k * n + pos]) * ink;
          ctx.globalAlpha = Math.min(1, w);
          ctx.beginPath();
          const a = f.side === "left" ? pos : k, b = f.side === "left" ? k : pos;
          ctx.moveTo(0, a * ROW + ROW / 2);
          ctx.lineTo(view.gap, b * ROW + ROW / 2);
          ctx.stroke();
        }
      }
      ctx.globalAlpha = 1;
    }
    // undo the last highlight, then mark the pinned and focused tokens and shade the other side
    for (const d of view.marked) { d.classList.remove("bs-pinned", "bs-focus"); d.style.background = ""; d.setAttribute("aria-pressed", "false"); }
    view.marked = [];
    const divs = (side) => (side === "left" ? view.leftDivs : view.rightDivs);
    const pinned = focusFor(t, state.focus);
    const pinPos = pinned && pinned.index !== null ? keep.indexOf(pinned.index) : -1;
    if (pinPos >= 0) {
      const d = divs(pinned.side)[pinPos];
      d.classList.add("bs-pinned");
      d.setAttribute("aria-pressed", "true");  // a screen reader hears which token is pinned
      view.marked.push(d);
    }
    readout.textContent = "";
    if (pos < 0) {
      if (f && f.linked && f.index === null) {
        const other = units(f.from.panel).labels[f.from.index];
        readout.appendChild(el("span", "bs-note", `“${other}” has no counterpart in ${"AB"[t]} (the texts are aligned word by word).`));
      } else {
        readout.appendChild(el("span", "bs-note", "Hover a token to focus its lines; click it to pin the numbers. " +
          (meta.texts.length === 2 ? "The focus is linked: the same word is focused in A and B." : "")));
      }
      return;
    }
    const focused = divs(f.side)[pos];
    focused.classList.add("bs-focus");
    view.marked.push(focused);
    const weights = new Float32Array(n);
    for (const m of shown) {
      for (let k = 0; k < n; k++) weights[k] += (f.side === "left" ? m.P.M[pos * n + k] : m.P.M[k * n + pos]) / shown.length;
    }
    const wmax = Math.max(1e-9, maxOf(weights));
    divs(f.side === "left" ? "right" : "left").forEach((d, k) => {
      d.style.background = `rgba(36, 86, 201, ${(0.35 * weights[k] / wmax).toFixed(3)})`;
      view.marked.push(d);
    });
    // the numbers: one column per matrix shown (built as one string: thousands of cells at 512 tokens)
    const lab = shown[0].P.labels[pos];
    const what = measureInfo() ? state.measure : "attention";
    const caption = (f.side === "left" ? `${what} from “${lab}” to each ${state.level}`
      : `${what} to “${lab}” from each ${state.level}`) + (source.exact ? "" : ` (stored to ±${storedTo()})`) +
      (view.capped ? `; lines: the ${FOCUS_LINES} strongest per head` : "");
    const parts = [`<caption>${esc(caption)}</caption><tr><th>${f.side === "left" ? "to" : "from"}</th>`];
    const compact = shown.length > 3;  // many heads: "h4" (the name in its tooltip), so more columns fit
    shown.forEach((m) => parts.push(`<th style="color:${m.color}" title="${esc(m.name)}">` +
      `${esc(compact && /^\d+$/.test(m.key) ? "h" + m.key : m.name)}</th>`));
    parts.push("</tr>");
    for (let k = 0; k < n; k++) {
      parts.push(`<tr><td>${esc(shown[0].P.labels[k])}</td>`);
      const from = f.side === "left" ? f.index : keep[k], to = f.side === "left" ? keep[k] : f.index;
      for (const m of shown) {
        const w = f.side === "left" ? m.P.M[pos * n + k] : m.P.M[k * n + pos];
        // the bar sits in a box of fixed width, so the numbers line up
        const bar = shown.length === 1 ? `<span class="bs-barbox"><span class="bs-bar" style="width:${Math.round(60 * Math.min(1, w * (m.ink || 1)))}px"></span></span>` : "";
        parts.push(`<td class="bs-val" data-from="${from}" data-to="${to}" data-head="${esc(m.key)}" data-value="${w}">${fmt(w)}${bar}</td>`);
      }
      parts.push("</tr>");
    }
    const table = el("table", "bs-values");
    table.innerHTML = parts.join("");
    readout.appendChild(table);
  }

  function esc(s) {
    return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  }

  // ---------------------------------------------------------------- matrix view

  /** A − B over the units the two texts share (aligned by difflib), as shown now; or a reason. */
  function diffOf(PA, PB) {
    const al = alignment();
    if (!al) return null;
    if (al.tooDifferent) {
      return { tooDifferent: true, reason: `The texts are too different to compare word by word: only ` +
        `${meta.alignment.matched_words} of their ${Math.max(...meta.alignment.words)} words match ` +
        `(${Math.round(100 * al.share)}%; a difference needs ${Math.round(100 * al.minShare)}%).` };
    }
    const posA = new Map(PA.keep.map((u, i) => [u, i])), posB = new Map(PB.keep.map((u, i) => [u, i]));
    const rows = [];
    for (let i = 0; i < PA.keep.length; i++) {
      const j = al.ab.get(PA.keep[i]);
      if (j !== undefined && posB.has(j)) rows.push([i, posB.get(j)]);
    }
    const n = rows.length;
    const M = new Float32Array(n * n);
    for (let a = 0; a < n; a++) {
      for (let b = 0; b < n; b++) {
        M[a * n + b] = PA.M[rows[a][0] * PA.n + rows[b][0]] - PB.M[rows[a][1] * PB.n + rows[b][1]];
      }
    }
    const inA = new Set(rows.map((r) => r[0])), inB = new Set(rows.map((r) => r[1]));
    // the weight a shared row gives the words left out (mean over the rows): it is in neither side
    // of the difference, so the text that gives more has the smaller cells here
    const lost = (P, side, kept) => {
      let total = 0;
      for (const r of rows) {
        for (let j = 0; j < P.n; j++) if (!kept.has(j)) total += P.M[r[side] * P.n + j];
      }
      return n ? total / n : 0;
    };
    return {
      lostA: lost(PA, 0, inA), lostB: lost(PB, 1, inB),
      t: 0, n, M, keep: rows.map((r) => PA.keep[r[0]]), keepB: rows.map((r) => PB.keep[r[1]]),
      labels: rows.map((r) => PA.labels[r[0]]), special: rows.map((r) => PA.special[r[0]]), segment: null,
      unmatchedA: PA.labels.filter((_, i) => !inA.has(i)),  // [SEP] too (a pair's second): its weight is left out too
      unmatchedB: PB.labels.filter((_, i) => !inB.has(i)),
    };
  }

  function fitCell(n) { return Math.max(2, Math.min(26, Math.floor(560 / Math.max(1, n)))); }

  async function renderMatrixView(gen) {
    const root = $("bs-matrix-view");
    const per = await Promise.all(meta.texts.map((_, t) => pickMatrices(t, state.layer)));
    if (gen !== renderGen) return;
    clearView(root);
    const P = per.map((list, t) => project(t, meanOf(list.map((m) => m.M))));
    const cell = state.zoom || fitCell(Math.max(...P.map((p) => p.n)));
    const bar = el("div", "bs-zoom");
    bar.append(el("span", "bs-label", "Zoom"));
    [["−", -1], ["+", 1]].forEach(([label, step]) => {
      const b = el("button", "bs-small", label);
      b.type = "button";
      b.dataset.zoom = String(step);
      b.disabled = !ZOOMS.some((z) => (step > 0 ? z > cell : z < cell));  // at the largest (smallest) cell
      b.addEventListener("click", () => {
        const bigger = ZOOMS.filter((z) => z > cell), smaller = ZOOMS.filter((z) => z < cell);
        state.zoom = step > 0 ? (bigger[0] || cell) : (smaller[smaller.length - 1] || cell);
        render();
      });
      bar.appendChild(b);
    });
    const fit = el("button", "bs-small", "fit");
    fit.type = "button";
    fit.addEventListener("click", () => { state.zoom = null; render(); });
    bar.append(fit, el("span", "bs-label", `${cell} px per cell; labels stay in view while you scroll`));
    root.appendChild(bar);
    const note = windowNote();
    if (note) root.appendChild(el("div", "bs-note", note));
    const panels = el("div", "bs-panels");
    root.appendChild(panels);
    const mi = measureInfo();
    const several = state.mode === "heads" && state.heads.length > 1 && (!mi || mi.per_head);
    const what = describe() + (several ? " (their mean)" : "");
    const shared = state.scale === "shared";
    const common = Math.max(1e-9, ...P.map((p) => maxOf(p.M)));
    P.forEach((p, t) => {
      const vmax = shared ? common : Math.max(1e-9, maxOf(p.M));
      const title = meta.texts.length > 1 ? `${"AB"[t]}: ${what}` : what;
      panels.appendChild(matrixPanel(p, title, false, String(t), vmax, cell,
        scaleText(false, vmax, meta.texts.length > 1 ? "A and B" : "this map")));
    });
    if (P.length === 2) {
      const d = diffOf(P[0], P[1]);
      if (d && d.tooDifferent) panels.appendChild(el("div", "bs-panel bs-note bs-diff-note", d.reason));
      else if (d && d.n) {
        const vmax = Math.max(1e-9, maxAbs(d.M));
        const panel = matrixPanel(d, `A − B: ${what}`, true, "diff", vmax, cell, scaleText(true, vmax, "the difference"));
        if (d.unmatchedA.length || d.unmatchedB.length) {
          const unitsName = state.level === "word" ? "Words" : "Sub-tokens";
          let text = `${unitsName} without a counterpart, left out of the difference: ` +
            [d.unmatchedA.length ? `A: ${d.unmatchedA.join(" ")}` : "", d.unmatchedB.length ? `B: ${d.unmatchedB.join(" ")}` : ""]
              .filter(Boolean).join("; ") + ".";
          if (!mi || mi.share) {  // rows are shares: what goes to those units is missing from the rest
            const gap = d.lostA - d.lostB;
            const gives = [[d.unmatchedB, "B", d.lostB], [d.unmatchedA, "A", d.lostA]].filter(([u]) => u.length)
              .map(([, side, v], k) => (k ? `${side}'s ${fmt(v)}` : `${side}'s shared ${unitsName.toLowerCase()} give ` +
                `them ${fmt(v)} of their weight`)).join(", ");
            text += ` ${gives} (a row's total, mean over the rows); the difference leaves that weight out` +
              (Math.abs(gap) < 0.0005 ? "." : `, so ${gap > 0 ? "A" : "B"}'s rows hold ${fmt(Math.abs(gap))} less ` +
              `on the shared ${unitsName.toLowerCase()} than ${gap > 0 ? "B" : "A"}'s, spread over their cells, and A − B ` +
              `leans ${gap > 0 ? "red (negative)" : "blue (positive)"}.`);
          }
          panel.appendChild(el("div", "bs-note bs-unmatched-note", text));
        }
        panels.appendChild(panel);
      }
    }
  }

  function matrixPanel(p, title, diverging, key, vmax, cellWanted, scaleLine) {
    const { n, M, labels } = p;
    const panel = el("div", "bs-panel bs-matrix");
    panel.dataset.panel = key;
    panel.appendChild(el("h3", "", title));
    const cell = Math.max(1, Math.min(cellWanted, Math.floor(MAX_CANVAS / Math.max(1, n))));
    const font = "11px ui-monospace, Menlo, Consolas, monospace";
    const probe = document.createElement("canvas").getContext("2d");
    probe.font = font;
    let lw = 8;
    for (const l of labels) lw = Math.max(lw, probe.measureText(l).width + 8);
    lw = Math.min(120, Math.ceil(lw));
    const step = Math.max(1, Math.ceil(13 / cell));  // every step-th label, so labels never overlap
    const side = n * cell;
    const scroll = el("div", "bs-mscroll");
    const grid = el("div", "bs-mgrid");
    grid.style.gridTemplateColumns = `${lw}px ${side}px`;
    grid.style.gridTemplateRows = `${lw}px ${side}px`;
    const corner = el("div", "bs-mcorner");
    const cols = el("canvas", "bs-collabels"), rows = el("canvas", "bs-rowlabels");
    const canvas = el("canvas", "bs-grid");
    // the keyboard's current cell, marked over the map (under the label strips, as the cells are)
    const cursor = el("div", "bs-mcursor");
    cursor.hidden = true;
    grid.append(corner, cols, rows, canvas, cursor);
    scroll.appendChild(grid);
    panel.appendChild(scroll);
    // the cells: one pixel per cell, scaled up without smoothing
    const small = document.createElement("canvas");
    small.width = Math.max(1, n);
    small.height = Math.max(1, n);
    const sctx = small.getContext("2d");
    const img = sctx.createImageData(small.width, small.height);
    for (let i = 0; i < n * n; i++) {
      const v = M[i] / vmax;
      const c = diverging ? divColor(v) : seqColor(v);
      img.data[4 * i] = c[0]; img.data[4 * i + 1] = c[1]; img.data[4 * i + 2] = c[2]; img.data[4 * i + 3] = 255;
    }
    sctx.putImageData(img, 0, 0);
    const ctx = setupCanvas(canvas, side, side);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(small, 0, 0, side, side);
    ctx.strokeStyle = "#d0d5dd";
    ctx.lineWidth = 1;
    ctx.strokeRect(0.5, 0.5, side - 1, side - 1);
    if (p.segment) {
      const b = p.segment.indexOf(1);
      if (b > 0) {
        ctx.strokeStyle = "#1d2330";
        ctx.setLineDash([4, 3]);
        ctx.beginPath();
        ctx.moveTo(0, b * cell); ctx.lineTo(side, b * cell);
        ctx.moveTo(b * cell, 0); ctx.lineTo(b * cell, side);
        ctx.stroke();
        ctx.setLineDash([]);
      }
    }
    // the labels, in strips that stay in view while the cells scroll
    const lctx = setupCanvas(rows, lw, side);
    lctx.font = font; lctx.fillStyle = "#1d2330"; lctx.textBaseline = "middle"; lctx.textAlign = "right";
    const cctx = setupCanvas(cols, side, lw);
    cctx.font = font; cctx.fillStyle = "#1d2330"; cctx.textBaseline = "middle"; cctx.textAlign = "left";
    for (let a = 0; a < n; a += step) {
      // an 11px label on a small cell: kept inside the strip at both ends, not cut in half
      const mid = Math.min(Math.max(a * cell + cell / 2, 6), side - 6);
      lctx.fillText(labels[a], lw - 4, mid, lw - 6);
      cctx.save();
      cctx.translate(mid, lw - 4);
      cctx.rotate(-Math.PI / 2);
      cctx.fillText(labels[a], 0, 0, lw - 6);
      cctx.restore();
    }
    if (step > 1) {
      corner.textContent = `every ${ordinal(step)}`;
      corner.title = `labels on every ${ordinal(step)} row and column (point at a cell for its tokens)`;
    }
    panel.appendChild(legend(vmax, diverging, scaleLine));
    // the note stays in the readout, unseen once a value shows, both in one grid cell: the box is
    // as tall as the taller of the two, so a value in the note's place moves nothing below it
    const out = el("div", "bs-mreadout");
    const hint = el("span", "bs-mhint", "Point at a cell for its exact value (or Tab to the heatmap and use the arrows).");
    const value = el("span", "bs-mvalue");
    out.append(hint, value);
    out.setAttribute("aria-live", "polite");  // what the arrow keys reach is read out
    panel.appendChild(out);
    const tip = $("bs-tip");
    const read = (a, b) => {  // row a attends to column b: the readout below the heatmap
      const w = M[a * n + b];
      const text = `${labels[a]} → ${labels[b]}: ${diverging ? fmtSigned(w, source.exact ? 4 : 3) : fmt(w)}`;
      value.textContent = text;
      hint.style.visibility = "hidden";
      out.dataset.from = String(p.keep[a]);
      out.dataset.to = String(p.keep[b]);
      out.dataset.value = String(w);
      return text;
    };
    let at = null;  // the cell read last, by the mouse or the keys: the arrows go on from it
    // The current cell is marked while the heatmap has the focus: the readout said its value, but
    // a sighted keyboard user saw nothing move on the map. The mark is 2px outside the cell, so a
    // cell of 2px shows it too.
    const mark = () => {
      cursor.hidden = !at || document.activeElement !== canvas;
      if (cursor.hidden) return;
      cursor.style.left = `${lw + at[1] * cell - 2}px`;
      cursor.style.top = `${lw + at[0] * cell - 2}px`;
      cursor.style.width = cursor.style.height = `${cell + 4}px`;
    };
    // The arrows go past the scroll box's edge on a zoomed map: it scrolls the current cell into
    // view, the part of the box the label strips (lw wide, stuck at its top and left) leave free.
    const reveal = () => {
      const x = lw + at[1] * cell, y = lw + at[0] * cell;
      if (x - lw < scroll.scrollLeft) scroll.scrollLeft = x - lw;
      else if (x + cell > scroll.scrollLeft + scroll.clientWidth) scroll.scrollLeft = x + cell - scroll.clientWidth;
      if (y - lw < scroll.scrollTop) scroll.scrollTop = y - lw;
      else if (y + cell > scroll.scrollTop + scroll.clientHeight) scroll.scrollTop = y + cell - scroll.clientHeight;
      // and the page, where the box goes below the window or under the sticky controls bar
      const r = cursor.getBoundingClientRect();
      const top = (parseFloat(document.documentElement.style.getPropertyValue("--bs-controls-h")) || 0) + 4;
      if (r.bottom > window.innerHeight) window.scrollBy(0, r.bottom - window.innerHeight + 4);
      else if (r.top < top) window.scrollBy(0, r.top - top);
    };
    canvas.addEventListener("mousemove", (e) => {
      const r = canvas.getBoundingClientRect();
      const b = Math.floor((e.clientX - r.left) / cell), a = Math.floor((e.clientY - r.top) / cell);
      if (a < 0 || b < 0 || a >= n || b >= n) { tip.hidden = true; return; }
      at = [a, b];
      mark();
      tip.textContent = read(a, b);
      tip.style.left = `${e.clientX + 14}px`;
      tip.style.top = `${e.clientY + 12}px`;
      tip.hidden = false;
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
    // the keyboard reads every cell too: Tab to the heatmap, the arrows move, Home/End go to a row's ends
    canvas.tabIndex = 0;
    canvas.setAttribute("role", "application");
    canvas.setAttribute("aria-label", `${title} heatmap: the arrow keys move from cell to cell; each value is read below it`);
    canvas.addEventListener("focus", () => {
      if (!at && n) { at = [0, 0]; read(0, 0); }  // a click keeps its cell
      mark();
    });
    canvas.addEventListener("blur", mark);
    canvas.addEventListener("keydown", (e) => {
      if (!at || !n || e.altKey || e.ctrlKey || e.metaKey) return;  // Alt+Left stays the browser's Back
      const [a, b] = at, last = n - 1;
      const to = { ArrowUp: [a - 1, b], ArrowDown: [a + 1, b], ArrowLeft: [a, b - 1], ArrowRight: [a, b + 1],
        Home: [a, 0], End: [a, last] }[e.key];
      if (!to) return;
      e.preventDefault();
      at = [Math.max(0, Math.min(last, to[0])), Math.max(0, Math.min(last, to[1]))];
      read(at[0], at[1]);
      mark();
      reveal();
    });
    return panel;
  }

  // ---------------------------------------------------------------- model view

  /** Max-pool a shown matrix into at most THUMB x THUMB cells, keeping the sign of the largest. */
  function pool(p) {
    const { n, M } = p;
    const s = Math.max(1, Math.min(n, THUMB));
    const pooled = new Float32Array(s * s);
    for (let a = 0; a < n; a++) {
      const pa = Math.floor(a * s / n) * s, row = a * n;
      for (let b = 0; b < n; b++) {
        const k = pa + Math.floor(b * s / n), v = M[row + b];
        if (Math.abs(v) > Math.abs(pooled[k])) pooled[k] = v;
      }
    }
    return { s, n, pooled, labels: p.labels };
  }

  /** The indices of the k largest entries of M (of |x| where signed), the largest first. */
  function topIndices(M, k, signed) {
    const top = [];  // [index, size], sorted, at most k
    for (let i = 0; i < M.length; i++) {
      const x = signed ? Math.abs(M[i]) : M[i];
      if (top.length === k && !(x > top[k - 1][1])) continue;
      let at = top.length;
      while (at > 0 && top[at - 1][1] < x) at--;
      top.splice(at, 0, [i, x]);
      if (top.length > k) top.pop();
    }
    return top.map((e) => e[0]);
  }

  /** A thumbnail's numbers in words, for a screen reader (its description): the map's 3
   * strongest cells, "row → column value", from the shown map itself, not the pooled picture. */
  function thumbSummary(p, diverging) {
    const cells = topIndices(p.M, 3, diverging).map((i) => {
      const a = Math.floor(i / p.n), b = i % p.n, v = p.M[i];
      return `“${p.labels[a]}” → “${p.labels[b]}” ${diverging ? fmtSigned(v, source.exact ? 4 : 3) : fmt(v)}`;
    });
    const what = diverging ? "largest differences, A − B (+ where A attends more)" : "strongest";
    return `${p.n} × ${p.n} ${unitName()}s; ${what}: ${cells.join(", ")}. Enter opens it in the head view.`;
  }

  function paintThumb(canvas, th, diverging, vmax) {
    const { s, pooled } = th;
    canvas.width = s;
    canvas.height = s;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(s, s);
    for (let k = 0; k < s * s; k++) {
      const c = diverging ? divColor(pooled[k] / vmax) : seqColor(pooled[k] / vmax);
      img.data[4 * k] = c[0]; img.data[4 * k + 1] = c[1]; img.data[4 * k + 2] = c[2]; img.data[4 * k + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  }

  async function renderModelView(gen) {
    const root = $("bs-model-view");
    clearView(root);
    const N = meta.layers, H = meta.heads;
    if (meta.texts.length > 1) {
      const seg = el("div", "bs-segment");
      seg.setAttribute("role", "group");  // three toggle buttons, one question: which map is shown
      seg.setAttribute("aria-label", "text shown");
      [[0, "A"], [1, "B"], ["diff", "A − B"]].forEach(([v, label]) => {
        const b = el("button", "", label);
        b.type = "button";
        b.dataset.text = String(v);
        b.setAttribute("aria-pressed", String(state.modelText === v));
        b.addEventListener("click", () => { state.modelText = v; render(); });
        seg.appendChild(b);
      });
      root.appendChild(seg);
      restoreFocus();  // the thumbnails below take seconds to draw: A / B / A − B need not wait
    }
    const which = state.modelText === "diff" && meta.texts.length < 2 ? 0 : state.modelText;
    const diverging = which === "diff";
    const cols = modelColumns();
    const mi = measureInfo();
    const intro = !mi ? "Every layer × head (rows × columns), then the mean over heads and the rollout. "
      : mi.per_head ? `${mi.name}: every layer × head (rows × columns), then the mean over heads. `
      : `${mi.name} has one map per layer (no heads): one thumbnail per layer. `;
    root.appendChild(el("div", "bs-note", intro +
      "Point at a thumbnail for its values; click one to open it in the head view." +
      (windowNote() ? ` (${windowNote()})` : "")));
    if (diverging && alignment().tooDifferent) {
      root.appendChild(el("div", "bs-note bs-diff-note", diffOf(null, null).reason));
      return;
    }
    const legendSlot = el("div", "bs-legend-slot");
    root.appendChild(legendSlot);
    const table = el("table", "bs-model-grid");
    const hr = document.createElement("tr");
    hr.appendChild(el("th"));
    for (const col of cols) hr.appendChild(el("th", "", col.header));
    table.appendChild(hr);
    root.appendChild(el("div", "bs-xscroll")).appendChild(table);  // on a narrow screen it scrolls sideways, not the view
    const textsNeeded = diverging ? [0, 1] : [which];
    const thumbs = [];
    let leftOut = null;  // A − B: the words without a counterpart (the same in every thumbnail)
    const slice = slicer();
    for (let l = 0; l < N; l++) {
      setProgress(`model view: layer ${l + 1} of ${N}…`);
      const tr = document.createElement("tr");
      tr.appendChild(el("th", "", `layer ${l}`));
      table.appendChild(tr);
      const perText = [];
      for (const t of textsNeeded) {
        const maps = await layerMaps(t, l);
        const shown = [];
        for (const M of maps) { shown.push(project(t, M)); await slice.tick(); }
        perText.push(shown);
      }
      if (gen !== renderGen) return;
      for (let k = 0; k < cols.length; k++) {
        let p = perText[0][k];
        if (diverging) p = diffOf(perText[0][k], perText[1][k]);
        if (diverging && p && !leftOut) leftOut = [p.unmatchedA, p.unmatchedB];
        const td = document.createElement("td");
        tr.appendChild(td);
        if (!p || !p.n) { td.textContent = "–"; continue; }
        const c = el("canvas", "bs-thumb");
        c.dataset.layer = String(l);
        c.dataset.head = cols[k].head;
        c.setAttribute("aria-label", cols[k].label(l));
        // its numbers in words: a screen reader says them with the name, on focus (the arrows
        // reach every thumbnail); a hidden element, so they are not read twice in the table
        const desc = el("span", "", thumbSummary(p, diverging));
        desc.id = `bs-thumb-${l}-${k}`;
        desc.hidden = true;
        c.setAttribute("aria-describedby", desc.id);
        const th = pool(p);
        thumbs.push({ canvas: c, th, l, k, col: cols[k] });
        td.append(c, desc);
        await slice.tick();
        if (gen !== renderGen) return;
      }
    }
    setProgress("");
    const shared = state.scale === "shared";
    let common = 1e-9;
    for (const x of thumbs) common = Math.max(common, diverging ? maxAbs(x.th.pooled) : maxOf(x.th.pooled));
    for (const x of thumbs) {
      const own = Math.max(1e-9, diverging ? maxAbs(x.th.pooled) : maxOf(x.th.pooled));
      x.vmax = shared ? common : own;
      paintThumb(x.canvas, x.th, diverging, x.vmax);
      x.canvas.dataset.vmax = String(x.vmax);
      wireThumb(x, diverging);
    }
    // one tab stop for the grid (not 72, or 144 on BERT-base): the arrows move between thumbnails
    const at = new Map(thumbs.map((x) => [`${x.l},${x.k}`, x.canvas]));
    for (const [i, x] of thumbs.entries()) {
      x.canvas.tabIndex = i === 0 ? 0 : -1;
      x.canvas.addEventListener("keydown", (e) => {
        if (e.altKey || e.ctrlKey || e.metaKey) return;
        const d = { ArrowRight: [0, 1], ArrowLeft: [0, -1], ArrowDown: [1, 0], ArrowUp: [-1, 0] }[e.key];
        const next = d && at.get(`${x.l + d[0]},${x.k + d[1]}`);
        if (!next) return;
        e.preventDefault();
        x.canvas.tabIndex = -1;
        next.tabIndex = 0;
        next.focus();
      });
    }
    legendSlot.appendChild(legend(common, diverging, scaleText(diverging, common, "every thumbnail"), !shared));
    if (leftOut && (leftOut[0].length || leftOut[1].length)) {
      legendSlot.appendChild(el("div", "bs-note bs-unmatched-note", `${state.level === "word" ? "Words" : "Sub-tokens"} ` +
        "without a counterpart, left out of " +
        "every difference: " + [leftOut[0].length ? `A: ${leftOut[0].join(" ")}` : "",
        leftOut[1].length ? `B: ${leftOut[1].join(" ")}` : ""].filter(Boolean).join("; ") + ". The weight a " +
        "text's rows give them is in neither side, so the text that gives them more has less on the shared words, " +
        "and each difference leans away from it (the matrix view gives the amounts, for one layer)."));
    }
  }

  function wireThumb(x, diverging) {
    const { canvas, th, l, col } = x;
    const tip = $("bs-tip");
    canvas.addEventListener("mousemove", (e) => {
      const r = canvas.getBoundingClientRect();
      const px = Math.min(th.s - 1, Math.floor((e.clientX - r.left) / r.width * th.s));
      const py = Math.min(th.s - 1, Math.floor((e.clientY - r.top) / r.height * th.s));
      const v = th.pooled[py * th.s + px];
      const name = canvas.getAttribute("aria-label");
      const val = diverging ? fmtSigned(v, source.exact ? 4 : 3) : fmt(v);
      let text;
      if (th.s === th.n) text = `${name}: ${th.labels[py]} → ${th.labels[px]}: ${val}`;
      else {
        const r0 = Math.ceil(py * th.n / th.s), r1 = Math.ceil((py + 1) * th.n / th.s) - 1;
        const c0 = Math.ceil(px * th.n / th.s), c1 = Math.ceil((px + 1) * th.n / th.s) - 1;
        text = `${name}: ${th.labels[r0]}…${th.labels[r1]} → ${th.labels[c0]}…${th.labels[c1]}: largest ${val}`;
      }
      tip.textContent = text;
      tip.style.left = `${e.clientX + 14}px`;
      tip.style.top = `${e.clientY + 12}px`;
      tip.hidden = false;
    });
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
    const open = async (keyboard) => {
      tip.hidden = true;
      state.layer = l;
      col.pick();
      state.view = "head";
      state.focus = null;
      syncControls();
      await render();
      if (!keyboard) return;  // focus goes on into the view it opened, not to the page's start
      const tok = $("bs-head-view").querySelector(".bs-tok[tabindex='0']");
      if (tok) tok.focus();
    };
    canvas.addEventListener("click", () => open(false));
    // the keyboard reaches every thumbnail too (see renderModelView): Enter or Space opens it
    canvas.setAttribute("role", "button");
    canvas.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(true); }
    });
  }

  // ---------------------------------------------------------------- query-key view

  /** One vector as a row of coloured cells (blue > 0, red < 0), scaled by vmax. A picture to a
   * screen reader (role img), named by what it is and its 3 largest dimensions. */
  function vectorBar(vec, offset, D, vmax, name, cls) {
    const c = el("canvas", "bs-vec" + (cls ? " " + cls : ""));
    const part = vec.subarray(offset, offset + D);
    const top = topIndices(part, 3, true).map((d) => `dimension ${d} ${fmtSigned(part[d])}`);
    c.setAttribute("role", "img");
    c.setAttribute("aria-label", `${name}: ${D} dimensions, largest ${top.join(", ")}`);
    const w = Math.max(2, Math.floor(160 / D));
    c.width = D * w;
    c.height = 12;
    const ctx = c.getContext("2d");
    for (let d = 0; d < D; d++) {
      const [r, g, b] = divColor(vec[offset + d] / vmax);
      ctx.fillStyle = `rgb(${r},${g},${b})`;
      ctx.fillRect(d * w, 0, w, 12);
    }
    return c;
  }

  async function renderQKView(gen) {
    const root = $("bs-qk-view");
    const t = Math.min(state.qkText, meta.texts.length - 1);
    const layer = state.layer, head = state.heads[0];
    const data = await source.qk(t, layer, head);
    if (gen !== renderGen) return;
    clearView(root);
    if (meta.texts.length > 1) {
      const seg = el("div", "bs-segment");
      seg.setAttribute("role", "group");
      seg.setAttribute("aria-label", "text shown");
      [[0, "A"], [1, "B"]].forEach(([v, label]) => {
        const b = el("button", "", label);
        b.type = "button";
        b.dataset.text = String(v);
        b.setAttribute("aria-pressed", String(t === v));
        b.addEventListener("click", () => { state.qkText = v; state.qkQuery = null; render(); });
        seg.appendChild(b);
      });
      root.appendChild(seg);
    }
    if (!data) {
      root.appendChild(el("div", "bs-note", "This file does not hold the queries, keys and values (they are stored " +
        "when small, or always with `bertscope view --qk`). The head, model and matrix views still work."));
      return;
    }
    const { q, k, v, T, D } = data;
    const x = meta.texts[t];
    const [s, e] = spanOf(t);
    let i = state.qkQuery;
    if (i === null || i >= T) {
      const f = state.focus && state.focus.panel === t ? state.focus : null;
      if (f && state.level === "token") i = f.index;
      else if (f) i = x.token_words.indexOf(f.index);
      else i = x.special.findIndex((sp, j) => !sp && j >= s && j < e);
      if (i < 0) i = s;
    }
    // the seed's step [3] (as `trace` numbers it) for query i, computed here from the model's own q, k, v
    const sqrtD = Math.sqrt(D);
    const raw = new Float64Array(T), scaled = new Float64Array(T), weight = new Float64Array(T);
    let mx = -Infinity;
    for (let j = 0; j < T; j++) {
      let dot = 0;
      for (let d = 0; d < D; d++) dot += q[i * D + d] * k[j * D + d];
      raw[j] = dot;
      scaled[j] = dot / sqrtD;  // every key here is a real token: mask 1, so + 0
      mx = Math.max(mx, scaled[j]);
    }
    let z = 0;
    for (let j = 0; j < T; j++) { weight[j] = Math.exp(scaled[j] - mx); z += weight[j]; }
    for (let j = 0; j < T; j++) weight[j] /= z;
    const context = new Float64Array(D);
    for (let j = 0; j < T; j++) for (let d = 0; d < D; d++) context[d] += weight[j] * v[j * D + d];

    const others = state.heads.length > 1 ? ` (the first of the ${state.heads.length} heads selected: this view shows one)` : "";
    const head3 = el("h3", "", `layer ${layer}, head ${head}${others}: how “${x.tokens[i]}” (token ${i}) attends`);
    root.appendChild(head3);
    const pick = el("label", "bs-qk-pick", "Query token ");
    const sel = el("select");
    sel.id = "bs-qk-query";
    const segB = x.segments ? x.segments.indexOf(1) : -1;  // a sentence pair: where segment B begins
    for (let j = 0; j < T; j++) sel.add(new Option(`${j}: ${x.tokens[j]}` + (segB > 0 && j >= segB ? " (B)" : ""), String(j)));
    sel.value = String(i);
    sel.addEventListener("change", () => { state.qkQuery = Number(sel.value); render(); });
    pick.appendChild(sel);
    root.appendChild(pick);
    restoreFocus();  // the table below is built in slices: the select need not wait for it
    root.appendChild(el("p", "bs-note",
      `[3] each key's score is the dot product q·k (the sum of q ⊙ k over the ${D} dimensions), divided by √${D} = ${sqrtD.toFixed(3)}; ` +
      `the mask adds 0 for a real token (a [PAD] key would get the dtype's minimum, so weight 0: see bertscope trace --pad). ` +
      `The softmax over all ${T} keys turns the scores into weights that sum to 1, ` +
      `and the head's output for this token is the weighted sum of the values, Σ weight · v ([4] merges the heads' outputs, [5] W_O mixes them: see bertscope trace).`));
    let vq = 1e-9, vqk = 1e-9, vv = 1e-9;
    for (let j = 0; j < T; j++) {
      for (let d = 0; d < D; d++) {
        vq = Math.max(vq, Math.abs(q[i * D + d]), Math.abs(k[j * D + d]));
        vqk = Math.max(vqk, Math.abs(q[i * D + d] * k[j * D + d]));
        vv = Math.max(vv, Math.abs(weight[j] * v[j * D + d]));
      }
    }
    const qrow = el("div", "bs-qk-q");
    qrow.id = "bs-qk-query-vec";
    qrow.dataset.values = Array.from(q.subarray(i * D, (i + 1) * D)).join(",");
    const lh = `layer ${layer}, head ${head}`;  // each bar's name starts with it
    qrow.append(el("span", "bs-qk-name", `q (query of “${x.tokens[i]}”)`),
      vectorBar(q, i * D, D, vq, `${lh}, q, the query of “${x.tokens[i]}” (token ${i})`));
    root.appendChild(qrow);
    root.appendChild(el("div", "bs-legend-text",
      `Bars: one cell per dimension, blue > 0, red < 0; q and k on one scale (±${vq.toFixed(3)}), ` +
      `q ⊙ k on its own (±${vqk.toFixed(3)}), weight · v on its own (±${vv.toFixed(3)}).`));
    if (s > 0 || e < T) root.appendChild(el("div", "bs-note", `Keys ${s}–${e - 1} shown; the softmax is over all ${T}.`));
    if (state.hideSpecial) root.appendChild(el("div", "bs-note", `The special tokens' keys ([CLS], [SEP], ...) are hidden; the softmax is over all ${T} keys, so the weights shown sum to less than 1.`));
    const table = el("table", "bs-qk-table");
    const hr = document.createElement("tr");
    for (const h of ["key", "k", "q ⊙ k", "q·k", "÷√D", "mask", "softmax", "weight · v"]) hr.appendChild(el("th", "", h));
    table.appendChild(hr);
    root.appendChild(el("div", "bs-xscroll")).appendChild(table);  // on a narrow screen it scrolls sideways, not the view
    let top = s;
    for (let j = s; j < e; j++) if (weight[j] > weight[top]) top = j;
    const slice = slicer();
    for (let j = s; j < e; j++) {
      if (state.hideSpecial && x.special[j]) continue;
      if (segB > 0 && (j === segB || (j > segB && j === s))) {
        const sr = el("tr", "bs-qk-seg");
        const sd = el("td", "", "segment B (the second text of the pair) ↓");
        sd.colSpan = 8;
        sr.appendChild(sd);
        table.appendChild(sr);
      }
      const tr = el("tr", "bs-qk-row" + (j === top ? " bs-qk-top" : "") + (j === i ? " bs-qk-self" : ""));
      tr.dataset.key = String(j);
      tr.dataset.raw = String(raw[j]);
      tr.dataset.scaled = String(scaled[j]);
      tr.dataset.weight = String(weight[j]);
      tr.appendChild(el("td", "bs-qk-tok", x.tokens[j]));
      const prod = new Float64Array(D), wv = new Float64Array(D);
      for (let d = 0; d < D; d++) { prod[d] = q[i * D + d] * k[j * D + d]; wv[d] = weight[j] * v[j * D + d]; }
      const key = `“${x.tokens[j]}” (token ${j})`;
      const cells = [vectorBar(k, j * D, D, vq, `${lh}, k, the key of ${key}`),
        vectorBar(prod, 0, D, vqk, `${lh}, q ⊙ k for the key ${key}, summing to q·k ${raw[j].toFixed(3)}`)];
      cells.forEach((c) => { const td = el("td"); td.appendChild(c); tr.appendChild(td); });
      tr.append(el("td", "bs-num", raw[j].toFixed(3)), el("td", "bs-num", scaled[j].toFixed(3)),
        el("td", "bs-num", "1 (+0)"), el("td", "bs-num", weight[j].toFixed(4)));
      const td = el("td");
      td.appendChild(vectorBar(wv, 0, D, vv, `${lh}, weight · v for the key ${key}, weight ${weight[j].toFixed(4)}`));
      tr.appendChild(td);
      tr.addEventListener("click", () => { state.qkQuery = j; render(); });
      tr.title = `click to make “${x.tokens[j]}” the query`;
      table.appendChild(tr);
      await slice.tick();
      if (gen !== renderGen) return;
    }
    const crow = el("div", "bs-qk-q");
    crow.id = "bs-qk-context";
    crow.dataset.values = Array.from(context).join(",");
    crow.append(el("span", "bs-qk-name", `Σ weight · v: head ${head}'s output for “${x.tokens[i]}” (before the heads are merged and W_O)`),
      vectorBar(context, 0, D, Math.max(1e-9, maxAbs(context)), `${lh}, Σ weight · v, the head's output for “${x.tokens[i]}”`));
    root.appendChild(crow);
  }

  // ---------------------------------------------------------------- controls

  function buildControls() {
    unitCache.clear();
    alignCache.clear();
    const layer = $("bs-layer");
    layer.textContent = "";
    for (let l = 0; l < meta.layers; l++) layer.add(new Option(String(l), String(l)));
    const heads = $("bs-heads");
    heads.textContent = "";
    for (let h = 0; h < meta.heads; h++) {
      const b = el("button", "bs-head", String(h));
      b.type = "button";
      b.dataset.head = String(h);
      b.setAttribute("aria-label", `head ${h}`);  // "0" alone says nothing read out of context
      b.style.setProperty("--hc", headColor(h));
      b.title = `head ${h} (click: only this head; shift/ctrl-click: add or remove it)`;
      heads.appendChild(b);
    }
    $("bs-model").textContent = `${meta.model} · ${meta.layers} layers × ${meta.heads} heads`;
    const measure = $("bs-measure");
    measure.textContent = "";
    measure.add(new Option("attention weights", "attention"));
    const longest = Math.max(...meta.texts.map((x) => x.tokens.length));
    for (const m of meta.measures || []) {
      const opt = new Option(m.name + (m.per_head ? "" : " (per layer)"), m.name);
      if (m.about) opt.title = m.about;  // what a value is, and whose method (also the switch's, below)
      if (m.max_tokens && longest > m.max_tokens) {  // the server would refuse it: say why here
        opt.disabled = true;
        opt.textContent += ` (texts up to ${m.max_tokens} tokens; this one has ${longest})`;
      }
      measure.add(opt);
    }
    $("bs-measure-label").hidden = !(meta.measures && meta.measures.length);
    const texts = $("bs-texts");
    texts.textContent = "";
    meta.texts.forEach((x, t) => {
      const d = el("div");
      if (meta.texts.length > 1) d.appendChild(el("b", "", "AB"[t]));
      // <bdi>: a right-to-left mark in a text stays inside it, never reorders the notes after it
      if (x.segments) {
        d.append(el("b", "", "A"), el("bdi", "", x.text), document.createTextNode("  "), el("b", "", "B"),
          el("bdi", "", x.pair || ""), document.createTextNode("  (one sentence pair: [CLS] A [SEP] B [SEP])"));
      } else d.appendChild(el("bdi", "", x.text));
      if (x.truncated) {  // before the text, where it is seen: the box scrolls, and the cut is at its end
        const n = x.tokens.length.toLocaleString();
        if (x.segments) d.prepend(el("span", "bs-cut", `the pair is cut to its first ${n} tokens to fit the model: `));
        else d.insertBefore(el("span", "bs-cut", `cut to its first ${n} tokens to fit the model: `), d.querySelector("bdi"));
      }
      texts.appendChild(d);
    });
    if (meta.alignment && alignment("word").tooDifferent) {
      texts.appendChild(el("div", "bs-note", "A and B share too few words for a word-by-word difference; " +
        "they are shown side by side."));
    }
    const T = Math.max(...meta.texts.map((x) => x.tokens.length));
    $("bs-span-of").textContent = `of ${T} sub-tokens`;  // positions, whatever the units shown
    $("bs-span-start").max = String(T - 1);
    $("bs-span-end").max = String(T);
    $("bs-controls").hidden = false;
    trackControlsHeight();
    syncControls();
  }

  function syncControls() {
    $("bs-layer").value = String(state.layer);
    $("bs-mode").value = state.mode;
    $("bs-measure").value = state.measure;
    const chosen = $("bs-measure").selectedOptions[0];
    $("bs-measure").title = chosen && chosen.title ? chosen.title : "";  // what the chosen measure's values are
    $("bs-level").value = state.level;
    $("bs-hide-special").checked = state.hideSpecial;
    $("bs-scale").value = state.scale;
    const T = meta ? Math.max(...meta.texts.map((x) => x.tokens.length)) : 0;
    $("bs-span-start").value = String(state.span ? state.span[0] : 0);
    $("bs-span-end").value = String(state.span ? state.span[1] : T);
    document.querySelectorAll(".bs-tab").forEach((b) => {
      const on = b.dataset.view === state.view;
      b.setAttribute("aria-selected", String(on));
      b.tabIndex = on ? 0 : -1;  // one tab stop for the list; the arrows move within it
    });
    const shownHeads = state.view === "qk" ? [state.heads[0]] : state.heads;
    document.querySelectorAll(".bs-head").forEach((b) => b.setAttribute("aria-pressed", String(shownHeads.includes(Number(b.dataset.head)))));
    ["head", "model", "matrix", "qk"].forEach((v) => { $(`bs-${v}-view`).hidden = v !== state.view; });
    // controls a view does not use are switched off, so they never seem to do nothing
    const v = state.view;
    const mi = v === "qk" ? null : measureInfo();  // the query-key view is the weights' own arithmetic
    const perLayer = !!mi && !mi.per_head;  // a per-layer measure has no heads to choose
    const noQK = v === "qk" && !!source && !source.hasQK;  // the view shows only why it is empty
    const off = {
      layer: v === "model" || noQK, mode: v === "model" || v === "qk" || perLayer, level: v === "qk",
      scale: v === "head" || v === "qk", heads: v === "model" || perLayer || noQK, headsAll: v === "model" || v === "qk" || perLayer,
      hide: noQK, span: noQK,
    };
    $("bs-measure").disabled = v === "qk";
    $("bs-mode").querySelector("option[value='rollout']").disabled = !!mi;
    $("bs-layer").disabled = off.layer;
    $("bs-mode").disabled = off.mode;
    $("bs-level").disabled = off.level;
    $("bs-scale").disabled = off.scale;
    $("bs-hide-special").disabled = off.hide;
    ["bs-span-start", "bs-span-end", "bs-span-all"].forEach((id) => { $(id).disabled = off.span; });
    // While the mean or rollout is shown the heads do not apply, yet stay clickable (a click on a
    // head switches back to heads): not dimmed to 0.25 (unreadable) but drawn dashed, and said,
    // to the eye and to a screen reader, which read them as pressed and nothing more.
    const unused = !off.heads && v !== "qk" && state.mode !== "heads";
    $("bs-heads").classList.toggle("bs-disabled", off.heads);
    $("bs-heads").classList.toggle("bs-unused", unused);
    const note = $("bs-heads-unused");
    note.hidden = !unused;
    const instead = state.mode === "rollout" ? "rollout" : "mean over heads";
    note.textContent = unused ? `not used: the ${instead} is shown` : "";
    document.querySelectorAll(".bs-head").forEach((b) => {
      b.disabled = off.heads;
      if (unused) b.setAttribute("aria-describedby", "bs-heads-unused");
      else b.removeAttribute("aria-describedby");
    });
    $("bs-heads-all").disabled = off.headsAll;
    const hints = {
      head: "Lines join each token (left) to the tokens it attends to (right); opacity = attention weight" +
        (state.mode === "mean" ? ", the mean over the layer's heads" : state.mode === "rollout"
          ? ", rolled out through the layers up to this one (Abnar & Zuidema)" : ", one colour per head") +
        ". Hover a token to focus its lines; click to pin the exact numbers.",
      model: "Thumbnails of every attention map. The colour scale is stated in the legend; point at a thumbnail for its values.",
      matrix: "Row = the token attending, column = the token attended to." +
        (state.mode === "heads" && state.heads.length > 1 && (!mi || mi.per_head) ? " Several heads selected: their mean." : "") +
        " Zoom with − and +; the labels stay in view.",
      qk: "The seed's steps for one head and one query token: q and every k over the head's dimensions, q ⊙ k, the score, ÷√D, the mask, the softmax and the weighted sum of the values. Pick the layer and a head above.",
    };
    if (mi && v === "head") {
      hints.head = `Lines join each token (left) to the tokens it takes from (right) by ${mi.name}; ` +
        (mi.share ? "opacity = its share of the row" : "opacity = its value over the layer's largest (the numbers are its own)") +
        ". Hover a token to focus its lines; click to pin the exact numbers.";
    }
    $("bs-hint").textContent = hints[state.view];
  }

  function readSpan() {
    const T = Math.max(...meta.texts.map((x) => x.tokens.length));
    const read = (id) => { const v = $(id).value.trim(); return v === "" ? NaN : Math.floor(Number(v)); };
    let s = read("bs-span-start"), e = read("bs-span-end");  // an empty box: its default
    if (!Number.isFinite(s)) s = 0;
    if (!Number.isFinite(e)) e = T;
    s = Math.max(0, Math.min(T - 1, s));
    e = Math.max(s + 1, Math.min(T, e));
    state.span = s === 0 && e === T ? null : [s, e];
  }

  function wireControls() {
    const tabs = [...document.querySelectorAll(".bs-tab")];
    tabs.forEach((b) => b.addEventListener("click", () => { state.view = b.dataset.view; syncControls(); render(); }));
    tabs.forEach((b, i) => b.addEventListener("keydown", (e) => {  // a tab list's keys: arrows, Home, End
      if (e.altKey || e.ctrlKey || e.metaKey || e.shiftKey) return;  // Alt+Left is the browser's Back
      const to = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabs.length - 1 }[e.key];
      if (to === undefined) return;
      e.preventDefault();
      const next = tabs[(to + tabs.length) % tabs.length];
      next.focus();
      next.click();
    }));
    $("bs-layer").addEventListener("change", (e) => { state.layer = Number(e.target.value); render(); });
    $("bs-mode").addEventListener("change", (e) => { state.mode = e.target.value; syncControls(); render(); });
    $("bs-measure").addEventListener("change", (e) => {
      state.measure = e.target.value;
      if (measureInfo() && state.mode === "rollout") state.mode = "heads";  // rollout is of the weights
      syncControls();
      render();
    });
    $("bs-level").addEventListener("change", (e) => { state.level = e.target.value; state.focus = null; state.hover = null; render(); });
    $("bs-hide-special").addEventListener("change", (e) => { state.hideSpecial = e.target.checked; render(); });
    $("bs-scale").addEventListener("change", (e) => { state.scale = e.target.value; render(); });
    ["bs-span-start", "bs-span-end"].forEach((id) => $(id).addEventListener("change", () => { readSpan(); syncControls(); render(); }));
    $("bs-span-all").addEventListener("click", () => { state.span = null; syncControls(); render(); });
    $("bs-heads").addEventListener("click", (e) => {
      const b = e.target.closest(".bs-head");
      if (!b || b.disabled) return;
      const h = Number(b.dataset.head);
      if ((e.shiftKey || e.ctrlKey || e.metaKey) && state.view !== "qk") {
        const i = state.heads.indexOf(h);
        if (i >= 0 && state.heads.length > 1) state.heads.splice(i, 1);
        else if (i < 0) state.heads = [...state.heads, h].sort((x, y) => x - y);
      } else state.heads = [h];
      if (state.view !== "qk") state.mode = "heads";
      syncControls();
      render();
    });
    // Escape takes back what a token or a pointer left on screen: the pinned numbers, a tooltip
    // (a select's or a box's own Escape is left to it)
    document.addEventListener("keydown", (e) => {
      if (e.key !== "Escape" || e.defaultPrevented) return;
      $("bs-tip").hidden = true;
      if (e.target.closest && e.target.closest("select, input, textarea")) return;
      if (state.view !== "head" || !state.focus) return;
      state.focus = null;
      writeView();
      redrawHeadPanels();
      announce("unpinned");
    });
    $("bs-heads-all").addEventListener("click", () => {
      state.heads = [...Array(meta.heads).keys()];
      state.mode = "heads";
      syncControls();
      render();
    });
  }

  // ---- the keyboard focus across a render ----
  // A render rebuilds the view it shows, and a control inside it (the zoom buttons, A / B /
  // A − B, the query token) goes with the rest: the focus fell back to the page's start, so the
  // next Tab began again at the top and a select's next arrow key did nothing. render() notes
  // which control had the focus and gives it to the same control in the new view.

  /** The data-* attributes that say which control an element is (not what it shows: data-vmax). */
  const KEY_DATA = ["view", "zoom", "text", "side", "i", "layer", "head"];

  /** What identifies a focused element of a view across a rebuild, or null for none. */
  function focusKey(e) {
    if (!e || e === document.body || !e.closest) return null;
    const view = e.closest(".bs-view");
    if (!view) return null;
    const panel = e.closest("[data-panel]");
    return {
      view: view.id, id: e.id, tag: e.tagName, role: e.getAttribute("role"),
      data: KEY_DATA.map((k) => e.dataset[k] ?? "").join("|"),
      text: e.id ? "" : e.textContent, panel: panel ? panel.dataset.panel : null,
    };
  }

  let refocus = null;  // the key of the control the last render took the focus from

  /** Focus the new view's control that matches refocus, if the focus was lost with the old one
   * (it is on the page's body); one since disabled (+ at the largest zoom) passes the focus to
   * the next control beside it that takes it. */
  function restoreFocus() {
    if (!refocus) return;
    const active = document.activeElement;
    // the focus is somewhere: the user went on
    if (active && active !== document.body && active.isConnected) { refocus = null; return; }
    const k = refocus;
    const root = $(k.view);
    // another view is shown: it sets its own focus
    if (!root || root.hidden) { refocus = null; return; }
    const found = k.id ? $(k.id) : [...root.querySelectorAll(k.tag)].find((e) => {
      const key = focusKey(e);
      return key.role === k.role && key.panel === k.panel && key.data === k.data && key.text === k.text;
    });
    // not built yet (a view drawn in slices): the end of render tries again
    if (!found || !root.contains(found)) return;
    let target = found;
    if (target.disabled) {  // the next control beside it, else the one before
      const near = [...target.parentElement.querySelectorAll("button, select, input, [tabindex]")];
      const at = near.indexOf(target), ok = (e) => !e.disabled && e.tabIndex >= 0;
      target = near.slice(at + 1).find(ok) || near.slice(0, at).reverse().find(ok) || null;
    }
    refocus = null;
    if (target) target.focus();
  }

  async function render() {
    if (!meta || !source) return;
    const gen = ++renderGen;
    document.documentElement.dataset.rendered = "0";
    // the control in the view that has the focus (a render already under way may have taken it:
    // then the one it noted goes on)
    const active = document.activeElement;
    refocus = focusKey(active) || (active === document.body ? refocus : null);
    // a pin on a word the settings now hide (a special token, one outside the window) goes: it
    // would draw nothing, and a link to it would not open on it
    if (state.focus && !keptUnits(state.focus.panel).includes(state.focus.index)) state.focus = null;
    writeView();
    if (source.focus) source.focus(state.measure === "attention" ? null : state.measure);  // the rest is dropped
    try {
      if (state.view === "head") await renderHeadView(gen);
      else if (state.view === "matrix") await renderMatrixView(gen);
      else if (state.view === "qk") await renderQKView(gen);
      else await renderModelView(gen);
      if (gen === renderGen) {
        setProgress("");
        restoreFocus();
        refocus = null;  // found or not, this render's: no later one moves the focus to it
        document.documentElement.dataset.rendered = "1";
        showError("");
      }
    } catch (err) {
      if (gen !== renderGen) return;  // a render since has drawn (or is drawing) what is asked now
      if (isAbort(err)) {  // its requests were dropped for a new text: no error, no wait shown, no dimming
        setProgress("");
        document.documentElement.dataset.rendered = "dropped";
        return;
      }
      setProgress("");
      showError(String(err.message || err));
      // no picture of another text, layer or measure stays under the error
      ["head", "model", "matrix", "qk"].forEach((v) => { $(`bs-${v}-view`).textContent = ""; });
      document.documentElement.dataset.rendered = "error";
    }
  }

  // ---- the view in the address ----
  // The settings that differ from how the page opens go into the address after "#"
  // (#layer=3&heads=1&pin=A.left.5: layer 3, head 1, the fifth word on the left pinned), so a
  // link or a reload opens on the same picture. A value that does not fit what is shown (a
  // layer the model lacks, a word past the text's end) is left at its default, and the page
  // says which.
  let opening = { span: null };  // how the page opens before the address's settings apply
  let pendingView = null;        // settings read from the address, for the next text asked for (taken then)
  const LETTER = ["A", "B"];

  function viewToHash() {
    const q = new URLSearchParams();
    if (state.view !== "head") q.set("view", state.view);
    if (state.layer !== 0) q.set("layer", String(state.layer));
    if (state.heads.join(",") !== "0") q.set("heads", state.heads.join(","));
    if (state.mode !== "heads") q.set("mode", state.mode);
    if (state.measure !== "attention") q.set("measure", state.measure);
    if (state.level !== "word") q.set("level", state.level);
    if (state.hideSpecial) q.set("special", "hidden");
    if (state.scale !== "shared") q.set("scale", state.scale);
    const span = state.span ? state.span.join("-") : "all";
    if (span !== (opening.span ? opening.span.join("-") : "all")) q.set("span", span);
    if (state.focus) q.set("pin", `${LETTER[state.focus.panel]}.${state.focus.side}.${state.focus.index}`);
    if (state.modelText !== 0) q.set("model", state.modelText === "diff" ? "A-B" : LETTER[state.modelText]);
    if (state.qkText !== 0) q.set("qk", LETTER[state.qkText]);
    if (state.qkQuery !== null) q.set("query", String(state.qkQuery));
    if (state.zoom !== null) q.set("zoom", String(state.zoom));
    return String(q);
  }

  /** Puts the shown settings into the address (the entry it is in: no new history entry). */
  function writeView() {
    if (!meta) return;
    const hash = viewToHash();
    const url = location.pathname + location.search + (hash ? "#" + hash : "");
    if (url === location.pathname + location.search + location.hash) return;
    try {
      history.replaceState(history.state, "", url);
    } catch (err) {  // a page where the address cannot be set (a notebook's frame): the view still works
    }
  }

  /** Applies settings read from the address to the text shown; returns the ones that did not
   * fit ("layer=9"), which are left as they were. */
  function applyView(hash) {
    const q = new URLSearchParams(hash.replace(/^#/, ""));
    const unfit = [];
    unitCache.clear();  // the words of the text now shown
    alignCache.clear();
    // what the address leaves out is at its default
    Object.assign(state, { view: "head", layer: 0, heads: [0], mode: "heads", measure: "attention", level: "word",
      hideSpecial: false, scale: "shared", span: opening.span, focus: null, hover: null, modelText: 0, qkText: 0,
      qkQuery: null, zoom: null });
    const int = (v) => (/^\d+$/.test(v) ? Number(v) : NaN);
    const short = (x) => (x.length > 40 ? x.slice(0, 40) + "…" : x);
    const known = new Set();
    const take = (key, ok, set) => {
      known.add(key);
      const [v, ...more] = q.getAll(key);
      if (v === undefined) return;
      if (ok(v)) set(v);
      else unfit.push(`${key}=${short(v)}`);
      for (const m of more) unfit.push(`${key}=${short(m)} (repeated: only the first is read)`);
    };
    const T = (t) => meta.texts[t].tokens.length;
    const textOf = (v) => LETTER.indexOf(v);
    take("view", (v) => ["head", "model", "matrix", "qk"].includes(v), (v) => { state.view = v; });
    take("layer", (v) => int(v) < meta.layers, (v) => { state.layer = int(v); });
    take("heads", (v) => v.split(",").every((h) => int(h) < meta.heads),
      (v) => { state.heads = [...new Set(v.split(",").map(int))].sort((x, y) => x - y); });
    take("measure", (v) => v === "attention" || (!!measureInfo(v) && !(measureInfo(v).max_tokens &&
      Math.max(...meta.texts.map((x) => x.tokens.length)) > measureInfo(v).max_tokens)), (v) => { state.measure = v; });
    take("mode", (v) => ["heads", "mean"].includes(v) || (v === "rollout" && !measureInfo()), (v) => { state.mode = v; });
    take("level", (v) => ["word", "token"].includes(v), (v) => { state.level = v; });
    take("special", (v) => v === "hidden" || v === "shown", (v) => { state.hideSpecial = v === "hidden"; });
    take("scale", (v) => ["shared", "panel"].includes(v), (v) => { state.scale = v; });
    const longest = Math.max(...meta.texts.map((x) => x.tokens.length));
    take("span", (v) => v === "all" || (/^\d+-\d+$/.test(v) && int(v.split("-")[0]) < int(v.split("-")[1]) &&
      int(v.split("-")[0]) < longest), (v) => {
      state.span = v === "all" ? null : [int(v.split("-")[0]), Math.min(longest, int(v.split("-")[1]))];
      if (state.span && state.span[0] === 0 && state.span[1] === longest) state.span = null;
    });
    take("pin", (v) => {
      const [p, side, i, ...rest] = v.split(".");
      const t = textOf(p);
      return !rest.length && t >= 0 && t < meta.texts.length && ["left", "right"].includes(side) && keptUnits(t).includes(int(i));
    }, (v) => {
      const [p, side, i] = v.split(".");
      state.focus = { panel: textOf(p), side, index: int(i) };
    });
    take("model", (v) => v === "A" || (meta.texts.length > 1 && (v === "B" || v === "A-B")),
      (v) => { state.modelText = v === "A-B" ? "diff" : textOf(v); });
    take("qk", (v) => v === "A" || (meta.texts.length > 1 && v === "B"), (v) => { state.qkText = textOf(v); });
    take("query", (v) => int(v) < T(Math.min(state.qkText, meta.texts.length - 1)), (v) => { state.qkQuery = int(v); });
    take("zoom", (v) => ZOOMS.includes(int(v)), (v) => { state.zoom = int(v); });
    for (const key of new Set(q.keys())) if (!known.has(key)) unfit.push(`${short(key)} (not a setting)`);
    return unfit;
  }

  /** Says under the texts which of the address's settings were left at their default. */
  function noteUnfit(unfit) {
    document.querySelectorAll(".bs-address-note").forEach((n) => n.remove());
    if (!unfit.length) return;
    $("bs-texts").appendChild(el("div", "bs-note bs-address-note", "The address asks for what this page cannot " +
      `show (${unfit.join(", ")}): left at the default.`));
  }

  let asked = 0;  // analyses asked for in serve mode (a file's page has one, not counted)

  async function start(m, src, ticket, view = null) {
    if (source && source !== src && source.close) source.close();  // the last text's requests: not wanted
    meta = m;
    source = src;
    tokenStops = {};
    state.layer = Math.min(state.layer, meta.layers - 1);
    state.heads = state.heads.filter((h) => h < meta.heads);
    if (!state.heads.length) state.heads = [0];
    state.focus = null;
    state.hover = null;
    state.qkQuery = null;
    if (state.measure !== "attention" && !measureInfo()) state.measure = "attention";
    const mi = measureInfo(), longest = Math.max(...meta.texts.map((x) => x.tokens.length));
    const tooLong = mi && mi.max_tokens && longest > mi.max_tokens ? mi : null;
    if (tooLong) state.measure = "attention";  // too long for it: said under the text
    if (meta.texts.length < 2) { state.modelText = 0; state.qkText = 0; }
    const opts = meta.options || {};
    state.span = opts.span ? [opts.span[0], opts.span[1]] : null;
    opening = { span: state.span };
    const unfit = view === null ? [] : applyView(view);  // a link's, Back's or Forward's view of this text
    buildControls();
    noteUnfit(unfit);
    if (tooLong) {
      const which = meta.texts.length > 1 ? "the longer text has" : "this one has";
      $("bs-texts").appendChild(el("div", "bs-note", `${tooLong.name} takes texts of up to ${tooLong.max_tokens} ` +
        `tokens and ${which} ${longest}: showing the attention weights instead.`));
    }
    await render();
    if (ticket === undefined || ticket === asked) document.documentElement.dataset.ready = "1";  // not a dropped text's
  }

  function startServer() {
    const form = $("bs-form");
    form.hidden = false;
    wireControls();
    let maxChars = null;
    const counters = [["bs-text", "bs-text-count"], ["bs-text-b", "bs-text-b-count"]];
    const count = () => counters.forEach(([id, out]) => {
      const n = [...$(id).value].length;
      const c = $(out);
      c.textContent = maxChars ? `${n.toLocaleString()} / ${maxChars.toLocaleString()} characters` : `${n.toLocaleString()} characters`;
      c.classList.toggle("bs-over", !!maxChars && n > maxChars);
    });
    counters.forEach(([id]) => $(id).addEventListener("input", count));
    const health = fetch(cfg.api + "health").then((r) => r.json()).then((h) => {
      maxChars = h.max_chars || null;
      count();
      if (!meta && h.model) $("bs-model").textContent = `${h.model} · ${h.layers} layers × ${h.heads} heads`;  // before any analysis
    }).catch(() => {});
    count();
    ["bs-text", "bs-text-b"].forEach((id) => $(id).addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        form.requestSubmit();
      }
    }));
    $("bs-text").addEventListener("invalid", () => showError(""));  // the browser says what is missing
    // The address holds the texts shown (?text=…&text_b=… or ?text=…&pair=…, the API's keys),
    // so a link or a reload opens on them, and Back and Forward go through the texts analysed;
    // without them the page opens on its sample text.
    const sample = $("bs-text").value;
    const fromAddress = () => {
      const params = new URLSearchParams(location.search);
      const text = params.get("text") || "";
      const linked = text.trim() !== "";
      $("bs-text").value = linked ? text : sample;
      $("bs-text-b").value = linked ? (params.get("pair") ?? params.get("text_b") ?? "") : "";
      $("bs-pair").checked = linked && params.get("pair") !== null;
      count();
    };
    // how the next analysis goes into the history: a new entry for one the user asks for; the
    // first one, and one that Back or Forward asked for, take the entry they are in
    let how = "replace";
    const remember = (request, mode) => {
      const q = new URLSearchParams({ text: request.text });
      if (request.text_b !== null) q.set("text_b", request.text_b);
      if (request.pair !== null) q.set("pair", request.pair);
      const query = String(q);  // a long text is not kept: an address has limits (servers', browsers')
      const url = query.length <= 8000 ? `${location.pathname}?${query}` : location.pathname;
      if (mode === "push" && url !== location.pathname + location.search) history.pushState(null, "", url);
      else history.replaceState(null, "", url);  // the view's settings follow once it is drawn
      shown = location.search;
      return query.length <= 8000 ? "" : "too long to keep in the page's address: a link or a reload opens the sample";
    };
    let shown = null;  // the query of the address whose texts are shown
    window.addEventListener("popstate", () => {  // Back or Forward, or an edited "#...": what the address holds
      if (meta && location.search === shown) {  // the same texts: their view only
        if (navigated && navigated === analyzing) {  // Back then Forward at once: Back's texts are not wanted
          analyzing.abort();
          const r = source.request;  // the box gets back the texts shown (a long one is in no address)
          $("bs-text").value = r.text;
          $("bs-text-b").value = r.pair ?? r.text_b ?? "";
          $("bs-pair").checked = r.pair !== null;
          count();
          $("bs-form-status").textContent = "";  // no "computing…" left from the request dropped
          document.documentElement.dataset.ready = "1";  // the texts shown are whole
        }
        pendingView = null;
        noteUnfit(applyView(location.hash));
        syncControls();
        render();
        return;
      }
      fromAddress();
      pendingView = location.hash;
      how = "replace";
      navigating = true;
      form.requestSubmit();
    });
    let analyzing = null;  // the AbortController of the last analysis asked for
    let navigating = false;  // the next submit is Back's or Forward's
    let navigated = null;  // the AbortController of the last analysis Back or Forward asked for
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const view = pendingView;  // the address's view, for this text only (null: the view shown goes on)
      pendingView = null;
      const fromHistory = navigating;
      navigating = false;
      const text = $("bs-text").value, textB = $("bs-text-b").value.trim() ? $("bs-text-b").value : null;
      const lengths = counters.map(([id]) => [...$(id).value].length);
      const which = lengths.findIndex((n) => maxChars && n > maxChars);
      if (which >= 0) {  // the counter is red: the server would answer 413
        const over = lengths[which], name = which === 0 ? "The text" : "The second text";
        showError(`${name} has ${over.toLocaleString()} characters; this server takes at most ${maxChars.toLocaleString()}.`);
        document.documentElement.dataset.ready = "error";
        return;
      }
      if ($("bs-pair").checked && textB === null) {
        showError("A sentence pair needs a second text: write one, or untick the sentence-pair box.");
        document.documentElement.dataset.ready = "error";
        return;
      }
      const pair = $("bs-pair").checked;
      const request = { text, text_b: pair ? null : textB, pair: pair ? textB : null };
      const status = $("bs-form-status");
      status.textContent = "computing…";
      showError("");  // an old error never stays on screen under a new request
      document.documentElement.dataset.ready = "0";
      if (analyzing) analyzing.abort();  // an analysis asked for before this one is not wanted now
      if (source && source.close) source.close();  // nor what the shown text was still waiting for
      const ctl = analyzing = new AbortController();
      navigated = fromHistory ? ctl : null;
      const ticket = ++asked;  // the newest analysis asked for: only it may say the page is ready
      const mode = how;
      how = "push";
      try {
        const body = await postJSON(cfg.api + "analyze", request, ctl.signal);
        status.textContent = remember(request, mode);
        await start(body, new ServerSource(request), ticket, view);
      } catch (err) {
        if (isAbort(err)) return;  // a newer request replaced this one
        status.textContent = "";
        setProgress("");
        // the text in the box is not the one drawn: say so, or the picture passes for it
        showError(String(err.message || err) + (meta ? " (Below: the last text analysed, not this one.)" : ""));
        document.documentElement.dataset.ready = "error";
      }
    });
    document.documentElement.dataset.ready = "form";
    fromAddress();
    pendingView = location.hash;
    // the sample (or the linked text) at once, once the server's limit is known: the page's
    // own check of a long linked text, rather than the server's 413
    health.finally(() => { if ($("bs-text").value.trim()) form.requestSubmit(); });
  }

  async function startFile() {
    wireControls();
    window.addEventListener("popstate", () => {  // an edited "#..." (or Back through such edits)
      if (!meta) return;
      noteUnfit(applyView(location.hash));
      syncControls();
      render();
    });
    try {
      await start(cfg.meta, await FileSource.load(cfg.meta), undefined, location.hash);
    } catch (err) {
      showError(String(err.message || err));
      document.documentElement.dataset.ready = "error";
    }
  }

  window.bertscope = { state, render, get meta() { return meta; } };
  if (cfg.mode === "server") startServer();
  else startFile();
})();
