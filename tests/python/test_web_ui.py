#!/usr/bin/python3
"""The daemon's web pages in a real browser: Debian's chromium, headless,
driven through chromedriver by Debian's python3-selenium.

The real prefixd serves / (status) and /plan (the KV calculator) on its
metrics listener. The test drives traffic from two tenants, one named like
a script tag, then:

- /: reads epoch, geometry, budget, every tenant's cached blocks, leases,
  hit rates and evictions by reason, and checks them against Stats over
  gRPC; the script-named tenant shows as text (escaped), and nothing on
  either page is loaded from anywhere but the daemon;
- /'s plots (inline SVG): the hit rate, cached blocks against the budget
  and evictions by reason carry the counts they are drawn from, which add
  up to what /metrics reports; with the fleet index (a second daemon fed
  by a vLLM-format publisher) the workers table equals ListWorkers, the
  routing counters and the Route rate and event lag plots equal /metrics,
  and a worker named like a script tag shows as text;
- /plan: sets the form like a user (model, geometry, dtype, batch,
  context, weights, GPUs) and checks every line the page shows against
  `prefixctl plan --batch ...`'s text and every cell and GPU row against its
  --json, for the same flags: Llama-3 (the 70B table, the 8B crossover, a
  custom geometry), DeepSeek-V3 (MLA: one column, the latent in the form,
  not one KV head), Gemma-2-9B, Jamba, Qwen3-Next and a model whose every
  layer slides; a size without a unit and other bad input get the CLI's
  message with the old figures dimmed; the page fills from its URL and keeps
  its flags there (a shared link shows the same); a config.json chosen in
  the page gives `--hf_config`'s figures, a broken one the parser's message;
- POST, PUT and DELETE are refused with 405 and change nothing;
- docs/metrics.md's chromium command for a screenshot by hand works as shown
  (as root only with --no-sandbox).

Writes a screenshot of each page (status.png, plan.png, and
status_index.png: the index's tables and the plots) to --screenshots
(docs/img holds copies for docs/metrics.md and docs/capacity.md).

Usage: test_web_ui.py --prefixd PATH --prefixctl PATH [--screenshots DIR]
Exits 77 (skip) when chromium, chromedriver or selenium is absent.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import common


def _extra(ap):
    ap.add_argument("--prefixctl", help="the prefixctl binary")
    ap.add_argument("--screenshots", help="directory for the screenshots (*.png)")


ARGS = common.setup(__doc__, _extra)

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait
except ImportError:
    webdriver = None
if webdriver is None or not os.path.exists(CHROMIUM) or not os.path.exists(CHROMEDRIVER):
    print("skip: needs chromium, chromium-driver and python3-selenium")
    sys.exit(77)

import prefixd  # noqa: E402
import prefixd_fixture  # noqa: E402

BLOCK = 16
# Llama-3-8B fp16 (the default model): 2 MiB blocks, 16 of them.
CONFIG = 'kv_budget: "32MiB"\nblock_size: %d\ndrain_timeout: "2s"\n' % BLOCK
EVIL = "<script>document.title='owned'</script><b>x</b>"

DAEMON = None
BROWSER = None


def tokens(first_block, n_blocks):
    return [b * BLOCK + j for b in range(first_block, first_block + n_blocks) for j in range(BLOCK)]


def http(method, url):
    req = urllib.request.Request(url, method=method, data=b"" if method != "GET" else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def setUpModule():
    global DAEMON, BROWSER
    if not ARGS.prefixd or not ARGS.prefixctl:
        raise unittest.SkipTest("--prefixd and --prefixctl are required")
    DAEMON = prefixd_fixture.Daemon(ARGS.prefixd, CONFIG).start()
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,1080", "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    BROWSER = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def tearDownModule():
    if BROWSER is not None:
        BROWSER.quit()
    if DAEMON is not None:
        rc = DAEMON.stop()
        logs = DAEMON.logs()
        DAEMON.close()
        if rc != 0:
            raise AssertionError("prefixd exited %s on SIGTERM:\n%s" % (rc, logs))


def base():
    return "http://" + DAEMON.metrics


def screenshot(name):
    if ARGS.screenshots:
        os.makedirs(ARGS.screenshots, exist_ok=True)
        BROWSER.save_screenshot(os.path.join(ARGS.screenshots, name))


def only_same_origin(test, origin=None):
    """Every resource the page loaded came from the daemon (at `origin`)."""
    urls = BROWSER.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
        ".concat([...document.querySelectorAll('[src],[href]')]"
        ".map(e => e.src || e.href))")
    for url in urls:
        test.assertTrue(url.startswith((origin or base()) + "/"), url)


def prefixctl_json(*args):
    out = subprocess.run([ARGS.prefixctl, "plan", "--json"] + list(args), check=True,
                         capture_output=True, text=True, timeout=30).stdout
    return json.loads(out)


def prefixctl_text(*args):
    return subprocess.run([ARGS.prefixctl, "plan"] + list(args), check=True,
                          capture_output=True, text=True, timeout=30).stdout


def metric(text, name, **labels):
    """The sum of the samples of `name` in Prometheus text whose labels
    include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not (line.startswith(name + "{") or
                                        line.startswith(name + " ")):
            continue
        series, value = line.rsplit(" ", 1)
        if all('%s="%s"' % kv in series for kv in labels.items()):
            total += float(value)
    return total


