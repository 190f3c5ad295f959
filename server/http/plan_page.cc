#include "server/http/plan_page.h"

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/flag_parser.h"
#include "base/status_macros.h"
#include "model/kv_geometry.h"
#include "model/plan_report.h"
#include "model/planner.h"
#include "server/http/html.h"

namespace prefixd {
namespace {

using nlohmann::json;

constexpr char kPlanBody[] = R"html(<h1>KV cache for a batch</h1>
<p class="muted">Every figure below is computed by the daemon with the code of
<code>prefixctl plan</code>: the fields are its flags, the answer is what it prints
(<a href="#command">the command line</a>). kv_bytes = batch &times; the KV of one sequence of
context tokens: full-attention layers hold every token, sliding-window layers at most the
window, state layers their fixed state.</p>
<form id="inputs" autocomplete="off">
<div>
<label>model <select id="model"></select></label>
<label>or a config.json <input id="hf_config" type="file" accept=".json,application/json"></label>
</div><div>
<label>layers <input id="layers" type="text" inputmode="numeric"></label>
<label>KV heads <input id="kv_heads" type="text" inputmode="numeric"></label>
<label>head_dim <input id="head_dim" type="text" inputmode="numeric"></label>
<label>attention heads <input id="attention_heads" type="text" inputmode="numeric"></label>
<label>kv_lora_rank <input id="kv_lora_rank" type="text" inputmode="numeric" placeholder="0"></label>
<label>qk_rope_head_dim <input id="qk_rope_head_dim" type="text" inputmode="numeric"></label>
</div><div>
<label>sliding window <input id="sliding_window" type="text" inputmode="numeric" placeholder="0"></label>
<label>sliding layers <input id="sliding_layers" type="text" inputmode="numeric" placeholder="0"></label>
<label>state layers <input id="state_layers" type="text" inputmode="numeric" placeholder="0"></label>
<label>state bytes per layer <input id="state_bytes" type="text" placeholder="e.g. 1MiB"></label>
</div><div>
<label>KV dtype <select id="kv_dtype"></select></label>
<label>batch <input id="batch" type="text" value="32"></label>
<label>context <input id="context" type="text" value="8k"></label>
<label>weights <input id="weights" type="text" placeholder="e.g. 140GB"></label>
<label>overhead <input id="overhead" type="text" placeholder="0"></label>
<label>GPUs <input id="gpus" type="text" value="1xH100-80GB" list="gpu_names" style="width:11em"></label>
<datalist id="gpu_names"></datalist>
</div>
</form>
<p id="error"></p>
<div id="figures">
<ul id="notes" class="muted"></ul>
<table class="kv" id="summary"></table>
<div class="stack" id="pool_bar"><div class="w"></div><div class="o"></div><div class="k"></div></div>
<p class="muted" id="pool_key">The chosen GPUs:<span class="key" style="background:#8a94a6"></span>weights<span class="key" style="background:#b9c0cc"></span>overhead<span class="key" style="background:#3b7ddd"></span>KV cache, red when the three do not fit.</p>
<div id="tables"></div>
<p class="muted">Each GPU's bar is the cache alone against one GPU's memory; it turns red when the cache alone does not fit on one GPU.</p>
<p class="muted" id="command"></p>
</div>
)html";

// Renders /plan.json's answers; computes nothing. The fields are prefixctl
// plan's flags, the URL carries them.
constexpr char kPlanJs[] = R"js("use strict";
const $ = (id) => document.getElementById(id);
const GEOMETRY = ["layers", "kv_heads", "head_dim", "attention_heads", "kv_lora_rank",
  "qk_rope_head_dim", "sliding_window", "sliding_layers", "state_layers", "state_bytes"];
const RUN = ["kv_dtype", "batch", "context", "weights", "overhead", "gpus"];
let DATA = null;    // /plan/presets.json
let hfText = null;  // a config.json's text, sent with the next request only
let asked = 0;      // the newest request: older answers are dropped

// A 64-bit integer past 2^53 stays exact: its JSON text.
const parseExact = (text) => JSON.parse(text, (k, v, ctx) =>
  (typeof v === "number" && !Number.isSafeInteger(v) && ctx ? ctx.source : v));

function mlaFields() {
  const mla = !/^\s*0*\s*$/.test($("kv_lora_rank").value);
  $("kv_heads").disabled = mla;
  $("head_dim").disabled = mla;
  $("qk_rope_head_dim").disabled = !mla;
}

// The flags of the form, as /plan.json and prefixctl plan take them.
function query() {
  const q = new URLSearchParams();
  const model = $("model").value;
  if (hfText !== null) {
    q.set("hf_config_json", hfText);
  } else if (model !== "custom" && model !== "daemon") {
    q.set("model", model);
  } else {
    for (const f of GEOMETRY) {
      if (!$(f).disabled && $(f).value.trim() !== "") q.set(f, $(f).value.trim());
    }
  }
  for (const f of RUN) if ($(f).value.trim() !== "") q.set(f, $(f).value.trim());
  return q;
}

function command(q) {
  const quote = (v) => (/^[\w.,:@%+=-]+$/.test(v) ? v : "'" + v.replaceAll("'", "'\\''") + "'");
  const args = [...q].map(([k, v]) =>
    k === "hf_config_json" ? "--hf_config config.json" : "--" + k + " " + quote(v));
  return "prefixctl plan " + args.join(" ");
}

function setFlags(flags) {
  for (const f of GEOMETRY) $(f).value = flags[f] !== undefined ? flags[f] : "";
  mlaFields();
}

function cell(tag, text, key) {
  const c = document.createElement(tag);
  c.textContent = text;
  if (key !== undefined) c.dataset.key = key;
  return c;
}

function bar(percent, over) {
  const b = document.createElement("span");
  b.className = "bar" + (over ? " over" : "");
  const fill = document.createElement("span");
  fill.style.width = Math.min(100, Number(percent)) + "%";
  b.appendChild(fill);
  return b;
}

function summary(lines) {
  const t = $("summary");
  t.replaceChildren();
  for (const line of lines) {
    const tr = document.createElement("tr");
    tr.append(cell("th", line.label), cell("td", line.value, line.key));
    t.appendChild(tr);
  }
}

// The dtype x KV-head cells carry their exact bytes, the GPU rows their bar.
function decorate(t, tr, i, plan) {
  if (t.key === "kv" && plan.variants) {
    tr.dataset.dtype = plan.variants[0].dtypes[i].dtype;
    [...tr.cells].slice(1).forEach((td, v) => {
      td.dataset.variant = plan.variants[v].label;
      td.dataset.bytes = String(plan.variants[v].dtypes[i].kv_bytes);
    });
  } else if (t.key === "gpus" && plan.per_gpu) {
    const g = plan.per_gpu[i];
    tr.dataset.gpu = g.gpu;
    if (g.kv_exceeds_gpu) tr.className = "over";
    tr.cells[tr.cells.length - 1].appendChild(bar(g.kv_percent_of_gpu, g.kv_exceeds_gpu));
  }
}

function tables(list, plan) {
  const box = $("tables");
  box.replaceChildren();
  for (const t of list) {
    box.appendChild(cell("h2", t.title));
    if (t.rows.length === 0) continue;
    const table = document.createElement("table");
    table.id = t.key + "_table";
    t.rows.forEach((r, i) => {
      const tr = document.createElement("tr");
      r.forEach((text, c) => {
        const label = c < t.label_columns;
        const td = cell(i === 0 || label ? "th" : "td", text, t.keys[c]);
        if (label) td.className = "l";
        tr.appendChild(td);
      });
      if (i > 0) decorate(t, tr, i - 1, plan);
      table.appendChild(tr);
    });
    box.appendChild(table);
  }
}

function poolBar(plan) {
  const show = Boolean(plan.gpus && plan.kv_bytes !== undefined);
  $("pool_bar").hidden = !show;
  $("pool_key").hidden = !show;
  if (!show) return;
  const parts = [plan.weight_bytes, plan.overhead_bytes, plan.kv_bytes].map(Number);
  const need = parts[0] + parts[1] + parts[2];
  const scale = Math.max(Number(plan.gpus.total_bytes), need);
  [...$("pool_bar").children].forEach((d, i) => { d.style.width = (100 * parts[i] / scale) + "%"; });
  $("pool_bar").className = "stack" + (plan.gpus.fits ? "" : " over");
}

function render(a) {
  $("error").textContent = "";
  $("figures").classList.remove("stale");
  $("notes").replaceChildren(...a.notes.map((n) => cell("li", n)));
  summary(a.lines);
  tables(a.tables, a.plan);
  poolBar(a.plan);
}

async function ask(q) {
  const r = await fetch("/plan.json?" + q);
  const text = await r.text();
  try {
    return parseExact(text);
  } catch (e) {
    return {error: "the daemon answered " + r.status + ": " + text};
  }
}

// Asks the daemon for the form's figures, or for a shared link's flags.
// The fields show the answer's model unless the user is writing them.
async function compute(shared) {
  const mine = ++asked;
  document.body.dataset.busy = "1";
  const fill = Boolean(shared) || hfText !== null || $("model").value !== "custom";
  const q = shared || query();
  $("command").textContent = command(q);
  const answer = await ask(q).catch((e) => ({error: String(e)}));
  if (mine !== asked) return;
  if (answer.error !== undefined) {
    $("error").textContent = answer.error;
    $("figures").classList.add("stale");
  } else {
    render(answer);
    if (fill) setFlags(answer.model_flags);
    if (hfText !== null) $("model").value = "custom";
  }
  hfText = null;
  history.replaceState(null, "", "/plan?" + query());
  document.body.dataset.busy = "0";
}

function option(select, value, text) {
  const o = document.createElement("option");
  o.value = value;
  o.textContent = text;
  select.appendChild(o);
}

function chooseModel() {
  if ($("model").value === "daemon") {
    setFlags(DATA.daemon.flags);
    $("kv_dtype").value = DATA.daemon.kv_dtype;
  }
  compute();
}

function readConfig() {
  const file = $("hf_config").files[0];
  if (!file) return;
  document.body.dataset.busy = "1";  // from now: the answer is on its way
  file.text().then((text) => { hfText = text; $("hf_config").value = ""; compute(); });
}

// A shared link: its flags fill the form and are asked as they are.
function fromUrl() {
  const q = new URLSearchParams(location.search);
  if ([...q.keys()].length === 0) return null;
  const geometry = GEOMETRY.some((f) => q.has(f));
  $("model").value = q.has("model") && !geometry ? q.get("model") : "custom";
  if ($("model").value === "") $("model").value = "custom";
  for (const f of [...GEOMETRY, ...RUN]) if (q.has(f)) $(f).value = q.get(f);
  mlaFields();
  return q;
}

async function main() {
  DATA = await (await fetch("/plan/presets.json")).json();
  option($("model"), "daemon", "this daemon: " + DATA.daemon.name);
  for (const p of DATA.presets) option($("model"), p, p);
  option($("model"), "custom", "custom");
  for (const d of DATA.dtypes) option($("kv_dtype"), d, d);
  for (const g of DATA.gpus) option($("gpu_names"), g, g);
  $("inputs").addEventListener("input", (e) => {
    if (e.target.tagName === "SELECT" || e.target.type === "file") return;
    if (GEOMETRY.includes(e.target.id)) $("model").value = "custom";
    mlaFields();
    compute();
  });
  $("model").addEventListener("change", chooseModel);
  $("kv_dtype").addEventListener("change", () => compute());
  $("hf_config").addEventListener("change", readConfig);
  $("inputs").addEventListener("submit", (e) => e.preventDefault());
  const shared = fromUrl();
  if (shared === null) {
    $("model").value = "daemon";
    setFlags(DATA.daemon.flags);
    $("kv_dtype").value = DATA.daemon.kv_dtype;
  }
  await compute(shared);
  document.body.dataset.ready = "1";
}
main();
)js";

