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
- /plan: sets model, batch, context, dtype and weights like a user, reads the
  computed figures and checks them against `prefixctl plan --batch ...
  --json` for the same inputs: the Llama-3-70B table (640 / 80 /
  10 GiB at fp16, 160 / 20 / 2.5 GiB at int4), the 8B crossover (114,441
  tokens with 15 GB of weights), the bars that turn red where the cache
  alone exceeds one GPU, and the models whose KV is not batch x context x
  bytes per token: DeepSeek-V3 (MLA, one column) in nvfp4, Gemma-2-9B
  (sliding window), Jamba and Qwen3-Next (state layers) and a model whose
  every layer slides (never crossed), texts included;
- POST, PUT and DELETE are refused with 405 and change nothing;
- docs/metrics.md's chromium command for a screenshot by hand works as shown
  (as root only with --no-sandbox).

Writes a screenshot of each page (status.png, plan.png) to --screenshots
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
import unittest
import urllib.error
import urllib.request

import common


def _extra(ap):
    ap.add_argument("--prefixctl", help="the prefixctl binary")
    ap.add_argument("--screenshots", help="directory for status.png and plan.png")


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


def only_same_origin(test):
    """Every resource the page loaded came from the daemon."""
    urls = BROWSER.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
        ".concat([...document.querySelectorAll('[src],[href]')]"
        ".map(e => e.src || e.href))")
    for url in urls:
        test.assertTrue(url.startswith(base() + "/"), url)


def prefixctl_json(*args):
    out = subprocess.run([ARGS.prefixctl, "plan", "--json"] + list(args), check=True,
                         capture_output=True, text=True, timeout=30).stdout
    return json.loads(out)


def prefixctl_text(*args):
    return subprocess.run([ARGS.prefixctl, "plan"] + list(args), check=True,
                          capture_output=True, text=True, timeout=30).stdout


def cli_line(text, label):
    """The value of prefixctl's `label` line (labels are padded to 18)."""
    for line in text.splitlines():
        if line.startswith(label.ljust(18)):
            return line[18:]
    raise AssertionError("no %r line in:\n%s" % (label, text))


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
        self.assertEqual(page["geometry"],
                         "32 layers x 8 KV heads x 128 head_dim, fp16: 131,072 B (128 KiB) per token")
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


READ_PLAN = """
const ids = ['tokens', 'bpt', 'seq', 'kv', 'weights_out', 'total', 'crossover', 'pool', 'error'];
const cells = [...document.querySelectorAll('#kv_table tr[data-dtype]')].flatMap(
  (tr) => [...tr.querySelectorAll('td[data-variant]')].map((td) => ({
    dtype: tr.dataset.dtype, variant: td.dataset.variant, text: td.textContent,
    bytes: td.dataset.bytes})));
const gpus = Object.fromEntries([...document.querySelectorAll('#gpu_table tr[data-gpu]')].map(
  (tr) => { const bar = tr.querySelector('td.alone .bar');
    return [tr.dataset.gpu, {
      need: Number(tr.querySelector('td.need').textContent.replaceAll(',', '')),
      pct: Number(tr.querySelector('td.pct').textContent.replace('%', '').replaceAll(',', '')),
      over: bar.classList.contains('over'),
      color: getComputedStyle(bar.firstChild).backgroundColor}]; }));
return {text: Object.fromEntries(ids.map((id) => [id, document.getElementById(id)?.textContent])),
        kv_bytes: document.getElementById('kv').dataset.bytes, cells, gpus};
"""


