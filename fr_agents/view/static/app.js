// fr-agents view: the page. Vanilla JavaScript, no dependencies.
//
// Safety rule of this file: text from the store (prompts, observations, model output, info)
// only ever enters the page as a text node (el() / textContent). Nothing here assigns
// innerHTML, so markup inside an episode shows as text and never runs.
"use strict";

const TREE_CHUNK = 300;
const ROOTS_PAGE = 50;
const POLL_MS = 2000;
const SVGNS = "http://www.w3.org/2000/svg";

const state = {
  tab: "trees",
  summary: null,
  poll: null, // last /api/poll answer
  roots: { offset: 0, total: 0 },
  // `gen` counts opened roots; `loading` is the gen whose chunk is in flight (null: none), so
  // opening another root while one loads starts the new load instead of waiting behind the old
  tree: { root: null, gen: 0, offset: 0, total: 0, parents: new Map(), depth: new Map(), kids: new Map(), indent: new Map(), collapsed: new Set(), loading: null },
  selected: null,
  compare: [],
  heatMode: "lp",
  runDirty: true,
};

// ------------------------------------------------------------------ helpers
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "dataset") Object.assign(e.dataset, v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}
function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}
const $ = (sel) => document.querySelector(sel);
function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); return node; }
function fmt(x, d = 3) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return String(x);
  return Math.abs(x) >= 1000 ? x.toFixed(0) : x.toFixed(d);
}
async function api(path) {
  const r = await fetch(path, { cache: "no-store" });
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}
// Answers can arrive out of order (the server answers each request on its own thread): the
// unfiltered root list asked for on load can land after the filtered one submitted right after.
// `apiLatest(kind, path, errorBox)` numbers each request of a kind and gives its answer only
// while no newer request of that kind was made (null otherwise, or on an error, which it shows
// in `errorBox` under the same rule): only the latest answer is drawn.
const asked = {};
async function apiLatest(kind, path, errorBox) {
  const n = (asked[kind] || 0) + 1;
  asked[kind] = n;
  try {
    const d = await api(path);
    return asked[kind] === n ? d : null;
  } catch (e) {
    if (asked[kind] === n) showError(errorBox, e);
    return null;
  }
}
function showError(where, err) { clear(where).append(el("p", { class: "err" }, String(err.message || err))); }

// token runs -> spans (kind decides the style)
function runsNode(runs, cls) {
  return el("div", { class: cls }, runs.map((r) => el("span", { class: "k-" + r.kind, dataset: { kind: r.kind } }, r.text)));
}

// ------------------------------------------------------------------ tabs and polling
function setTab(tab) {
  state.tab = tab;
  for (const b of document.querySelectorAll(".tab")) b.classList.toggle("active", b.dataset.tab === tab);
  $("#page-run").hidden = tab !== "run";
  $("#page-trees").hidden = tab !== "trees";
  if (tab === "run" && state.runDirty) loadRun();
  history.replaceState(null, "", "#" + tab);
}

async function poll() {
  const live = $("#live-status");
  try {
    const p = await api("/api/poll");
    const prev = state.poll;
    state.poll = p;
    live.className = "live ok";
    live.textContent = "live · " + new Date().toLocaleTimeString();
    if (prev) {
      const storeMoved = JSON.stringify(prev.store) !== JSON.stringify(p.store);
      if (storeMoved || prev.metrics !== p.metrics) {
        state.runDirty = true;
        if (state.tab === "run") loadRun();
      }
      if (storeMoved) {
        loadSummary();
        loadRoots(false);
        if (state.tree.root !== null) $("#tree-reload").hidden = false;
      }
    }
  } catch (e) {
    live.className = "live err";
    live.textContent = "disconnected: " + e.message;
  }
  setTimeout(poll, POLL_MS);
}

async function loadSummary() {
  const s = await api("/api/summary");
  const first = !state.summary;
  state.summary = s;
  $("#title").textContent = `${s.kind} ${s.name}`;
  document.title = `fr-agents view · ${s.name}`;
  if (first && s.filters) {
    const f = $("#filters");
    for (const st of s.filters.statuses) f.status.append(el("option", { value: st }, st));
    for (const env of s.filters.envs) f.env.append(el("option", { value: env }, env));
    for (const so of s.filters.sorts) f.sort.append(el("option", { value: so }, so.replace("_", " ")));
  } else if (s.filters) {
    const have = new Set([...$("#filters").env.options].map((o) => o.value));
    for (const env of s.filters.envs) if (!have.has(env)) $("#filters").env.append(el("option", { value: env }, env));
  }
  $("#tab-run").hidden = s.kind !== "run";
}