def scrape():
    status, _, body = http("GET", base() + "/metrics")
    assert status == 200, status
    return body


# Every plot: each line's drawn values and the raw per-interval counts.
READ_PLOTS = """
const num = (s) => s.split(' ').map(Number);
return Object.fromEntries([...document.querySelectorAll('figure.plot')].map((f) => [f.id,
  {svg: f.querySelectorAll('svg').length, caption: f.querySelector('figcaption').textContent,
   lines: Object.fromEntries([...f.querySelectorAll('path[data-series]')].map((p) => [
     p.dataset.series, Object.fromEntries([...p.attributes]
       .filter((a) => a.name.startsWith('data-') && a.name != 'data-series')
       .map((a) => [a.name.slice(5), num(a.value)]).concat([['d', p.getAttribute('d')]]))]))}]));
"""


# Everything the status page shows, read in one script so that its reload
# (every 5 s) cannot happen halfway through.
READ_STATUS = """
const text = (id) => document.getElementById(id).textContent;
const rows = (table) => [...document.querySelectorAll('#' + table + ' tr[data-tenant]')].map(
  (tr) => [tr.dataset.tenant, Object.fromEntries([...tr.cells].map(
    (td) => [td.className.split(' ').pop(), td.textContent]))]);
return {title: document.title, epoch: text('epoch'), geometry: text('geometry'),
        budget: text('budget'), resident: text('resident'), now: text('now'),
        tenants: Object.fromEntries(rows('tenants')),
        evictions: Object.fromEntries(rows('evictions')),
        retention: Object.fromEntries(rows('retention')),
        bold: document.querySelectorAll('td b').length,
        scripts: document.querySelectorAll('script').length};
"""


class StatusPageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        acme = prefixd.Client(DAEMON.tcp, tenant="acme")
        evil = prefixd.Client(DAEMON.tcp, tenant=EVIL)
        cls.clients = (acme, evil)
        acme.insert(tokens(0, 4), [100, 101, 102, 103])
        acme.match(tokens(0, 4) + [1])          # 64 of 65 tokens hit
        cls.lease = acme.match(tokens(0, 2), pin=True).lease  # 32 of 32
        acme.match(tokens(50, 1))               # 0 of 16
        acme.evict(1)                            # one requested eviction
        evil.insert(tokens(10, 2), [200, 201])
        evil.match(tokens(10, 2))               # 32 of 32
        # 5 blocks cached of 16: 12 more evict one by budget.
        evil.insert(tokens(20, 12), list(range(300, 312)))
        evil.invalidate([311])                   # one invalidated
        cls.stats = acme.stats(all_tenants=True)
        BROWSER.get(base() + "/")
        cls.page = BROWSER.execute_script(READ_STATUS)
        screenshot("status.png")

    @classmethod
    def tearDownClass(cls):
        cls.lease.release()
        for c in cls.clients:
            c.close()

    def test_summary(self):
        page = self.page
        self.assertEqual(page["title"], "prefixd status")
        self.assertEqual(page["epoch"], "%016x" % self.stats.epoch)
        self.assertEqual(page["geometry"], "llama-3-8b: 32 layers, 8 KV heads, 32 attention "
                         "heads, head_dim 128; fp16: 131,072 B (128 KiB) per token")
        self.assertEqual(page["budget"], "32 MiB = 16 blocks")
        self.assertEqual(self.stats.budget_blocks, 16)
        resident = sum(t.cached_blocks for t in self.stats.tenants)
        self.assertEqual(resident, 15)  # 4 - 1 requested - 1 budget + 2 + 12 - 1 invalidated
        self.assertEqual(page["resident"], "15 blocks (30 MiB, 93.8% of the budget)")
        only_same_origin(self)

    def test_tenants_match_stats(self):
        page = self.page
        self.assertEqual(sorted(page["tenants"]), sorted(["acme", EVIL]))
        self.assertEqual(sorted(t.tenant for t in self.stats.tenants), sorted(page["tenants"]))
        for t in self.stats.tenants:
            row = page["tenants"][t.tenant]
            self.assertEqual(row["cached"], str(t.cached_blocks), t.tenant)
            self.assertEqual(row["pinned"], str(t.pinned_blocks), t.tenant)
            self.assertEqual(row["leases"], str(t.active_leases), t.tenant)
            self.assertEqual(row["matches"], str(t.match_requests), t.tenant)
            self.assertEqual(row["inserts"], str(t.insert_requests), t.tenant)
            evicted = {e.reason: e.blocks for e in t.evictions}
            for reason in ("budget", "limit", "requested", "invalidated", "reset"):
                self.assertEqual(page["evictions"][t.tenant][reason],
                                 str(evicted.get(reason, 0)), (t.tenant, reason))
            self.assertEqual([c.retention for c in t.retention], ["low", "default", "high"])
            for c in t.retention:
                cells = page["retention"][t.tenant]
                self.assertEqual(cells["cached-" + c.retention], str(c.cached_blocks),
                                 (t.tenant, c.retention))
                self.assertEqual(cells["evicted-" + c.retention], str(c.evicted_blocks),
                                 (t.tenant, c.retention))
        acme, evil = page["tenants"]["acme"], page["tenants"][EVIL]
        # Everything happened within the window: the recent rate is the total.
        self.assertEqual(acme["hit"], "85.0% (96/113)")
        self.assertEqual(acme["recent"], "85.0% (96/113)")
        self.assertEqual(acme["leases"], "1")
        self.assertEqual(acme["pinned"], "2")
        self.assertEqual(evil["recent"], "100.0% (32/32)")
        self.assertEqual(page["evictions"]["acme"]["requested"], "1")
        self.assertEqual(page["evictions"][EVIL]["invalidated"], "1")
        self.assertEqual(sum(int(page["evictions"][t]["budget"]) for t in page["evictions"]), 1)
        # No hints: every block is of the default class, and the policy's
        # evictions (budget, requested) count there; invalidations do not.
        self.assertEqual(page["retention"]["acme"]["cached-default"], acme["cached"])
        self.assertEqual(int(page["retention"]["acme"]["evicted-default"])
                         + int(page["retention"][EVIL]["evicted-default"]), 2)

    def test_tenant_name_is_text(self):
        # Shown exactly, as text: had it been markup, the <script> and <b>
        # would be elements and the cell's text would be just "x".
        self.assertEqual(self.page["tenants"][EVIL]["tenant"], EVIL)
        self.assertEqual(self.page["bold"], 0)
        self.assertEqual(self.page["scripts"], 0)
        self.assertEqual(self.page["title"], "prefixd status")
        status, headers, body = http("GET", base() + "/")
        self.assertEqual(status, 200)
        self.assertIn("default-src 'none'", headers["Content-Security-Policy"])
        self.assertIn("&lt;script&gt;document.title=&#39;owned&#39;&lt;/script&gt;", body)
        self.assertNotIn(EVIL, body)

    def test_plots_add_up_to_the_metrics(self):
        # The drawn counts come from the same counters as /metrics: with no
        # traffic in between, every series' intervals add up to its total
        # (the daemon is younger than the plots' hour).
        BROWSER.get(base() + "/")
        plots = BROWSER.execute_script(READ_PLOTS)
        text = scrape()
        self.assertEqual(sorted(plots), ["plot-cached", "plot-evictions", "plot-hit-rate"])
        for plot in plots.values():
            self.assertEqual(plot["svg"], 1)
        hit = plots["plot-hit-rate"]["lines"]["hit rate"]
        self.assertEqual(sum(hit["hit-tokens"]), metric(text, "prefixd_match_hit_tokens_total"))
        self.assertEqual(sum(hit["looked-up-tokens"]), metric(text, "prefixd_match_tokens_total"))
        self.assertGreater(sum(hit["looked-up-tokens"]), 0)
        # The last interval's rate is its own counts'.
        last = [i for i, n in enumerate(hit["looked-up-tokens"]) if n > 0][-1]
        self.assertAlmostEqual(hit["values"][last],
                               100 * hit["hit-tokens"][last] / hit["looked-up-tokens"][last],
                               places=3)
        cached = plots["plot-cached"]["lines"]
        self.assertEqual(cached["cached blocks"]["values"][-1], metric(text, "prefixd_cached_blocks"))
        self.assertEqual(set(cached["budget"]["values"]), {16})
        evictions = plots["plot-evictions"]["lines"]
        self.assertEqual(sorted(evictions),
                         sorted(["budget", "limit", "requested", "invalidated", "reset"]))
        for reason, line in evictions.items():
            self.assertEqual(sum(line["blocks"]),
                             metric(text, "prefixd_evicted_blocks_total", reason=reason), reason)
        self.assertEqual(sum(evictions["budget"]["blocks"]), 1)
        # Drawn: every line has a path, the last point at the right edge.
        self.assertTrue(hit["d"].startswith("M"), hit["d"])
        self.assertRegex(cached["cached blocks"]["d"], r"L548\.0 [0-9.]+ $")
        self.assertIsNone(BROWSER.execute_script("return document.getElementById('workers')"))
        only_same_origin(self)

    def test_reloads_itself(self):
        acme = self.clients[0]
        before = BROWSER.execute_script(READ_STATUS)
        acme.match(tokens(0, 1))
        WebDriverWait(BROWSER, 15, poll_frequency=0.5).until(
            lambda b: b.execute_script(READ_STATUS)["now"] != before["now"])
        after = BROWSER.execute_script(READ_STATUS)
        self.assertEqual(int(after["tenants"]["acme"]["matches"]),
                         int(before["tenants"]["acme"]["matches"]) + 1)

    def test_read_only(self):
        acme = self.clients[0]
        before = acme.stats(all_tenants=True)
        for method in ("POST", "PUT", "DELETE"):
            for path in ("/", "/plan", "/metrics"):
                status, headers, _ = http(method, base() + path)
                self.assertEqual(status, 405, (method, path))
                self.assertEqual(headers.get("Allow"), "GET, HEAD")
        after = acme.stats(all_tenants=True)
        self.assertEqual(before.SerializeToString(), after.SerializeToString())


