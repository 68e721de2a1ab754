// hypsearch page: search by label (with autocompletion) or by picture; results grouped by
// level; a Poincaré-disk picture of the answer. Plain JavaScript, no build step.
"use strict";

const $ = (sel) => document.querySelector(sel);
const form = $("#search-form");
const input = $("#q");
const list = $("#suggestions");
const message = $("#message");
const answer = $("#answer");
const results = $("#results");
const summary = $("#summary");
const disk = $("#disk");
const drop = $("#drop");
const fileInput = $("#file");
const queryPicture = $("#query-picture");
const SVG = "http://www.w3.org/2000/svg";
const LEVEL_COLORS = ["var(--level0)", "var(--level1)", "var(--level2)", "var(--level3)"];

// ------------------------------------------------------------------ helpers

function mode() {
  return document.querySelector('input[name="mode"]:checked').value;
}

const MODES = ["auto", "entailment", "hierarchical", "nearest"];

// a mode from the address bar: only a known value is used (entailment shows as auto)
function setMode(m) {
  if (!MODES.includes(m)) return;
  const value = m === "entailment" ? "auto" : m;
  for (const el of document.querySelectorAll('input[name="mode"]')) el.checked = el.value === value;
}

function k() {
  const v = parseInt($("#k").value, 10);
  return Number.isFinite(v) ? Math.min(Math.max(v, 1), 200) : 12;
}

// hierarchical mode shows the firmest few of every level; the other modes the first k
function sizing() {
  return mode() === "hierarchical" ? { k: 1000, per_level: k() } : { k: k() };
}

function syncSizeLabel() {
  $("#k-label").textContent = mode() === "hierarchical" ? "Per level" : "Results";
}

function shortName(label) {
  if (!label) return "(no label)";
  const m = /^(.+)\.[a-z]\.\d+$/.exec(label);
  return (m ? m[1] : label).replace(/_/g, " ");
}

function levelTitle(level, via, queryLabel, hits, ran) {
  if (level === null || level === undefined) {
    return ran === "nearest" ? ["Nearest items", ""] : ["What it is", shortName(queryLabel)];
  }
  const under = `under ${shortName(via)}`;
  if (level === 0) {
    // a class (every item carries the label itself) or an inner node of the taxonomy
    const same = hits.every((h) => h.label === via);
    return same ? ["Same class", shortName(via || queryLabel)] : ["Level 0", under];
  }
  if (level === 1) return ["Siblings", under];
  if (level === 2) return ["Cousins", under];
  return [`Level ${level}`, under];
}

function levelColor(level) {
  if (level === null || level === undefined) return LEVEL_COLORS[0];
  return LEVEL_COLORS[Math.min(level, LEVEL_COLORS.length - 1)];
}

function showMessage(text, { error = false, suggestions = [] } = {}) {
  message.hidden = false;
  message.className = error ? "error" : "";
  message.textContent = text;
  if (suggestions.length) {
    message.append(" Try:");
    for (const s of suggestions) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = s;
      b.addEventListener("click", () => { input.value = s; searchLabel(s); });
      message.append(b);
    }
  }
}

function clearMessage() {
  message.hidden = true;
  message.textContent = "";
}

async function api(path, options = {}) {
  const r = await fetch(path, options);
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    const detail = body && body.detail ? body.detail : `${r.status} ${r.statusText}`;
    const err = new Error(typeof detail === "string" ? detail : JSON.stringify(detail));
    err.suggestions = (body && body.suggestions) || [];
    throw err;
  }
  return body;
}

// ------------------------------------------------------------------ autocompletion

let completeTimer = null;
let completeSeq = 0;
let active = -1;

function closeList() {
  list.hidden = true;
  list.innerHTML = "";
  active = -1;
  input.setAttribute("aria-expanded", "false");
}

function highlight(i) {
  const items = [...list.children];
  items.forEach((li, j) => li.setAttribute("aria-selected", j === i ? "true" : "false"));
  active = i;
}

async function complete(prefix) {
  const seq = ++completeSeq;
  if (!prefix.trim()) { closeList(); return; }
  let names = [];
  try {
    names = await api(`/v1/labels?prefix=${encodeURIComponent(prefix)}&limit=12`);
  } catch (e) { return; }
  if (seq !== completeSeq) return; // a newer keystroke won
  list.innerHTML = "";
  for (const name of names) {
    const li = document.createElement("li");
    li.setAttribute("role", "option");
    li.textContent = name;
    li.addEventListener("mousedown", (ev) => { ev.preventDefault(); choose(name); });
    list.append(li);
  }
  list.hidden = names.length === 0;
  input.setAttribute("aria-expanded", names.length ? "true" : "false");
  active = -1;
}

