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