// ------------------------------------------------------------------ run page
async function loadRun() {
  state.runDirty = false;
  const d = await apiLatest("run", "/api/run", $("#charts"));
  if (!d) return;
  const c = d.curves, last = c.last || {}, st = d.stats || {};
  const cards = clear($("#run-cards"));
  const card = (label, v, id) => cards.append(el("div", { class: "card", id }, el("div", { class: "v" }, v), el("div", { class: "l" }, label)));
  card("learner steps", fmt(c.steps), "card-steps");
  card("last batch reward", fmt(last.reward), "card-reward");
  card("last acceptance", fmt(last.acceptance), "card-acceptance");
  card("tokens/s", fmt(last.tokens_per_s, 0), "card-tps");
  card("leaves in store", fmt(st.leaves), "card-leaves");
  card("sharing ratio (store)", fmt(st.sharing_ratio), "card-sharing");
  card("consumed / available", `${fmt(st.consumed)} / ${fmt(st.available)}`, "card-consumed");

  const charts = clear($("#charts"));
  const s = c.series;
  charts.append(
    lineChart("reward", [
      { ...s.reward, color: "#2f6fdf" },
      { ...s.success, color: "#1e8449", points: true },
      ...(s.success_at_k ? [{ ...s.success_at_k, color: "#8e44ad", points: true }] : []),
    ], { ymin: 0 }),
    lineChart("acceptance", [{ ...s.acceptance, color: "#16a085" }], { ymin: 0, ymax: 1 }),
    barChart("lag", "policy lag histogram (trajectories)", c.lag_hist),
    lineChart("tokens", [{ ...s.tokens_per_s, color: "#d35400" }], { ymin: 0 }),
    lineChart("sharing", [{ ...s.sharing, color: "#7f8c8d", points: true }], { ymin: 0 }),
    lineChart("loss", [{ ...s.loss, color: "#c0392b" }], {}),
  );
  $("#config").textContent = d.config || "(no config.yaml)";
  const tb = clear($("#checkpoints tbody"));
  for (const ck of d.checkpoints) {
    tb.append(el("tr", {}, el("td", {}, ck.name + (ck.latest ? "  (latest)" : "")), el("td", {}, ck.step),
      el("td", {}, ck.complete ? "yes" : "no"), el("td", {}, (ck.bytes / 1e6).toFixed(2) + " MB"),
      el("td", {}, new Date(ck.mtime * 1000).toLocaleString())));
  }
  const ev = clear($("#events"));
  for (const e of c.events) ev.append(el("li", {}, JSON.stringify(e)));
}

function chartBox(id, title) {
  return el("div", { class: "chart", id: "chart-" + id, dataset: { chart: id } }, el("h3", {}, title));
}

function lineChart(id, series, opts) {
  const title = series.map((s) => s.label).join(" · ");
  const box = chartBox(id, title);
  const pts = series.flatMap((s) => s.x.map((x, i) => [x, s.y[i]]).filter((p) => p[1] !== null));
  box.dataset.points = String(pts.length);
  if (!pts.length) { box.append(el("div", { class: "empty" }, "no data yet")); return box; }
  const W = 360, H = 170, L = 44, R = 8, T = 8, B = 22;
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  let y0 = opts.ymin !== undefined ? Math.min(opts.ymin, ...ys) : Math.min(...ys);
  let y1 = opts.ymax !== undefined ? Math.max(opts.ymax, ...ys) : Math.max(...ys);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  g.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }), svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  for (const y of [y0, (y0 + y1) / 2, y1]) g.append(svg("text", { class: "tick", x: L - 4, y: sy(y) + 3, "text-anchor": "end" }, fmt(y, 2)));
  for (const x of [x0, x1]) g.append(svg("text", { class: "tick", x: sx(x), y: H - 6, "text-anchor": "middle" }, fmt(x, 0)));
  let ly = T + 10;
  for (const s of series) {
    const p = s.x.map((x, i) => [x, s.y[i]]).filter((q) => q[1] !== null);
    if (!p.length) continue;
    if (p.length > 1) g.append(svg("polyline", { fill: "none", stroke: s.color, "stroke-width": 1.6, points: p.map((q) => `${sx(q[0]).toFixed(1)},${sy(q[1]).toFixed(1)}`).join(" ") }));
    if (s.points || p.length === 1 || p.length <= 30) {
      for (const [i, q] of p.entries()) {
        g.append(svg("circle", { cx: sx(q[0]), cy: sy(q[1]), r: 2.6, fill: s.color },
          svg("title", {}, `${s.label}: ${fmt(q[1])} at step ${q[0]}${s.names ? " (" + s.names[i] + ")" : ""}`)));
      }
    }
    g.append(svg("text", { class: "series-label", x: W - R, y: ly, "text-anchor": "end", fill: s.color }, s.label));
    ly += 12;
  }
  box.append(g);
  return box;
}

