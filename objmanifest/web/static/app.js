// objmanifest web: draws the view named by <body data-view> from its JSON API
// (<body data-api>) and polls it every data-interval seconds with If-None-Match, so an
// unchanged view costs a 304 without a body. Everything shown is set as text (never as
// markup), and links are built from quoted path segments.
"use strict";

(function () {
  const body = document.body;
  const view = body.dataset.view;
  const interval = Math.max(0.2, parseFloat(body.dataset.interval || "2")) * 1000;
  const STATES = ["pending", "writing", "ready", "consumed", "failed", "dead"];
  const ATTENTION_HELP = {
    dead: "retries exhausted",
    overdue: "lease expired, not yet taken over",
    late: "past the stage's deadline",
    blocked: "waiting for, or blocked by, dependencies",
    backing_off: "failed, waiting out its retry backoff",
  };

  let etag = null;
  let data = null;
  let fetchedAt = 0;
  let updates = 0;
  let timer = null;

  // -- small DOM helpers -----------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "dataset") Object.assign(node.dataset, v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v !== null && v !== undefined) node.setAttribute(k, String(v));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined) continue;
      node.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // Quoted as Python's quote(s, safe="") does, so the server's links and these agree.
  const seg = (s) => encodeURIComponent(s).replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());
  const filePath = (id) => id.split("/").map(seg).join("/");
  const boardUrl = (task) => "/tasks/" + seg(task);
  const stageUrl = (task, stage, query) =>
    "/tasks/" + seg(task) + "/stages/" + seg(stage) + (query ? "?" + new URLSearchParams(query) : "");
  const entryUrl = (task, id) => "/tasks/" + seg(task) + "/entries/" + filePath(id);

  function badge(state) {
    return el("span", { class: "state s-" + (STATES.includes(state) ? state : "other") }, state || "undeclared");
  }

  function size(n) {
    if (n === null || n === undefined) return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = n, u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    return (u ? v.toFixed(1) : String(v)) + " " + units[u];
  }

  function time(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return isNaN(d) ? iso : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  }

  function storeNow() {
    // The store's clock when the view was read, moved on by the time since.
    if (!data || !data.store_time) return Date.now();
    return Date.parse(data.store_time) + (performance.now() - fetchedAt);
  }

  function leaseLeft(entry) {
    if (entry.state !== "writing" || !entry.lease_expires_at) return "";
    const left = (Date.parse(entry.lease_expires_at) - storeNow()) / 1000;
    if (left <= 0) return "expired " + Math.round(-left) + "s ago";
    return Math.round(left) + "s";
  }

  function short(text, n) {
    if (!text) return "";
    return text.length > n ? text.slice(0, n - 1) + "…" : text;
  }

  // -- polling ---------------------------------------------------------------------------

  function live(text, cls) {
    const node = document.getElementById("live");
    node.textContent = text;
    node.className = "live " + (cls || "");
    node.dataset.updates = String(updates);
  }

  function apiUrl() {
    const url = new URL(body.dataset.api, location.href);
    if (view === "entries") {
      for (const [k, v] of new URLSearchParams(location.search)) url.searchParams.set(k, v);
    }
    return url.toString();
  }

  async function poll() {
    timer = null;
    try {
      const headers = etag ? { "If-None-Match": etag } : {};
      const response = await fetch(apiUrl(), { headers, cache: "no-store", credentials: "same-origin" });
      if (response.status === 304) {
        tick();
        live("live · unchanged " + new Date().toLocaleTimeString(), "ok");
      } else if (response.ok) {
        data = await response.json();
        fetchedAt = performance.now();
        etag = response.headers.get("ETag");
        updates += 1;
        render();
        live("live · updated " + new Date().toLocaleTimeString(), "ok");
      } else {
        let message = response.status + " " + response.statusText;
        try { message = (await response.json()).message || message; } catch (e) { /* text */ }
        showError(message);
        live("error", "bad");
      }
    } catch (e) {
      console.error(e);
      live(e instanceof TypeError && /fetch/i.test(e.message) ? "offline · retrying" : "error: " + e.message, "bad");
    }
    schedule();
  }

  function schedule() {
    if (timer === null && !document.hidden) timer = setTimeout(poll, interval);
  }

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      if (timer !== null) { clearTimeout(timer); timer = null; }
      live("paused (page hidden)", "");
    } else if (timer === null) {
      poll();
    }
  });

  function showError(message) {
    const main = document.getElementById("main");
    main.replaceChildren(el("p", { class: "error", role: "alert" }, message));
  }

  function tick() {
    // Between changes only the lease clocks move.
    for (const cell of document.querySelectorAll("[data-lease]")) {
      const entry = JSON.parse(cell.dataset.lease);
      cell.textContent = leaseLeft(entry);
    }
  }

  // -- views -----------------------------------------------------------------------------

  function render() {
    const main = document.getElementById("main");
    const drawn = { tasks: drawTasks, board: drawBoard, entries: drawEntries, entry: drawEntry }[view];
    main.replaceChildren(...[drawn(data)].flat(Infinity).filter((n) => n !== null && n !== undefined && n !== false));
    tick();
  }

  function countsRow(label, counts, total, task, stage, extra) {
    return el("tr", extra || {},
      el("th", { scope: "row" }, label),
      STATES.map((s) => el("td", { class: "n" + (counts[s] ? "" : " zero"), dataset: { stage: stage || "", state: s } },
        counts[s] && task && stage && !extra ? el("a", { href: stageUrl(task, stage, { state: s }) }, counts[s]) : counts[s])),
      el("td", { class: "n total", dataset: { stage: stage || "", state: "total" } }, total),
      el("td", { class: "bar" }, stackedBar(counts, total)));
  }

  function stackedBar(counts, total) {
    const bar = el("div", { class: "stack", title: STATES.map((s) => s + " " + counts[s]).join(", ") });
    if (!total) return bar;
    for (const s of STATES) {
      if (!counts[s]) continue;
      const part = el("span", { class: "s-" + s });
      part.style.width = (100 * counts[s] / total).toFixed(2) + "%";
      bar.appendChild(part);
    }
    return bar;
  }

  function sparkline(series, bucketSeconds) {
    const w = 120, h = 28, n = series.ready.length;
    const peak = Math.max(1, ...series.ready, ...series.consumed, ...series.failed);
    const bw = w / n;
    const chart = svg("svg", { class: "spark", width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img" },
      svg("title", {}, "per " + bucketSeconds + " s, oldest first: ready " + series.ready.join(" ") +
        "; consumed " + series.consumed.join(" ") + "; failed " + series.failed.join(" ")));
    series.ready.forEach((v, i) => {
      const bh = (h - 2) * v / peak;
      chart.appendChild(svg("rect", { x: i * bw + 1, y: h - bh, width: bw / 2 - 1, height: bh, class: "r" }));
    });
    series.consumed.forEach((v, i) => {
      const bh = (h - 2) * v / peak;
      chart.appendChild(svg("rect", { x: i * bw + bw / 2, y: h - bh, width: bw / 2 - 1, height: bh, class: "c" }));
    });
    return chart;
  }

  function rate(values, bucketSeconds) {
    const last = values.slice(-5);
    const perMinute = last.reduce((a, b) => a + b, 0) / (last.length * bucketSeconds / 60);
    return perMinute >= 10 ? perMinute.toFixed(0) : perMinute.toFixed(1);
  }

  function drawTasks(d) {
    const rows = d.tasks.map((t) => el("tr", {},
      el("th", { scope: "row" }, el("a", { href: boardUrl(t.task_id) }, t.task_id)),
      t.error ? el("td", { class: "error", colspan: STATES.length + 2 }, t.error) : [
        el("td", {}, (t.stages || []).join(" → ")),
        STATES.map((s) => el("td", { class: "n" + (t.totals[s] ? "" : " zero") }, t.totals[s])),
        el("td", {}, t.finished ? "finished" : t.attention ? t.attention + " need attention" : ""),
      ]));
    return [
      el("h1", {}, "Tasks"),
      el("p", { class: "meta" }, d.url, d.endpoint ? " at " + d.endpoint : ""),
      d.tasks.length ? el("table", { class: "grid" },
        el("thead", {}, el("tr", {}, el("th", {}, "task"), el("th", {}, "stages"),
          STATES.map((s) => el("th", { class: "n" }, s)), el("th", {}, ""))),
        el("tbody", {}, rows)) : el("p", {}, "No tasks under this URL yet."),
    ];
  }

  function drawBoard(d) {
    const t = d.throughput;
    const stageRows = [];
    for (const s of d.stages) {
      stageRows.push(countsRow(el("a", { href: stageUrl(d.task_id, s.stage) }, s.stage), s.counts, s.total, d.task_id, s.stage));
      for (const p of s.partitions) {
        stageRows.push(countsRow("↳ " + p.shard, p.counts, p.total, d.task_id, p.shard, { class: "partition" }));
      }
    }
    const flow = el("table", { class: "grid flow" },
      el("thead", {}, el("tr", {}, el("th", {}, "stage"), el("th", {}, "per minute, last " + t.buckets + " min"),
        el("th", { class: "n" }, "ready/min"), el("th", { class: "n" }, "consumed/min"), el("th", { class: "n" }, "failed/min"))),
      el("tbody", {}, d.stages.map((s) => el("tr", {},
        el("th", { scope: "row" }, s.stage),
        el("td", {}, sparkline(s.throughput, t.bucket_seconds)),
        el("td", { class: "n", dataset: { stage: s.stage, rate: "ready" } }, rate(s.throughput.ready, t.bucket_seconds)),
        el("td", { class: "n", dataset: { stage: s.stage, rate: "consumed" } }, rate(s.throughput.consumed, t.bucket_seconds)),
        el("td", { class: "n", dataset: { stage: s.stage, rate: "failed" } }, rate(s.throughput.failed, t.bucket_seconds))))));
    const attention = [];
    for (const [kind, notes] of Object.entries(d.attention)) {
      if (!notes.length) continue;
      attention.push(el("section", { class: "attention a-" + kind, dataset: { kind } },
        el("h3", {}, kind + " (" + notes.length + ")", el("small", {}, " " + (ATTENTION_HELP[kind] || ""))),
        el("ul", {}, notes.slice(0, 50).map((n) => el("li", {},
          el("a", { href: entryUrl(d.task_id, n.file_id) }, n.file_id), " ", badge(n.state),
          el("span", { class: "stage" }, n.stage), el("span", { class: "reason" }, n.reason))),
          notes.length > 50 ? el("li", {}, "… and " + (notes.length - 50) + " more") : null)));
    }
    const damage = [...d.damage.unfinished.map((n) => ["unfinished", n]), ...d.damage.unindexed.map((n) => ["unindexed", n])];
    const contended = d.stages.filter((s) => s.contended).map((s) =>
      el("p", { class: "contended", dataset: { stage: s.stage } }, el("b", {}, s.stage), " is contended: its writers lost " +
        s.lost_races_per_commit.toFixed(2) + " races per commit lately, more agents than its shards take: split it into more partitions."));
    const settings = d.settings;
    return [
      el("h1", {}, d.task_id, " ", d.finished ? el("span", { class: "done" }, "finished") : null),
      el("p", { class: "meta" },
        "stages " + settings.stages.join(" → ") + " · lease " + settings.lease_seconds + " s · " +
        settings.max_retries + " retries · store time " + time(d.store_time)),
      el("div", { class: "totals" }, STATES.map((s) =>
        el("div", { class: "total-card s-" + s, dataset: { total: s } }, el("b", {}, d.totals[s]), el("span", {}, s)))),
      el("h2", {}, "Stages"),
      el("table", { class: "grid counts" },
        el("thead", {}, el("tr", {}, el("th", {}, "stage"), STATES.map((s) => el("th", { class: "n" }, s)),
          el("th", { class: "n" }, "total"), el("th", {}, ""))),
        el("tbody", {}, stageRows)),
      el("h2", {}, "Throughput"),
      settings.journal ? flow : el("p", {}, "This task keeps no journal (schema 1): run `objmanifest migrate`."),
      el("h2", {}, "Needs attention"),
      contended.length ? contended : null,
      attention.length || contended.length ? attention : el("p", { class: "calm" }, "Nothing needs attention."),
      damage.length || (d.damage.objects || []).length ? [el("h2", {}, "Damage"), el("ul", {},
        (d.damage.objects || []).map((n) => el("li", { class: "damaged-object" }, n.kind + " ",
          el("code", {}, n.key), ": " + n.problem + " (" + n.fix + ")")),
        damage.map(([k, n]) =>
          el("li", {}, k + ": ", el("code", {}, n.file_id), " (" + n.stage + "): " + n.reason)))] : null,
    ];
  }

  function drawEntries(d) {
    const params = new URLSearchParams(location.search);
    const stateSelect = el("select", { name: "state" }, el("option", { value: "" }, "any state"),
      STATES.map((s) => el("option", { value: s, selected: params.get("state") === s }, s + " (" + d.counts[s] + ")")));
    const agents = new Set(d.agents);
    if (params.get("agent")) agents.add(params.get("agent"));
    const agentSelect = el("select", { name: "agent" }, el("option", { value: "" }, "any holder"),
      [...agents].sort().map((a) => el("option", { value: a, selected: params.get("agent") === a }, a)));
    stateSelect.addEventListener("change", () => stateSelect.form.submit());
    agentSelect.addEventListener("change", () => agentSelect.form.submit());
    const form = el("form", { method: "get", class: "filter" }, "show ", stateSelect, " held by ", agentSelect,
      el("noscript", {}, el("button", {}, "filter")));
    const f = d.filter;
    const rows = d.entries.map((e) => e.archived
      ? el("tr", { class: "archived" }, el("td", {}, el("a", { href: entryUrl(d.task_id, e.file_id) }, e.file_id)),
          el("td", {}, badge(e.state)), el("td", { colspan: 9, class: "muted" }, "archived"))
      : el("tr", { dataset: { file: e.file_id } },
          el("td", {}, el("a", { href: entryUrl(d.task_id, e.file_id) }, e.file_id),
            e.partition ? el("small", { class: "muted" }, " " + e.partition) : null),
          el("td", {}, badge(e.state)),
          el("td", {}, e.holder || ""),
          el("td", { class: "n" }, e.epoch),
          el("td", { class: "n", dataset: { lease: JSON.stringify({ state: e.state, lease_expires_at: e.lease_expires_at }) } }),
          el("td", { class: "n" }, e.retries + "/" + d.max_retries),
          el("td", { class: "n" }, size(e.size)),
          el("td", { title: e.checksum || "" }, el("code", {}, short((e.checksum || "").replace(/^xxh3-128:/, ""), 13))),
          el("td", {}, time(e.updated_at)),
          el("td", { class: "error-text", title: e.error || "" }, short(e.error, 60))));
    const pager = [];
    if (f.offset > 0) {
      const q = Object.fromEntries(params); q.offset = Math.max(0, f.offset - f.limit);
      pager.push(el("a", { href: "?" + new URLSearchParams(q) }, "← previous"));
    }
    if (f.offset + f.limit < d.matched) {
      const q = Object.fromEntries(params); q.offset = f.offset + f.limit;
      pager.push(el("a", { href: "?" + new URLSearchParams(q) }, "next →"));
    }
    return [
      el("h1", {}, d.stage),
      el("p", { class: "meta" }, d.matched + " of " + d.total + " entries" +
        (d.matched > d.entries.length ? ", showing " + (f.offset + 1) + "–" + (f.offset + d.entries.length) : "") +
        " · store time " + time(d.store_time)),
      (d.damaged || []).length ? el("ul", {}, d.damaged.map((n) => el("li", { class: "damaged-object" },
        "shard ", el("code", {}, n.address), " is damaged (" + n.problem + "): its entries are not shown; run `objmanifest repair`"))) : null,
      form,
      el("table", { class: "grid entries" },
        el("thead", {}, el("tr", {}, ["file id", "state", "holder", "epoch", "lease left", "retries", "size", "checksum", "updated", "error"]
          .map((h) => el("th", {}, h)))),
        el("tbody", {}, rows)),
      el("p", { class: "pager" }, pager),
    ];
  }

  function drawEntry(d) {
    const e = d.entry;
    const fields = [
      ["stage", el("a", { href: stageUrl(d.task_id, e.stage) }, e.stage)],
      ["state", badge(e.state)],
      ["holder", e.holder || "—"],
      ["epoch", e.epoch],
      ["lease left", el("span", { dataset: { lease: JSON.stringify({ state: e.state, lease_expires_at: e.lease_expires_at }) } })],
      ["lease expires", time(e.lease_expires_at) || "—"],
      ["retries", e.retries + " of " + d.max_retries],
      ["size", e.size === null ? "—" : size(e.size) + " (" + e.size + " bytes)" + (e.chunked ? ", chunked" : "")],
      ["checksum", e.checksum ? el("code", {}, e.checksum) : "—"],
      ["error", e.error || "—"],
      ["depends on", e.depends_on.length ? e.depends_on.map((id) => [el("a", { href: entryUrl(d.task_id, id) }, id), " "]) : "—"],
      ["consumers", e.consumers.length ? e.consumers.join(", ") + " (consumed by " + (e.consumed_by.join(", ") || "none yet") + ")" : "queue (any one agent)"],
      ["declared", time(e.declared_at)],
      ["claimed", time(e.claimed_at) || "—"],
      ["ready since", time(e.ready_at) || "—"],
      ["may be retried from", time(e.retry_at) || "—"],
      ["updated", time(e.updated_at)],
    ];
    if (e.partition) fields.splice(1, 0, ["partition", e.partition]);
    const timeline = d.history.map((t) => el("li", { class: "step" },
      el("time", {}, time(t.at)), " ",
      el("b", {}, t.command), " by ", el("span", { class: "actor" }, t.actor || "—"), ": ",
      t.from_state ? [badge(t.from_state), " → "] : "declared ", badge(t.to_state),
      t.epoch !== null ? el("span", { class: "muted" }, " epoch " + t.epoch) : null,
      t.retry_count ? el("span", { class: "muted" }, " retries " + t.retry_count) : null,
      t.error ? el("div", { class: "error-text" }, t.error) : null));
    return [
      el("h1", {}, e.file_id),
      el("dl", { class: "fields" }, fields.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
      el("h2", {}, "History"),
      d.journal ? null : el("p", {}, "This task keeps no journal (schema 1)."),
      d.dropped.some((x) => x.cause !== "damage") ? el("p", { class: "muted" }, "Journal retention dropped older records of this shard.") : null,
      d.dropped.some((x) => x.cause === "damage") ? el("p", { class: "muted" }, "Some records of this shard were lost with a damaged journal block (repair found it).") : null,
      timeline.length ? el("ol", { class: "timeline" }, timeline) : el("p", {}, "No recorded history."),
      el("h2", {}, "Lineage"),
      d.graph.nodes.length > 1 ? drawGraph(d) : el("p", {}, "Made from nothing declared: it depends on no entry."),
    ];
  }

  function drawGraph(d) {
    const g = d.graph, pad = 8;
    const w = g.width + 2 * pad, h = g.height + 2 * pad;
    const at = {};
    for (const n of g.nodes) at[n.id] = n;
    const picture = svg("svg", { class: "lineage", width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img" },
      svg("title", {}, "lineage of " + d.entry.file_id));
    for (const edge of g.edges) {
      const a = at[edge.from], b = at[edge.to];
      if (!a || !b) continue;
      const x1 = pad + a.x + g.node_width, y1 = pad + a.y + g.node_height / 2;
      const x2 = pad + b.x, y2 = pad + b.y + g.node_height / 2;
      const mx = (x1 + x2) / 2;
      picture.appendChild(svg("path", { class: "edge", d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}` }));
    }
    for (const n of g.nodes) {
      const node = d.lineage.nodes[n.id] || {};
      const link = svg("a", { href: entryUrl(d.task_id, n.id), class: "node s-" + (n.state || "other") + (n.id === d.entry.file_id ? " root" : "") },
        svg("title", {}, n.id + " · " + (n.state || "not declared") + (node.producer ? " · made by " + node.producer : "") +
          (node.checksum ? " · " + node.checksum : "")),
        svg("rect", { x: pad + n.x, y: pad + n.y, width: g.node_width, height: g.node_height, rx: 6 }),
        svg("text", { x: pad + n.x + 8, y: pad + n.y + 16 }, short(n.id, 30)),
        svg("text", { x: pad + n.x + 8, y: pad + n.y + 31, class: "sub" }, (n.stage || "?") + " · " + (n.state || "not declared")));
      picture.appendChild(link);
    }
    return [
      el("div", { class: "graph" }, picture),
      g.hidden ? el("p", { class: "muted" }, g.hidden + " more upstream entries are not drawn (see the JSON API).") : null,
    ];
  }

  window.objmanifest = { updates: () => updates };
  poll();
})();
