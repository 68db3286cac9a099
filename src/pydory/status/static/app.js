// pydory's live dashboard: one GET /dashboard/json per second, everything drawn from it.
// Rates are differences between successive documents (the daemon serves lifetime totals).
"use strict";

const FEED = "/dashboard/json";
const TICK_MS = 1000;
const HISTORY = 120; // points kept per series: two minutes at one per second
const MIN_SPAN = 30; // charts stretch the first half minute of history over their width
const SVG = "http://www.w3.org/2000/svg";

const REASON_COLOURS = {
  malformed: "#f87171",
  unsupported_api_key: "#fb923c",
  unsupported_version: "#fbbf24",
  bad_topic: "#a3e635",
  too_long: "#34d399",
  no_memory: "#22d3ee",
  rate_limit: "#60a5fa",
  kafka_error: "#a78bfa",
  failed_delivery_attempts: "#f472b6",
  shutdown_delay: "#e879f9",
  unclean_disconnect: "#94a3b8",
  spool_corrupt: "#78716c",
};

// --- state ---------------------------------------------------------------------------------

const state = {
  previous: null, // the last document, to differentiate totals
  series: {
    received: [],
    delivered: [],
    inFlight: [],
    discards: [],
    commitLag: [],
  },
  discardSteps: [], // per tick: {reason: discards per second}
  topicRates: new Map(), // topic -> array of accepted msg/s
};

function push(series, value) {
  series.push(value);
  if (series.length > HISTORY) series.shift();
}

// --- formatting ----------------------------------------------------------------------------

const integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
const oneDecimal = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

function formatCount(n) {
  return n === null || n === undefined ? "–" : integer.format(n);
}

function formatRate(perSecond) {
  if (perSecond === null || perSecond === undefined || Number.isNaN(perSecond)) return "–";
  return perSecond >= 100 ? integer.format(perSecond) : oneDecimal.format(perSecond);
}

function formatBytes(bytes) {
  const units = ["B", "KiB", "MiB", "GiB"];
  let value = Math.abs(bytes);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const sign = bytes < 0 ? "−" : "";
  return `${sign}${value >= 100 || unit === 0 ? integer.format(value) : oneDecimal.format(value)} ${units[unit]}`;
}

function formatDuration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return `${integer.format(seconds * 1000)} ms`;
  if (seconds < 120) return `${oneDecimal.format(seconds)} s`;
  if (seconds < 7200) return `${integer.format(seconds / 60)} min`;
  if (seconds < 172800) return `${oneDecimal.format(seconds / 3600)} h`;
  return `${oneDecimal.format(seconds / 86400)} d`;
}

function formatMs(ms) {
  if (ms === null || ms === undefined) return "–";
  return ms >= 100 ? `${integer.format(ms)} ms` : `${oneDecimal.format(ms)} ms`;
}

function formatClock(epochMs) {
  if (!epochMs) return "never";
  return new Date(epochMs).toLocaleTimeString("en-GB", { hour12: false });
}

function ago(nowSeconds, epochMs) {
  if (!epochMs) return "never";
  return `${formatDuration(Math.max(0, nowSeconds - epochMs / 1000))} ago`;
}

// --- small DOM helpers ---------------------------------------------------------------------

function byId(id) {
  return document.getElementById(id);
}

function setText(id, text) {
  const element = byId(id);
  if (element.textContent !== text) element.textContent = text;
}

function cell(text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function svgElement(name, attributes) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  return element;
}

const SHORT_VALUE = 24; // characters

function facts(id, pairs) {
  const list = byId(id);
  list.replaceChildren();
  for (const [term, value, className] of pairs) {
    const dt = document.createElement("dt");
    dt.textContent = term;
    const dd = document.createElement("dd");
    dd.textContent = value;
    dd.dataset.fact = term;
    if (className) dd.className = className;
    // A short value (a number and its unit) never wraps; a long one (a path) may break.
    if (String(value).length <= SHORT_VALUE) dd.classList.add("one-line");
    list.append(dt, dd);
  }
}

// --- charts --------------------------------------------------------------------------------