function barChart(id, title, pairs) {
  const box = chartBox(id, title);
  box.dataset.points = String(pairs.length);
  if (!pairs.length) { box.append(el("div", { class: "empty" }, "no data yet")); return box; }
  const W = 360, H = 170, L = 44, B = 22, T = 8;
  const max = Math.max(...pairs.map((p) => p[1]));
  const bw = Math.min(50, (W - L - 8) / pairs.length - 6);
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  g.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - 8, y2: H - B }));
  g.append(svg("text", { class: "tick", x: L - 4, y: T + 6, "text-anchor": "end" }, String(max)));
  pairs.forEach(([lag, n], i) => {
    const h = ((H - B - T) * n) / max, x = L + 6 + i * (bw + 6);
    g.append(svg("rect", { x, y: H - B - h, width: bw, height: h, fill: "#2f6fdf" }, svg("title", {}, `lag ${lag}: ${n} trajectories`)));
    g.append(svg("text", { class: "tick", x: x + bw / 2, y: H - 6, "text-anchor": "middle" }, `lag ${lag}`));
    g.append(svg("text", { class: "tick", x: x + bw / 2, y: H - B - h - 3, "text-anchor": "middle" }, String(n)));
  });
  box.append(g);
  return box;
}

// ------------------------------------------------------------------ root list
function filterQuery() {
  const q = {};
  for (const [k, v] of new FormData($("#filters")).entries()) if (v !== "") q[k] = v;
  return q;
}

async function loadRoots(resetPage) {
  if (resetPage) state.roots.offset = 0;
  const q = new URLSearchParams({ ...filterQuery(), offset: state.roots.offset, limit: ROOTS_PAGE });
  const d = await apiLatest("roots", "/api/roots?" + q, $("#roots tbody"));
  if (!d) return;
  state.roots.total = d.total;
  $("#roots-count").textContent = d.total ? `${d.offset + 1}–${d.offset + d.rows.length} of ${d.total} roots` : "no roots match";
  $("#roots-prev").disabled = d.offset === 0;
  $("#roots-next").disabled = d.offset + d.rows.length >= d.total;
  const tb = clear($("#roots tbody"));
  for (const r of d.rows) {
    const reward = r.leaves ? `${fmt(r.reward_mean, 2)} (${fmt(r.reward_min, 2)}…${fmt(r.reward_max, 2)})` : "–";
    const leaves = r.leaves === r.leaves_total ? String(r.leaves) : `${r.leaves}/${r.leaves_total}`;
    const tr = el("tr", { dataset: { root: r.id }, class: r.id === state.tree.root ? "selected" : "" },
      el("td", {}, "#" + r.id, el("div", { class: "hint env" }, r.env || "–"), r.open ? el("div", { class: "hint" }, `${r.open} open`) : null),
      el("td", { class: "leaves" }, leaves, r.pruned ? el("div", { class: "badge pruned" }, `${r.pruned} pruned`) : null),
      el("td", {}, reward),
      el("td", { class: "prompt", title: JSON.stringify(r.meta) }, "…" + r.prompt_tail));
    tr.addEventListener("click", () => openRoot(r.id));
    tb.append(tr);
  }
}

// ------------------------------------------------------------------ one tree
async function openRoot(root) {
  const t = state.tree;
  Object.assign(t, { root, gen: t.gen + 1, offset: 0, total: 0, parents: new Map(), depth: new Map(), kids: new Map(), indent: new Map(), collapsed: new Set() });
  state.compare = [];
  updateCompareButton();
  for (const tr of document.querySelectorAll("#roots tbody tr")) tr.classList.toggle("selected", Number(tr.dataset.root) === root);
  clear($("#tree"));
  $("#tree-reload").hidden = true;
  $("#tree-title").textContent = `root #${root}`;
  await loadTreeChunk();
}

