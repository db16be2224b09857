// Writes the export-attention gallery: a static page whose inline script draws the layer x head maps from inline
// data (canvas, one pixel per patch) and shows overlays written next to it, so it opens from disk with no network.
#include "explain/gallery.h"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "image/draw.h"
#include "util/fs.h"

namespace vit {
namespace {

// Percent-encodes one path segment for a relative URL (names may hold spaces, '#', '%', non-ASCII bytes).
std::string url_segment(const std::string& name) {
  std::string out;
  for (const unsigned char c : name) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char escaped[4];
      std::snprintf(escaped, sizeof escaped, "%%%02X", c);
      out += escaped;
    }
  }
  return out;
}

// Maps rounded to 4 decimals: plenty for 256 colours, and it keeps the page small.
nlohmann::ordered_json maps_json(const AttentionExportResult& result) {
  const auto maps = result.head_maps.to(torch::kFloat64).contiguous();  // (layers, heads, gh, gw)
  const auto on = result.head_on.accessor<bool, 2>();
  nlohmann::ordered_json layers = nlohmann::ordered_json::array(), flags = nlohmann::ordered_json::array();
  for (int64_t r = 0; r < maps.size(0); ++r) {
    nlohmann::ordered_json row = nlohmann::ordered_json::array(), row_on = nlohmann::ordered_json::array();
    for (int64_t c = 0; c < maps.size(1); ++c) {
      const auto flat = maps[r][c].reshape(-1).contiguous();
      const double* values = flat.data_ptr<double>();
      std::vector<double> rounded(flat.numel());
      for (int64_t i = 0; i < flat.numel(); ++i) rounded[i] = std::round(values[i] * 1e4) / 1e4;
      row.push_back(rounded);
      row_on.push_back(on[r][c]);
    }
    layers.push_back(row);
    flags.push_back(row_on);
  }
  return {{"maps", layers}, {"on", flags}};
}

nlohmann::ordered_json image_json(const AttentionExportResult& result) {
  const auto& summary = result.summary;
  auto maps = maps_json(result);
  nlohmann::ordered_json image = {
      {"name", result.dir_name},
      {"dir", url_segment(result.dir_name)},
      {"image", summary.at("image")},
      {"size", {summary.at("image_size").at("height"), summary.at("image_size").at("width")}},
      {"grid", summary.at("model").at("grid")},
      {"view", {result.view.top, result.view.left, result.view.bottom, result.view.right}},
      {"prediction", summary.at("prediction")},
      {"files", summary.at("files")},
      {"layers", result.layers},
      {"heads", result.heads},
      {"maps", maps["maps"]},
      {"on", maps["on"]},
      {"method", summary.at("method")},
  };
  if (summary.contains("faithfulness")) {
    auto faithfulness = summary.at("faithfulness");
    for (auto& [key, curves] : faithfulness["curves"].items()) {
      for (auto& [metric, curve] : curves.items()) curve.erase("top1");  // the page draws probabilities only
    }
    image["faithfulness"] = faithfulness;
  }
  return image;
}