// A filled sparkline of ``values`` scaled to the SVG's 200x40 viewBox (or given size).
function sparkline(svg, values, width = 200, height = 40) {
  svg.replaceChildren();
  if (values.length < 2) return;
  const max = Math.max(...values, 1e-9);
  const span = Math.max(values.length, MIN_SPAN);
  const step = width / (span - 1);
  const offset = (span - values.length) * step;
  const points = values.map((v, i) => [offset + i * step, height - 2 - (v / max) * (height - 4)]);
  const line = points.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
  svg.append(
    svgElement("polygon", {
      points: `${offset},${height} ${line} ${width},${height}`,
      class: "spark-fill",
    }),
    svgElement("polyline", { points: line, class: "spark-line" }),
  );
}

// The pool: a half-ring filled to used/budget, red once depleted.
function poolGauge(svg, pool) {
  svg.replaceChildren();
  const share = Math.min(1, Math.max(0, pool.used / pool.budget));
  const arc = (fraction) => {
    const angle = Math.PI * (1 - fraction);
    return [100 + 80 * Math.cos(angle), 100 - 80 * Math.sin(angle)];
  };
  const [endX, endY] = arc(share);
  svg.append(svgElement("path", { d: "M 20 100 A 80 80 0 0 1 180 100", class: "gauge-track" }));
  if (share > 0) {
    const level = pool.available <= 0 ? "bad" : share > 0.8 ? "warn" : "ok";
    svg.append(
      svgElement("path", {
        d: `M 20 100 A 80 80 0 0 1 ${endX.toFixed(2)} ${endY.toFixed(2)}`,
        class: `gauge-fill ${level}`,
      }),
    );
  }
  const label = svgElement("text", { x: 100, y: 92, class: "gauge-value" });
  label.textContent = `${oneDecimal.format(share * 100)}%`;
  const caption = svgElement("text", { x: 100, y: 114, class: "gauge-caption" });
  caption.textContent = "of the budget in use";
  svg.append(label, caption);
}

// Discards per second by reason: stacked bars, one per tick, newest on the right.
function discardChart(svg, steps) {
  svg.replaceChildren();
  const width = 600;
  const height = 140;
  const totals = steps.map((step) => Object.values(step).reduce((a, b) => a + b, 0));
  const max = Math.max(...totals, 1);
  const span = Math.max(steps.length, MIN_SPAN);
  const barWidth = width / span;
  const offset = (span - steps.length) * barWidth;
  for (const fraction of [0.5, 1]) {
    const y = height - fraction * (height - 12);
    svg.append(svgElement("line", { x1: 0, x2: width, y1: y, y2: y, class: "grid-line" }));
    const label = svgElement("text", { x: 4, y: y - 3, class: "axis-label" });
    label.textContent = `${formatRate(max * fraction)}/s`;
    svg.append(label);
  }
  steps.forEach((step, i) => {
    let y = height;
    for (const [reason, perSecond] of Object.entries(step)) {
      if (perSecond <= 0) continue;
      const barHeight = (perSecond / max) * (height - 12);
      y -= barHeight;
      svg.append(
        svgElement("rect", {
          x: (offset + i * barWidth + 0.5).toFixed(1),
          y: y.toFixed(1),
          width: Math.max(1, barWidth - 1).toFixed(1),
          height: barHeight.toFixed(1),
          fill: REASON_COLOURS[reason] || "#cbd5e1",
        }),
      );
    }
  });
}

function discardLegend(discards) {
  const legend = byId("discard-legend");
  legend.replaceChildren();
  const seen = Object.entries(discards).filter(([, n]) => n > 0);
  if (seen.length === 0) {
    const item = document.createElement("li");
    item.className = "muted";
    item.textContent = "no discards since start-up";
    legend.append(item);
    return;
  }
  for (const [reason, count] of seen.sort((a, b) => b[1] - a[1])) {
    const item = document.createElement("li");
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = REASON_COLOURS[reason] || "#cbd5e1";
    item.append(swatch, `${reason.replaceAll("_", " ")} `);
    const total = document.createElement("b");
    total.textContent = formatCount(count);
    item.append(total);
    legend.append(item);
  }
}

// --- one refresh ---------------------------------------------------------------------------

function sum(values) {
  return values.reduce((a, b) => a + b, 0);
}