class PlanPageTest(unittest.TestCase):
    def setUp(self):
        BROWSER.get(base() + "/plan")
        WebDriverWait(BROWSER, 10).until(
            lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")

    def set(self, **fields):
        for name, value in fields.items():
            el = BROWSER.find_element(By.ID, name)
            if el.tag_name == "select":
                Select(el).select_by_value(value)
            else:
                el.clear()
                el.send_keys(value)

    def text(self, id_):
        return self.read()["text"][id_]

    def read(self):
        """The calculator's figures, read in one script: texts, the dtype x
        KV-head cells {(dtype, variant): (text, bytes)} and the GPU rows."""
        page = BROWSER.execute_script(READ_PLAN)
        page["cells"] = {(c["dtype"], c["variant"]): (c["text"], int(c["bytes"]))
                         for c in page["cells"]}
        return page

    def kv_cells(self):
        return self.read()["cells"]

    def gpu_rows(self):
        return self.read()["gpus"]

    def assert_matches_cli(self, cli):
        """The page's figures equal prefixctl plan --json's."""
        page = self.read()
        self.assertEqual(int(page["kv_bytes"]), cli["kv_bytes"])
        cells = page["cells"]
        for v in cli["variants"]:
            for d in v["dtypes"]:
                self.assertEqual(cells[(d["dtype"], v["label"])][1], d["kv_bytes"],
                                 (d["dtype"], v["label"]))
        self.assertEqual(len(cells), sum(len(v["dtypes"]) for v in cli["variants"]))
        rows = page["gpus"]
        for g in cli["per_gpu"]:
            self.assertEqual(rows[g["gpu"]]["need"], g["gpus_needed"], g["gpu"])
            self.assertEqual(rows[g["gpu"]]["pct"], g["kv_percent_of_gpu"], g["gpu"])
            self.assertEqual(rows[g["gpu"]]["over"], g["kv_exceeds_gpu"], g["gpu"])

    def test_defaults_to_the_daemons_geometry(self):
        self.assertEqual(Select(BROWSER.find_element(By.ID, "preset")).first_selected_option
                         .get_attribute("value"), "daemon")
        self.assertEqual(BROWSER.find_element(By.ID, "layers").get_attribute("value"), "32")
        self.assertEqual(self.text("error"), "")
        only_same_origin(self)

    def test_70b_table_and_int4_row(self):
        self.set(preset="llama-3-70b", dtype="fp16", batch="32", context="8k", weights="140GB")
        cells = self.kv_cells()
        self.assertEqual([cells[("fp16", v)][0] for v in ("MHA-64", "GQA-8", "MQA-1")],
                         ["640 GiB", "80 GiB", "10 GiB"])
        self.assertEqual([cells[("int4", v)][0] for v in ("MHA-64", "GQA-8", "MQA-1")],
                         ["160 GiB", "20 GiB", "2.5 GiB"])
        self.assertEqual(self.text("kv"), "85,899,345,920 B (80 GiB)")
        cli = prefixctl_json("--model", "llama-3-70b", "--kv_dtype", "fp16", "--batch", "32",
                             "--context", "8k", "--weights", "140GB")
        self.assert_matches_cli(cli)
        # The CLI's table reads the same.
        text = prefixctl_text("--model", "llama-3-70b", "--batch", "32", "--context", "8k",
                              "--weights", "140GB")
        self.assertIn("fp16 *  640 GiB   80 GiB   10 GiB", text)
        self.assertIn("int4    160 GiB   20 GiB  2.5 GiB", text)
        # 80 GiB of cache alone exceeds an 80 GB card (red bar), not a 141 GB one.
        rows = self.gpu_rows()
        self.assertTrue(rows["H100-80GB"]["over"])
        self.assertEqual(rows["H100-80GB"]["color"], "rgb(214, 69, 69)")
        self.assertFalse(rows["H200-141GB"]["over"])
        self.assertEqual(rows["H200-141GB"]["color"], "rgb(59, 125, 221)")
        self.assertIn(self.text("crossover").split(" ")[0], text)
        screenshot("plan.png")

    def test_llama8b_crossover(self):
        self.set(preset="llama-3-8b", dtype="fp16", batch="1", context="114441", weights="15GB",
                 gpu="L4-24GB", gpu_count="1")
        self.assertTrue(self.text("crossover").startswith("114,441 cached tokens"))
        self.assertEqual(self.text("pool"), "1 x L4-24GB = 24 GB: do not fit, 5.59 GiB short")
        cli = prefixctl_json("--model", "llama-3-8b", "--batch", "1", "--context", "114441",
                             "--weights", "15GB", "--gpus", "L4-24GB")
        self.assertEqual(cli["crossover_tokens"], 114441)
        self.assertFalse(cli["gpus"]["fits"])
        self.assert_matches_cli(cli)

    def test_other_dtype_and_custom_geometry(self):
        self.set(preset="llama-3-70b")
        self.set(kv_heads="4", dtype="fp8", batch="7", context="3000", weights="16.06GB",
                 overhead="2GiB")
        self.assertEqual(Select(BROWSER.find_element(By.ID, "preset")).first_selected_option
                         .get_attribute("value"), "custom")
        cli = prefixctl_json("--model", "llama-3-70b", "--kv_heads", "4", "--kv_dtype", "fp8",
                             "--batch", "7", "--context", "3000", "--weights", "16.06GB",
                             "--overhead", "2GiB")
        self.assert_matches_cli(cli)
        self.assertTrue(self.text("total").startswith("{:,} B".format(cli["total_bytes"])))

    def assert_like_cli(self, fields, args, variants):
        """Sets the page like a user and checks every figure and the
        formula, per-sequence and crossover texts against prefixctl's."""
        self.set(**fields)
        self.assertEqual(self.text("error"), "")
        cli = prefixctl_json(*args)
        self.assert_matches_cli(cli)
        self.assertEqual(sorted({v for (_, v) in self.kv_cells()}), sorted(variants))
        text = prefixctl_text(*args)
        page = self.read()["text"]
        self.assertEqual(page["bpt"], cli_line(text, "Bytes per token"))
        self.assertEqual(page["crossover"], cli_line(text, "Decode crossover"))
        if "Per sequence" in text:
            self.assertEqual(page["seq"], cli_line(text, "Per sequence"))
        return cli, page

    def test_deepseek_v3_mla_in_nvfp4(self):
        # One latent per layer, shared by all heads: one column, "MLA".
        # 61 x (512 + 64) x (0.5 B + 1 B per 16 values) = 19,764 B per token.
        cli, page = self.assert_like_cli(
            dict(preset="deepseek-v3", dtype="nvfp4", batch="2", context="1000",
                 weights="671GB"),
            ["--model", "deepseek-v3", "--kv_dtype", "nvfp4", "--batch", "2", "--context",
             "1000", "--weights", "671GB"], ["MLA"])
        self.assertEqual(cli["kv_bytes"], 2 * 1000 * 19764)
        self.assertEqual(self.kv_cells()[("nvfp4", "MLA")][1], 39528000)
        self.assertEqual(self.kv_cells()[("fp16", "MLA")][1], 2 * 1000 * 70272)
        self.assertTrue(page["bpt"].startswith("19,764 B"), page["bpt"])

    def test_gemma_2_9b_sliding_window(self):
        # 21 of 42 layers hold at most 4,096 tokens: (8,192 x 21 + 4,096 x 21)
        # x 8,192 B = 2,113,929,216 B per sequence, not 8,192 x 344,064.
        cli, page = self.assert_like_cli(
            dict(preset="gemma-2-9b", dtype="fp16", batch="4", context="8k", weights="10GB"),
            ["--model", "gemma-2-9b", "--kv_dtype", "fp16", "--batch", "4", "--context",
             "8k", "--weights", "10GB"], ["MHA-16", "GQA-8", "MQA-1"])
        self.assertEqual(cli["sequence_bytes"], 2113929216)
        self.assertEqual(self.text("kv"), "8,455,716,864 B (7.88 GiB)")
        self.assertTrue(page["crossover"].startswith("10,437 tokens per sequence"))
        # Shorter than the window every layer holds every token.
        self.assert_like_cli(
            dict(context="1000"),
            ["--model", "gemma-2-9b", "--kv_dtype", "fp16", "--batch", "4", "--context",
             "1000", "--weights", "10GB"], ["MHA-16", "GQA-8", "MQA-1"])
        self.assertEqual(int(self.read()["kv_bytes"]), 4 * 1000 * 344064)

    def test_hybrid_state_layers(self):
        # Jamba: 28 Mamba layers of 311,296 B per sequence beside 4 KV layers.
        cli, _ = self.assert_like_cli(
            dict(preset="jamba-v0.1", dtype="nvfp4", batch="3", context="5000", weights="100GB"),
            ["--model", "jamba-v0.1", "--kv_dtype", "nvfp4", "--batch", "3", "--context",
             "5000", "--weights", "100GB"], ["MHA-32", "GQA-8", "MQA-1"])
        self.assertEqual(cli["kv_bytes"], 3 * (5000 * 4 * 1152 + 28 * 311296))
        self.assert_like_cli(
            dict(preset="qwen3-next-80b-a3b", dtype="bf16", batch="16", context="32k",
                 weights="160GB"),
            ["--model", "qwen3-next-80b-a3b", "--kv_dtype", "bf16", "--batch", "16",
             "--context", "32k", "--weights", "160GB"], ["MHA-16", "GQA-2", "MQA-1"])

    def test_every_layer_sliding_is_never_crossed(self):
        self.set(preset="llama-3-8b")
        self.set(sliding_window="1024", sliding_layers="32", batch="2", context="8k",
                 weights="16GB")
        cli, page = self.assert_like_cli(
            {}, ["--model", "llama-3-8b", "--sliding_window", "1024", "--sliding_layers", "32",
                 "--batch", "2", "--context", "8k", "--weights", "16GB"],
            ["MHA-32", "GQA-8", "MQA-1"])
        self.assertEqual(cli["crossover_context"], 0)
        self.assertTrue(page["crossover"].startswith("never at batch 2"), page["crossover"])

    def test_bad_input_is_named(self):
        self.set(batch="0")
        self.assertEqual(self.text("error"), 'batch must be a positive integer, got "0"')
        self.set(batch="2", weights="1.5B")
        self.assertEqual(self.text("error"), 'weights: "1.5B" is not a whole number of bytes')
        self.set(weights="", sliding_window="4096")
        self.assertEqual(self.text("error"), "sliding_window 4096 with sliding_layers 0: give "
                         "both (0 < sliding_layers <= layers 32) or neither")
        self.set(sliding_window="", head_dim="100", dtype="nvfp4")
        self.assertEqual(self.text("error"), "head_dim 100 is not a multiple of 16: nvfp4 "
                         "stores one scale per 16 values")


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