async function loadTreeChunk() {
  const t = state.tree;
  if (t.loading === t.gen || t.root === null) return;
  const gen = t.gen;
  t.loading = gen;
  try {
    const d = await api(`/api/tree/${t.root}?offset=${t.offset}&limit=${TREE_CHUNK}`);
    if (gen !== t.gen) return; // another root was opened meanwhile
    t.total = d.total_nodes;
    const title = $("#tree-title");
    clear(title).append(`root #${d.root} · `, el("span", { id: "tree-leaves" }, String(d.total_leaves)), " leaves · ",
      el("span", { id: "tree-nodes" }, String(d.total_nodes)), " nodes", d.pruned ? ` · ${d.pruned} pruned` : "");
    const box = $("#tree");
    for (const n of d.nodes) box.append(treeRow(n));
    t.offset += d.nodes.length;
    const more = $("#tree-more");
    more.hidden = t.offset >= t.total;
    more.textContent = `load more (${t.offset} of ${t.total} nodes shown)`;
    box.dataset.shown = String(t.offset);
  } catch (e) {
    if (gen === t.gen) showError($("#tree"), e);
  } finally {
    if (t.loading === gen) t.loading = null;
  }
}

function leafBadges(leaf) {
  if (!leaf) return [];
  const out = [
    el("span", { class: "badge reward" + (leaf.reward <= 0 ? " zero" : ""), dataset: { reward: leaf.reward } }, `reward ${fmt(leaf.reward)}`),
  ];
  if (leaf.partial_score !== null) out.push(el("span", { class: "badge" }, `partial ${fmt(leaf.partial_score, 2)}`));
  out.push(el("span", { class: "badge" }, leaf.status));
  if (leaf.state === "pruned") out.push(el("span", { class: "badge pruned" }, "pruned"));
  else out.push(el("span", { class: "badge state" }, leaf.state + (leaf.batch !== null ? ` · batch ${leaf.batch}` : "")));
  return out;
}

function treeRow(n) {
  const t = state.tree;
  t.parents.set(n.id, n.parent);
  t.depth.set(n.id, n.depth);
  t.kids.set(n.id, n.children);
  // indent by forks, not by nodes: a node that is its parent's only child (the next turn of an
  // episode) stands under it at the same indent, so a 30-turn episode reads as a list; each fork's
  // branches go one step in. Nodes arrive depth first, so a parent is known before its children.
  const indent = n.parent === null ? 0 : (t.indent.get(n.parent) ?? 0) + ((t.kids.get(n.parent) ?? 0) > 1 ? 1 : 0);
  t.indent.set(n.id, indent);
  const guides = Array.from({ length: indent }, () => el("span", { class: "guide" }));
  const toggle = el("span", { class: "toggle", title: "collapse / expand" }, n.children ? "▾" : "·");
  if (n.children) toggle.addEventListener("click", (ev) => { ev.stopPropagation(); toggleCollapse(n.id, toggle); });
  const cmp = el("input", { type: "checkbox", class: "cmp", title: "compare this branch", dataset: { node: n.id } });
  cmp.addEventListener("click", (ev) => { ev.stopPropagation(); pickCompare(n.id, cmp.checked); });
  const kinds = [`${n.n} tok`];
  if (n.policy_n) kinds.push(`${n.policy_n} policy v${n.version}`);
  if (n.demo_n) kinds.push(`${n.demo_n} demo`);
  const meta = el("div", { class: "meta" }, cmp, el("b", {}, "#" + n.id), n.depth === 0 ? el("span", { class: "badge" }, "root") : null, el("span", {}, kinds.join(" · ")),
    n.children > 1 ? el("span", { class: "badge" }, `${n.children} branches · ${n.leaves_below} leaves`) : null, ...leafBadges(n.leaf));
  const box = el("div", { class: "box" }, meta, runsNode(n.runs, "text"));
  box.addEventListener("click", () => openNode(n.id));
  const row = el("div", { class: "node" + (n.leaf && n.leaf.state === "pruned" ? " pruned" : ""), dataset: { node: n.id, depth: n.depth, indent, leaf: n.leaf ? "1" : "0" } }, guides, toggle, box);
  if (hiddenByAncestor(n.id)) row.hidden = true;
  return row;
}

function hiddenByAncestor(id) {
  const t = state.tree;
  let p = t.parents.get(id);
  while (p !== null && p !== undefined) {
    if (t.collapsed.has(p)) return true;
    p = t.parents.get(p);
  }
  return false;
}