function totals(doc) {
  return {
    received: sum(Object.values(doc.received)),
    delivered: sum(doc.topics.map((t) => t.delivered)),
    inFlight: sum(doc.topics.map((t) => t.in_flight)),
    discards: sum(Object.values(doc.discards)),
  };
}

function rate(current, previous, elapsed) {
  return elapsed > 0 ? Math.max(0, (current - previous) / elapsed) : 0;
}

function render(doc) {
  const previous = state.previous;
  const elapsed = previous ? doc.now - previous.now : 0;
  const now = totals(doc);
  const before = previous ? totals(previous) : null;

  const received = before ? rate(now.received, before.received, elapsed) : null;
  const delivered = before ? rate(now.delivered, before.delivered, elapsed) : null;
  const discarded = before ? rate(now.discards, before.discards, elapsed) : null;
  if (before) {
    push(state.series.received, received);
    push(state.series.delivered, delivered);
    push(state.series.discards, discarded);
    const step = {};
    for (const [reason, count] of Object.entries(doc.discards)) {
      step[reason] = rate(count, previous.discards[reason] || 0, elapsed);
    }
    push(state.discardSteps, step);
  }
  push(state.series.inFlight, now.inFlight);

  renderIdentity(doc);
  renderKpis(doc, now, { received, delivered, discarded });
  poolGauge(byId("pool-gauge"), doc.pool);
  renderPoolFacts(doc.pool);
  discardChart(byId("discard-chart"), state.discardSteps);
  discardLegend(doc.discards);
  renderTopics(doc, previous, elapsed);
  renderBrokers(doc.brokers);
  renderMetadata(doc);
  renderMsgDebug(doc.msg_debug);
  renderSpool(doc.spool, doc.overload);
  state.previous = doc;
}

function renderIdentity(doc) {
  const uptime = formatDuration(doc.now - doc.since);
  setText("identity", `v${doc.version} · pid ${doc.pid} · up ${uptime} · ${location.host}`);
}

function renderKpis(doc, now, rates) {
  setText("received-rate", formatRate(rates.received));
  setText("received-total", `${formatCount(now.received)} since start-up`);
  setText("delivered-rate", formatRate(rates.delivered));
  setText("delivered-total", `${formatCount(now.delivered)} since start-up`);
  setText("in-flight", formatCount(now.inFlight));
  const queued = (key) => sum(doc.topics.map((t) => t[key]));
  setText(
    "queue-summary",
    `new ${formatCount(doc.new)} · batch ${formatCount(queued("batch"))} · ` +
      `send ${formatCount(queued("send_wait"))} · ack ${formatCount(queued("ack_wait"))}`,
  );
  setText("discard-rate", formatRate(rates.discarded));
  setText("discard-total", `${formatCount(now.discards)} since start-up`);
  sparkline(byId("received-spark"), state.series.received);
  sparkline(byId("delivered-spark"), state.series.delivered);
  sparkline(byId("in-flight-spark"), state.series.inFlight);
  sparkline(byId("discard-spark"), state.series.discards);
  renderCommitPoint(doc.commit_point);
}

function renderCommitPoint(commit) {
  if (!commit) {
    setText("commit-lag", "–");
    setText("commit-lag-unit", "");
    setText("commit-detail", "not available on this daemon");
    return;
  }
  push(state.series.commitLag, commit.lag_s);
  const [value, unit] = formatDuration(commit.lag_s).split(" ");
  setText("commit-lag", value);
  setText("commit-lag-unit", unit || "");
  setText(
    "commit-detail",
    `${formatCount(commit.open_messages)} open · at ${formatClock(commit.commit_point_ms)}`,
  );
  sparkline(byId("commit-spark"), state.series.commitLag);
}

function renderPoolFacts(pool) {
  facts("pool-facts", [
    ["used", formatBytes(pool.used)],
    ["available", formatBytes(pool.available), pool.available <= 0 ? "bad" : ""],
    ["budget", formatBytes(pool.budget)],
    [
      "time depleted",
      `${oneDecimal.format(pool.percent_time_depleted)}%`,
      pool.percent_time_depleted > 0 ? "warn" : "",
    ],
  ]);
}