function choose(name) {
  input.value = name;
  closeList();
  searchLabel(name);
}

input.addEventListener("input", () => {
  clearTimeout(completeTimer);
  completeTimer = setTimeout(() => complete(input.value), 120);
});
input.addEventListener("keydown", (ev) => {
  const n = list.children.length;
  if (list.hidden || !n) return;
  if (ev.key === "ArrowDown") { ev.preventDefault(); highlight((active + 1) % n); }
  else if (ev.key === "ArrowUp") { ev.preventDefault(); highlight((active - 1 + n) % n); }
  else if (ev.key === "Enter" && active >= 0) { ev.preventDefault(); choose(list.children[active].textContent); }
  else if (ev.key === "Escape") closeList();
});
input.addEventListener("blur", () => setTimeout(closeList, 150));

// ------------------------------------------------------------------ searching

let lastQuery = null; // {kind: "label", text} or {kind: "image", file}

function setBusy(busy) {
  results.dataset.state = busy ? "loading" : "done";
  $("#go").disabled = busy;
}

// a general label: one section per child branch holding items (POST /v1/count facets)
async function facetsOf(text) {
  try {
    const c = await api("/v1/count", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ label: text, facet: "children" }),
    });
    return c.facets || [];
  } catch (e) {
    return [];
  }
}

async function searchLabel(text) {
  text = (text || "").trim();
  if (!text) { showMessage(`Type a label name, such as ${input.placeholder.replace(" …", "")}.`); return; }
  lastQuery = { kind: "label", text };
  // a completion still waiting for its debounce (or its answer) must not reopen the list
  clearTimeout(completeTimer);
  completeSeq++;
  closeList();
  clearMessage();
  queryPicture.hidden = true;
  const params = new URLSearchParams({ q: text, mode: mode() });
  history.replaceState(null, "", `/?${params}`);
  setBusy(true);
  try {
    const post = (extra) => api("/v1/search", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ label: text, mode: mode(), ...sizing(), disk: true, ...extra }),
    });
    // "what it is": a label above several child branches that hold items shows one
    // section a branch (when the label ran by entailment: its cone holds the images)
    const [first, facets] = await Promise.all([
      post({}),
      mode() === "auto" ? facetsOf(text) : Promise.resolve([]),
    ]);
    const grouped = first.query.mode === "entailment" && facets.length >= 2;
    const body = grouped ? await post({ group_by: "children" }) : first;
    render(body, `label “${text}”`);
    if (mode() === "hierarchical") countLevels(body);
  } catch (e) {
    answer.hidden = true;
    showMessage(e.message, { error: true, suggestions: e.suggestions });
  } finally {
    setBusy(false);
  }
}

async function searchImage(file) {
  if (!file) return;
  lastQuery = { kind: "image", file };
  clearMessage();
  closeList();
  queryPicture.src = URL.createObjectURL(file);
  queryPicture.hidden = false;
  history.replaceState(null, "", "/");
  setBusy(true);
  const data = new FormData();
  data.append("file", file, file.name || "picture");
  const size = sizing();
  const params = new URLSearchParams({ k: String(size.k), mode: mode(), disk: "true" });
  if (size.per_level) params.set("per_level", String(size.per_level));
  try {
    const body = await api(`/v1/search/image?${params}`, { method: "POST", body: data });
    render(body, `your picture (${file.name || "dropped"})`);
  } catch (e) {
    answer.hidden = true;
    showMessage(e.message, { error: true });
  } finally {
    setBusy(false);
  }
}