# The fleet index's tables: the workers (cells by class, blocks by medium)
# and the routing counters.
READ_INDEX = """
const cells = (tr) => Object.fromEntries([...tr.cells].map(
  (td) => [td.className.split(' ').pop(), td.textContent]));
return {workers: Object.fromEntries([...document.querySelectorAll('#workers tr[data-worker]')]
          .map((tr) => [tr.dataset.worker, cells(tr)])),
        mediums: Object.fromEntries([...document.querySelectorAll('#workers tr[data-worker]')]
          .map((tr) => [tr.dataset.worker, Object.fromEntries(
            [...tr.querySelectorAll('[data-medium]')].map(
              (s) => [s.dataset.medium, s.textContent.split(' ').pop()]))])),
        routing: Object.fromEntries([...document.querySelectorAll('#routing td[id]')]
          .map((td) => [td.id, td.textContent])),
        bold: document.querySelectorAll('td b').length};
"""


READ_PLAN = """
const line = (k) => document.querySelector('#summary td[data-key="' + k + '"]')?.textContent;
const cells = [...document.querySelectorAll('#kv_table tr[data-dtype]')].flatMap(
  (tr) => [...tr.querySelectorAll('td[data-variant]')].map((td) => ({
    dtype: tr.dataset.dtype, variant: td.dataset.variant, text: td.textContent,
    bytes: td.dataset.bytes})));
const gpus = Object.fromEntries([...document.querySelectorAll('#gpus_table tr[data-gpu]')].map(
  (tr) => { const bar = tr.querySelector('td[data-key=alone] .bar');
    return [tr.dataset.gpu, {
      need: Number(tr.querySelector('td[data-key=need]').textContent.replaceAll(',', '')),
      pct: Number(tr.querySelector('td[data-key=pct]').textContent.replace('%', '').replaceAll(',', '')),
      over: bar.classList.contains('over'),
      color: getComputedStyle(bar.firstChild).backgroundColor}]; }));
const fields = Object.fromEntries([...document.querySelectorAll('#inputs input[type=text], #inputs select')]
  .map((e) => [e.id, {value: e.value, disabled: e.disabled}]));
return {lines: Object.fromEntries([...document.querySelectorAll('#summary td[data-key]')].map(
          (td) => [td.parentElement.firstChild.textContent, td.textContent])),
        kv: line('kv'), kv_title: document.querySelector('#tables h2')?.textContent,
        error: document.getElementById('error').textContent,
        stale: document.getElementById('figures').classList.contains('stale'),
        notes: [...document.querySelectorAll('#notes li')].map((li) => li.textContent),
        command: document.getElementById('command').textContent,
        search: location.search, cells, gpus, fields};
"""