function renderTopics(doc, previous, elapsed) {
  const body = byId("topics");
  if (doc.topics.length === 0) return;
  const before = new Map((previous ? previous.topics : []).map((t) => [t.topic, t]));
  const rows = doc.topics.map((topic) => {
    const old = before.get(topic.topic);
    const inRate = old ? rate(topic.accepted, old.accepted, elapsed) : null;
    const outRate = old ? rate(topic.delivered, old.delivered, elapsed) : null;
    let history = state.topicRates.get(topic.topic);
    if (!history) state.topicRates.set(topic.topic, (history = []));
    if (inRate !== null) push(history, inRate);

    const row = document.createElement("tr");
    row.dataset.topic = topic.topic;
    const spark = svgElement("svg", {
      class: "spark small",
      viewBox: "0 0 200 40",
      preserveAspectRatio: "none",
    });
    sparkline(spark, history);
    const sparkCell = document.createElement("td");
    sparkCell.className = "c";
    sparkCell.append(spark);
    row.append(
      cell(topic.topic, "l topic"),
      cell(formatRate(inRate), "rate"),
      cell(formatRate(outRate), "rate"),
      sparkCell,
      cell(formatCount(topic.accepted)),
      cell(formatCount(topic.delivered)),
      cell(formatCount(topic.discarded), topic.discarded > 0 ? "warn" : ""),
      cell(formatCount(topic.in_flight)),
      cell(formatCount(topic.batch)),
      cell(formatCount(topic.send_wait)),
      cell(formatCount(topic.ack_wait)),
      cell(leaders(topic.leaders), "l leaders"),
    );
    return row;
  });
  body.replaceChildren(...rows);
}

function leaders(byPartition) {
  const parts = Object.entries(byPartition).sort((a, b) => Number(a[0]) - Number(b[0]));
  if (parts.length === 0) return "unknown topic";
  return parts.map(([p, broker]) => `${p}→${broker < 0 ? "none" : broker}`).join("  ");
}

function renderBrokers(brokers) {
  if (brokers.length === 0) return;
  const rows = brokers.map((broker) => {
    const row = document.createElement("tr");
    const stateCell = document.createElement("td");
    stateCell.className = "l";
    const pill = document.createElement("span");
    pill.className = `pill ${broker.up ? "ok" : broker.state === "UNKNOWN" ? "idle" : "bad"}`;
    pill.textContent = broker.state;
    stateCell.append(pill);
    row.append(
      cell(String(broker.node_id), "l"),
      cell(broker.address, "l mono"),
      stateCell,
      cell(formatMs(broker.rtt_avg_ms)),
      cell(formatMs(broker.rtt_p99_ms)),
      cell(formatCount(broker.errors), broker.errors > 0 ? "warn" : ""),
      cell(formatCount(broker.request_timeouts), broker.request_timeouts > 0 ? "warn" : ""),
      cell(formatCount(broker.leader_partitions)),
    );
    return row;
  });
  byId("brokers").replaceChildren(...rows);
}

function renderMetadata(doc) {
  const metadata = doc.metadata;
  const statsAge = doc.stats_taken_at ? formatDuration(Math.max(0, doc.now - doc.stats_taken_at)) : "none yet";
  // Before the first fetch succeeds the daemon holds what it reads ("new"): say so.
  const lastUpdated = metadata.known
    ? [`${formatClock(metadata.last_updated)} (${ago(doc.now, metadata.last_updated)})`, ""]
    : [`no metadata yet (${formatCount(doc.new)} ${doc.new === 1 ? "message" : "messages"} waiting)`, "warn"];
  facts("metadata-facts", [
    ["last updated", ...lastUpdated],
    ["last modified", `${formatClock(metadata.last_modified)} (${ago(doc.now, metadata.last_modified)})`],
    ["fetch failures", formatCount(metadata.fetch_failures), metadata.fetch_failures > 0 ? "warn" : ""],
    ["update requests", formatCount(metadata.update_requests)],
    ["librdkafka stats", statsAge === "none yet" ? statsAge : `${statsAge} old`],
    // One fact per input: three on one line wrapped in this narrow card.
    ...Object.entries(doc.received).map(([transport, n]) => [
      `received, ${transport.replace("_", " ")}`,
      formatCount(n),
    ]),
  ]);
}