form.addEventListener("submit", (ev) => { ev.preventDefault(); searchLabel(input.value); });
for (const r of document.querySelectorAll('input[name="mode"]')) {
  r.addEventListener("change", () => {
    syncSizeLabel();
    if (!lastQuery) return;
    if (lastQuery.kind === "label") searchLabel(lastQuery.text); else searchImage(lastQuery.file);
  });
}
fileInput.addEventListener("change", () => searchImage(fileInput.files[0]));
drop.addEventListener("dragover", (ev) => { ev.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (ev) => {
  ev.preventDefault();
  drop.classList.remove("over");
  const f = ev.dataTransfer && ev.dataTransfer.files && ev.dataTransfer.files[0];
  if (f) searchImage(f);
});

// ------------------------------------------------------------------ rendering

function itemImage(id) {
  return `/v1/items/${encodeURIComponent(id)}/image`;
}

function section(key, badgeText, color, title, sub, hits) {
  const el = document.createElement("section");
  el.className = "group";
  el.dataset.level = key;
  const h = document.createElement("h2");
  const badge = document.createElement("span");
  badge.className = "badge";
  badge.style.background = color;
  badge.textContent = badgeText;
  const t = document.createElement("span");
  t.textContent = title;
  const v = document.createElement("span");
  v.className = "via";
  v.textContent = sub;
  h.append(badge, t, v);
  const grid = document.createElement("div");
  grid.className = "grid";
  for (const hit of hits) grid.append(hitCard(hit));
  el.append(h, grid);
  return el;
}

// hierarchical levels: how many items each level holds (the count under its via
// label less the count under the level before)
async function countLevels(body) {
  const sections = [...results.querySelectorAll("section.group")];
  let below = 0;
  for (const el of sections) {
    if (!el.dataset.via) continue;
    let n;
    try {
      n = (await api("/v1/count", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ label: el.dataset.via }),
      })).count;
    } catch (e) {
      return;
    }
    const span = el.querySelector(".via");
    span.textContent = `${span.textContent.split(" · ")[0]} · ${el.dataset.shown} of ${(n - below).toLocaleString()}`;
    below = n;
  }
}

function render(body, what) {
  answer.hidden = false;
  const q = body.query;
  const n = body.groups ? body.groups.reduce((a, g) => a + g.results.length, 0) : body.results.length;
  summary.innerHTML = "";
  const s = document.createElement("span");
  s.innerHTML = `Results for <strong></strong>: query label <strong class="qlabel"></strong>, `
    + `distance to the origin ${q.distance_to_origin.toFixed(3)}; ${n} items.`;
  s.querySelector("strong").textContent = what;
  const ql = s.querySelector(".qlabel");
  ql.textContent = q.label || "none";
  ql.id = "query-label";
  summary.append(s);

  results.innerHTML = "";
  if (body.groups) {
    if (!body.groups.length) {
      const p = document.createElement("p");
      p.textContent = "No items.";
      results.append(p);
    }
    body.groups.forEach((g, i) => {
      const sub = `${g.count.toLocaleString()} items under it · ${g.results.length} shown`;
      results.append(section(`child-${i}`, "▸", levelColor(0), shortName(g.label), sub, g.results));
    });
    drawDisk(body.disk);
    return;
  }
  const groups = new Map();
  for (const hit of body.results) {
    const key = hit.level === null || hit.level === undefined ? q.mode : String(hit.level);
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(hit);
  }
  if (!body.results.length) {
    const p = document.createElement("p");
    p.textContent = "No items.";
    results.append(p);
  }
  for (const [key, hits] of groups) {
    const level = key === "nearest" || key === "entailment" ? null : Number(key);
    const [title, sub] = levelTitle(level, hits[0].via, q.label, hits, q.mode);
    const badge = level === null ? "k" : String(level);
    const el = section(key, badge, levelColor(level), title, `${sub} · ${hits.length} shown`, hits);
    if (level !== null && hits[0].via) {
      el.dataset.via = hits[0].via;
      el.dataset.shown = String(hits.length);
    }
    results.append(el);
  }
  drawDisk(body.disk);
}

function hitCard(hit) {
  const fig = document.createElement("figure");
  fig.className = "hit";
  fig.dataset.id = hit.id;
  fig.title = `${hit.id}\n${hit.label || ""}\nscore ${hit.score.toFixed(3)}\ngeodesic distance ${hit.distance.toFixed(4)}`;
  const img = document.createElement("img");
  img.loading = "lazy";
  img.alt = `${shortName(hit.label)} (${hit.id})`;
  img.src = itemImage(hit.id);
  img.addEventListener("error", () => {
    const ph = document.createElement("div");
    ph.className = "noimg";
    ph.textContent = "no picture";
    img.replaceWith(ph);
  });
  const cap = document.createElement("figcaption");
  const lab = document.createElement("div");
  lab.className = "label";
  lab.textContent = shortName(hit.label);
  const dist = document.createElement("div");
  dist.className = "dist score";
  dist.textContent = `${Math.round(hit.score * 100)}%`;
  dist.title = `score ${hit.score.toFixed(3)} · geodesic distance ${hit.distance.toFixed(3)}`;
  cap.append(lab, dist);
  fig.append(img, cap);
  return fig;
}