def cli_error(*args):
    """prefixctl plan's message for bad flags (stderr, its prefix removed)."""
    r = subprocess.run([ARGS.prefixctl, "plan"] + list(args), capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0, (args, r.stdout)
    return r.stderr.strip().removeprefix("prefixctl plan: ")


def cli_lines(text):
    """prefixctl plan's "Label   value" lines (labels are padded to 18)."""
    return {l[:18].rstrip(): l[18:] for l in text.split("\n\n")[0].splitlines()
            if not l.startswith("note: ")}


HF_CONFIGS = os.path.join(common.REPO, "tests", "data", "hf_configs")


class PlanPageTest(unittest.TestCase):
    maxDiff = None
    """The calculator renders what the daemon answers with prefixctl plan's
    code: every line and cell is compared with the CLI's for the same flags."""

    def setUp(self):
        self.open("/plan")

    def open(self, path):
        BROWSER.get(base() + path)
        WebDriverWait(BROWSER, 10).until(
            lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
        self.idle()

    def idle(self):
        WebDriverWait(BROWSER, 10, poll_frequency=0.05).until(
            lambda b: b.execute_script("return document.body.dataset.busy") == "0")

    def set(self, **fields):
        """Types into the form like a user (a select: picks the option)."""
        for name, value in fields.items():
            el = BROWSER.find_element(By.ID, name)
            if el.tag_name == "select":
                Select(el).select_by_value(value)
            else:
                el.clear()
                if value:
                    el.send_keys(value)
                else:
                    BROWSER.execute_script(
                        "arguments[0].dispatchEvent(new Event('input', {bubbles: true}))", el)
            self.idle()

    def read(self):
        page = BROWSER.execute_script(READ_PLAN)
        page["cells"] = {(c["dtype"], c["variant"]): (c["text"], int(c["bytes"]))
                         for c in page["cells"]}
        return page

    def assert_like_cli(self, *args):
        """The page's lines equal prefixctl plan's text, its cells and GPU rows
        the --json figures, and the command it shows is those flags."""
        page = self.read()
        self.assertEqual(page["error"], "")
        self.assertFalse(page["stale"])
        text = prefixctl_text(*args)
        self.assertEqual(page["lines"], cli_lines(text))
        cli = prefixctl_json(*args)
        cells = page["cells"]
        for v in cli["variants"]:
            for d in v["dtypes"]:
                self.assertEqual(cells[(d["dtype"], v["label"])][1], d["kv_bytes"],
                                 (d["dtype"], v["label"]))
        self.assertEqual(len(cells), sum(len(v["dtypes"]) for v in cli["variants"]))
        for g in cli["per_gpu"]:
            row = page["gpus"][g["gpu"]]
            self.assertEqual(row["need"], g["gpus_needed"], g["gpu"])
            self.assertEqual(row["pct"], g["kv_percent_of_gpu"], g["gpu"])
            self.assertEqual(row["over"], g["kv_exceeds_gpu"], g["gpu"])
        return cli, page

    def test_defaults_to_the_daemons_geometry(self):
        page = self.read()
        self.assertEqual(page["fields"]["model"]["value"], "daemon")
        self.assertEqual(page["fields"]["layers"]["value"], "32")
        self.assertEqual(page["error"], "")
        self.assertEqual(page["command"], "prefixctl plan --layers 32 --kv_heads 8 --head_dim 128 "
                         "--attention_heads 32 --kv_dtype fp16 --batch 32 --context 8k "
                         "--gpus 1xH100-80GB")
        self.assert_like_cli(*page["command"].split()[2:])
        only_same_origin(self)

    def test_70b_table_and_int4_row(self):
        self.set(model="llama-3-70b", kv_dtype="fp16", batch="32", context="8k",
                 weights="140GB")
        cli, page = self.assert_like_cli("--model", "llama-3-70b", "--kv_dtype", "fp16",
                                         "--batch", "32", "--context", "8k", "--weights",
                                         "140GB", "--gpus", "1xH100-80GB")
        cells = page["cells"]
        self.assertEqual([cells[("fp16", v)][0] for v in ("MHA-64", "GQA-8", "MQA-1")],
                         ["640 GiB", "80 GiB", "10 GiB"])
        self.assertEqual([cells[("int4", v)][0] for v in ("MHA-64", "GQA-8", "MQA-1")],
                         ["160 GiB", "20 GiB", "2.5 GiB"])
        self.assertEqual(page["kv"], "85,899,345,920 B (80 GiB) = 262,144 tokens x 327,680 B")
        # The fields show the preset's geometry.
        self.assertEqual(page["fields"]["layers"]["value"], "80")
        self.assertEqual(page["fields"]["kv_heads"]["value"], "8")
        # 80 GiB of cache alone exceeds an 80 GB card (red bar), not a 141 GB one.
        self.assertTrue(page["gpus"]["H100-80GB"]["over"])
        self.assertEqual(page["gpus"]["H100-80GB"]["color"], "rgb(214, 69, 69)")
        self.assertFalse(page["gpus"]["H200-141GB"]["over"])
        self.assertEqual(page["gpus"]["H200-141GB"]["color"], "rgb(59, 125, 221)")
        screenshot("plan.png")

    def test_llama8b_crossover(self):
        self.set(model="llama-3-8b", kv_dtype="fp16", batch="1", context="114441",
                 weights="15GB", gpus="L4-24GB")
        cli, page = self.assert_like_cli("--model", "llama-3-8b", "--batch", "1", "--context",
                                         "114441", "--weights", "15GB", "--gpus", "L4-24GB")
        self.assertTrue(page["lines"]["Decode crossover"].startswith("114,441 cached tokens"))
        self.assertEqual(page["lines"]["GPUs"], "1 x L4-24GB = 24 GB: do not fit, 5.59 GiB short")
        self.assertEqual(cli["crossover_tokens"], 114441)

    def test_custom_geometry_over_a_preset(self):
        self.set(model="llama-3-70b")
        self.set(kv_heads="4", kv_dtype="fp8", batch="7", context="3000", weights="16.06GB",
                 overhead="2GiB")
        page = self.read()
        self.assertEqual(page["fields"]["model"]["value"], "custom")
        cli, _ = self.assert_like_cli("--layers", "80", "--kv_heads", "4", "--head_dim", "128",
                                      "--attention_heads", "64", "--kv_dtype", "fp8", "--batch",
                                      "7", "--context", "3000", "--weights", "16.06GB",
                                      "--overhead", "2GiB", "--gpus", "1xH100-80GB")
        self.assertEqual(cli, prefixctl_json("--model", "llama-3-70b", "--kv_heads", "4",
                                             "--kv_dtype", "fp8", "--batch", "7", "--context",
                                             "3000", "--weights", "16.06GB", "--overhead",
                                             "2GiB", "--gpus", "1xH100-80GB")
                         | {"model": cli["model"]})

    def test_deepseek_v3_mla_in_nvfp4(self):
        # One latent per layer, shared by all heads: one column, "MLA", and
        # the form shows the latent, not "KV heads 1, head_dim 64".
        self.set(model="deepseek-v3", kv_dtype="nvfp4", batch="2", context="1000",
                 weights="671GB")
        cli, page = self.assert_like_cli("--model", "deepseek-v3", "--kv_dtype", "nvfp4",
                                         "--batch", "2", "--context", "1000", "--weights",
                                         "671GB", "--gpus", "1xH100-80GB")
        self.assertEqual(cli["kv_bytes"], 2 * 1000 * 19764)
        self.assertEqual(sorted({v for (_, v) in page["cells"]}), ["MLA"])
        self.assertEqual(page["cells"][("fp16", "MLA")][1], 2 * 1000 * 70272)
        self.assertIn("MLA (kv_lora_rank 512, qk_rope_head_dim 64)", page["lines"]["Model"])
        f = page["fields"]
        self.assertEqual((f["kv_heads"]["value"], f["kv_heads"]["disabled"]), ("", True))
        self.assertEqual((f["head_dim"]["value"], f["head_dim"]["disabled"]), ("", True))
        self.assertEqual(f["kv_lora_rank"]["value"], "512")
        self.assertEqual((f["qk_rope_head_dim"]["value"], f["qk_rope_head_dim"]["disabled"]),
                         ("64", False))
        # Edited, it stays MLA: the flags are the latent's.
        self.set(layers="30")
        self.assert_like_cli("--layers", "30", "--attention_heads", "128", "--kv_lora_rank",
                             "512", "--qk_rope_head_dim", "64", "--kv_dtype", "nvfp4", "--batch",
                             "2", "--context", "1000", "--weights", "671GB", "--gpus",
                             "1xH100-80GB")

    def test_sliding_window_and_state_layers(self):
        self.set(model="gemma-2-9b", kv_dtype="fp16", batch="4", context="8k", weights="10GB")
        cli, page = self.assert_like_cli("--model", "gemma-2-9b", "--kv_dtype", "fp16",
                                         "--batch", "4", "--context", "8k", "--weights", "10GB",
                                         "--gpus", "1xH100-80GB")
        self.assertEqual(cli["sequence_bytes"], 2113929216)
        self.assertIn("Per sequence", page["lines"])
        self.set(model="jamba-v0.1", kv_dtype="nvfp4", batch="3", context="5000",
                 weights="100GB")
        cli, _ = self.assert_like_cli("--model", "jamba-v0.1", "--kv_dtype", "nvfp4",
                                      "--batch", "3", "--context", "5000", "--weights", "100GB",
                                      "--gpus", "1xH100-80GB")
        self.assertEqual(cli["kv_bytes"], 3 * (5000 * 4 * 1152 + 28 * 311296))
        self.set(model="qwen3-next-80b-a3b", kv_dtype="bf16", batch="16", context="32k",
                 weights="160GB")
        self.assert_like_cli("--model", "qwen3-next-80b-a3b", "--kv_dtype", "bf16", "--batch",
                             "16", "--context", "32k", "--weights", "160GB", "--gpus",
                             "1xH100-80GB")

    def test_every_layer_sliding_is_never_crossed(self):
        self.set(model="llama-3-8b")
        self.set(sliding_window="1024", sliding_layers="32", batch="2", context="8k",
                 weights="16GB")
        cli, page = self.assert_like_cli(
            "--layers", "32", "--kv_heads", "8", "--head_dim", "128", "--attention_heads", "32",
            "--sliding_window", "1024", "--sliding_layers", "32", "--batch", "2", "--context",
            "8k", "--weights", "16GB", "--gpus", "1xH100-80GB")
        self.assertEqual(cli["crossover_context"], 0)
        self.assertTrue(page["lines"]["Decode crossover"].startswith("never at batch 2"))

    def test_a_unitless_size_is_refused_as_the_cli_refuses_it(self):
        # "140" is not 140 bytes: the CLI refuses it, and so does the page,
        # in the CLI's words, with the old figures dimmed.
        self.set(model="llama-3-70b", batch="32", context="8k", weights="140GB")
        before = self.read()
        self.set(weights="140")
        page = self.read()
        self.assertEqual(page["error"], cli_error("--model", "llama-3-70b", "--batch", "32",
                                                  "--context", "8k", "--weights", "140"))
        self.assertIn("--weights", page["error"])
        self.assertTrue(page["stale"])
        self.assertEqual(page["lines"], before["lines"])  # dimmed, not changed
        self.set(weights="140GB")
        self.assertFalse(self.read()["stale"])

    def test_bad_input_gets_the_cli_message(self):
        base_flags = ["--model", "llama-3-8b", "--kv_dtype", "fp16", "--context", "8k",
                      "--gpus", "1xH100-80GB"]
        self.set(model="llama-3-8b")
        for fields, flags in [
                (dict(batch="0"), ["--batch", "0"]),
                (dict(batch="2", weights="1.5B"), ["--batch", "2", "--weights", "1.5B"]),
                (dict(weights="", context="8q"), ["--batch", "2", "--context", "8q"]),
                (dict(context="8k", gpus="3xH100"), ["--batch", "2", "--gpus", "3xH100"])]:
            self.set(**fields)
            page = self.read()
            self.assertEqual(page["error"], cli_error(*(base_flags + flags)), fields)
            self.assertTrue(page["stale"], fields)
        self.set(gpus="1xH100-80GB", sliding_window="4096")
        self.assertEqual(self.read()["error"], cli_error(
            "--layers", "32", "--kv_heads", "8", "--head_dim", "128", "--attention_heads", "32",
            "--sliding_window", "4096", "--batch", "2", "--context", "8k"))
        self.set(sliding_window="", head_dim="100", kv_dtype="nvfp4")
        self.assertEqual(self.read()["error"], "head_dim 100 is not a multiple of 16: nvfp4 "
                         "stores one scale per 16 values")

    def test_filled_from_its_url(self):
        # A shared link: its flags fill the form and give the CLI's figures.
        self.open("/plan?model=deepseek-v3&kv_dtype=nvfp4&batch=2&context=1000&weights=671GB"
                  "&gpus=2xH200-141GB")
        page = self.read()
        self.assertEqual(page["fields"]["model"]["value"], "deepseek-v3")
        self.assertEqual(page["fields"]["batch"]["value"], "2")
        self.assertEqual(page["fields"]["kv_lora_rank"]["value"], "512")
        self.assert_like_cli("--model", "deepseek-v3", "--kv_dtype", "nvfp4", "--batch", "2",
                             "--context", "1000", "--weights", "671GB", "--gpus",
                             "2xH200-141GB")
        # A change goes into the URL, and that link shows the same.
        self.set(batch="5")
        page = self.read()
        self.assertIn("batch=5", page["search"])
        self.open("/plan" + page["search"])
        self.assertEqual(self.read()["lines"], page["lines"])
        # Flags over a preset, as the CLI takes them.
        self.open("/plan?model=llama-3-70b&kv_heads=2&batch=3&context=1k")
        page = self.assert_like_cli("--model", "llama-3-70b", "--kv_heads", "2", "--batch", "3",
                                    "--context", "1k")[1]
        self.assertEqual(page["fields"]["kv_heads"]["value"], "2")
        self.assertEqual(page["fields"]["layers"]["value"], "80")

    def test_reads_a_config_json(self):
        self.set(batch="4", context="8k", weights="10GB")
        path = os.path.join(HF_CONFIGS, "gemma-2-9b.json")
        BROWSER.find_element(By.ID, "hf_config").send_keys(path)
        self.idle()
        self.assert_like_cli("--hf_config", path, "--batch", "4", "--context", "8k", "--weights",
                             "10GB", "--gpus", "1xH100-80GB")
        page = self.read()
        self.assertEqual(page["fields"]["model"]["value"], "custom")
        self.assertEqual(page["fields"]["sliding_window"]["value"], "4096")
        self.assertIn("sliding_window=4096", page["search"])  # the link: the geometry
        # The same parser as the CLI's: a broken file gets its message.
        with tempfile.NamedTemporaryFile("w", suffix=".json") as bad:
            bad.write('{"num_hidden_layers": 2}')
            bad.flush()
            BROWSER.find_element(By.ID, "hf_config").send_keys(bad.name)
            self.idle()
            page = self.read()
            self.assertEqual(page["error"], cli_error("--hf_config_json",
                                                      '{"num_hidden_layers": 2}', "--batch",
                                                      "4"))
            self.assertTrue(page["stale"])


class IndexStatusTest(unittest.TestCase):
    """A second daemon runs the fleet index over one vLLM-format publisher
    (prefixd.kv_publisher) named like a script tag: the status page's
    workers table is ListWorkers', its routing counters and the Route rate
    and event lag plots are /metrics'."""

    @classmethod
    def setUpClass(cls):
        from prefixd import kv_publisher
        cls.pub = kv_publisher.Publisher(name="e0<b>x", encoding="map")
        cls.daemon = prefixd_fixture.Daemon(
            ARGS.prefixd, CONFIG, args=["--index_block_size=%d" % BLOCK,
                                        "--index_source=" + cls.pub.source_flag()]).start()
        cls.client = prefixd.Client(cls.daemon.tcp)
        assert cls.pub.wait_for_subscriber(), "the daemon never subscribed"
        stored = kv_publisher.block_stored
        cls.pub.publish([stored([1, 2, 3, 4], None, tokens(0, 4), BLOCK)])
        cls.pub.publish([stored([5], 4, tokens(4, 1), BLOCK),
                         stored([1, 2], None, tokens(0, 2), BLOCK, medium="CPU")])
        cls.pub.publish([kv_publisher.block_removed([5])])
        deadline = time.monotonic() + 20
        while cls.workers()[0].last_seq != cls.pub.last_seq:
            assert time.monotonic() < deadline, cls.workers()
            time.sleep(0.02)
        for prompt in (tokens(0, 4) + [1], tokens(0, 2), tokens(50, 1)):
            cls.client.route(prompt)
        cls.metrics = "http://" + cls.daemon.metrics
        BROWSER.get(cls.metrics + "/")
        cls.page = BROWSER.execute_script(READ_INDEX)
        cls.plots = BROWSER.execute_script(READ_PLOTS)
        BROWSER.execute_script("document.getElementById('workers').scrollIntoView()")
        screenshot("status_index.png")
        cls.text = http("GET", cls.metrics + "/metrics")[2]
        cls.listed = cls.workers()

    @classmethod
    def workers(cls):
        return cls.client.list_workers().workers

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        rc = cls.daemon.stop()
        cls.daemon.close()
        cls.pub.close()
        assert rc == 0, rc

    def test_workers_table_is_list_workers(self):
        self.assertEqual(len(self.listed), 1)
        w = self.listed[0]
        row = self.page["workers"][w.worker]
        self.assertEqual(row["worker"], "e0<b>x")  # text, not markup
        self.assertEqual(self.page["bold"], 0)
        self.assertEqual(row["state"], w.state.name)
        self.assertEqual(row["state"], "LIVE")
        self.assertEqual(row["detail"], w.state_detail)
        self.assertEqual(int(row["seq"]), w.last_seq)
        self.assertEqual(int(row["seq"]), 2)
        self.assertEqual(self.page["mediums"][w.worker], {m: str(n) for m, n in w.mediums.items()})
        self.assertEqual(w.mediums, {"GPU": 4, "CPU": 2})
        self.assertEqual(int(row["events"]), w.events)
        self.assertEqual(int(row["gaps"]), w.gaps)
        self.assertEqual(int(row["replays-ok"]) + int(row["replays-failed"]), w.replays)
        self.assertEqual(int(row["clears"]), w.clears)

    def test_routing_counters_are_the_metrics(self):
        r = self.page["routing"]
        self.assertEqual(r["route-requests"], "3")
        self.assertEqual(float(r["route-requests"]),
                         metric(self.text, "prefixd_index_route_requests_total"))
        self.assertEqual(float(r["route-prompt-blocks"]),
                         metric(self.text, "prefixd_index_route_prompt_blocks_total"))
        self.assertEqual(float(r["route-matched-blocks"]),
                         metric(self.text, "prefixd_index_route_matched_blocks_total"))
        self.assertEqual(r["route-hit-rate"], "85.7% (6/7)")  # 4 of 4, 2 of 2, 0 of 1

    def test_route_and_lag_plots_are_the_metrics(self):
        self.assertEqual(sorted(self.plots), ["plot-cached", "plot-evictions", "plot-hit-rate",
                                              "plot-lag", "plot-routes"])
        routes = self.plots["plot-routes"]["lines"]["Route"]
        self.assertEqual(sum(routes["requests"]), 3)
        lag = self.plots["plot-lag"]["lines"]["event lag"]
        self.assertEqual(sum(lag["batches"]),
                         metric(self.text, "prefixd_index_event_lag_seconds_count"))
        self.assertEqual(sum(lag["batches"]), 3)
        self.assertAlmostEqual(sum(lag["lag-seconds"]),
                               metric(self.text, "prefixd_index_event_lag_seconds_sum"), places=4)
        last = [i for i, n in enumerate(lag["batches"]) if n > 0][-1]
        self.assertAlmostEqual(lag["values"][last],
                               1000 * lag["lag-seconds"][last] / lag["batches"][last], places=2)
        only_same_origin(self, self.metrics)


class DocumentedChromiumTest(unittest.TestCase):
    """docs/metrics.md's command for a screenshot of the status page by hand
    runs as shown (the daemon's address aside): as root, chromium starts
    only with --no-sandbox, which the command must carry."""

    def test_the_documented_screenshot_command(self):
        with open(os.path.join(common.REPO, "docs", "metrics.md")) as f:
            lines = [l.strip()[2:] for l in f if l.strip().startswith("$ chromium ")]
        self.assertEqual(len(lines), 1, "one `$ chromium ...` command in docs/metrics.md")
        command = lines[0].replace("http://127.0.0.1:9464/", "http://%s/" % DAEMON.metrics)
        out = [a.split("=", 1)[1] for a in command.split() if a.startswith("--screenshot=")]
        self.assertEqual(len(out), 1, command)
        with tempfile.TemporaryDirectory(prefix="prefixd-chromium-") as tmp:
            r = subprocess.run(["bash", "-c", command], cwd=tmp, capture_output=True,
                               text=True, timeout=120)
            path = os.path.join(tmp, out[0])
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            self.assertTrue(os.path.exists(path), r.stderr[-2000:])
            with open(path, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main()