function toggleCollapse(id, toggle) {
  const t = state.tree;
  if (t.collapsed.has(id)) t.collapsed.delete(id); else t.collapsed.add(id);
  toggle.textContent = t.collapsed.has(id) ? "▸" : "▾";
  for (const row of document.querySelectorAll("#tree .node")) row.hidden = hiddenByAncestor(Number(row.dataset.node));
}

// ------------------------------------------------------------------ node detail
async function openNode(id) {
  state.selected = id;
  for (const row of document.querySelectorAll("#tree .node")) row.classList.toggle("selected", Number(row.dataset.node) === id);
  const box = $("#detail");
  let d;
  try { d = await api(`/api/node/${id}`); } catch (e) { showError(box, e); return; }
  if (state.selected !== id) return;
  clear(box);
  box.dataset.node = String(id);
  const kv = el("dl", { class: "kv" });
  const add = (k, v, attrs) => kv.append(el("dt", {}, k), el("dd", attrs || {}, v));
  add("node", `#${d.id} (root #${d.root}${d.parent !== null ? ", parent #" + d.parent : ""})`);
  add("path", d.path.map((x) => "#" + x).join(" → "));
  add("tokens", `${d.n} (positions ${d.offset}–${d.offset + d.n - 1}), policy version ${d.version < 0 ? "none" : "v" + d.version}`);
  add("leaves below", String(d.leaves_below));
  if (d.leaf) {
    add("reward", fmt(d.leaf.reward), { id: "detail-reward" });
    add("partial score", fmt(d.leaf.partial_score));
    add("status", d.leaf.status, { id: "detail-status" });
    add("state", d.leaf.state, { id: "detail-state" });
    add("consumed by", d.leaf.batch !== null ? `store batch ${d.leaf.batch}` : "not consumed", { id: "detail-batch" });
    if (d.episodes && d.episodes.length) add("ledger", d.episodes.map((e) => `episode ${e.episode} → learner batch ${e.batch}`).join("; "), { id: "detail-ledger" });
    add("trajectory", `${d.leaf.length} tokens, policy versions ${d.leaf.versions.join("…")}`);
  }
  box.append(el("h3", {}, d.leaf ? `Leaf #${d.id}` : d.parent === null ? `Root #${d.id}` : `Node #${d.id}`), kv);
  if (d.transcript && d.transcript.length) {
    // the whole episode, turn by turn: what the env said, what the policy (or a demo) replied
    const who = { env: "env", policy: "policy", demo: "demo" };
    const head = `reward ${fmt(d.leaf.reward)} · partial score ${fmt(d.leaf.partial_score)} · ${d.transcript.filter((t) => t.kind !== "env").length} replies`;
    box.append(el("h2", {}, "Transcript"), el("div", { class: "hint", id: "transcript-head" }, head),
      el("div", { class: "transcript", id: "transcript" }, d.transcript.map((t) =>
        el("div", { class: "turn k-" + t.kind }, el("b", {}, who[t.kind] || t.kind), el("pre", {}, t.text)))));
  }
  box.append(el("h2", {}, "Text"), runsNode(d.runs, "fulltext"));
  box.lastChild.id = "detail-text";
  // heat map
  const modeSel = el("select", { id: "heat-mode" }, el("option", { value: "lp" }, "behaviour log-prob"), el("option", { value: "v" }, "policy version"));
  modeSel.value = state.heatMode;
  const legend = el("span", { id: "heat-legend" });
  const heat = el("div", { class: "heat", id: "heat" });
  const paint = () => {
    state.heatMode = modeSel.value;
    clear(legend);
    if (state.heatMode === "lp") legend.append("p = 0 ", el("span", { class: "scale" }), " p = 1");
    else legend.append("one colour per policy version; grey: not sampled by the policy");
    for (const span of heat.children) span.style.background = tokenColor(span.dataset);
  };
  modeSel.addEventListener("change", paint);
  for (const tk of d.tokens) {
    const tip = `pos ${tk.pos} · id ${tk.id} · ${tk.kind}` + (tk.lp !== null ? ` · log-prob ${tk.lp.toFixed(4)} (p ${Math.exp(tk.lp).toFixed(3)}) · v${tk.v}` : "");
    heat.append(el("span", { class: "tok " + tk.kind, title: tip, dataset: { lp: tk.lp === null ? "" : tk.lp, v: tk.v, kind: tk.kind, id: tk.id } }, tk.piece === "" ? "∅" : tk.piece));
  }
  box.append(el("div", { class: "heat-mode" }, "colour by ", modeSel, legend), heat);
  paint();
  if (d.info && Object.keys(d.info).length) box.append(el("h2", {}, "info"), el("pre", { class: "info", id: "detail-info" }, JSON.stringify(d.info, null, 2)));
  if (d.meta) box.append(el("h2", {}, "root meta"), el("pre", { class: "info", id: "detail-meta" }, JSON.stringify(d.meta, null, 2)));
}