// The flags the page may send: prefixctl plan's, less those that read
// files or change the output's form.
absl::StatusOr<std::vector<std::string>> PlanArgs(absl::string_view query) {
  ASSIGN_OR_RETURN(const auto params, ParseQuery(query));
  std::vector<std::string> args;
  for (const auto& [name, value] : params) {
    if (name == "hf_config" ||
        (name == "model" && absl::EndsWith(value, ".json"))) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "=", value,
                       ": the daemon reads no files; send the "
                       "config.json's text as hf_config_json"));
    }
    if (name == "help" || name == "json") {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": not a flag of /plan.json (it answers JSON)"));
    }
    args.push_back(absl::StrCat("--", name, "=", value));
  }
  return args;
}

json TablesJson(const std::vector<PlanTable>& tables) {
  json out = json::array();
  for (const PlanTable& t : tables) {
    out.push_back({{"key", t.key},
                   {"title", t.title},
                   {"keys", t.keys},
                   {"rows", t.rows},
                   {"label_columns", t.label_columns}});
  }
  return out;
}

json ReportJson(const PlanReport& r) {
  json lines = json::array();
  for (const PlanLine& line : r.lines) {
    lines.push_back(
        {{"key", line.key}, {"label", line.label}, {"value", line.value}});
  }
  json flags = json::object();
  for (const auto& [name, value] : GeometryFlags(r.model)) flags[name] = value;
  return {{"plan", json::parse(r.json)},
          {"notes", r.notes},
          {"lines", std::move(lines)},
          {"tables", TablesJson(r.tables)},
          {"model_flags", std::move(flags)}};
}