function svg(tag, attrs, parent) {
  const el = document.createElementNS(SVG, tag);
  for (const [a, v] of Object.entries(attrs)) el.setAttribute(a, v);
  if (parent) parent.append(el);
  return el;
}

function drawDisk(d) {
  disk.innerHTML = "";
  svg("circle", { cx: 0, cy: 0, r: 1, class: "boundary" }, disk);
  if (!d) return;
  const byName = new Map();
  for (const p of d.points) if (p.kind === "label") byName.set(p.name, p);
  // y grows downwards in SVG: flip it
  const X = (p) => p.x;
  const Y = (p) => -p.y;
  const tree = svg("g", { class: "tree" }, disk);
  for (const p of byName.values()) {
    const parent = p.parent && byName.get(p.parent);
    if (parent) svg("line", { x1: X(p), y1: Y(p), x2: X(parent), y2: Y(parent) }, tree);
  }
  const res = svg("g", { class: "results" }, disk);
  for (const p of d.points.filter((p) => p.kind === "result")) {
    const c = svg("circle", { cx: X(p), cy: Y(p), r: 0.017, class: "result", fill: levelColor(p.level) }, res);
    svg("title", {}, c).textContent = `${p.name} · ${p.label || ""}`;
  }
  // label names: the deepest first (the answer's own labels), and a name only where
  // it overlaps none already written, so the general labels near the origin, which
  // crowd together, do not pile up (every label keeps its dot and its tooltip)
  const labels = svg("g", { class: "labels" }, disk);
  const written = [];
  // the query's own label is named before any other
  const asked = d.points.find((p) => p.kind === "query")?.label;
  const first = (p) => (p.name === asked ? 0 : 1);
  const named = [...byName.values()].sort(
    (a, b) => first(a) - first(b) || Math.hypot(b.x, b.y) - Math.hypot(a.x, a.y),
  );
  for (const p of named) {
    const g = svg("g", { class: "label" }, labels);
    svg("circle", { cx: X(p), cy: Y(p), r: 0.013 }, g);
    const text = shortName(p.name);
    const w = 0.026 * text.length;
    const box = { x: X(p) + 0.02, y: Y(p) - 0.03, w, h: 0.055 };
    const clash = written.some((b) => box.x < b.x + b.w && b.x < box.x + box.w && box.y < b.y + b.h && b.y < box.y + box.h);
    if (!clash) {
      const t = svg("text", { x: box.x, y: Y(p) + 0.012 }, g);
      t.textContent = text;
      written.push(box);
    }
    svg("title", {}, g).textContent = p.name;
  }
  const o = d.points.find((p) => p.kind === "origin");
  if (o) {
    const g = svg("g", { class: "origin" }, disk);
    svg("path", { d: `M${X(o) - 0.025},${Y(o)}h0.05M${X(o)},${Y(o) - 0.025}v0.05` }, g);
    const t = svg("text", { x: X(o) + 0.03, y: Y(o) - 0.02 }, g);
    t.textContent = "origin";
    svg("title", {}, g).textContent = "the origin of the ball";
  }
  const q = d.points.find((p) => p.kind === "query");
  if (q) {
    const star = svg("path", { class: "query", d: starPath(X(q), Y(q), 0.04, 0.017) }, disk);
    svg("title", {}, star).textContent = `query · ${q.label || ""}`;
  }
}

function starPath(cx, cy, r1, r2) {
  let dpath = "";
  for (let i = 0; i < 10; i++) {
    const r = i % 2 ? r2 : r1;
    const a = Math.PI / 2 + (i * Math.PI) / 5;
    dpath += `${i ? "L" : "M"}${(cx + r * Math.cos(a)).toFixed(4)},${(cy - r * Math.sin(a)).toFixed(4)}`;
  }
  return dpath + "Z";
}

// ------------------------------------------------------------------ start

async function start() {
  api("/v1/stats").then((s) => {
    $("#stats").textContent = `${s.items.toLocaleString()} items · ${s.labels} labels in use · dim ${s.dim}`;
    // the built-in pretrained models place photos among the WordNet nouns
    if (String(s.model).startsWith("pretrained:")) input.placeholder = "feline, vehicle, beverage, building …";
  }).catch(() => {});
  const params = new URLSearchParams(location.search);
  if (params.get("mode")) setMode(params.get("mode"));
  syncSizeLabel();
  if (params.get("k")) $("#k").value = params.get("k");
  const q = params.get("q");
  if (q) {
    input.value = q;
    await searchLabel(q);
  } else {
    results.dataset.state = "idle";
  }
}

start();