const char* kPageHead = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>Attention export</title>
<style>
:root { --ink: #1c2230; --muted: #5a6376; --line: #dce1e8; --paper: #fff; --bg: #f3f5f8; --accent: #2358d4;
        --masked: #cf2b2b; --cell: 64px; --aspect: 1; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--ink); background: var(--bg); }
header { background: var(--paper); border-bottom: 1px solid var(--line); padding: 18px 28px 14px; }
header h1 { font-size: 21px; margin: 0 0 6px; }
.meta { display: flex; flex-wrap: wrap; gap: 4px 18px; color: var(--muted); font-size: 13px; margin: 0; }
.meta b { color: var(--ink); font-weight: 600; }
nav { margin-top: 12px; display: flex; flex-wrap: wrap; gap: 6px; }
nav a { font-size: 12.5px; color: var(--ink); text-decoration: none; border: 1px solid var(--line);
        border-radius: 999px; padding: 2px 10px; background: var(--bg); }
nav a:hover { border-color: var(--accent); color: var(--accent); }
nav a.bad { color: var(--masked); }
main { max-width: 1320px; margin: 0 auto; padding: 22px 28px 60px; }
.card { background: var(--paper); border: 1px solid var(--line); border-radius: 10px; padding: 18px 20px 20px;
        margin-bottom: 22px; box-shadow: 0 1px 2px rgba(20, 30, 50, .05); }
.card-head { display: flex; flex-wrap: wrap; align-items: baseline; gap: 2px 14px; }
.card-head h2 { margin: 0; font-size: 18px; }
.path { color: var(--muted); font-size: 12.5px; word-break: break-all; }
.layout { display: grid; grid-template-columns: minmax(220px, 290px) minmax(0, 1fr); gap: 22px; margin-top: 14px; }
h3 { font-size: 13px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); margin: 18px 0 8px; }
.layout h3:first-child, .side h3:first-child { margin-top: 0; }
.top1 { font-size: 17px; font-weight: 600; margin-bottom: 8px; }
.top1 span { color: var(--muted); font-weight: 400; }
.bars { list-style: none; margin: 0; padding: 0; }
.bars li { display: grid; grid-template-columns: minmax(0, 1fr) 56px; gap: 2px 8px; font-size: 13px; margin: 0 0 6px; }
.bars .label { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.bars .pct { text-align: right; color: var(--muted); font-variant-numeric: tabular-nums; }
.bars .track { grid-column: 1 / 3; height: 6px; background: #e9edf3; border-radius: 3px; overflow: hidden; }
.bars .fill { height: 100%; background: var(--accent); border-radius: 3px; }
.figs { display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 12px; }
figure { margin: 0; }
.thumb { display: block; width: 100%; padding: 0; border: 1px solid var(--line); border-radius: 6px; overflow: hidden;
         background: #e6e9ee; cursor: zoom-in; }
.thumb img { display: block; width: 100%; aspect-ratio: var(--aspect); object-fit: contain; }
.thumb:hover, .thumb:focus-visible { border-color: var(--accent); outline: none; }
figcaption { font-size: 12.5px; color: var(--muted); margin-top: 4px; }
.strip { display: flex; gap: 10px; overflow-x: auto; padding-bottom: 6px; }
.strip figure { flex: 0 0 128px; }
.gridwrap { overflow-x: auto; padding-bottom: 4px; }
table.lh { border-collapse: separate; border-spacing: 4px; }
table.lh th { font-size: 12px; font-weight: 600; color: var(--muted); white-space: nowrap; padding: 0 2px; }
table.lh th.row { text-align: right; padding-right: 6px; }
table.lh td { padding: 0; }
.cell { position: relative; display: block; width: var(--cell); aspect-ratio: var(--aspect); padding: 0; margin: 0;
        border: 1px solid var(--line); border-radius: 4px; overflow: hidden; cursor: zoom-in; background: #d9dde4; }
.cell img, .cell canvas { position: absolute; inset: 0; width: 100%; height: 100%; }
.cell canvas, #lb-map { image-rendering: pixelated; }
canvas.cropped { box-shadow: 0 0 0 100vmax rgba(0, 0, 0, .8); }  /* dims what the model never saw */
.cell:hover, .cell:focus-visible { outline: 2px solid var(--accent); outline-offset: 1px; }
.cell.masked { border: 2px solid var(--masked); }
.badge { position: absolute; left: 2px; bottom: 2px; font-size: 10px; line-height: 14px; padding: 0 4px;
         border-radius: 3px; background: #fff; color: var(--masked); font-weight: 700; }
.note { font-size: 12.5px; color: var(--muted); margin: 6px 0 0; }
.legend { display: flex; align-items: center; gap: 8px; font-size: 12px; color: var(--muted); margin-top: 8px; }
.ramp { width: 160px; height: 10px; border-radius: 2px; border: 1px solid var(--line); }
.faith svg { width: 100%; max-width: 300px; height: auto; display: block; }
table.faith-table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; margin-top: 6px; }
table.faith-table th, table.faith-table td { padding: 4px 10px; border-bottom: 1px solid var(--line);
                                             text-align: right; }
table.faith-table th:first-child, table.faith-table td:first-child { text-align: left; white-space: nowrap; }
table.faith-table thead th { cursor: pointer; user-select: none; white-space: nowrap; color: var(--muted); }
table.faith-table thead th[aria-sort="ascending"]::after { content: " \25b2"; }
table.faith-table thead th[aria-sort="descending"]::after { content: " \25bc"; }
table.faith-table td.best { font-weight: 700; color: var(--accent); }
table.faith-small { font-size: 12px; }
table.faith-small th, table.faith-small td { padding: 2px 6px; }
.faith-plot { display: block; max-width: 100%; margin-top: 12px; border: 1px solid var(--line); border-radius: 6px; }
.faith .auc { font-size: 12.5px; color: var(--muted); margin: 4px 0 0; }
.swatch { display: inline-block; width: 14px; height: 3px; margin: 0 6px 3px 0; vertical-align: middle; }
.errors li { margin-bottom: 6px; }
.errors code { word-break: break-all; }
#lightbox { position: fixed; inset: 0; z-index: 10; display: flex; align-items: center; justify-content: center;
            background: rgba(18, 22, 32, .72); padding: 2vh 2vw; }
#lightbox[hidden] { display: none; }
.lb-panel { position: relative; background: var(--paper); border-radius: 10px; padding: 14px 16px 12px;
            max-width: 96vw; max-height: 96vh; box-shadow: 0 12px 40px rgba(0, 0, 0, .35); }
.lb-stage { position: relative; background: #d9dde4; border-radius: 4px; overflow: hidden; }
.lb-stage img, .lb-stage canvas { position: absolute; inset: 0; width: 100%; height: 100%; }
#lb-picture { display: block; max-width: 90vw; max-height: 80vh; border-radius: 4px; }
#lb-caption { margin: 8px 36px 0 0; font-size: 14px; }
#lb-close { position: absolute; top: 6px; right: 8px; border: 0; background: none; font-size: 24px; line-height: 1;
            cursor: pointer; color: var(--muted); }
@media (max-width: 820px) {
  header, main { padding-left: 14px; padding-right: 14px; }
  .layout { grid-template-columns: minmax(0, 1fr); }
  .card .cell { width: 46px; }
}
</style>
</head>
<body>
<header>
  <h1>Attention export</h1>
  <p class="meta" id="run"></p>
  <nav id="toc" aria-label="images"></nav>
</header>
<main id="cards"><section class="card" id="faithfulness" hidden></section></main>
<div id="lightbox" hidden role="dialog" aria-modal="true" aria-labelledby="lb-caption">
  <div class="lb-panel">
    <button id="lb-close" type="button" aria-label="close">&times;</button>
    <div class="lb-stage" id="lb-stage"><img id="lb-backdrop" alt=""><canvas id="lb-map"></canvas></div>
    <img id="lb-picture" alt="">
    <p id="lb-caption"></p>
    <div class="legend" id="lb-legend"><span>0</span><span class="ramp"></span><span>map max</span></div>
  </div>
</div>
<script id="export-data" type="application/json">)HTML";

const char* kPageScript = R"HTML(</script>
<script>
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("export-data").textContent);
  const LUT = DATA.colormap.map(h => [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16)));
  const RAMP = "linear-gradient(to right, " +
      [0, 32, 64, 96, 128, 160, 192, 224, 255].map(i => DATA.colormap[i]).join(", ") + ")";

  function el(tag, props, children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (key === "text") node.textContent = value;
      else if (key === "class") node.className = value;
      else if (key === "style") node.style.cssText = value;
      else if (key.includes("-")) node.setAttribute(key, value);
      else node[key] = value;
    }
    for (const child of children || []) if (child) node.appendChild(child);
    return node;
  }
  const pct = p => (100 * p).toFixed(p >= 0.0995 ? 1 : 2) + "%";
  const url = (entry, file) => entry.dir + "/" + file;
  // Maps lie on the window of the image the model saw (the centre crop when crop_pct < 1).
  const placeOnView = (canvas, view) => {
    const [top, left, bottom, right] = view.map(v => 100 * v);
    Object.assign(canvas.style, {top: top + "%", left: left + "%", width: (right - left) + "%",
                                 height: (bottom - top) + "%", right: "auto", bottom: "auto"});
    canvas.classList.toggle("cropped", top > 0 || left > 0 || bottom < 100 || right < 100);
  };

  // One canvas pixel per patch; CSS scales it up without smoothing.
  function paintMap(canvas, values, gh, gw) {
    canvas.width = gw;
    canvas.height = gh;
    const ctx = canvas.getContext("2d");
    const pixels = ctx.createImageData(gw, gh);
    for (let i = 0; i < gh * gw; i++) {
      const c = LUT[Math.round(Math.min(1, Math.max(0, values[i])) * 255)];
      pixels.data.set([c[0], c[1], c[2], 255], 4 * i);
    }
    ctx.putImageData(pixels, 0, 0);
  }

  function runMeta() {
    const meta = document.getElementById("run");
    for (const [label, value] of Object.entries(DATA.run)) {
      meta.appendChild(el("span", {}, [el("b", {text: label + ": "}), document.createTextNode(String(value))]));
    }
    const toc = document.getElementById("toc");
    DATA.images.forEach((entry, i) => toc.appendChild(el("a", {href: "#card-" + i, text: entry.name})));
    DATA.errors.forEach(e => toc.appendChild(el("a", {href: "#errors", class: "bad", text: e.image.split("/").pop()})));
  }

  function predictionBlock(entry) {
    const p = entry.prediction;
    const top = p.topk[0];
    const list = el("ul", {class: "bars"});
    for (const t of p.topk) {
      list.appendChild(el("li", {}, [
        el("span", {class: "label", text: t.label, title: "class " + t.index}),
        el("span", {class: "pct", text: pct(t.prob)}),
        el("span", {class: "track"},
           [el("span", {class: "fill", style: "display:block;width:" + (100 * t.prob) + "%"})]),
      ]));
    }
    return el("div", {class: "side"}, [
      el("h3", {text: "Prediction"}),
      el("div", {class: "top1 prediction", text: top.label + " "}, [el("span", {text: pct(top.prob)})]),
      list,
      entry.faithfulness ? faithBlock(entry) : null,
    ]);
  }

  // The faithfulness metrics: key, heading, which direction is better.
  const METRICS = [["deletion", "deletion", "lower"], ["insertion", "insertion", "higher"],
                   ["positive", "positive pert.", "lower"], ["negative", "negative pert.", "higher"]];
  const COLORS = ["#2358d4", "#d4701f", "#2f9e44", "#9c36b5", "#c92a2a", "#8a93a3"];
  const methodTitle = key => ({raw: "raw attention", rollout: "rollout", grad_rollout: "gradient rollout",
                               attribution: "transformer attribution", gradcam: "attention Grad-CAM",
                               random: "random order"})[key] || key;

  // A table of methods x metrics; clicking a heading sorts by it (again: the other way). The best value of each
  // column is marked.
  function sortableTable(rows, columns, small) {
    const table = el("table", {class: "faith-table" + (small ? " faith-small" : "")});
    const head = el("tr", {}, [el("th", {scope: "col", text: "method", "data-col": "-1"})]);
    columns.forEach(([key, title, better], c) =>
        head.appendChild(el("th", {scope: "col", "data-col": String(c), title: better + " is better",
                                   text: title + (better === "lower" ? " \u2193" : " \u2191")})));
    const body = el("tbody");
    const cells = rows.map(row => columns.map(([key]) => row.values[key]));
    columns.forEach(([key, title, better], c) => {
      const values = cells.map(r => r[c]).filter(v => typeof v === "number");
      const best = better === "lower" ? Math.min(...values) : Math.max(...values);
      rows.forEach((row, r) => { row.best = row.best || {}; row.best[c] = cells[r][c] === best; });
    });
    rows.forEach((row, r) => {
      const tr = el("tr", {"data-method": row.key}, [el("td", {text: row.title})]);
      cells[r].forEach((v, c) => tr.appendChild(el("td", {class: row.best[c] ? "best" : "",
                                                          "data-value": String(v), text: v.toFixed(4)})));
      body.appendChild(tr);
    });
    table.appendChild(el("thead", {}, [head]));
    table.appendChild(body);
    head.addEventListener("click", event => {
      const th = event.target.closest("th");
      if (!th) return;
      const c = Number(th.dataset.col);
      const ascending = th.getAttribute("aria-sort") !== "ascending";
      head.querySelectorAll("th").forEach(h => h.removeAttribute("aria-sort"));
      th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      const sorted = Array.from(body.rows).sort((a, b) => {
        const x = c < 0 ? a.cells[0].textContent : Number(a.cells[c + 1].dataset.value);
        const y = c < 0 ? b.cells[0].textContent : Number(b.cells[c + 1].dataset.value);
        return (x < y ? -1 : x > y ? 1 : 0) * (ascending ? 1 : -1);
      });
      sorted.forEach(tr => body.appendChild(tr));
    });
    return table;
  }

  // The folder's table at the top of the page: mean AUC per method over the images that measured it.
  function faithOverview() {
    const f = DATA.faithfulness;
    const section = document.getElementById("faithfulness");
    if (!f || !f.table) return;
    const columns = METRICS.concat([["positive_accuracy", "positive pert. accuracy", "lower"],
                                    ["negative_accuracy", "negative pert. accuracy", "higher"]]);
    const rows = f.table.map(row => ({key: row.method, title: methodTitle(row.method), values: row}));
    section.appendChild(el("h2", {text: "Which map to trust: faithfulness over " + f.images + " image" +
                                        (f.images === 1 ? "" : "s")}));
    section.appendChild(sortableTable(rows, columns, false));
    section.appendChild(el("p", {class: "note", text: "Mean over the images of the area under each curve: the " +
        "probability of the explained class (accuracy: the share of images still predicting it) as patches are " +
        "blanked most relevant first (deletion, positive perturbation: lower is better), restored onto a blank " +
        "image (insertion) or blanked least relevant first (negative perturbation: higher is better). A method " +
        "that does not beat the random order explains nothing about this model. Positive and negative " +
        "perturbation (Chefer et al. 2021) stop at 90%. Click a heading to sort."}));
    if (f.plot) section.appendChild(el("img", {class: "faith-plot", src: f.plot, alt: "mean faithfulness curves"}));
    section.hidden = false;
  }

  // Per image: the deletion curves of every method against the random order, and its four AUCs per method.
  function faithBlock(entry) {
    const f = entry.faithfulness;
    const NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", "0 0 300 150");
    const add = (tag, attrs) => {
      const node = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
      svg.appendChild(node);
      return node;
    };
    const keys = Object.keys(f.curves);
    const fractions = f.metrics.deletion.fractions;
    // The y axis ends at a round value just above the highest probability, so small ones stay readable.
    const top = Math.max(...keys.flatMap(key => f.curves[key].deletion.probs));
    const decade = top > 0 ? Math.pow(10, Math.floor(Math.log10(top))) : 1;
    const ymax = Math.min(1, [1, 2, 2.5, 5, 10].map(m => m * decade).find(v => top <= v));
    const x = v => 46 + v * 246, y = v => 128 - v / ymax * 116;
    add("rect", {x: 46, y: 12, width: 246, height: 116, fill: "#fafbfc", stroke: "#dce1e8"});
    for (const t of [0, 0.5, 1]) {
      add("text", {x: 41, y: y(t * ymax) + 4, "font-size": 10, "text-anchor": "end", fill: "#5a6376"})
          .textContent = +(t * ymax).toPrecision(3);
      add("text", {x: x(t), y: 143, "font-size": 10, "text-anchor": "middle", fill: "#5a6376"}).textContent = t;
    }
    const legend = el("div", {class: "auc"});
    keys.forEach((key, i) => {
      const color = key === "random" ? COLORS[5] : COLORS[i % 5];
      const probs = f.curves[key].deletion.probs;
      const points = fractions.map((fr, j) => x(fr).toFixed(1) + "," + y(probs[j]).toFixed(1)).join(" ");
      add("polyline", {points, fill: "none", stroke: color, "stroke-width": 2,
                       "stroke-dasharray": key === "random" ? "4 3" : "none"});
      legend.appendChild(el("div", {}, [el("span", {class: "swatch", style: "background:" + color}),
                                        document.createTextNode(methodTitle(key))]));
    });
    const rows = keys.map(key => {
      const values = {};
      METRICS.forEach(([m]) => { values[m] = f.curves[key][m].auc; });
      return {key, title: methodTitle(key), values};
    });
    const short = METRICS.map(([m, title, better]) => [m, m.slice(0, 3) + ".", better]);
    return el("div", {class: "faith"}, [
      el("h3", {text: "Deletion curves"}),
      svg,
      legend,
      el("p", {class: "note",
               text: "probability of \"" + f.label + "\" vs fraction of patches blanked; lower AUC is better"}),
      sortableTable(rows, short, true),
      entry.files.faithfulness_png ? el("p", {class: "note"}, [
        el("a", {href: url(entry, entry.files.faithfulness_png), text: "all four curves (faithfulness.png)"})]) : null,
    ]);
  }

  function picture(entry, file, caption) {
    const src = url(entry, file);
    const button = el("button", {class: "thumb", type: "button", "data-src": src,
                                 "data-caption": entry.name + " \u00b7 " + caption},
                      [el("img", {src, alt: caption, loading: "lazy"})]);
    return el("figure", {}, [button, el("figcaption", {text: caption})]);
  }

  function card(entry, index) {
    const files = entry.files;
    const figs = el("div", {class: "figs"});
    if (files.preview_png) figs.appendChild(picture(entry, files.preview_png, "input"));
    const m = entry.method;
    for (const map of m.maps) {
      const file = files[map.key + "_png"];
      if (!file) continue;
      let caption = map.title;
      if (map.key === "rollout") caption += " (" + m.rollout.head_fusion + ", discard " + m.rollout.discard_ratio + ")";
      if (map.class_specific) caption += " for \"" + map.label + "\"";
      figs.appendChild(picture(entry, file, caption));
    }
    const strip = el("div", {class: "strip"});
    (files.layer_png || []).forEach((file, i) => strip.appendChild(picture(entry, file, "layer " + entry.layers[i])));

    const [gh, gw] = entry.grid;
    const head = el("tr", {}, [el("th")]);
    entry.heads.forEach(h => head.appendChild(el("th", {scope: "col", text: "head " + h})));
    const table = el("table", {class: "lh"}, [el("thead", {}, [head])]);
    const body = el("tbody");
    entry.layers.forEach((layer, r) => {
      const row = el("tr", {}, [el("th", {class: "row", scope: "row", text: "layer " + layer})]);
      entry.heads.forEach((h, c) => {
        const on = entry.on[r][c];
        const canvas = el("canvas", {style: "opacity:" + (files.preview_png ? DATA.alpha : 1)});
        paintMap(canvas, entry.maps[r][c], gh, gw);
        placeOnView(canvas, entry.view);
        const label = "layer " + layer + ", head " + h + (on ? "" : " (masked)");
        const cell = el("button", {class: "cell" + (on ? "" : " masked"), type: "button", title: label,
                                   "data-image": index, "data-row": r, "data-col": c,
                                   "data-layer": layer, "data-head": h, "aria-label": label},
                        [files.preview_png ? el("img", {src: url(entry, files.preview_png), alt: ""}) : null,
                         canvas, on ? null : el("span", {class: "badge", text: "masked"})]);
        row.appendChild(el("td", {}, [cell]));
      });
      body.appendChild(row);
    });
    table.appendChild(body);

    const masked = entry.method.masked_heads.length;
    const main = el("div", {}, [
      figs.childNodes.length ? el("h3", {text: "Overlays"}) : null,
      figs.childNodes.length ? figs : null,
      strip.childNodes.length ? el("h3", {text: "Attention per layer (head mean)"}) : null,
      strip.childNodes.length ? strip : null,
      el("h3", {text: "Layer \u00d7 head (click a map to enlarge)"}),
      el("div", {class: "gridwrap"}, [table]),
      el("p", {class: "note", text: "Each map is the attention from " + entry.method.readout + " over the " + gh +
                                    "\u00d7" + gw +
                                    " patch grid, divided by its own max." +
                                    (masked ? " Red: heads switched off by --mask-heads (exported, but they " +
                                              "contribute nothing downstream)." : "")}),
      el("div", {class: "legend"}, [el("span", {text: "0"}), el("span", {class: "ramp", style: "background:" + RAMP}),
                                   el("span", {text: "map max"})]),
    ]);
    const section = el("section", {class: "card", id: "card-" + index, "data-name": entry.name}, [
      el("div", {class: "card-head"}, [
        el("h2", {text: entry.name}),
        el("span", {class: "path", text: entry.image + " \u00b7 " + entry.size[1] + "\u00d7" + entry.size[0] + " px"}),
      ]),
      el("div", {class: "layout"}, [predictionBlock(entry), main]),
    ]);
    section.style.setProperty("--aspect", entry.size[1] + " / " + entry.size[0]);
    // Few heads get large cells; twelve still fit beside the prediction column.
    const heads = entry.heads.length;
    section.style.setProperty("--cell", (heads <= 4 ? 104 : heads <= 8 ? 76 : 58) + "px");
    return section;
  }

  function errorsBlock() {
    const list = el("ul", {class: "errors"});
    DATA.errors.forEach(e => list.appendChild(el("li", {}, [el("code", {text: e.image}),
                                                            document.createTextNode(": " + e.message)])));
    return el("section", {class: "card", id: "errors"}, [el("h2", {text: "Images that could not be processed"}), list]);
  }

  // ---- the large view ----
  const box = document.getElementById("lightbox");
  const stage = document.getElementById("lb-stage"), bigMap = document.getElementById("lb-map");
  const backdrop = document.getElementById("lb-backdrop"), bigPicture = document.getElementById("lb-picture");
  const caption = document.getElementById("lb-caption"), legend = document.getElementById("lb-legend");
  legend.querySelector(".ramp").style.background = RAMP;

  function openMap(cell) {
    const entry = DATA.images[Number(cell.dataset.image)];
    const r = Number(cell.dataset.row), c = Number(cell.dataset.col);
    const [gh, gw] = entry.grid;
    paintMap(bigMap, entry.maps[r][c], gh, gw);
    placeOnView(bigMap, entry.view);
    const aspect = entry.size[1] / entry.size[0];
    const width = Math.min(0.86 * window.innerWidth, 0.74 * window.innerHeight * aspect, 900);
    stage.style.width = Math.round(width) + "px";
    stage.style.height = Math.round(width / aspect) + "px";
    if (entry.files.preview_png) {
      backdrop.src = url(entry, entry.files.preview_png);
      backdrop.hidden = false;
      bigMap.style.opacity = DATA.alpha;
    } else {
      backdrop.hidden = true;
      bigMap.style.opacity = 1;
    }
    stage.hidden = false;
    legend.hidden = false;
    bigPicture.hidden = true;
    const on = entry.on[r][c];
    caption.textContent = entry.name + " \u00b7 layer " + cell.dataset.layer + ", head " + cell.dataset.head +
        (on ? "" : " \u00b7 masked: exported, contributes nothing downstream");
    const {image, layer, head} = cell.dataset;
    Object.assign(box.dataset, {kind: "map", image, layer, head});
    show();
  }

  function openPicture(button) {
    bigPicture.src = button.dataset.src;
    bigPicture.hidden = false;
    stage.hidden = true;
    legend.hidden = true;
    caption.textContent = button.dataset.caption;
    Object.assign(box.dataset, {kind: "picture", image: "", layer: "", head: ""});
    show();
  }

  let opener = null;
  function show() {
    opener = document.activeElement;
    box.hidden = false;
    document.getElementById("lb-close").focus();
  }
  function hide() {
    box.hidden = true;
    if (opener) opener.focus();
  }

  document.addEventListener("click", event => {
    const cell = event.target.closest(".cell");
    if (cell) return openMap(cell);
    const thumb = event.target.closest(".thumb");
    if (thumb) return openPicture(thumb);
    if (!box.hidden && (event.target === box || event.target.id === "lb-close")) hide();
  });
  document.addEventListener("keydown", event => {
    if (event.key === "Escape" && !box.hidden) hide();
  });

  runMeta();
  faithOverview();
  const cards = document.getElementById("cards");
  DATA.images.forEach((entry, i) => cards.appendChild(card(entry, i)));
  if (DATA.errors.length) cards.appendChild(errorsBlock());
  if (!DATA.images.length && !DATA.errors.length) cards.appendChild(el("p", {text: "No images were exported."}));
  document.body.dataset.ready = "true";
})();
</script>
</body>
</html>
)HTML";

}  // namespace