// Names and messages may carry the request's bytes, which need not be
// UTF-8: those are written as U+FFFD rather than thrown.
std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

HttpResponse ErrorJson(absl::string_view message) {
  return JsonResponse(400, Dump(json{{"error", std::string(message)}}));
}

// The KV dtypes the calculator offers (model/kv_geometry.h).
constexpr KvDtype kDtypes[] = {KvDtype::kFp32, KvDtype::kFp16, KvDtype::kBf16,
                               KvDtype::kFp8,  KvDtype::kInt8, KvDtype::kInt4,
                               KvDtype::kNvfp4};

}  // namespace

HttpResponse PlanPage::PlanJson(absl::string_view query) {
  absl::StatusOr<std::vector<std::string>> args = PlanArgs(query);
  if (!args.ok()) return ErrorJson(args.status().message());
  absl::StatusOr<ParsedFlags> flags = ParsedFlags::Parse(PlanFlags(), *args);
  if (!flags.ok()) return ErrorJson(flags.status().message());
  absl::StatusOr<PlanReport> report = MakePlanReport(*flags);
  if (!report.ok()) return ErrorJson(report.status().message());
  return JsonResponse(200, Dump(ReportJson(*report)));
}

std::string PlanPage::PresetsJson() const {
  const ModelGeometry& g = facts_.model.geometry;
  json flags = json::object();
  for (const auto& [name, value] : GeometryFlags(g)) flags[name] = value;
  json gpus = json::array();
  for (const GpuModel& gpu : KnownGpus()) gpus.push_back(gpu.name);
  json dtypes = json::array();
  for (KvDtype d : kDtypes) dtypes.push_back(std::string(KvDtypeName(d)));
  return Dump(
      json{{"daemon",
            {{"name", g.name.empty() ? facts_.model_description : g.name},
             {"kv_dtype", std::string(KvDtypeName(facts_.model.kv_dtype))},
             {"flags", std::move(flags)}}},
           {"presets", PresetNames()},
           {"gpus", std::move(gpus)},
           {"dtypes", std::move(dtypes)}});
}

std::optional<HttpResponse> PlanPage::Handle(const HttpRequest& request) const {
  const std::string& path = request.path;
  if (path == "/plan") {
    return HtmlResponse(
        absl::StrCat(PageStart("prefixd KV calculator"), kPlanBody,
                     PageEnd("<script src=\"/plan.js\"></script>\n")));
  }
  if (path == "/plan.js") {
    return HttpResponse{200, "text/javascript; charset=utf-8", kPlanJs, {}};
  }
  if (path == "/plan.json") return PlanJson(request.query);
  if (path == "/plan/presets.json") return JsonResponse(200, PresetsJson());
  return std::nullopt;
}

}  // namespace prefixd
