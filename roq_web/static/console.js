/* RoQ web console: the overview page (/) and the queue page (/queues/NAME).
 *
 * Plain browser JavaScript served as is (no build step, nothing from a CDN). Each page polls the
 * HTTP API (docs/http.md) every two seconds. Values from the API reach the page only through
 * textContent and attributes, never as markup. The login token is read from its field, sent once
 * and forgotten: the session is an HttpOnly cookie, and every unsafe request carries the session's
 * CSRF value in X-CSRF-Token. A refused or failed action is shown in #message; a failed poll marks
 * the data as stale in the top bar and polling goes on.
 */
"use strict";

(() => {
  const POLL_MS = 2000;
  const OVERVIEW_SECONDS = 300; // the sparklines of the overview: the last 5 minutes
  const MIN_SPAN = 60; // seconds a chart spans at least, on a gateway younger than the chart's window
  const OK_MESSAGE_MS = 8000; // successes fade; errors stay until replaced or closed
  const SVG_NS = "http://www.w3.org/2000/svg";
  const UNSAFE = new Set(["POST", "PUT", "PATCH", "DELETE"]);

  const state = {
    page: document.body.dataset.page,
    session: null,
    shown: false, // the page's data is on screen and polling
    messageTimer: null,
  };

  // ------------------------------------------------------------------ DOM helpers

  const $ = (id) => document.getElementById(id);

  /** An HTML element; string children become text nodes, never markup. */
  function h(tag, attrs, ...children) {
    return build(document.createElement(tag), attrs, children);
  }

  function svg(tag, attrs, ...children) {
    return build(document.createElementNS(SVG_NS, tag), attrs, children);
  }

  function build(node, attrs, children) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child !== null && child !== undefined && child !== false) node.append(child);
    }
    return node;
  }

  /** Put `content` (text, a node or a list of them) into `node`, untouched when the text is the same. */
  function setContent(node, content) {
    if (typeof content === "string" || typeof content === "number") {
      const text = String(content);
      if (node.textContent !== text || node.children.length) node.textContent = text;
    } else {
      node.replaceChildren(...[content].flat().filter((c) => c !== null && c !== undefined));
    }
  }

  function setText(id, text) {
    setContent($(id), text === null || text === undefined ? "–" : String(text));
  }

  // ------------------------------------------------------------------ formatting

  function fmtRate(value) {
    if (value === null || value === undefined) return "–";
    return value < 10 ? value.toFixed(1) : Math.round(value).toLocaleString("en-US");
  }

  function fmtCount(value) {
    return value === null || value === undefined ? "–" : Number(value).toLocaleString("en-US");
  }

  /** 1200 → "1.2k": the chart's axis labels. */
  function fmtCompact(value) {
    const units = [[1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (const [size, unit] of units) {
      if (Math.abs(value) >= size) return `${+(value / size).toFixed(1)}${unit}`;
    }
    return `${+value.toFixed(2)}`;
  }

  function fmtBytes(bytes) {
    if (bytes === null || bytes === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let value = Number(bytes);
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
  }

  function fmtPercent(value) {
    return value === null || value === undefined ? "–" : `${value.toFixed(0)}%`;
  }

  function fmtSeconds(value) {
    if (value === null || value === undefined) return "–";
    if (value < 60) return `${value.toFixed(value < 10 ? 1 : 0)} s`;
    if (value < 3600) return `${Math.floor(value / 60)} min ${Math.round(value % 60)} s`;
    return `${(value / 3600).toFixed(1)} h`;
  }

  function fmtClock(epochSeconds, withSeconds = true) {
    const options = { hour: "2-digit", minute: "2-digit", hour12: false };
    if (withSeconds) options.second = "2-digit";
    return new Date(epochSeconds * 1000).toLocaleTimeString("en-GB", options);
  }

  function plural(count, word) {
    return `${count} ${word}${count === 1 ? "" : "s"}`;
  }

  const queueHref = (name) => `/queues/${encodeURIComponent(name)}`;
  const queueApi = (name, rest = "") => `/api/queues/${encodeURIComponent(name)}${rest}`;

  // ------------------------------------------------------------------ the API

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  /** One API request. `json` is sent as JSON, `text` as a raw body; answers the parsed JSON or
   *  throws ApiError with the API's own code and message. */
  async function api(method, path, { json, text } = {}) {
    const headers = {};
    const init = { method, headers, credentials: "same-origin", cache: "no-store" };
    if (json !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(json);
    } else if (text !== undefined) {
      headers["Content-Type"] = "text/plain; charset=utf-8";
      init.body = text;
    }
    if (UNSAFE.has(method)) headers["X-CSRF-Token"] = (state.session && state.session.csrf) || "";
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      throw new ApiError(0, "network", `the gateway does not answer (${err.message})`);
    }
    const body = await response.text();
    let data = null;
    try {
      data = body ? JSON.parse(body) : null;
    } catch (err) {
      data = null;
    }
    if (!response.ok) {
      const code = (data && data.error) || `http_${response.status}`;
      throw new ApiError(response.status, code, (data && data.message) || body || response.statusText);
    }
    return data;
  }

  const ERROR_LABELS = {
    0: "No answer", 400: "Rejected", 401: "Unauthorized", 403: "Refused", 404: "Not found",
    409: "Conflict", 413: "Too large", 429: "Busy", 503: "Unavailable",
  };

  /** "Refused (create queue orders): app has the client role; … need the admin role". */
  function describeError(err, action) {
    if (!(err instanceof ApiError)) return `Error (${action}): ${err.message}`;
    const label = ERROR_LABELS[err.status] || `Error ${err.status}`;
    const text = String(err.message || err.code).replace(/^refused:\s*/i, "");
    return `${label} (${action}): ${text}`;
  }

  // ------------------------------------------------------------------ messages

  function showMessage(kind, text) {
    const box = $("message");
    box.className = `message ${kind}`;
    box.dataset.kind = kind;
    $("message-text").textContent = text;
    box.hidden = false;
    clearTimeout(state.messageTimer);
    if (kind === "ok" || kind === "info") state.messageTimer = setTimeout(hideMessage, OK_MESSAGE_MS);
  }

  function hideMessage() {
    $("message").hidden = true;
  }

  function reportError(err, action) {
    if (!(err instanceof ApiError)) console.error(err);
    showMessage("error", describeError(err, action));
    if (err instanceof ApiError && err.status === 401) refreshSession().catch(() => {});
  }

  /** Run a user's action with its button disabled; any failure is shown in #message. */
  async function act(action, button, work) {
    if (button) button.disabled = true;
    try {
      await work();
    } catch (err) {
      reportError(err, action);
    } finally {
      if (button) button.disabled = false;
    }
  }

  /** Ask before a destructive action, in the page's own dialog (no window.confirm). */
  function confirmAction(title, text, okLabel) {
    const dialog = $("confirm-dialog");
    $("confirm-title").textContent = title;
    $("confirm-text").textContent = text;
    $("confirm-ok").textContent = okLabel;
    return new Promise((resolve) => {
      const finish = (answer) => {
        $("confirm-ok").onclick = $("confirm-cancel").onclick = dialog.oncancel = null;
        if (dialog.open) dialog.close();
        resolve(answer);
      };
      $("confirm-ok").onclick = () => finish(true);
      $("confirm-cancel").onclick = () => finish(false);
      dialog.oncancel = () => finish(false);
      dialog.showModal();
      $("confirm-cancel").focus();
    });
  }

  // ------------------------------------------------------------------ page chrome

  /** The parts both pages share: top bar, message line, login form, confirmation dialog. */
  function buildChrome() {
    const tab = (href, label, page) => h("a", { href, class: state.page === page ? "active" : null }, label);
    const topbar = h("header", { class: "topbar" },
      h("a", { class: "brand", href: "/" },
        h("img", { src: "/static/favicon.svg", alt: "", width: 26, height: 26 }),
        h("span", { class: "brand-name" }, "RoQ"), h("span", { class: "brand-sub" }, "console")),
      h("nav", { class: "tabs" }, tab("/", "Overview", "overview"),
        h("a", { href: "/docs", target: "_blank", rel: "noopener" }, "HTTP API")),
      h("span", { class: "spacer" }),
      h("span", { id: "live-status", class: "live", "data-testid": "live-status" }),
      h("div", { id: "session", class: "session", "data-testid": "session" },
        h("span", { class: "who" }, h("span", { id: "session-user", "data-testid": "session-user" })),
        h("span", { id: "session-role", class: "badge", "data-testid": "session-role", hidden: true }),
        h("button", { type: "button", id: "logout", class: "ghost", "data-testid": "logout", hidden: true,
          onclick: logout }, "Log out")));
    const message = h("div", { id: "message", class: "message", role: "alert", "data-testid": "message", hidden: true },
      h("span", { id: "message-text" }),
      h("button", { type: "button", class: "close", "aria-label": "close", onclick: hideMessage }, "×"));
    const loginPanel = h("section", { id: "login-panel", class: "login-card", hidden: true, "data-testid": "login-panel" },
      h("h1", {}, "Log in to the RoQ console"),
      h("p", { class: "muted" }, "This gateway needs a token. An operator makes one with ",
        h("code", {}, "roq web token add NAME --role client|admin"), "."),
      h("form", { id: "login-form", class: "form", "data-testid": "login-form", novalidate: true, onsubmit: login },
        h("label", {}, "Token",
          h("input", { id: "login-token", type: "password", autocomplete: "off", spellcheck: "false",
            "data-testid": "login-token", placeholder: "roq_…" })),
        h("div", { class: "actions" },
          h("button", { type: "submit", class: "primary", id: "login-submit", "data-testid": "login-submit" }, "Log in"))));
    const dialog = h("dialog", { id: "confirm-dialog", class: "dialog", "data-testid": "confirm-dialog" },
      h("h2", { id: "confirm-title" }), h("p", { id: "confirm-text" }),
      h("div", { class: "actions" },
        h("button", { type: "button", id: "confirm-cancel", "data-testid": "confirm-cancel" }, "Cancel"),
        h("button", { type: "button", id: "confirm-ok", class: "danger", "data-testid": "confirm-ok" }, "Confirm")));
    const main = document.querySelector("main");
    document.body.prepend(topbar, message);
    main.prepend(loginPanel);
    document.body.append(dialog);
  }

  function setLive(error) {
    const live = $("live-status");
    if (error) {
      live.className = "live stale";
      live.textContent = `stale: ${describeError(error, "refresh")}`;
    } else {
      live.className = "live ok";
      live.textContent = `live · ${fmtClock(Date.now() / 1000)}`;
    }
  }

  // ------------------------------------------------------------------ session

  function renderSession() {
    const s = state.session;
    const role = $("session-role");
    $("session-user").textContent = s.role ? s.name : "not logged in";
    $("session-user").className = s.role ? "" : "muted";
    role.hidden = !s.role;
    role.textContent = s.auth ? s.role || "" : `${s.role} · auth off`;
    role.className = `badge role-${s.role || "none"}`;
    $("logout").hidden = !(s.auth && s.role);
    $("login-panel").hidden = Boolean(s.role);
    $("content").hidden = !s.role;
    document.body.dataset.role = s.role || "none";
  }

  async function refreshSession() {
    state.session = await api("GET", "/api/session");
    renderSession();
    if (state.session.role) showPage();
    else hidePage();
  }

  async function login(event) {
    event.preventDefault();
    const field = $("login-token");
    const token = field.value.trim();
    field.value = ""; // the cookie carries the session from here: keep no copy of the token
    if (!token) {
      showMessage("error", "Rejected (log in): paste a token first");
      return;
    }
    await act("log in", $("login-submit"), async () => {
      state.session = await api("POST", "/api/session", { json: { token } });
      renderSession();
      showMessage("ok", `Logged in as ${state.session.name} (${state.session.role}).`);
      showPage();
    });
  }

  async function logout() {
    await act("log out", $("logout"), async () => {
      await api("DELETE", "/api/session");
      hidePage();
      await refreshSession();
      showMessage("info", "Logged out.");
    });
  }

  // ------------------------------------------------------------------ polling

  const poller = { generation: 0, timer: null, refresh: null };

  /** Call the page's refresh now and then every POLL_MS; a newer start or a stop ends the loop. */
  function startPolling(refresh) {
    stopPolling();
    const generation = poller.generation;
    poller.refresh = refresh;
    const tick = async () => {
      try {
        await refresh();
        if (generation === poller.generation) setLive(null);
      } catch (err) {
        if (generation !== poller.generation) return;
        if (err instanceof ApiError && err.status === 401) {
          showMessage("error", describeError(err, "refresh"));
          await refreshSession().catch(() => {});
          return;
        }
        setLive(err);
      }
      if (generation === poller.generation) poller.timer = setTimeout(tick, POLL_MS);
    };
    tick();
  }

  function stopPolling() {
    poller.generation += 1;
    clearTimeout(poller.timer);
  }

  /** After an action: show its effect at once rather than at the next tick. */
  function pollNow() {
    if (state.shown && poller.refresh) startPolling(poller.refresh);
  }

  function showPage() {
    if (state.shown) return;
    state.shown = true;
    startPolling(PAGES[state.page].refresh);
  }

  function hidePage() {
    state.shown = false;
    stopPolling();
    $("live-status").textContent = "";
    $("live-status").className = "live";
  }

  // ------------------------------------------------------------------ tables

  /**
   * Keep a table body in step with `items`: one row per key, made once and updated in place (no
   * flicker, and a row keeps its identity between refreshes). `columns`: [{cell(item) → content,
   * cls, testid(item)}]; `rowAttrs(item)`: the attributes of a new row.
   */
  function syncTable(tbody, columns, items, keyOf, rowAttrs, emptyText) {
    const existing = new Map();
    for (const row of tbody.querySelectorAll("tr[data-key]")) existing.set(row.dataset.key, row);
    const empty = tbody.querySelector("tr.empty");
    if (items.length && empty) empty.remove();
    let previous = null;
    for (const item of items) {
      const key = String(keyOf(item));
      let row = existing.get(key);
      if (row) existing.delete(key);
      else row = newRow(columns, item, key, rowAttrs);
      columns.forEach((column, i) => setContent(row.cells[i], column.cell(item)));
      const wanted = previous ? previous.nextSibling : tbody.firstChild;
      if (row !== wanted) tbody.insertBefore(row, wanted);
      previous = row;
    }
    for (const stale of existing.values()) stale.remove();
    if (!items.length && !empty) {
      tbody.append(h("tr", { class: "empty" }, h("td", { colspan: columns.length }, emptyText)));
    }
  }

  function newRow(columns, item, key, rowAttrs) {
    const row = h("tr", rowAttrs ? rowAttrs(item) : {});
    row.dataset.key = key;
    for (const column of columns) {
      row.append(h("td", { class: column.cls || null, "data-testid": column.testid ? column.testid(item) : null }));
    }
    return row;
  }

  function badge(text, kind) {
    return h("span", { class: `badge ${kind}` }, text);
  }

  function queueLink(name) {
    return h("a", { href: queueHref(name), "data-testid": `queue-link-${name}` }, name);
  }

  /** A horizontal bar and its percentage. */
  function meter(percent, detail) {
    const value = Math.max(0, Math.min(100, percent || 0));
    const fill = h("span", { class: `meter-fill ${value >= 90 ? "high" : value >= 70 ? "warn" : ""}` });
    fill.style.width = `${value}%`; // CSSOM, which the page's Content-Security-Policy allows
    return h("div", { class: "meter" },
      h("span", { class: "meter-track" }, fill),
      h("span", { class: "meter-value" }, fmtPercent(percent)),
      h("span", { class: "meter-detail" }, detail));
  }

  const EVENT_KINDS = {
    scaling: "info", relocation: "info", failover: "warn", restart: "warn", leader: "accent",
    "host lost": "bad", "host joined": "good", "queue created": "neutral", "queue deleted": "neutral",
  };

  function renderEvents(list, events, withQueue, emptyText) {
    const newest = events.slice().reverse().slice(0, 40);
    if (!newest.length) {
      list.replaceChildren(h("li", { class: "empty" }, emptyText));
      return;
    }
    list.replaceChildren(...newest.map((e) => h("li", { class: "event", "data-kind": e.kind },
      h("time", { datetime: new Date(e.time * 1000).toISOString() }, fmtClock(e.time)),
      badge(e.kind, EVENT_KINDS[e.kind] || "neutral"),
      withQueue && e.queue ? queueLink(e.queue) : null,
      h("span", { class: "detail" }, e.detail))));
  }

  // ------------------------------------------------------------------ charts

  /** A round step for about `count` ticks up to `max`. */
  function niceStep(max, count) {
    const raw = max / count;
    const power = 10 ** Math.floor(Math.log10(raw));
    const scaled = raw / power;
    return (scaled <= 1 ? 1 : scaled <= 2 ? 2 : scaled <= 5 ? 5 : 10) * power;
  }

  /** SVG path data of one series; a hole longer than three samples breaks the line. */
  function linePath(times, values, x, y, maxGap) {
    let d = "";
    let last = null;
    times.forEach((t, i) => {
      d += `${last === null || t - last > maxGap ? "M" : "L"}${x(t).toFixed(1)},${y(values[i]).toFixed(1)}`;
      last = t;
    });
    return d;
  }

  function areaPath(times, values, x, y, base) {
    if (!times.length) return "";
    const line = times.map((t, i) => `L${x(t).toFixed(1)},${y(values[i]).toFixed(1)}`).join("");
    return `M${x(times[0]).toFixed(1)},${base}${line}L${x(times[times.length - 1]).toFixed(1)},${base}Z`;
  }

  /**
   * The time a chart spans: up to the newest sample (the server's clock, not the browser's) and back
   * `seconds`, or only back to the oldest sample (at least MIN_SPAN) when the gateway has sampled
   * for less: a young gateway's history fills the chart rather than a sliver at its right edge.
   */
  function historySpan(history, seconds) {
    let end = 0;
    let first = Infinity;
    for (const group of [history.queues || {}, history.hosts || {}]) {
      for (const series of Object.values(group)) {
        if (!series.t.length) continue;
        end = Math.max(end, series.t[series.t.length - 1]);
        first = Math.min(first, series.t[0]);
      }
    }
    if (!end) end = Date.now() / 1000;
    return { start: Math.max(end - seconds, Math.min(first, end - MIN_SPAN)), end };
  }

  function fmtSpan(seconds) {
    return seconds >= 120 ? `${Math.round(seconds / 60)} minutes` : `${Math.round(seconds)} seconds`;
  }

  /** A small chart without axes: `lines` are [{values, cls}] over `times`. */
  function sparkline(times, lines, start, end, interval, label, width = 160) {
    const height = 34;
    const peak = Math.max(0, ...lines.flatMap((l) => l.values));
    const top = peak > 0 ? peak * 1.1 : 1;
    const x = (t) => ((t - start) / (end - start)) * width;
    const y = (v) => height - 2 - (v / top) * (height - 5);
    const chart = svg("svg", { class: "spark", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
      "aria-label": label },
    svg("title", {}, label),
    svg("line", { class: "spark-base", x1: 0, x2: width, y1: height - 1.5, y2: height - 1.5 }));
    chart.append(svg("path", { class: `area ${lines[0].cls}`, d: areaPath(times, lines[0].values, x, y, height - 2) }));
    for (const line of lines) {
      chart.append(svg("path", { class: `line ${line.cls}`, d: linePath(times, line.values, x, y, interval * 3) }));
    }
    return chart;
  }

  /**
   * The queue page's chart: msg/s in and out over `span`, with axes, grid and a readout of the
   * values under the pointer (or the latest ones).
   */
  function rateChart(container, series, span, interval, hoverX) {
    const { start, end } = span;
    const seconds = end - start;
    const style = getComputedStyle(container);
    const inner = container.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const width = Math.max(320, Math.floor(inner) || 900);
    const height = 230;
    const pad = { left: 52, right: 14, top: 24, bottom: 26 };
    const times = series.t.filter((t) => t >= start);
    const skip = series.t.length - times.length;
    const ins = series.in.slice(skip);
    const outs = series.out.slice(skip);
    const peak = Math.max(0, ...ins, ...outs);
    const step = niceStep(Math.max(peak * 1.08, 4), 4);
    const top = Math.max(step * 4, Math.ceil((peak * 1.08) / step) * step);
    const plotWidth = width - pad.left - pad.right;
    const plotHeight = height - pad.top - pad.bottom;
    const x = (t) => pad.left + ((t - start) / seconds) * plotWidth;
    const y = (v) => pad.top + plotHeight - (v / top) * plotHeight;
    const base = pad.top + plotHeight;
    const chart = svg("svg", { class: "rate-chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
      "aria-label": `messages per second in and out, the last ${fmtSpan(seconds)}` });
    for (let v = 0; v <= top + step / 2; v += step) {
      chart.append(svg("line", { class: v === 0 ? "axis" : "grid", x1: pad.left, x2: width - pad.right, y1: y(v), y2: y(v) }),
        svg("text", { class: "tick", x: pad.left - 8, y: y(v) + 4, "text-anchor": "end" }, fmtCompact(v)));
    }
    const tickStep = seconds <= 90 ? 15 : seconds <= 180 ? 30 : seconds <= 360 ? 60 : 120;
    for (let t = Math.ceil(start / tickStep) * tickStep; t <= end; t += tickStep) {
      chart.append(svg("line", { class: "grid vertical", x1: x(t), x2: x(t), y1: pad.top, y2: base }),
        svg("text", { class: "tick", x: x(t), y: height - 8, "text-anchor": "middle" }, fmtClock(t, tickStep < 60)));
    }
    chart.append(
      svg("text", { class: "unit", x: pad.left, y: 11, "text-anchor": "start" }, "msg/s"),
      svg("path", { class: "area in", d: areaPath(times, ins, x, y, base) }),
      svg("path", { class: "line in", d: linePath(times, ins, x, y, interval * 3) }),
      svg("path", { class: "line out", d: linePath(times, outs, x, y, interval * 3) }));
    let at = times.length - 1;
    if (hoverX !== null && times.length) {
      const t = start + ((hoverX - pad.left) / plotWidth) * seconds;
      at = nearestIndex(times, t);
      chart.append(svg("line", { class: "cursor", x1: x(times[at]), x2: x(times[at]), y1: pad.top, y2: base }),
        svg("circle", { class: "dot in", cx: x(times[at]), cy: y(ins[at]), r: 3.5 }),
        svg("circle", { class: "dot out", cx: x(times[at]), cy: y(outs[at]), r: 3.5 }));
    }
    if (!times.length) {
      chart.append(svg("text", { class: "no-data", x: width / 2, y: height / 2, "text-anchor": "middle" },
        "no samples yet"));
    }
    container.replaceChildren(chart);
    return at >= 0 ? { time: times[at], in: ins[at], out: outs[at], latest: at === times.length - 1 } : null;
  }

  function nearestIndex(times, t) {
    let best = 0;
    times.forEach((value, i) => {
      if (Math.abs(value - t) < Math.abs(times[best] - t)) best = i;
    });
    return best;
  }

  // ------------------------------------------------------------------ overview page

  const QUEUE_COLUMNS = [
    { cell: (q) => queueLink(q.name), cls: "name" },
    { cell: (q) => exchangeState(q.running, q.exchanges), cls: "num", testid: (q) => `exchanges-${q.name}` },
    { cell: (q) => fmtRate(q.msgs_in_per_s), cls: "num rate in", testid: (q) => `rate-in-${q.name}` },
    { cell: (q) => fmtRate(q.msgs_out_per_s), cls: "num rate out", testid: (q) => `rate-out-${q.name}` },
    { cell: (q) => q.spark, cls: "spark-cell", testid: (q) => `spark-${q.name}` },
    { cell: (q) => fmtCount(q.publishers), cls: "num" },
    { cell: (q) => fmtCount(q.subscriptions), cls: "num" },
    { cell: (q) => fmtBytes(q.retained_bytes), cls: "num" },
  ];

  const HOST_COLUMNS = [
    { cell: (host) => host.name, cls: "name nowrap" },
    { cell: (host) => meter(host.cpu_percent, host.cpus ? `of ${plural(host.cpus, "CPU")}` : "–"), cls: "meter-cell",
      testid: (host) => `host-cpu-${host.name}` },
    { cell: (host) => meter(host.memory_percent, `${fmtBytes(host.memory_used_bytes)} used`), cls: "meter-cell" },
    { cell: (host) => `${host.exchanges} / ${host.capacity}`, cls: "num" },
    { cell: (host) => host.spark, cls: "spark-cell" },
  ];

  const GCM_COLUMNS = [
    { cell: (g) => (g.leader ? badge("leader", "good") : badge("standby", "neutral")) },
    { cell: (g) => g.id, cls: "mono" },
    { cell: (g) => g.endpoint || "–", cls: "mono" },
    { cell: (g) => g.host || "–" },
  ];

  const PLACEMENT_COLUMNS = [
    { cell: (x) => queueLink(x.queue), cls: "name" },
    { cell: (x) => x.id, cls: "mono strong" },
    { cell: (x) => x.host || "unplaced", cls: "nowrap", testid: (x) => `placement-host-${x.queue}-${x.id}` },
    { cell: (x) => (x.running ? badge("running", "good") : badge("down", "bad")) },
    { cell: (x) => fmtRate(x.msgs_in_per_s), cls: "num rate in" },
    { cell: (x) => fmtRate(x.msgs_out_per_s), cls: "num rate out" },
    { cell: (x) => fmtCount(x.restarts), cls: "num" },
  ];

  function exchangeState(running, total) {
    return h("span", { class: running < total ? "warn-text" : null }, `${running}/${total}`);
  }

  async function refreshOverview() {
    const admin = state.session && state.session.role === "admin"; // permissions are for admins only
    const [cluster, history, permissions] = await Promise.all([
      api("GET", "/api/cluster"), api("GET", `/api/history?seconds=${OVERVIEW_SECONDS}`),
      admin ? api("GET", "/api/permissions") : null]);
    renderOverview(cluster, history);
    renderPermissions(permissions);
  }

  // ------------------------------------------------------------------ permissions (overview, admins)

  const RIGHTS = ["publish", "subscribe", "consume"];

  function patternList(patterns) {
    if (!patterns.length) return h("span", { class: "muted" }, "–");
    return h("span", { class: "patterns" }, ...patterns.map((p) => h("span", { class: "pattern" }, p)));
  }

  const PERMISSION_COLUMNS = [
    { cell: (k) => k.name, cls: "name mono" },
    { cell: (k) => k.certificate || "none", cls: "mono small", testid: (k) => `permission-certificate-${k.name}` },
    { cell: (k) => (k.admin ? badge("admin", "accent") : "–"), testid: (k) => `permission-admin-${k.name}` },
    ...RIGHTS.map((right) => ({ cell: (k) => patternList(k[right]), testid: (k) => `permission-${right}-${k.name}` })),
    { cell: (k) => h("button", { type: "button", class: "ghost small", "data-testid": `permission-reset-${k.name}`,
      onclick: (event) => resetPermissions(k.name, event.currentTarget) }, "Reset") },
  ];

  function renderPermissions(table) {
    const panel = $("permissions-panel");
    panel.hidden = !table;
    if (!table) return;
    const everything = table.default === "all" ? "every right on every queue" : "no queue";
    setText("permissions-default", `keys without an entry: ${table.default} (${everything}); keys under admins/: `
      + `everything · ${table.enforced ? "enforced" : "kept, not enforced: the cluster runs without CURVE"}`);
    syncTable($("permissions-body"), PERMISSION_COLUMNS, table.keys, (k) => k.name,
      (k) => ({ "data-testid": `permission-row-${k.name}` }), "No entries: every key has the default.");
  }

  /** The form's request: {key, body, what} for POST /api/permissions/KEY/grant or /revoke. */
  function permissionRequest() {
    const key = $("perm-name").value.trim();
    const right = $("perm-right").value;
    const pattern = $("perm-pattern").value.trim();
    const body = right === "admin" ? { admin: true } : { [right]: pattern ? [pattern] : [] };
    return { key, body, what: right === "admin" ? "admin" : `${right} ${pattern || "(no queues)"}` };
  }

  async function changePermissions(verb, button) {
    const { key, body, what } = permissionRequest();
    if (!body.admin && !$("perm-pattern").value.trim()) {
      // The API takes none as "everything" for a revoke: the form never sends that by accident.
      showMessage("error", `Rejected (${verb} ${what}): name the queues, a queue name or a pattern`);
      return;
    }
    await act(`${verb} ${what} ${verb === "grant" ? "to" : "from"} ${key || "(no key)"}`, button, async () => {
      const answer = await api("POST", `/api/permissions/${encodeURIComponent(key)}/${verb}`, { json: body });
      const done = verb === "grant" ? "Granted" : "Revoked";
      showMessage("ok", answer.changed ? `${done} ${what}: key ${answer.name} now has `
        + `${describeEntry(answer.entry)}.` : `Key ${answer.name} unchanged: ${describeEntry(answer.entry)}.`);
      pollNow();
    });
  }

  function describeEntry(entry) {
    if (!entry) return "no entry (the default)";
    const rights = RIGHTS.map((right) => `${right} ${entry[right].join(" ") || "–"}`).join("; ");
    return entry.admin ? `admin; ${rights}` : rights;
  }

  async function resetPermissions(key, button) {
    const sure = await confirmAction(`Reset the permissions of key ${key}?`,
      "Its entry is removed: the key gets the cluster's default permissions for new connections.", "Reset");
    if (!sure) return;
    await act(`reset the permissions of ${key}`, button, async () => {
      await api("DELETE", `/api/permissions/${encodeURIComponent(key)}`);
      showMessage("ok", `Key ${key} has no entry now: the default applies.`);
      pollNow();
    });
  }

  function renderOverview(cluster, history) {
    const { start, end } = historySpan(history, OVERVIEW_SECONDS);
    const span = fmtSpan(end - start);
    const queues = cluster.queues.map((q) => {
      const series = (history.queues || {})[q.name] || { t: [], in: [], out: [] };
      const label = `${q.name}, the last ${span}: up to ${fmtRate(Math.max(0, ...series.in))} msg/s in, `
        + `${fmtRate(Math.max(0, ...series.out))} msg/s out`;
      const spark = sparkline(series.t, [{ values: series.in, cls: "in" }, { values: series.out, cls: "out" }],
        start, end, history.interval, label);
      return { ...q, spark };
    });
    const hosts = cluster.hosts.map((host) => {
      const series = (history.hosts || {})[host.name] || { t: [], cpu: [] };
      const spark = sparkline(series.t, [{ values: series.cpu, cls: "cpu" }], start, end, history.interval,
        `${host.name} CPU, the last ${span}`, 120);
      return { ...host, spark };
    });
    renderTiles(cluster);
    setText("spark-span", `the last ${span}`);
    syncTable($("queues-body"), QUEUE_COLUMNS, queues, (q) => q.name,
      (q) => ({ "data-testid": `queue-row-${q.name}` }), "No queues yet: create one below.");
    syncTable($("hosts-body"), HOST_COLUMNS, hosts, (host) => host.name,
      (host) => ({ "data-testid": `host-row-${host.name}` }), "No hosts: start an HCM.");
    syncTable($("placements-body"), PLACEMENT_COLUMNS, cluster.placements || [], (x) => `${x.queue}/${x.id}`,
      (x) => ({ "data-testid": `placement-row-${x.queue}-${x.id}` }), "No exchanges: create a queue.");
    syncTable($("gcms-body"), GCM_COLUMNS, cluster.gcms, (g) => g.id,
      (g) => ({ "data-testid": `gcm-row-${g.id}` }), "No GCM is running.");
    renderEvents($("events-list"), cluster.events, true, "No scaling or failover events yet.");
    setText("as-of", `as of ${fmtClock(cluster.time)}`);
  }

  function renderTiles(cluster) {
    const sum = (key) => cluster.queues.reduce((total, q) => total + (q[key] || 0), 0);
    const standby = cluster.gcms.filter((g) => !g.leader).length;
    const exchanges = cluster.hosts.reduce((total, host) => total + host.exchanges, 0);
    const capacity = cluster.hosts.reduce((total, host) => total + host.capacity, 0);
    const running = sum("running");
    setText("tile-leader", cluster.leader ? cluster.leader.id : "no leader");
    $("tile-leader").classList.toggle("bad-text", !cluster.leader);
    setText("tile-leader-endpoint", cluster.leader ? cluster.leader.endpoint : "no GCM leads: admin actions wait");
    setText("tile-gcms", cluster.gcms.length);
    setText("tile-gcms-sub", `${cluster.leader ? 1 : 0} leader, ${standby} standby`);
    setText("tile-hosts", cluster.hosts.length);
    setText("tile-hosts-sub", `${exchanges} of ${capacity} exchange slots used`);
    setText("tile-queues", cluster.queues.length);
    setText("tile-queues-sub", `${running} of ${sum("exchanges")} exchanges running`
      + (cluster.unplaced ? `, ${cluster.unplaced} unplaced` : ""));
    setText("tile-in", fmtRate(sum("msgs_in_per_s")));
    setText("tile-out", fmtRate(sum("msgs_out_per_s")));
  }

  function setupOverview() {
    $("create-form").addEventListener("submit", createQueue);
    $("permission-form").addEventListener("submit", (event) => {
      event.preventDefault();
      changePermissions("grant", $("perm-grant"));
    });
    $("perm-revoke").addEventListener("click", () => changePermissions("revoke", $("perm-revoke")));
    const deleted = new URLSearchParams(location.search).get("deleted");
    if (deleted) {
      showMessage("ok", `Queue ${deleted} deleted.`);
      history.replaceState(null, "", "/");
    }
  }

  async function createQueue(event) {
    event.preventDefault();
    const name = $("create-name").value.trim();
    const body = { name, exchanges: numberOrText($("create-exchanges").value) ?? 1 };
    const replicas = $("create-replicas").value;
    if (replicas) body.replicas = Number(replicas);
    await act(`create queue ${name || "(no name)"}`, $("create-submit"), async () => {
      const queue = await api("POST", "/api/queues", { json: body });
      showMessage("ok", `Queue ${queue.name} created with ${plural(queue.exchanges, "exchange")}.`);
      $("create-form").reset();
      pollNow();
    });
  }

  /** A form field's number, or its text when it is not one (the API then says what is wrong). */
  function numberOrText(value) {
    const text = String(value).trim();
    if (text === "") return undefined;
    return Number.isFinite(Number(text)) ? Number(text) : text;
  }

  // ------------------------------------------------------------------ queue page

  const queuePage = {
    name: queueNameFromPath(location.pathname),
    seconds: 300,
    hoverX: null,
    last: null, // {queue, history}: the chart redraws from it when the pointer moves
    rules: null, // the rules as last loaded: edits are what differs from them
    scaleEdited: false,
  };

  function queueNameFromPath(path) {
    const raw = path.replace(/^\/queues\//, "").replace(/\/+$/, "");
    try {
      return decodeURIComponent(raw);
    } catch (err) {
      return raw; // a malformed %-escape: the API will say the queue does not exist
    }
  }

  const RULE_FIELDS = [
    ["max_rate", "Max msg/s", "per exchange; scale out above", "any"],
    ["max_publishers", "Max publishers", "per exchange; scale out above", "1"],
    ["max_cpu", "Max host CPU %", "of a host running an exchange", "any"],
    ["max_memory", "Max host memory %", "of a host running an exchange", "any"],
    ["min_exchanges", "Min exchanges", "never scale in below", "1"],
    ["max_exchanges", "Max exchanges", "never scale out above", "1"],
    ["scale_in_below", "Scale in below", "fraction of the limits, 0–1", "any"],
  ];

  const EXCHANGE_COLUMNS = [
    { cell: (x) => x.id, cls: "mono strong" },
    { cell: (x) => x.host || "unplaced", cls: "nowrap", testid: (x) => `exchange-host-${x.id}` },
    { cell: (x) => (x.running ? badge("running", "good") : badge("down", "bad")), testid: (x) => `exchange-state-${x.id}` },
    { cell: (x) => [h("div", { class: "mono small" }, x.incarnation || "–"),
      h("div", { class: "mono small muted" }, x.endpoint || "")] },
    { cell: (x) => x.replica_host || "–", cls: "nowrap" },
    { cell: (x) => fmtRate(x.msgs_in_per_s), cls: "num rate in" },
    { cell: (x) => fmtRate(x.msgs_out_per_s), cls: "num rate out" },
    { cell: (x) => fmtCount(x.publishers), cls: "num" },
    { cell: (x) => fmtCount(x.subscriptions), cls: "num" },
    { cell: (x) => fmtBytes(x.retained_bytes), cls: "num" },
    { cell: (x) => (x.latency_p99_ms === null || x.latency_p99_ms === undefined ? "–" : `${x.latency_p99_ms} ms`), cls: "num" },
    { cell: (x) => fmtCount(x.restarts), cls: "num" },
  ];

  const PUBLISHER_COLUMNS = [
    { cell: (p) => p.id, cls: "mono" },
    { cell: (p) => p.exchange, cls: "mono" },
    { cell: (p) => fmtRate(p.msgs_per_s), cls: "num rate in" },
  ];

  const SUBSCRIBER_COLUMNS = [
    { cell: (s) => s.name, cls: "mono strong" },
    { cell: (s) => fmtCount(s.messages), cls: "num", testid: (s) => `lag-${s.name}` },
    { cell: (s) => fmtCount(s.frames), cls: "num" },
    { cell: (s) => fmtSeconds(s.seconds), cls: "num" },
    { cell: (s) => `${fmtSeconds(s.reported_ago)} ago`, cls: "num" },
  ];

  /** A group's figures (GET /api/queues/{q} `groups`), each cell with a testid `group-KEY-NAME`. */
  const GROUP_FIGURES = [
    ["members", fmtCount], ["ready", fmtCount], ["delayed", fmtCount], ["in_flight", fmtCount],
    ["acked", fmtCount], ["redelivered", fmtCount], ["dead_lettered", fmtCount],
    ["oldest_ready_s", (seconds) => (seconds > 0 ? fmtSeconds(seconds) : "–")],
  ];

  const GROUP_COLUMNS = [
    { cell: (g) => g.name, cls: "mono strong" },
    { cell: (g) => g.topics.join(", ") || "(all)", cls: "mono small" },
    ...GROUP_FIGURES.map(([key, format]) => ({ cell: (g) => format(g[key]), cls: "num",
      testid: (g) => `group-${key}-${g.name}` })),
    { cell: (g) => groupActions(g.name), cls: "admin-only" },
  ];

  const PEEK_COLUMNS = [
    { cell: (m) => fmtCount(m.seq), cls: "num" },
    { cell: (m) => m.topic, cls: "mono" },
    { cell: (m) => m.exchange, cls: "mono" },
    { cell: (m) => m.publisher, cls: "mono small" },
    { cell: (m) => payloadCell(m), cls: "payload" },
  ];

  function payloadCell(message) {
    const binary = message.encoding !== "utf-8";
    return h("span", { class: `payload-text${binary ? " binary" : ""}`, title: message.payload },
      binary ? badge("base64", "neutral") : null, message.payload);
  }

  async function refreshQueue() {
    let queue;
    let history;
    try {
      [queue, history] = await Promise.all([api("GET", queueApi(queuePage.name)),
        api("GET", `/api/history?seconds=${queuePage.seconds}`)]);
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        showMissingQueue(err);
        return;
      }
      throw err;
    }
    queuePage.last = { queue, history };
    renderQueue(queue);
  }

  function showMissingQueue(err) {
    stopPolling();
    $("queue-details").hidden = true;
    $("queue-missing").hidden = false;
    for (const id of ["scale-form", "delete-queue", "purge-queue", "delete-if-empty"]) $(id).hidden = true;
    showMessage("error", describeError(err, `show queue ${queuePage.name}`));
  }

  function renderQueue(queue) {
    const running = queue.exchanges_detail.filter((x) => x.running).length;
    const total = queue.exchanges_detail.length;
    const health = $("queue-state");
    health.textContent = `${running}/${total} exchanges running`;
    health.className = `badge ${running === total ? "good" : "warn"}`;
    setText("queue-scaling", describeRules(queue.rules));
    setText("tile-in", fmtRate(queue.msgs_in_per_s));
    setText("tile-out", fmtRate(queue.msgs_out_per_s));
    setText("tile-exchanges", `${running}/${total}`);
    setText("tile-replicas", queue.replicas === 2 ? "each with a replica" : "no replicas");
    setText("tile-publishers", fmtCount(queue.publisher_count));
    setText("tile-subscriptions", fmtCount(queue.subscriptions));
    setText("tile-retained", fmtBytes(queue.retained_bytes));
    drawQueueChart();
    syncTable($("exchanges-body"), EXCHANGE_COLUMNS, queue.exchanges_detail, (x) => x.id,
      (x) => ({ "data-testid": `exchange-row-${x.id}` }), "No exchanges.");
    renderGroups(queue.groups);
    syncTable($("publishers-body"), PUBLISHER_COLUMNS, queue.publishers, (p) => `${p.exchange}/${p.id}`,
      (p) => ({ "data-testid": `publisher-row-${p.id}` }), "No publisher is sending.");
    syncTable($("subscribers-body"), SUBSCRIBER_COLUMNS, queue.subscribers, (s) => s.name,
      (s) => ({ "data-testid": `subscriber-row-${s.name}` }), "No durable subscriber.");
    renderEvents($("events-list"), queue.events, false, "No scaling or failover events for this queue yet.");
    if (!queuePage.scaleEdited && document.activeElement !== $("scale-exchanges")) {
      $("scale-exchanges").value = total;
    }
    if (queue.rules) fillRules(queue.rules, false);
  }

  function describeRules(rules) {
    if (!rules) return "no rules";
    const limits = ["max_rate", "max_publishers", "max_cpu", "max_memory"].filter((k) => rules[k] > 0);
    if (!limits.length) return "fixed size: no scaling limit set";
    return `autoscaling ${rules.min_exchanges}–${rules.max_exchanges} exchanges`;
  }

  function drawQueueChart() {
    if (!queuePage.last) return;
    const { queue, history } = queuePage.last;
    const series = (history.queues || {})[queue.name] || { t: [], in: [], out: [] };
    const span = historySpan(history, queuePage.seconds);
    const point = rateChart($("rate-chart"), series, span, history.interval, queuePage.hoverX);
    const readout = $("chart-readout");
    if (!point) {
      readout.replaceChildren();
      return;
    }
    readout.replaceChildren(
      h("span", { class: "muted" }, point.latest && queuePage.hoverX === null ? "now" : fmtClock(point.time)),
      h("span", { class: "key in" }), `in ${fmtRate(point.in)} msg/s`,
      h("span", { class: "key out" }), `out ${fmtRate(point.out)} msg/s`);
  }

  function setupQueue() {
    const name = queuePage.name;
    setText("queue-name", name);
    document.title = `${name} · RoQ console`;
    $("tile-in").dataset.testid = `rate-in-${name}`;
    $("tile-out").dataset.testid = `rate-out-${name}`;
    const chart = $("rate-chart");
    chart.addEventListener("mousemove", (event) => {
      queuePage.hoverX = event.clientX - chart.getBoundingClientRect().left;
      drawQueueChart();
    });
    chart.addEventListener("mouseleave", () => {
      queuePage.hoverX = null;
      drawQueueChart();
    });
    window.addEventListener("resize", drawQueueChart);
    for (const button of $("chart-window").querySelectorAll("button")) {
      button.addEventListener("click", () => {
        queuePage.seconds = Number(button.dataset.seconds);
        markWindow();
        pollNow();
      });
    }
    markWindow();
    $("scale-exchanges").addEventListener("input", () => { queuePage.scaleEdited = true; });
    $("scale-form").addEventListener("submit", scaleQueue);
    $("delete-queue").addEventListener("click", deleteQueue);
    $("purge-queue").addEventListener("click", purgeQueue);
    $("delete-if-empty").addEventListener("click", deleteQueueIfEmpty);
    $("peek-form").addEventListener("submit", peekMessages);
    $("publish-form").addEventListener("submit", publishMessage);
    buildRuleFields();
    syncTable($("peek-body"), PEEK_COLUMNS, [], () => "", null, "Give a topic (or its start) and press Peek.");
    $("rules-form").addEventListener("submit", saveRules);
    $("rules-reset").addEventListener("click", () => queuePage.rules && fillRules(queuePage.rules, true));
    $("rules-clear").addEventListener("click", clearRules);
  }

  function markWindow() {
    for (const button of $("chart-window").querySelectorAll("button")) {
      button.classList.toggle("active", Number(button.dataset.seconds) === queuePage.seconds);
    }
  }

  async function scaleQueue(event) {
    event.preventDefault();
    const name = queuePage.name;
    const wanted = numberOrText($("scale-exchanges").value);
    const current = queuePage.last ? queuePage.last.queue.exchanges_detail.length : "?";
    if (wanted === undefined) {
      showMessage("error", `Rejected (scale queue ${name}): give the number of exchanges`);
      return;
    }
    if (wanted === current) {
      showMessage("info", `Queue ${name} has ${plural(current, "exchange")} already.`);
      return;
    }
    const sure = await confirmAction(`Scale queue ${name}?`,
      `From ${plural(current, "exchange")} to ${wanted}. Publishers and subscribers follow on their own.`,
      "Scale");
    if (!sure) return;
    await act(`scale queue ${name}`, $("scale-submit"), async () => {
      const queue = await api("POST", queueApi(name, "/scale"), { json: { exchanges: wanted } });
      queuePage.scaleEdited = false;
      showMessage("ok", `Queue ${name} scaled to ${plural(queue.exchanges, "exchange")}.`);
      pollNow();
    });
  }

  async function deleteQueue() {
    const name = queuePage.name;
    const sure = await confirmAction(`Delete queue ${name}?`,
      "Its exchanges stop and the messages they retain are gone. This cannot be undone.", "Delete queue");
    if (!sure) return;
    await act(`delete queue ${name}`, $("delete-queue"), async () => {
      await api("DELETE", queueApi(name));
      stopPolling();
      location.assign(`/?deleted=${encodeURIComponent(name)}`);
    });
  }

  async function deleteQueueIfEmpty() {
    const name = queuePage.name;
    const sure = await confirmAction(`Delete queue ${name} if it is empty?`,
      "Only if it holds no message: nothing retained, no consumer group's backlog. Otherwise it stays.",
      "Delete if empty");
    if (!sure) return;
    await act(`delete queue ${name} if empty`, $("delete-if-empty"), async () => {
      await api("DELETE", queueApi(name, "?if_empty=true"));
      stopPolling();
      location.assign(`/?deleted=${encodeURIComponent(name)}`);
    });
  }

  async function peekMessages(event) {
    event.preventDefault();
    const topic = $("peek-topic").value;
    const limit = numberOrText($("peek-limit").value) ?? 20;
    if (!topic) {
      showMessage("error", "Rejected (peek): give a topic, or the start of one");
      return;
    }
    await act(`peek at ${topic}`, $("peek-submit"), async () => {
      const query = new URLSearchParams({ topic, limit: String(limit) });
      const answer = await api("GET", queueApi(queuePage.name, `/peek?${query}`));
      // In the API's order, oldest first (as `roq subscribe` and the stream would print them).
      const messages = answer.messages;
      const body = $("peek-body");
      body.replaceChildren();
      syncTable(body, PEEK_COLUMNS, messages, (m) => `${m.exchange}/${m.pos}/${m.publisher}/${m.seq}`,
        (m) => ({ "data-testid": `peek-row-${m.seq}` }), `No retained message on topics starting with ${topic}.`);
      setText("peek-summary", `${plural(messages.length, "message")} on topics starting with “${topic}” (the latest `
        + `retained, oldest first), as of ${fmtClock(Date.now() / 1000)}`);
    });
  }

  async function publishMessage(event) {
    event.preventDefault();
    const topic = $("publish-topic").value;
    const text = $("publish-text").value;
    const split = $("publish-split").checked;
    if (!topic) {
      showMessage("error", "Rejected (publish): give a topic");
      return;
    }
    await act(`publish to ${topic}`, $("publish-submit"), async () => {
      const query = new URLSearchParams({ topic });
      if (split) query.set("split", "lines");
      const sent = await api("POST", queueApi(queuePage.name, `/messages?${query}`), { text });
      const seqs = sent.count === 1 ? `seq ${sent.first_seq}` : `seq ${sent.first_seq}–${sent.last_seq}`;
      const summary = `Published ${plural(sent.count, "message")} to ${sent.queue} on ${sent.topic} (${seqs}, `
        + `publisher ${sent.publisher}).`;
      setText("publish-result", `Last sent: ${seqs} on ${sent.topic}`);
      showMessage("ok", summary);
      if (!$("peek-topic").value) $("peek-topic").value = topic;
    });
  }

  function buildRuleFields() {
    $("rules-fields").replaceChildren(...RULE_FIELDS.map(([key, label, hint, step]) =>
      h("label", {}, label,
        h("input", { id: `rule-${key}`, name: key, type: "number", step, min: 0, "data-testid": `rule-${key}` }),
        h("span", { class: "hint" }, hint))));
  }

  function rulesEdited() {
    if (!queuePage.rules) return false;
    return RULE_FIELDS.some(([key]) => $(`rule-${key}`).value !== String(queuePage.rules[key] ?? ""));
  }

  /** Show `rules`; a poll does not overwrite the user's unsaved edits (force does). */
  function fillRules(rules, force) {
    if (!force && rulesEdited()) return;
    queuePage.rules = rules;
    for (const [key] of RULE_FIELDS) {
      const input = $(`rule-${key}`);
      if (force || document.activeElement !== input) input.value = String(rules[key] ?? "");
    }
  }

  async function saveRules(event) {
    event.preventDefault();
    const changes = {};
    for (const [key] of RULE_FIELDS) {
      const value = $(`rule-${key}`).value;
      if (value !== "" && (!queuePage.rules || value !== String(queuePage.rules[key]))) changes[key] = numberOrText(value);
    }
    const name = queuePage.name;
    if (!Object.keys(changes).length) {
      showMessage("info", "No rule changed: edit a value first.");
      return;
    }
    await act(`save the rules of ${name}`, $("rules-save"), async () => {
      const rules = await api("PUT", queueApi(name, "/rules"), { json: { rules: changes, clear: false } });
      fillRules(rules, true);
      const list = Object.keys(changes).map((key) => `${key} = ${rules[key]}`).join(", ");
      showMessage("ok", `Rules of ${name} saved: ${list}.`);
      pollNow();
    });
  }

  async function clearRules() {
    const name = queuePage.name;
    const sure = await confirmAction(`Clear the rules of ${name}?`,
      "The queue keeps its current number of exchanges and stops scaling by itself.", "Clear rules");
    if (!sure) return;
    await act(`clear the rules of ${name}`, $("rules-clear"), async () => {
      const rules = await api("PUT", queueApi(name, "/rules"), { json: { rules: null, clear: true } });
      fillRules(rules, true);
      showMessage("ok", `Rules of ${name} cleared: it keeps a fixed size.`);
      pollNow();
    });
  }

  // ------------------------------------------------------------------ consumer groups (queue page)

  const groupButtons = new Map(); // group → its row's buttons, made once (a poll keeps the same nodes)

  function renderGroups(groups) {
    for (const name of groupButtons.keys()) {
      if (!groups.some((g) => g.name === name)) groupButtons.delete(name);
    }
    syncTable($("groups-body"), GROUP_COLUMNS, groups, (g) => g.name,
      (g) => ({ "data-testid": `group-row-${g.name}` }), "No consumer group: members join one with group=NAME.");
  }

  function groupActions(name) {
    if (!groupButtons.has(name)) {
      groupButtons.set(name, h("span", { class: "row-actions" },
        h("button", { type: "button", class: "ghost small", "data-testid": `group-reset-${name}`,
          onclick: (event) => resetGroup(name, event.currentTarget) }, "Reset"),
        h("button", { type: "button", class: "ghost small danger-text", "data-testid": `group-delete-${name}`,
          onclick: (event) => deleteGroup(name, event.currentTarget) }, "Delete")));
    }
    return groupButtons.get(name);
  }

  /** The messages an admin command's results say it dropped, over the exchanges. */
  function dropped(status, key) {
    return Object.values(status.results).reduce((total, result) => total + (result[key] || 0), 0);
  }

  /** Say what a command did; a 202 (some exchange has not answered yet) says which apply it later. */
  function reportCommand(status, done) {
    const late = status.waiting.length;
    showMessage(late ? "info" : "ok", late ? `${done} ${status.waiting.join(", ")} `
      + `${late === 1 ? "has" : "have"} not answered yet: the command applies there as soon as it can.` : done);
    pollNow();
  }

  async function resetGroup(name, button) {
    const queue = queuePage.name;
    const sure = await confirmAction(`Reset group ${name} of ${queue}?`,
      "Its ready and delayed messages are dropped. Its members stay, and keep what they hold in flight "
      + "until they ack it.", "Reset group");
    if (!sure) return;
    await act(`reset group ${name}`, button, async () => {
      const status = await api("POST", queueApi(queue, `/groups/${encodeURIComponent(name)}/reset`));
      reportCommand(status, `Group ${name} reset: ${plural(dropped(status, "dropped"), "message")} dropped.`);
    });
  }

  async function deleteGroup(name, button) {
    const queue = queuePage.name;
    const sure = await confirmAction(`Delete group ${name} of ${queue}?`,
      "The group goes with every message it holds. It is refused while members are connected: stop them first.",
      "Delete group");
    if (!sure) return;
    await act(`delete group ${name}`, button, async () => {
      const status = await api("DELETE", queueApi(queue, `/groups/${encodeURIComponent(name)}`));
      reportCommand(status, `Group ${name} deleted with ${plural(dropped(status, "dropped"), "message")}.`);
    });
  }

  async function purgeQueue() {
    const name = queuePage.name;
    const sure = await confirmAction(`Purge queue ${name}?`,
      "Its retained messages and every consumer group's ready and delayed messages are dropped, on its "
      + "replicas and journals too. Messages members hold in flight stay theirs.", "Purge");
    if (!sure) return;
    await act(`purge queue ${name}`, $("purge-queue"), async () => {
      const status = await api("POST", queueApi(name, "/purge"));
      reportCommand(status, `Queue ${name} purged: ${plural(dropped(status, "messages"), "retained message")} and `
        + `${plural(dropped(status, "group_messages"), "group message")} dropped.`);
    });
  }

  // ------------------------------------------------------------------ start

  const PAGES = {
    overview: { setup: setupOverview, refresh: refreshOverview },
    queue: { setup: setupQueue, refresh: refreshQueue },
  };

  async function start() {
    buildChrome();
    PAGES[state.page].setup();
    try {
      await refreshSession();
    } catch (err) {
      reportError(err, "read the session");
    }
  }

  start();
})();