std::string gallery_html(const std::vector<AttentionExportResult>& results, const std::vector<GalleryError>& errors,
                         const nlohmann::ordered_json& run, const std::string& colormap, double alpha,
                         const nlohmann::ordered_json& faithfulness) {
  nlohmann::ordered_json data = {{"run", run}, {"colormap", colormap_table(colormap)}, {"alpha", alpha}};
  if (!faithfulness.is_null()) {
    // The page needs the table and the plot's name, not the folder's mean curves.
    data["faithfulness"] = {{"images", faithfulness.at("images")}, {"table", faithfulness.at("table")}};
    if (faithfulness.contains("plot")) data["faithfulness"]["plot"] = faithfulness.at("plot");
  }
  data["images"] = nlohmann::ordered_json::array();
  for (const auto& result : results) data["images"].push_back(image_json(result));
  data["errors"] = nlohmann::ordered_json::array();
  for (const auto& error : errors) data["errors"].push_back({{"image", error.image}, {"message", error.message}});
  // '<' only occurs inside JSON strings, where \u003c means the same: the data can never close its <script>.
  std::string json = data.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::string escaped;
  escaped.reserve(json.size());
  for (const char c : json) {
    if (c == '<') escaped += "\\u003c";
    else escaped += c;
  }
  return std::string(kPageHead) + escaped + kPageScript;
}

void write_gallery(const std::string& out_dir, const std::vector<AttentionExportResult>& results,
                   const std::vector<GalleryError>& errors, const nlohmann::ordered_json& run,
                   const std::string& colormap, double alpha, const nlohmann::ordered_json& faithfulness) {
  write_file_atomic(out_dir + "/index.html", gallery_html(results, errors, run, colormap, alpha, faithfulness));
}

}  // namespace vit