// The write-ahead spool (or "off") and the overload policy, with the time paused for memory.
function renderSpool(spool, overload) {
  const pairs = [];
  if (overload) {
    pairs.push(
      ["policy", overload.policy],
      ["inputs", overload.paused ? "paused: memory pool depleted" : "reading", overload.paused ? "warn" : ""],
      ["paused", `${formatCount(overload.pauses)} times, ${formatDuration(overload.paused_seconds)}`],
    );
  }
  if (!spool) {
    pairs.push(["spool", "off"]);
  } else {
    const fsync =
      spool.fsync_interval_ms === null ? "none" : spool.fsync_interval_ms === 0 ? "always" : `every ${formatMs(spool.fsync_interval_ms)}`;
    pairs.push(
      ["spool", spool.directory],
      ["on disk", `${formatBytes(spool.bytes)} of ${formatBytes(spool.max_bytes)} in ${formatCount(spool.segments)} segment${spool.segments === 1 ? "" : "s"}`],
      ["unsettled", formatCount(spool.outstanding)],
      ["written ahead", formatCount(spool.appended)],
      ["fsync", `${fsync} (${formatCount(spool.fsyncs)} so far)`],
      ["replayed at start", formatCount(spool.replayed), spool.replayed > 0 ? "warn" : ""],
      ["unprotected", formatCount(spool.unprotected), spool.unprotected > 0 ? "bad" : ""],
      ["errors", `${formatCount(spool.errors)} disk, ${formatCount(spool.full)} full`, spool.errors + spool.full > 0 ? "bad" : ""],
    );
  }
  facts("spool-facts", pairs);
}

// Which topics message debugging traces (the card is hidden when <msgDebug> is off).
function renderMsgDebug(msgDebug) {
  const card = byId("msg-debug-card");
  card.hidden = !msgDebug;
  if (!msgDebug) return;
  const tracing = msgDebug.all_topics || msgDebug.topics.length > 0;
  const traced = msgDebug.all_topics ? "all topics" : msgDebug.topics.join(", ") || "none";
  facts("msg-debug-facts", [
    ["traced topics", traced, tracing ? "warn" : ""],
    ["directory", msgDebug.directory],
    ["written", `${formatBytes(msgDebug.bytes_written)} of ${formatBytes(msgDebug.byte_limit)}`],
    ["time left", msgDebug.seconds_left === null ? "–" : formatDuration(msgDebug.seconds_left)],
    ["last stopped by", msgDebug.stopped || "–"],
  ]);
  byId("msg-debug-stop").disabled = !tracing;
}

async function stopMsgDebug() {
  const button = byId("msg-debug-stop");
  const note = byId("msg-debug-note");
  button.disabled = true;
  try {
    const response = await fetch("/msg_debug/del_all_topics", { cache: "no-store" });
    note.textContent = response.ok ? (await response.text()).trim() : `failed: HTTP ${response.status}`;
  } catch (error) {
    note.textContent = `failed: ${error.message}`;
  }
}

// --- the loop ------------------------------------------------------------------------------

function setLive(live, text) {
  const indicator = byId("live");
  indicator.dataset.state = live ? "live" : "down";
  setText("live-text", text);
}

async function tick() {
  try {
    const response = await fetch(FEED, { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    render(await response.json());
    setLive(true, "live");
  } catch (error) {
    setLive(false, `disconnected (${error.message})`);
  } finally {
    setTimeout(tick, TICK_MS);
  }
}

async function updateMetadata() {
  const button = byId("update-metadata");
  const note = byId("metadata-note");
  button.disabled = true;
  try {
    const response = await fetch("/metadata_update", { method: "POST" });
    note.textContent = response.ok ? (await response.text()).trim() : `failed: HTTP ${response.status}`;
  } catch (error) {
    note.textContent = `failed: ${error.message}`;
  } finally {
    button.disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  byId("update-metadata").addEventListener("click", updateMetadata);
  byId("msg-debug-stop").addEventListener("click", stopMsgDebug);
  tick();
});
