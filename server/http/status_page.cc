#include "server/http/status_page.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/types.h"
#include "model/planner.h"
#include "model/units.h"

namespace prefixd {
namespace {

// The pages may use only what they are served with: no other origin, no
// plugins, no framing. Inline styles only (the pages' own <style>).
constexpr char kSecurityPolicy[] =
    "default-src 'none'; script-src 'self'; connect-src 'self'; "
    "style-src 'unsafe-inline'; img-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'";

// How often the status page reloads itself.
constexpr int kRefreshSeconds = 5;

constexpr char kStyle[] = R"css(
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;
 margin:0;color:#1d2330;background:#f6f7f9}
nav{background:#1d2330;color:#fff;padding:8px 20px}
nav a{color:#cfe0ff;margin-left:16px;text-decoration:none}
main{padding:4px 20px 20px;max-width:1200px}
h1{font-size:20px;margin:14px 0 6px} h2{font-size:16px;margin:18px 0 6px}
table{border-collapse:collapse;background:#fff;margin:4px 0}
th,td{border:1px solid #d8dce3;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#eef1f5} td.l,th.l{text-align:left}
table.kv th{text-align:left;width:9em}
table.kv td{text-align:left}
.bar{display:inline-block;width:160px;height:10px;background:#e3e7ee;
 vertical-align:middle;margin-left:8px}
.bar span{display:block;height:100%;background:#3b7ddd}
.bar.over span{background:#d64545} tr.over td.pct{color:#b02a2a;font-weight:600}
.muted{color:#667085} code{font-size:13px}
label{display:inline-block;margin:4px 14px 4px 0}
input,select{font:inherit;padding:1px 4px} input[type=text]{width:7em}
.stack{display:flex;height:22px;width:100%;max-width:900px;background:#e3e7ee;
 margin:6px 0;border:1px solid #c9ced8}
.stack div{height:100%} .stack .w{background:#8a94a6} .stack .o{background:#b9c0cc}
.stack .k{background:#3b7ddd} .stack.over .k{background:#d64545}
#error{color:#b02a2a;font-weight:600}
td.tenant{white-space:normal;word-break:break-all;max-width:18em}
.key{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}
)css";

constexpr char kPlanHtml[] = R"html(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>prefixd KV calculator</title>
<style>)html";

constexpr char kPlanBody[] = R"html(</style></head><body>
<nav><b>prefixd</b><a href="/">status</a><a href="/plan">KV calculator</a><a href="/metrics">metrics</a></nav>
<main>
<h1>KV cache for a batch</h1>
<p class="muted">kv_bytes = batch &times; the KV of one sequence of context tokens: full-attention layers hold every token,
sliding-window layers at most the window, state layers their fixed state. One token in one layer is
2 &times; kv_heads &times; head_dim values (MLA: kv_lora_rank + head_dim, head_dim being qk_rope_head_dim) &times; dtype bytes,
nvfp4 adding a 1-byte scale per 16 values: the same arithmetic as <code>prefixctl plan --batch N --context LEN</code>.</p>
<form id="inputs" autocomplete="off">
<div>
<label>model <select id="preset"></select></label>
<label>layers <input id="layers" type="text" inputmode="numeric"></label>
<label>KV heads <input id="kv_heads" type="text" inputmode="numeric"></label>
<label>head_dim <input id="head_dim" type="text" inputmode="numeric"></label>
<label>attention heads <input id="attention_heads" type="text" inputmode="numeric"></label>
</div><div>
<label>kv_lora_rank <input id="kv_lora_rank" type="text" inputmode="numeric" placeholder="0"></label>
<label>sliding window <input id="sliding_window" type="text" inputmode="numeric" placeholder="0"></label>
<label>sliding layers <input id="sliding_layers" type="text" inputmode="numeric" placeholder="0"></label>
<label>state layers <input id="state_layers" type="text" inputmode="numeric" placeholder="0"></label>
<label>state bytes per layer <input id="state_bytes" type="text" placeholder="0"></label>
</div><div>
<label>KV dtype <select id="dtype"></select></label>
<label>batch <input id="batch" type="text" value="32"></label>
<label>context <input id="context" type="text" value="8k"></label>
<label>weights <input id="weights" type="text" placeholder="e.g. 140GB"></label>
<label>overhead <input id="overhead" type="text" placeholder="0"></label>
<label>GPUs <input id="gpu_count" type="text" value="1" style="width:3em"> &times; <select id="gpu"></select></label>
</div>
</form>
<p id="error"></p>
<table class="kv" id="summary">
<tr><th>batch x context</th><td id="tokens"></td></tr>
<tr><th>bytes per token</th><td id="bpt"></td></tr>
<tr><th>per sequence</th><td id="seq"></td></tr>
<tr><th>KV cache</th><td id="kv"></td></tr>
<tr><th>weights</th><td id="weights_out"></td></tr>
<tr><th>weights + KV</th><td id="total"></td></tr>
<tr><th>decode crossover</th><td id="crossover"></td></tr>
<tr><th>GPUs</th><td id="pool"></td></tr>
</table>
<div class="stack" id="pool_bar"><div class="w"></div><div class="o"></div><div class="k"></div></div>
<p class="muted">The chosen GPUs:<span class="key" style="background:#8a94a6"></span>weights<span class="key" style="background:#b9c0cc"></span>overhead<span class="key" style="background:#3b7ddd"></span>KV cache, red when the three do not fit.</p>
<h2 id="kv_title">KV cache by KV heads and dtype</h2>
<table id="kv_table"></table>
<h2>GPUs for weights + overhead + KV, by GPU</h2>
<p class="muted">The bar is the cache alone against one GPU's memory; it turns red when the cache alone does not fit on one GPU.</p>
<table id="gpu_table"></table>
</main>
<script src="/plan.js"></script>
</body></html>
)html";

// The forward calculator of model/forward.cc, in the browser. Every byte
// count is a BigInt, so the figures are exact and the same as `prefixctl
// plan --batch`'s; bytes() and count() are FormatBytes and FormatCount of
// model/units.cc.
constexpr char kPlanJs[] = R"js("use strict";
const $ = (id) => document.getElementById(id);
let DATA = null;

function count(n) {
  return BigInt(n).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}
const KI = 1024n;
const UNITS = [["PiB", KI ** 5n], ["PB", 1000n ** 5n], ["TiB", KI ** 4n],
  ["TB", 1000n ** 4n], ["GiB", KI ** 3n], ["GB", 1000n ** 3n],
  ["MiB", KI ** 2n], ["MB", 1000n ** 2n], ["KiB", KI], ["kB", 1000n]];
function hundredths(q) {
  return (q / 100n) + "." + (q % 100n).toString().padStart(2, "0");
}
function exactIn(b, u) {
  const h = b * 100n;
  if (h % u !== 0n) return "";
  const q = h / u;
  if (q % 100n === 0n) return (q / 100n).toString();
  if (q % 10n === 0n) return (q / 100n) + "." + ((q / 10n) % 10n);
  return hundredths(q);
}
function bytes(b) {
  if (b < KI) return b + " B";
  for (const [name, u] of UNITS) {
    if (b < u || b / u >= KI) continue;
    const e = exactIn(b, u);
    if (e) return e + " " + name;
  }
  for (const [name, u] of UNITS) {
    if (b >= u && name.endsWith("iB")) {
      // printf's %.2f: to nearest, ties to even.
      let q = b * 100n / u;
      const r = b * 100n % u;
      if (2n * r > u || (2n * r === u && q % 2n === 1n)) q += 1n;
      return hundredths(q) + " " + name;
    }
  }
  return b + " B";
}
const fullBytes = (b) => count(b) + " B (" + bytes(b) + ")";

// ParseBytes of model/units.cc: a decimal and a unit, whole bytes only.
const BYTE_UNITS = {"": 1n, "b": 1n, "kb": 1000n, "mb": 1000n ** 2n,
  "gb": 1000n ** 3n, "tb": 1000n ** 4n, "pb": 1000n ** 5n, "kib": KI,
  "mib": KI ** 2n, "gib": KI ** 3n, "tib": KI ** 4n, "pib": KI ** 5n};
function parseBytes(what, text) {
  const m = /^\s*(\d+)(?:\.(\d+))?\s*([a-zA-Z]*)\s*$/.exec(text);
  const unit = m ? BYTE_UNITS[m[3].toLowerCase()] : undefined;
  if (!m || unit === undefined) throw what + ": \"" + text + "\" is not a size such as 140GB";
  const frac = m[2] || "";
  const scaled = BigInt(m[1] + frac) * unit;
  const div = 10n ** BigInt(frac.length);
  if (scaled % div !== 0n) throw what + ": \"" + text + "\" is not a whole number of bytes";
  return scaled / div;
}
// A positive integer; k = 1024 and M = 1024^2 where `suffixes` allows.
function parsePositive(what, text, suffixes) {
  const m = /^\s*(\d+)\s*([kKmM]?)\s*$/.exec(text);
  if (!m || (m[2] && !suffixes) || BigInt(m[1]) === 0n) {
    throw what + " must be a positive integer" + (suffixes ? " (k = 1024)" : "") +
      ", got \"" + text + "\"";
  }
  const mult = {"": 1n, "k": 1024n, "K": 1024n, "m": 1048576n, "M": 1048576n}[m[2]];
  return BigInt(m[1]) * mult;
}

// A whole number >= 0; empty is 0.
function parseCount(what, text) {
  if (text.trim() === "") return 0n;
  const m = /^\s*(\d+)\s*$/.exec(text);
  if (!m) throw what + " must be a whole number >= 0, got \"" + text + "\"";
  return BigInt(m[1]);
}
const min = (a, b) => (a < b ? a : b);
const ceilDiv = (a, b) => (a + b - 1n) / b;
const isMla = (g) => g.kv_lora_rank > 0n;
const keepsEveryToken = (g) => g.sliding_layers === 0n && g.state_layers === 0n;

function label(g, kv) {
  if (isMla(g)) return "MLA";
  if (kv === 1n) return "MQA-1";
  if (kv === g.attention_heads) return "MHA-" + kv;
  return "GQA-" + kv;
}
function dtypeOf(name) {
  const d = DATA.dtypes.find((x) => x.name === name);
  return {bits: BigInt(d.bits), group: BigInt(d.scale_group)};
}
// The values one token caches per layer and K or V: MLA's latent plus the
// rotated key part, or one head.
const vectorValues = (g) => (isMla(g) ? g.kv_lora_rank + g.head_dim : g.head_dim);

// ValidateGeometry of model/kv_geometry.cc, with its messages.
function checkGeometry(g, dtype) {
  if (isMla(g) && g.kv_heads !== 1n) {
    throw "kv_lora_rank " + g.kv_lora_rank + ": MLA caches one latent per layer, shared by all " +
      "heads, so it needs kv_lora_rank > 0 with kv_heads 1 (got kv_heads " + g.kv_heads + ")";
  }
  if (g.sliding_layers > g.layers || (g.sliding_window > 0n) !== (g.sliding_layers > 0n)) {
    throw "sliding_window " + g.sliding_window + " with sliding_layers " + g.sliding_layers +
      ": give both (0 < sliding_layers <= layers " + g.layers + ") or neither";
  }
  if ((g.state_layers > 0n) !== (g.state_bytes > 0n)) {
    throw "state_layers " + g.state_layers + " with state_bytes_per_layer " + g.state_bytes +
      ": give both (> 0, their product below 2^64) or neither";
  }
  const {group} = dtypeOf(dtype);
  const values = vectorValues(g);
  if (group > 0n && values % group !== 0n) {
    throw (isMla(g) ? "kv_lora_rank + qk_rope_head_dim " : "head_dim ") + values +
      " is not a multiple of " + group + ": " + dtype + " stores one scale per " + group + " values";
  }
}

// LayerBytesPerToken: one token in one KV layer, scales included.
function layerBytes(g, kv, dtype) {
  const {bits, group} = dtypeOf(dtype);
  const values = vectorValues(g);
  const vector = values * bits + (group > 0n ? values / group * 8n : 0n);
  return (isMla(g) ? vector : 2n * kv * vector) / 8n;
}
const perToken = (g, kv, dtype) => g.layers * layerBytes(g, kv, dtype);
// SequenceKvBytes with block_size 0: exact tokens, sliding layers up to the
// window, state layers their state.
function perSequence(g, kv, dtype, context) {
  return layerBytes(g, kv, dtype) * ((g.layers - g.sliding_layers) * context +
    g.sliding_layers * min(context, g.sliding_window)) + g.state_layers * g.state_bytes;
}
// CrossoverContext of model/forward.cc: the smallest context at which
// batch x perSequence reaches the weights, 0 for never.
function crossoverContext(g, layer, batch, weights) {
  if (weights === 0n) return 0n;
  const full = layer * (g.layers - g.sliding_layers);
  const all = layer * g.layers;
  const state = g.state_layers * g.state_bytes;
  const target = ceilDiv(weights, batch);
  if (state >= target) return 1n;
  const rest = target - state;
  const windowBytes = all * g.sliding_window;
  if (rest <= windowBytes) return ceilDiv(rest, all);
  if (full === 0n) return 0n;
  return g.sliding_window + ceilDiv(rest - windowBytes, full);
}

// The texts of prefixctl's KvDtypeSizeText, BytesPerTokenFormula,
// ForwardKvLines and ForwardCrossover.
function sizeText(dtype) {
  const {bits, group} = dtypeOf(dtype);
  const b = bits % 8n === 0n ? (bits / 8n) + " B" : (Number(bits) / 8) + " B";
  return group > 0n ? "(" + b + " + 1 B per " + group + " values)" : b;
}
function tokenFormula(g, dtype) {
  if (isMla(g)) {
    return g.layers + " layers x (" + g.kv_lora_rank + " kv_lora_rank + " + g.head_dim +
      " qk_rope_head_dim) x " + sizeText(dtype);
  }
  return "2 x " + g.layers + " layers x " + g.kv_heads + " kv_heads x " + g.head_dim +
    " head_dim x " + sizeText(dtype);
}
function sequenceFormula(x) {
  const g = x.g;
  if (keepsEveryToken(g)) {
    return count(x.context) + " tokens x " + count(perToken(g, g.kv_heads, x.dtype)) + " B";
  }
  let parts = "(" + count(x.context) + " tokens x " + (g.layers - g.sliding_layers) + " layers";
  if (g.sliding_layers > 0n) {
    parts += " + " + count(min(x.context, g.sliding_window)) + " tokens x " + g.sliding_layers +
      " sliding layers";
  }
  parts += ") x " + count(layerBytes(g, g.kv_heads, x.dtype)) + " B";
  if (g.state_layers > 0n) {
    parts += " + " + g.state_layers + " state layers x " + count(g.state_bytes) + " B";
  }
  return parts;
}
function crossoverText(x, bpt) {
  if (!x.weightsGiven) return "give the weights";
  if (keepsEveryToken(x.g)) {
    return count(ceilDiv(x.weights, bpt)) +
      " cached tokens in flight read as many bytes per decode step as the weights";
  }
  const c = crossoverContext(x.g, layerBytes(x.g, x.g.kv_heads, x.dtype), x.batch, x.weights);
  if (c === 0n) {
    return "never at batch " + count(x.batch) +
      ": every KV layer slides, so the KV stops growing below the weights";
  }
  return count(c) + " tokens per sequence (" + count(x.batch * c) + " in flight): batch " +
    count(x.batch) + " then reads as many KV bytes per decode step as weights";
}

const EXTRAS = ["kv_lora_rank", "sliding_window", "sliding_layers", "state_layers"];

function readInputs() {
  const g = {};
  for (const f of ["layers", "kv_heads", "head_dim"]) g[f] = parsePositive(f, $(f).value, false);
  const att = $("attention_heads").value.trim();
  g.attention_heads = att === "" ? 0n : parsePositive("attention heads", att, false);
  for (const f of EXTRAS) g[f] = parseCount(f, $(f).value);
  const state = $("state_bytes").value.trim();
  g.state_bytes = state === "" ? 0n : parseBytes("state bytes per layer", state);
  checkGeometry(g, $("dtype").value);
  return {
    g, dtype: $("dtype").value,
    batch: parsePositive("batch", $("batch").value, false),
    context: parsePositive("context", $("context").value, true),
    weightsGiven: $("weights").value.trim() !== "",
    weights: $("weights").value.trim() === "" ? 0n : parseBytes("weights", $("weights").value),
    overhead: $("overhead").value.trim() === "" ? 0n : parseBytes("overhead", $("overhead").value),
    gpu: DATA.gpus.find((x) => x.name === $("gpu").value),
    gpuCount: parsePositive("GPU count", $("gpu_count").value, false),
  };
}

function cell(tag, text, cls) {
  const c = document.createElement(tag);
  c.textContent = text;
  if (cls) c.className = cls;
  return c;
}
function row(table, cells) {
  const tr = document.createElement("tr");
  for (const c of cells) tr.appendChild(c);
  table.appendChild(tr);
  return tr;
}
function bar(percent, over) {
  const b = document.createElement("span");
  b.className = "bar" + (over ? " over" : "");
  const fill = document.createElement("span");
  fill.style.width = Math.min(100, Number(percent)) + "%";
  b.appendChild(fill);
  return b;
}

// VariantHeads of model/forward.cc: an MLA model's latent has no KV heads
// to vary.
function variantHeads(g) {
  if (isMla(g)) return [g.kv_heads];
  const heads = [g.kv_heads, 1n];
  if (g.attention_heads > 0n) heads.push(g.attention_heads);
  return [...new Set(heads.map(String))].map(BigInt).sort((a, b) => (a < b ? 1 : a > b ? -1 : 0));
}

function kvTable(x) {
  const uniq = variantHeads(x.g);
  const dtypes = ["fp16", "fp8", "int4"];
  if (!dtypes.includes(x.dtype)) dtypes.push(x.dtype);
  const t = $("kv_table");
  t.replaceChildren();
  row(t, [cell("th", "dtype", "l"), ...uniq.map((h) =>
    cell("th", label(x.g, h) + (h === x.g.kv_heads ? " *" : "")))]);
  for (const d of dtypes) {
    const tr = row(t, [cell("th", d + (d === x.dtype ? " *" : ""), "l"), ...uniq.map((h) => {
      const kv = x.batch * perSequence(x.g, h, d, x.context);
      const c = cell("td", bytes(kv));
      c.dataset.variant = label(x.g, h);
      c.dataset.bytes = kv.toString();
      c.title = fullBytes(kv);
      return c;
    })]);
    tr.dataset.dtype = d;
  }
}

function gpuTable(kv, total) {
  const t = $("gpu_table");
  t.replaceChildren();
  row(t, [cell("th", "gpu", "l"), cell("th", "memory"), cell("th", "gpus needed"),
    cell("th", "KV / one GPU"), cell("th", "cache alone", "l")]);
  for (const g of DATA.gpus) {
    const mem = BigInt(g.memory_bytes);
    const pct = kv * 100n / mem;
    const over = kv > mem;
    const alone = cell("td", over ? "exceeds one GPU" : "fits one GPU", "l alone");
    alone.appendChild(bar(pct, over));
    const tr = row(t, [cell("td", g.name, "l"), cell("td", bytes(mem)),
      cell("td", count(ceilDiv(total, mem)), "need"), cell("td", count(pct) + "%", "pct"), alone]);
    tr.dataset.gpu = g.name;
    if (over) tr.className = "over";
  }
}

function poolBar(x, kv, poolBytes) {
  const scale = Number(poolBytes > x.weights + x.overhead + kv ? poolBytes : x.weights + x.overhead + kv);
  const parts = $("pool_bar").children;
  [x.weights, x.overhead, kv].forEach((b, i) => { parts[i].style.width = (100 * Number(b) / scale) + "%"; });
  $("pool_bar").className = "stack" + (x.weights + x.overhead + kv > poolBytes ? " over" : "");
}

function compute() {
  let x;
  try {
    x = readInputs();
    $("error").textContent = "";
  } catch (e) {
    $("error").textContent = String(e);
    return;
  }
  const tokens = x.batch * x.context;
  const bpt = perToken(x.g, x.g.kv_heads, x.dtype);
  const seq = perSequence(x.g, x.g.kv_heads, x.dtype, x.context);
  const kv = x.batch * seq;
  const total = x.weights + x.overhead + kv;
  $("tokens").textContent = count(x.batch) + " x " + count(x.context) + " tokens = " + count(tokens) + " tokens";
  $("bpt").textContent = fullBytes(bpt) + " = " + tokenFormula(x.g, x.dtype);
  $("seq").textContent = fullBytes(seq) + " = " + sequenceFormula(x);
  $("kv").textContent = fullBytes(kv);
  $("kv").dataset.bytes = kv.toString();
  $("weights_out").textContent = x.weightsGiven ? fullBytes(x.weights) : "not given: 0 B";
  $("total").textContent = fullBytes(total) + " = weights + overhead + KV";
  $("crossover").textContent = crossoverText(x, bpt);
  const poolBytes = BigInt(x.gpu.memory_bytes) * x.gpuCount;
  const pool = x.gpuCount + " x " + x.gpu.name + " = " + bytes(poolBytes);
  $("pool").textContent = poolBytes >= total
    ? pool + ": fit, " + bytes(poolBytes - total) + " to spare"
    : pool + ": do not fit, " + bytes(total - poolBytes) + " short";
  poolBar(x, kv, poolBytes);
  $("kv_title").textContent = "KV cache of " + count(x.batch) + " x " + count(x.context) +
    " tokens by KV heads and dtype (* = this model, this dtype)";
  kvTable(x);
  gpuTable(kv, total);
}

function choosePreset() {
  const name = $("preset").value;
  const p = name === "daemon" ? DATA.daemon : DATA.presets.find((q) => q.name === name);
  if (!p) return;
  for (const f of ["layers", "kv_heads", "head_dim"]) $(f).value = p[f];
  $("attention_heads").value = p.attention_heads ? p.attention_heads : "";
  for (const f of EXTRAS) $(f).value = p[f] ? p[f] : "";
  $("state_bytes").value = p.state_bytes_per_layer ? p.state_bytes_per_layer : "";
  if (name === "daemon") $("dtype").value = DATA.daemon.kv_dtype;
}

function option(select, value, text) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = text;
  select.appendChild(o);
}

async function main() {
  DATA = await (await fetch("/plan/presets.json")).json();
  option($("preset"), "daemon", "this daemon: " + DATA.daemon.name);
  for (const p of DATA.presets) option($("preset"), p.name, p.name);
  option($("preset"), "custom", "custom");
  for (const d of DATA.dtypes) option($("dtype"), d.name, d.name);
  for (const g of DATA.gpus) option($("gpu"), g.name, g.name);
  choosePreset();
  $("preset").addEventListener("change", () => { choosePreset(); compute(); });
  for (const f of ["layers", "kv_heads", "head_dim", "attention_heads", ...EXTRAS, "state_bytes"]) {
    $(f).addEventListener("input", () => { $("preset").value = "custom"; });
  }
  $("inputs").addEventListener("input", compute);
  $("inputs").addEventListener("change", compute);
  $("inputs").addEventListener("submit", (e) => e.preventDefault());
  compute();
  document.body.dataset.ready = "1";
}
main();
)js";

// The KV dtypes the calculator offers (model/kv_geometry.h).
constexpr KvDtype kDtypes[] = {KvDtype::kFp32, KvDtype::kFp16, KvDtype::kBf16,
                               KvDtype::kFp8,  KvDtype::kInt8, KvDtype::kInt4,
                               KvDtype::kNvfp4};

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\", std::string(1, c));
    } else if (static_cast<unsigned char>(c) < 0x20 || c == '<') {
      // '<' too, so that no "</script>" can appear in the JSON.
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Every field SequenceKvBytes uses, so that the page computes what
// `prefixctl plan --batch` does for MLA, sliding-window and hybrid models.
std::string GeometryJson(const ModelGeometry& g) {
  return absl::StrCat("\"layers\": ", g.layers, ", \"kv_heads\": ", g.kv_heads,
                      ", \"head_dim\": ", g.head_dim,
                      ", \"attention_heads\": ", g.attention_heads,
                      ", \"kv_lora_rank\": ", g.kv_lora_rank,
                      ", \"sliding_window\": ", g.sliding_window,
                      ", \"sliding_layers\": ", g.sliding_layers,
                      ", \"state_layers\": ", g.state_layers,
                      ", \"state_bytes_per_layer\": ", g.state_bytes_per_layer);
}

std::string HitRate(uint64_t hit, uint64_t looked_up) {
  if (looked_up == 0) return "-";
  return absl::StrFormat("%.1f%% (%s/%s)", 100.0 * hit / looked_up,
                         FormatCount(hit), FormatCount(looked_up));
}

std::string Td(absl::string_view cls, absl::string_view text) {
  return absl::StrCat("<td class=\"", cls, "\">", text, "</td>");
}

std::string Bar(double fraction) {
  return absl::StrFormat(
      "<span class=\"bar%s\"><span style=\"width:%.1f%%\"></span></span>",
      fraction > 1 ? " over" : "", std::min(fraction, 1.0) * 100);
}

std::string SummaryTable(const DaemonFacts& info, const CacheStats& s) {
  const ModelGeometry& g = info.model.geometry;
  const double used =
      s.budget_blocks == 0
          ? 0
          : static_cast<double>(s.resident_blocks) / s.budget_blocks;
  auto row = [](absl::string_view id, absl::string_view th,
                absl::string_view td) {
    return absl::StrCat("<tr><th>", th, "</th><td id=\"", id, "\">", td,
                        "</td></tr>\n");
  };
  return absl::StrCat(
      "<table class=\"kv\" id=\"summary\">\n",
      row("epoch", "epoch", absl::StrFormat("%016x", info.epoch)),
      row("model", "model", HtmlEscape(info.model_description)),
      row("geometry", "geometry",
          absl::StrCat(g.layers, " layers x ", g.kv_heads, " KV heads x ",
                       g.head_dim, " head_dim, ",
                       KvDtypeName(info.model.kv_dtype), ": ",
                       FormatCount(info.bytes_per_token), " B (",
                       FormatBytes(info.bytes_per_token), ") per token")),
      row("fingerprint", "fingerprint", HtmlEscape(info.fingerprint)),
      row("blocks", "block",
          absl::StrCat(s.block_size, " tokens, ", FormatBytes(s.block_bytes))),
      row("budget", "budget",
          absl::StrCat(FormatBytes(s.budget_bytes), " = ",
                       FormatCount(s.budget_blocks), " blocks")),
      row("resident", "cached",
          absl::StrCat(FormatCount(s.resident_blocks), " blocks (",
                       FormatBytes(s.resident_blocks * s.block_bytes), ", ",
                       absl::StrFormat("%.1f%%", used * 100), " of the budget)",
                       Bar(used))),
      "</table>\n");
}

std::string TenantTable(const CacheStats& s, absl::Duration window_length,
                        const HitRateWindow::Result& window) {
  const std::string span = absl::FormatDuration(window_length);
  std::string out = absl::StrCat(
      "<table id=\"tenants\">\n<tr><th class=\"l\">tenant</th><th>cached "
      "blocks</th><th>cached bytes</th><th>pinned blocks</th>"
      "<th>leases</th><th>leases expired</th><th>hit rate, last ",
      span,
      "</th><th>hit rate, all</th><th>matches</th><th>inserts</th></tr>\n");
  for (const TenantUsage& t : s.tenants) {
    const std::string name = HtmlEscape(t.tenant);
    HitRateWindow::Rate recent;
    if (auto it = window.tenants.find(t.tenant); it != window.tenants.end()) {
      recent = it->second;
    }
    absl::StrAppend(
        &out, "<tr data-tenant=\"", name, "\">", Td("l tenant", name),
        Td("cached", FormatCount(t.cached_blocks)),
        Td("bytes", FormatBytes(t.cached_blocks * s.block_bytes)),
        Td("pinned", FormatCount(t.pinned_blocks)),
        Td("leases", FormatCount(t.active_leases)),
        Td("expired", FormatCount(t.lease_expired)),
        Td("recent", HitRate(recent.hit_tokens, recent.looked_up_tokens)),
        Td("hit", HitRate(t.match_hit_tokens, t.match_tokens)),
        Td("matches", FormatCount(t.match_requests)),
        Td("inserts", FormatCount(t.insert_requests)), "</tr>\n");
  }
  return out + "</table>\n";
}

std::string EvictionTable(const CacheStats& s) {
  std::string out = "<table id=\"evictions\">\n<tr><th class=\"l\">tenant</th>";
  for (int r = 0; r < kNumEvictReasons; ++r) {
    absl::StrAppend(&out, "<th>", EvictReasonName(static_cast<EvictReason>(r)),
                    "</th>");
  }
  out += "</tr>\n";
  for (const TenantUsage& t : s.tenants) {
    const std::string name = HtmlEscape(t.tenant);
    absl::StrAppend(&out, "<tr data-tenant=\"", name, "\">",
                    Td("l tenant", name));
    for (int r = 0; r < kNumEvictReasons; ++r) {
      absl::StrAppend(
          &out, Td(EvictReasonName(static_cast<EvictReason>(r)),
                   FormatCount(t.evicted_blocks[static_cast<size_t>(r)])));
    }
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

// Cached and evicted blocks by retention class (docs/api.md, "Retention").
std::string RetentionTable(const CacheStats& s) {
  std::string out = "<table id=\"retention\">\n<tr><th class=\"l\">tenant</th>";
  for (const char* state : {"cached", "evicted"}) {
    for (const char* cls : kRetentionClassNames)
      absl::StrAppend(&out, "<th>", state, " ", cls, "</th>");
  }
  out += "</tr>\n";
  for (const TenantUsage& t : s.tenants) {
    const std::string name = HtmlEscape(t.tenant);
    absl::StrAppend(&out, "<tr data-tenant=\"", name, "\">",
                    Td("l tenant", name));
    for (int r = 0; r < 3; ++r) {
      absl::StrAppend(&out, Td(absl::StrCat("cached-", kRetentionClassNames[r]),
                               FormatCount(t.cached_blocks_by_retention[r])));
    }
    for (int r = 0; r < 3; ++r) {
      absl::StrAppend(&out,
                      Td(absl::StrCat("evicted-", kRetentionClassNames[r]),
                         FormatCount(t.evicted_blocks_by_retention[r])));
    }
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

HttpResponse Html(std::string body) {
  return {200,
          "text/html; charset=utf-8",
          std::move(body),
          {{"Content-Security-Policy", kSecurityPolicy}}};
}

}  // namespace

std::string HtmlEscape(absl::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

void HitRateWindow::Record(absl::Time now, const CacheStats& stats) {
  MutexLock lock(&mu_);
  RecordLocked(now, stats);
}

void HitRateWindow::RecordLocked(absl::Time now, const CacheStats& stats) {
  Sample sample{now, {}};
  for (const TenantUsage& t : stats.tenants) {
    sample.tenants[t.tenant] = {t.match_hit_tokens, t.match_tokens};
  }
  samples_.push_back(std::move(sample));
  // Keep the newest sample at least `window_` old as the baseline.
  while (samples_.size() > 1 && samples_[1].time <= now - window_) {
    samples_.pop_front();
  }
}

HitRateWindow::Result HitRateWindow::Over(absl::Time now,
                                          const CacheStats& stats) {
  MutexLock lock(&mu_);
  RecordLocked(now, stats);
  const Sample& base = samples_.front();
  const Sample& last = samples_.back();
  Result result;
  result.span = last.time - base.time;
  for (const auto& [tenant, rate] : last.tenants) {
    Rate then;  // a tenant created since the baseline started from 0
    if (auto it = base.tenants.find(tenant); it != base.tenants.end()) {
      then = it->second;
    }
    result.tenants[tenant] = {rate.hit_tokens - then.hit_tokens,
                              rate.looked_up_tokens - then.looked_up_tokens};
  }
  return result;
}

StatusPage::StatusPage(const PrefixCache* cache, DaemonFacts info,
                       absl::Duration window, absl::Duration sample_interval)
    : cache_(cache),
      info_(std::move(info)),
      window_(window),
      hit_rates_(window) {
  hit_rates_.Record(absl::Now(), cache_->Stats(TenantScope::All()));
  sampler_ = std::make_unique<PeriodicThread>(sample_interval, [this] {
    hit_rates_.Record(absl::Now(), cache_->Stats(TenantScope::All()));
  });
}

std::string StatusPage::StatusHtml(absl::Time now) {
  const CacheStats stats = cache_->Stats(TenantScope::All());
  const HitRateWindow::Result window = hit_rates_.Over(now, stats);
  return absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"refresh\" content=\"",
      kRefreshSeconds, "\">\n<title>prefixd status</title>\n<style>", kStyle,
      "</style></head><body>\n<nav><b>prefixd</b><a href=\"/\">status</a>"
      "<a href=\"/plan\">KV calculator</a><a href=\"/metrics\">metrics</a>"
      "</nav>\n<main>\n<h1>prefixd ",
      HtmlEscape(info_.version), "</h1>\n", SummaryTable(info_, stats),
      "<h2>Tenants</h2>\n", TenantTable(stats, window_, window),
      "<h2>Evicted blocks by reason</h2>\n", EvictionTable(stats),
      "<h2>Blocks by retention priority</h2>\n", RetentionTable(stats),
      "<p class=\"muted\">Retention: low below 50, default 50 (unset or "
      "lapsed), high above 50; evicted counts the policy's evictions (budget, "
      "limit, requested).</p>\n",
      "<p class=\"muted\">Hit rate: prompt tokens matched / tokens looked "
      "up; the last ",
      absl::FormatDuration(window_),
      " counts from the daemon's start while it is younger. Reloads every ",
      kRefreshSeconds, " s; read at <span id=\"now\">",
      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", now, absl::UTCTimeZone()),
      "</span>.</p>\n</main></body></html>\n");
}

std::string StatusPage::PresetsJson() const {
  const ModelGeometry& g = info_.model.geometry;
  std::vector<std::string> presets;
  for (const std::string& name : PresetNames()) {
    absl::StatusOr<ModelPreset> p = FindPreset(name);
    if (!p.ok()) continue;
    presets.push_back(absl::StrCat(
        "{\"name\": ", JsonString(name), ", ", GeometryJson(p->geometry),
        ", \"source\": ", JsonString(p->source), "}"));
  }
  std::vector<std::string> gpus;
  for (const GpuModel& gpu : KnownGpus()) {
    gpus.push_back(absl::StrCat("{\"name\": ", JsonString(gpu.name),
                                ", \"memory_bytes\": ", gpu.memory_bytes, "}"));
  }
  std::vector<std::string> dtypes;
  for (KvDtype d : kDtypes) {
    dtypes.push_back(absl::StrCat("{\"name\": ", JsonString(KvDtypeName(d)),
                                  ", \"bits\": ", KvDtypeBits(d),
                                  ", \"scale_group\": ", KvDtypeScaleGroup(d),
                                  "}"));
  }
  return absl::StrCat(
      "{\"daemon\": {\"name\": ",
      JsonString(g.name.empty() ? info_.model_description : g.name), ", ",
      GeometryJson(g),
      ", \"kv_dtype\": ", JsonString(KvDtypeName(info_.model.kv_dtype)),
      ", \"block_size\": ", info_.model.block_size, "},\n\"presets\": [",
      absl::StrJoin(presets, ",\n "), "],\n\"gpus\": [",
      absl::StrJoin(gpus, ",\n "), "],\n\"dtypes\": [",
      absl::StrJoin(dtypes, ", "), "]}\n");
}

std::optional<HttpResponse> StatusPage::Handle(absl::string_view path) {
  if (path == "/") return Html(StatusHtml(absl::Now()));
  if (path == "/plan") return Html(absl::StrCat(kPlanHtml, kStyle, kPlanBody));
  if (path == "/plan.js") {
    return HttpResponse{200, "text/javascript; charset=utf-8", kPlanJs, {}};
  }
  if (path == "/plan/presets.json") {
    return HttpResponse{200, "application/json", PresetsJson(), {}};
  }
  return std::nullopt;
}

}  // namespace prefixd