function tokenColor(ds) {
  if (ds.kind !== "policy") return "";
  if (state.heatMode === "lp") {
    const p = Math.exp(Number(ds.lp));
    return `hsl(${Math.round(120 * p)}, 75%, 78%)`;
  }
  return `hsl(${(Number(ds.v) * 67 + 200) % 360}, 65%, 80%)`;
}

// ------------------------------------------------------------------ compare two branches
function updateCompareButton() {
  const b = $("#compare-btn");
  b.textContent = `compare ${state.compare.length}/2`;
  b.disabled = state.compare.length !== 2;
}

function pickCompare(id, on) {
  state.compare = state.compare.filter((x) => x !== id);
  if (on) state.compare.push(id);
  while (state.compare.length > 2) {
    const drop = state.compare.shift();
    const box = document.querySelector(`#tree .cmp[data-node="${drop}"]`);
    if (box) box.checked = false;
  }
  updateCompareButton();
}

async function showCompare() {
  const [a, b] = state.compare;
  const box = $("#compare");
  box.hidden = false;
  const d = await apiLatest("compare", `/api/compare?a=${a}&b=${b}`, box);
  if (!d) return;
  clear(box);
  const close = el("button", { id: "compare-close" }, "close");
  close.addEventListener("click", () => { box.hidden = true; });
  const side = (s, cls) => el("div", { class: "side " + cls, dataset: { node: s.id } },
    el("div", { class: "meta" }, el("b", {}, "#" + s.id), ...leafBadges(s.leaf)),
    s.segments.length ? s.segments.map((g) => el("div", { class: "seg", dataset: { node: g.id } },
      el("span", { class: "hint" }, `#${g.id} · ${g.n} tok${g.policy_n ? " · v" + g.version : ""}`), el("br"), runsNode(g.runs, "segtext")))
      : el("p", { class: "hint" }, "(this node is the split point itself)"));
  box.append(
    el("h3", {}, `Compare #${a} and #${b} `, close),
    el("div", { class: "hint", id: "compare-split", dataset: { node: d.split.id } }, `split after node #${d.split.id} (token ${d.split_offset}); shared context ends with:`),
    runsNode(d.split.runs, "split"),
    el("div", { class: "sides" }, side(d.a, "side-a"), side(d.b, "side-b")),
  );
}

// ------------------------------------------------------------------ wiring
function init() {
  for (const b of document.querySelectorAll(".tab")) b.addEventListener("click", () => setTab(b.dataset.tab));
  $("#filters").addEventListener("submit", (ev) => { ev.preventDefault(); loadRoots(true); });
  $("#filters").addEventListener("reset", () => setTimeout(() => loadRoots(true), 0));
  $("#roots-prev").addEventListener("click", () => { state.roots.offset = Math.max(0, state.roots.offset - ROOTS_PAGE); loadRoots(false); });
  $("#roots-next").addEventListener("click", () => { state.roots.offset += ROOTS_PAGE; loadRoots(false); });
  $("#tree-more").addEventListener("click", loadTreeChunk);
  $("#tree-reload").addEventListener("click", () => openRoot(state.tree.root));
  $("#compare-btn").addEventListener("click", showCompare);
  // load the next chunk when the "load more" button scrolls into view
  new IntersectionObserver((entries) => { if (entries.some((e) => e.isIntersecting)) loadTreeChunk(); }, { root: $(".tree-pane") }).observe($("#tree-more"));
  loadSummary().then(() => {
    const want = location.hash.slice(1);
    const isRun = state.summary.kind === "run";
    setTab(want === "trees" || (want === "run" && isRun) ? want : isRun ? "run" : "trees");
    loadRoots(true);
    poll();
  }).catch((e) => showError($("#detail"), e));
}

document.addEventListener("DOMContentLoaded", init);
