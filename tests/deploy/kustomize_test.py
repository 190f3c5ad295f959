#!/usr/bin/python3
"""Renders deploy/k8s with `kubectl kustomize` and checks the objects.

Checks: the kinds; the prefixd sidecar's native gRPC probes on the port it
listens on; the Unix socket's emptyDir mounted by prefixd and the engine at
the directory of the config's unix:// listener; every writable path prefixd
needs (socket, snapshot) on a volume, since the root filesystem is read-only;
the security context and resources of every container; that every ConfigMap
and Secret the pod names is rendered; metrics on 0.0.0.0:9464 reachable
through the Service and the ServiceMonitor; the PrometheusRule in step with
deploy/prometheus/alerts.yml and the dashboard ConfigMap with
deploy/grafana/prefixd.json (when those exist); the example token hash.

Then the fleet index component (deploy/k8s/index), rendered with the base by
an overlay in a temporary directory outside the repository (as users include
it: kustomize refuses an overlay inside its base's directory): its objects;
the index Deployment's 2 replicas, gRPC probes on prefixd.v1.PrefixIndex,
config assembly, security context and resources; its config's pool source
(the headless Service's name, port 5557, replay_port 5558), block size and
auth; the headless Service vllm-events (clusterIP None) selecting the engine
pods on 5557/5558; the Route and metrics Services, the ServiceMonitor (job
"prefixd", no pod scraped twice) and the index alerts in the PrometheusRule;
the NetworkPolicies, evaluated for routers, engines, Prometheus and other
pods; the engine's --kv-events-config (valid JSON, the endpoints, the topic
from the downward API's POD_NAME) and a vLLM image that has it.

With --prefixd, the rendered configs (ConfigMap + principals Secret, joined as
the pods' init containers join them) are also loaded by the real daemon; the
index's must make it report prefixd.v1.PrefixIndex SERVING (its probes).

Exit 0 pass, 1 fail, 77 skip (kubectl absent).
Usage: kustomize_test.py [--repo DIR] [--prefixd PATH] [unittest args]
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import common  # noqa: E402  (tests/python/common.py)

ARGS = None

try:
    import yaml
except ImportError:
    print("FAIL: python3 yaml module missing: apt-get install python3-yaml")
    sys.exit(1)


def render(repo, path=None, what="deploy/k8s"):
    r = subprocess.run(["kubectl", "kustomize", path or os.path.join(repo, "deploy", "k8s")],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError("kubectl kustomize %s: exit %d\n%s" % (what, r.returncode, r.stderr))
    return [d for d in yaml.safe_load_all(r.stdout) if d]


INDEX_OVERLAY = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
components:
  - %s
"""


def render_index(repo):
    """The base plus the index component, through an overlay of the kind
    docs/index.md shows, in a temporary directory (kustomize wants relative
    paths, and refuses an overlay inside its base's directory)."""
    tmp = tempfile.mkdtemp(prefix="prefixd-kustomize-")
    try:
        k8s = os.path.join(os.path.realpath(repo), "deploy", "k8s")
        with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
            f.write(INDEX_OVERLAY % (os.path.relpath(k8s, tmp),
                                     os.path.relpath(os.path.join(k8s, "index"), tmp)))
        return render(repo, tmp, "of an overlay with deploy/k8s and the component deploy/k8s/index")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def textproto_strings(text, field):
    """Values of `field: "..."` lines (top level or nested) in a textproto."""
    return re.findall(r'^\s*%s\s*:\s*"([^"]*)"' % re.escape(field), text, re.M)


def all_containers(pod):
    return pod.get("initContainers", []) + pod.get("containers", [])


def mounts_of(container):
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def volume_for_path(container, path):
    """The mount whose mountPath contains `path` (longest match), or None."""
    best = None
    for mount_path, m in mounts_of(container).items():
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            if best is None or len(mount_path) > len(best["mountPath"]):
                best = m
    return best


def effective(pod, container, key):
    sc = container.get("securityContext", {})
    return sc[key] if key in sc else pod.get("securityContext", {}).get(key)


# ---- textproto configs, selectors and NetworkPolicies (the index component) ----

_TEXTPROTO_TOKEN = re.compile(r'\s+|#[^\n]*|"((?:[^"\\]|\\.)*)"|([{}:])|([^\s{}:"#]+)')


def parse_textproto(text):
    """A textproto as {field: [values]}, a message's value being such a dict
    and a scalar's its text (strings unquoted). Enough for the configs here."""
    tokens = []
    pos = 0
    while pos < len(text):
        m = _TEXTPROTO_TOKEN.match(text, pos)
        if m is None:
            raise ValueError("textproto: cannot read %r" % text[pos:pos + 20])
        pos = m.end()
        if m.group(1) is not None:
            tokens.append(("str", m.group(1)))
        elif m.group(2):
            tokens.append((m.group(2), m.group(2)))
        elif m.group(3):
            tokens.append(("word", m.group(3)))

    def message(i, closing):
        out = {}
        while i < len(tokens) and tokens[i][0] != "}":
            kind, name = tokens[i]
            if kind != "word":
                raise ValueError("textproto: a field name expected, not %r" % name)
            i += 1
            if i < len(tokens) and tokens[i][0] == ":":
                i += 1
            if i < len(tokens) and tokens[i][0] == "{":
                value, i = message(i + 1, True)
            elif i < len(tokens) and tokens[i][0] in ("str", "word"):
                value = tokens[i][1]
                i += 1
                while i < len(tokens) and tokens[i][0] == "str":  # "a" "b" concatenate
                    value += tokens[i][1]
                    i += 1
            else:
                raise ValueError("textproto: no value for %s" % name)
            out.setdefault(name, []).append(value)
        if closing:
            if i >= len(tokens):
                raise ValueError("textproto: a message is not closed")
            i += 1
        elif i < len(tokens):
            raise ValueError("textproto: an unmatched }")
        return out, i
    return message(0, False)[0]


def selects(selector, labels):
    """A matchLabels selector (or a Service's plain selector) against labels."""
    sel = selector.get("matchLabels", selector) if isinstance(selector, dict) else {}
    if isinstance(selector, dict) and selector.get("matchExpressions"):
        return False  # none here; never guessed
    return all(labels.get(k) == v for k, v in sel.items())


def peer_admits(peer, labels, same_namespace):
    """One NetworkPolicy peer against a pod: podSelector alone means this
    namespace; with a namespaceSelector, {} means any namespace (a selector
    with labels is taken to mean another namespace). ipBlock: no pod."""
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        ns = peer["namespaceSelector"] or {}
        if (ns.get("matchLabels") or ns.get("matchExpressions")) and same_namespace:
            return False
    elif not same_namespace:
        return False  # a podSelector alone: this namespace only
    return selects(peer.get("podSelector") or {}, labels)


def policy_admits(policy, direction, labels, port, same_namespace=True, protocol="TCP"):
    """Whether `policy` lets traffic on `port` in `direction` ("ingress"
    from a pod with `labels`, "egress" to it)."""
    key = "from" if direction == "ingress" else "to"
    for rule in policy["spec"].get(direction, []) or []:
        ports = rule.get("ports")
        if ports and not any(p.get("port") == port and p.get("protocol", "TCP") == protocol
                             for p in ports):
            continue
        peers = rule.get(key)
        if not peers or any(peer_admits(p, labels, same_namespace) for p in peers):
            return True
    return False


def decode_secret(secret, key):
    import base64
    if not secret:
        return ""
    if key in secret.get("stringData", {}):
        return secret["stringData"][key]
    return base64.b64decode(secret.get("data", {}).get(key, "")).decode()


class Rendered:
    """What both test cases share: the rendered objects by kind (docs,
    by_kind, set by setUpClass) and the checks of one pod's security."""

    @classmethod
    def load(cls, docs):
        cls.docs = docs
        cls.by_kind = {}
        for d in docs:
            cls.by_kind.setdefault(d["kind"], []).append(d)

    @classmethod
    def one(cls, kind, name_prefix=""):
        objs = [o for o in cls.by_kind.get(kind, [])
                if o["metadata"]["name"].startswith(name_prefix)]
        return objs[0] if len(objs) == 1 else None

    @classmethod
    def named(cls, kind, name):
        """The object `name`, or the generated `name-<hash>`; None if not one."""
        objs = [o for o in cls.by_kind.get(kind, [])
                if re.fullmatch(re.escape(name) + r"(-[a-z0-9]{10})?", o["metadata"]["name"])]
        return objs[0] if len(objs) == 1 else None

    def check_security(self):
        pod_sc = self.pod.get("securityContext", {})
        self.assertIs(pod_sc.get("runAsNonRoot"), True, "pod runAsNonRoot")
        self.assertEqual(pod_sc.get("seccompProfile", {}).get("type"), "RuntimeDefault",
                         "pod seccompProfile RuntimeDefault")
        self.assertIs(self.pod.get("automountServiceAccountToken"), False,
                      "no service account token mounted")
        for c in all_containers(self.pod):
            name = c["name"]
            sc = c.get("securityContext", {})
            with self.subTest(container=name):
                self.assertIs(effective(self.pod, c, "runAsNonRoot"), True, "%s: non-root" % name)
                uid = effective(self.pod, c, "runAsUser")
                self.assertTrue(isinstance(uid, int) and uid > 0,
                                "%s: runAsUser %s > 0" % (name, uid))
                self.assertIs(sc.get("readOnlyRootFilesystem"), True,
                              "%s: readOnlyRootFilesystem" % name)
                self.assertIs(sc.get("allowPrivilegeEscalation"), False,
                              "%s: allowPrivilegeEscalation false" % name)
                self.assertEqual(sc.get("capabilities", {}).get("drop"), ["ALL"],
                                 "%s: capabilities drop ALL" % name)
                self.assertFalse(sc.get("privileged"), "%s: not privileged" % name)
                res = c.get("resources", {})
                for part in ("requests", "limits"):
                    self.assertTrue(all(k in res.get(part, {}) for k in ("cpu", "memory")),
                                    "%s: cpu and memory %s: %s" % (name, part, res))


def setUpModule():
    if shutil.which("kubectl") is None:
        raise unittest.SkipTest("kubectl not found (apt-get install kubernetes-client)")


class KustomizeTest(Rendered, unittest.TestCase):
    """deploy/k8s as `kubectl kustomize` renders it."""

    @classmethod
    def setUpClass(cls):
        cls.load(render(ARGS.repo))
        cls.deployment = cls.one("Deployment")
        cls.pod = cls.deployment["spec"]["template"]["spec"] if cls.deployment else {}
        named = {c["name"]: c for c in all_containers(cls.pod)}
        cls.prefixd = named.get("prefixd")
        cls.engine = named.get("engine")
        cm = cls.one("ConfigMap", "prefixd-config")
        cls.config_text = (cm or {}).get("data", {}).get("prefixd.textproto", "")
        cls.principals_text = decode_secret(cls.one("Secret", "prefixd-principals"),
                                            "principals.textproto")

    def test_kinds(self):
        kinds = sorted(d["kind"] for d in self.docs)
        want = ["ConfigMap", "Deployment", "PrometheusRule", "Secret", "Secret", "Service",
                "ServiceMonitor"]
        if os.path.exists(os.path.join(ARGS.repo, "deploy", "grafana", "prefixd.json")):
            want = sorted(want + ["ConfigMap"])
        self.assertEqual(kinds, want, "kinds: %s" % ", ".join(want))
        for d in self.docs:
            what = "%s/%s labelled part-of prefixd" % (d["kind"], d["metadata"]["name"])
            with self.subTest(what):
                self.assertEqual(d["metadata"].get("labels", {}).get("app.kubernetes.io/part-of"),
                                 "prefixd", what)

    def require_pod(self):
        self.assertIsNotNone(self.deployment, "one Deployment")
        self.assertIsNotNone(self.prefixd, "a prefixd container")
        self.assertIsNotNone(self.engine, "an engine container")

    def test_pod(self):
        self.require_pod()

    def test_config(self):
        self.assertIsNotNone(self.one("ConfigMap", "prefixd-config"), "ConfigMap prefixd-config")
        self.assertIn("listen", self.config_text, "ConfigMap holds prefixd.textproto")
        self.assertIsNotNone(self.one("Secret", "prefixd-principals"), "Secret prefixd-principals")
        self.assertIn("principals", self.principals_text, "Secret holds the principals")
        self.assertNotRegex(self.config_text,
                            re.compile(r"^\s*(principals\s*\{|token_sha256)", re.M),
                            "no principals (token hashes) in the ConfigMap")

    def test_sidecar(self):
        self.require_pod()
        c = self.prefixd
        if c in self.pod.get("initContainers", []):
            self.assertEqual(c.get("restartPolicy"), "Always",
                             "prefixd is a native sidecar (init container, restartPolicy Always)")
            order = [x["name"] for x in self.pod["initContainers"]]
            writer = [x for x in self.pod["initContainers"] if x["name"] == "prefixd-config"]
            self.assertTrue(bool(writer) and order.index("prefixd-config") < order.index("prefixd"),
                            "the config is assembled before prefixd starts: %s" % order)
        args = c.get("args", []) + c.get("command", [])
        configs = [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
        self.assertEqual(len(configs), 1, "prefixd gets --config=FILE: %s" % args)
        m = volume_for_path(c, configs[0])
        self.assertIsNotNone(m, "the config file %s is on a volume" % configs[0])
        writers = [x for x in self.pod.get("initContainers", [])
                   if x is not c and (volume_for_path(x, configs[0]) or {}).get("name")
                   == m["name"]]
        self.assertTrue(any(configs[0] in " ".join(w.get("command", [])) for w in writers),
                        "an init container writes %s" % configs[0])

    def test_probes(self):
        self.require_pod()
        c = self.prefixd
        ports = {p["containerPort"]: p for p in c.get("ports", [])}
        tcp = [a for a in textproto_strings(self.config_text, "listen")
               if not a.startswith("unix:")]
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            probe = c.get(kind)
            if kind == "startupProbe" and probe is None:
                continue
            with self.subTest(kind):
                self.assertTrue(probe is not None and "grpc" in probe,
                                "prefixd %s is a native gRPC probe: %s" % (kind, probe))
                port = probe["grpc"].get("port")
                self.assertEqual(port, 50051, "%s on port 50051" % kind)
                self.assertIn(port, ports, "%s port is a container port" % kind)
                self.assertTrue(any(a.endswith(":%s" % port) and a.split(":")[0]
                                    in ("0.0.0.0", "[::]") for a in tcp),
                                "%s: prefixd listens on the pod IP at %s (the kubelet dials "
                                "it): %s" % (kind, port, tcp))
        rp = (c.get("readinessProbe") or {}).get("grpc", {})
        self.assertIn(rp.get("service"), (None, "", "prefixd.v1.PrefixCache"),
                      "readiness asks a service prefixd reports: %s" % rp)

    def unix_listener(self):
        unix = [a for a in textproto_strings(self.config_text, "listen") if a.startswith("unix:")]
        self.assertEqual(len(unix), 1, "the config has one unix:// listener: %s" % unix)
        return unix[0]

    def test_socket(self):
        self.require_pod()
        path = self.unix_listener()[len("unix://"):]
        sock_dir = os.path.dirname(path)
        pm = volume_for_path(self.prefixd, path)
        em = volume_for_path(self.engine, path)
        self.assertTrue(pm is not None and pm["mountPath"] == sock_dir,
                        "prefixd mounts a volume at %s: %s" % (sock_dir, pm))
        self.assertTrue(em is not None and em["mountPath"] == sock_dir,
                        "the engine mounts a volume at %s: %s" % (sock_dir, em))
        self.assertEqual(pm["name"], em["name"], "both mount the same volume (%s)" % pm["name"])
        self.assertTrue(not pm.get("readOnly") and not em.get("readOnly"),
                        "the socket volume is writable in both (connect needs write)")
        vol = [v for v in self.pod["volumes"] if v["name"] == pm["name"]]
        self.assertTrue(len(vol) == 1 and "emptyDir" in vol[0],
                        "the socket volume is an emptyDir: %s" % vol)

    def test_engine_env(self):
        self.require_pod()
        unix = self.unix_listener()
        env = {e["name"]: e for e in self.engine.get("env", [])}
        self.assertEqual(env.get("PREFIXD_ADDR", {}).get("value"), unix,
                         "engine PREFIXD_ADDR = %s" % unix)
        ref = env.get("PREFIXD_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
        self.assertTrue(ref.get("name", "").startswith("prefixd-engine-token"),
                        "engine PREFIXD_TOKEN comes from a Secret: %s" % ref)

    def test_writable_paths(self):
        self.require_pod()
        snap = textproto_strings(self.config_text, "snapshot_path")
        self.assertEqual(len(snap), 1, "the config sets snapshot_path: %s" % snap)
        m = volume_for_path(self.prefixd, snap[0])
        self.assertTrue(m is not None and not m.get("readOnly"),
                        "snapshot %s is on a writable volume (root fs is read-only): %s"
                        % (snap[0], m))

    def test_security(self):
        self.require_pod()
        self.check_security()

    def test_references(self):
        self.require_pod()
        names = {(d["kind"], d["metadata"]["name"]) for d in self.docs}
        refs = []
        for v in self.pod.get("volumes", []):
            if "configMap" in v:
                refs.append(("ConfigMap", v["configMap"]["name"]))
            if "secret" in v:
                refs.append(("Secret", v["secret"]["secretName"]))
        for c in all_containers(self.pod):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.append(("Secret", ref["name"]))
        self.assertGreaterEqual(len(refs), 3, "the pod names its ConfigMap and Secrets: %s" % refs)
        for ref in refs:
            with self.subTest(ref=ref):
                self.assertIn(ref, names, "%s %s is rendered" % ref)
        mounted = {v["name"] for v in self.pod.get("volumes", [])}
        for c in all_containers(self.pod):
            for m in c.get("volumeMounts", []):
                with self.subTest(container=c["name"], volume=m["name"]):
                    self.assertIn(m["name"], mounted, "%s mounts defined volume %s"
                                  % (c["name"], m["name"]))

    def test_metrics(self):
        self.require_pod()
        ml = textproto_strings(self.config_text, "metrics_listen")
        self.assertEqual(ml, ["0.0.0.0:9464"], "metrics_listen 0.0.0.0:9464 (reachable in the pod)")
        svc = self.one("Service")
        self.assertIsNotNone(svc, "one Service")
        port = [p for p in svc["spec"]["ports"] if p.get("port") == 9464]
        self.assertEqual(len(port), 1, "Service port 9464: %s" % svc["spec"]["ports"])
        named = {p.get("name"): p["containerPort"] for p in self.prefixd.get("ports", [])}
        target = port[0].get("targetPort", 9464)
        self.assertTrue(named.get(target) == 9464 or target == 9464,
                        "Service targets prefixd's metrics port: %s" % ((target, named),))
        labels = self.deployment["spec"]["template"]["metadata"]["labels"]
        sel = svc["spec"]["selector"]
        self.assertTrue(all(labels.get(k) == v for k, v in sel.items()),
                        "Service selects the engine pods: %s" % ((sel, labels),))
        sm = self.one("ServiceMonitor")
        self.assertIsNotNone(sm, "one ServiceMonitor")
        want = sm["spec"]["selector"]["matchLabels"]
        have = svc["metadata"].get("labels", {})
        self.assertTrue(all(have.get(k) == v for k, v in want.items()),
                        "ServiceMonitor selects the Service: %s" % ((want, have),))
        job = have.get(sm["spec"].get("jobLabel", ""), svc["metadata"]["name"])
        self.assertEqual(job, "prefixd", "scraped as job=\"prefixd\" (what the alerts expect)")
        eps = sm["spec"].get("endpoints", [])
        self.assertTrue(any(e.get("port") == port[0].get("name") for e in eps),
                        "ServiceMonitor scrapes the Service's metrics port: %s" % eps)

    def test_prometheus_rule(self):
        rule = self.one("PrometheusRule")
        self.assertIsNotNone(rule, "one PrometheusRule")
        groups = rule["spec"].get("groups", [])
        rules = [r for g in groups for r in g.get("rules", [])]
        self.assertTrue(len(rules) >= 5 and all(r.get("expr") for r in rules),
                        "PrometheusRule has %d rules, each with an expr" % len(rules))
        alerts = os.path.join(ARGS.repo, "deploy", "prometheus", "alerts.yml")
        if os.path.exists(alerts):
            with open(alerts) as f:
                self.assertEqual(yaml.safe_load(f), rule["spec"],
                                 "PrometheusRule spec == deploy/prometheus/alerts.yml")
        else:
            print("note  deploy/prometheus/alerts.yml absent: the rule is the interim one")
        promtool = shutil.which("promtool")
        if promtool:
            r = subprocess.run([promtool, "check", "rules", "/dev/stdin"],
                               input=yaml.safe_dump(rule["spec"]), capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(r.returncode, 0, "promtool check rules on the PrometheusRule\n%s"
                             % (r.stdout + r.stderr))
        else:
            print("note  promtool absent: rule syntax not checked")

    def test_dashboard(self):
        src = os.path.join(ARGS.repo, "deploy", "grafana", "prefixd.json")
        if not os.path.exists(src):
            print("note  deploy/grafana/prefixd.json absent: no dashboard ConfigMap expected")
            return
        cm = self.one("ConfigMap", "prefixd-grafana-dashboard")
        self.assertIsNotNone(cm, "ConfigMap prefixd-grafana-dashboard")
        self.assertEqual(cm["metadata"].get("labels", {}).get("grafana_dashboard"), "1",
                         "dashboard ConfigMap labelled grafana_dashboard=1")
        with open(src) as f:
            self.assertTrue(cm.get("data", {}).get("prefixd.json") == f.read(),
                            "dashboard ConfigMap == deploy/grafana/prefixd.json")

    def test_sync(self):
        r = subprocess.run([sys.executable, os.path.join(ARGS.repo, "deploy", "k8s",
                                                         "sync-monitoring.py"), "--check"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, "deploy/k8s/monitoring is in step with its sources\n%s"
                         % (r.stdout + r.stderr))

    def test_example_token(self):
        tok = decode_secret(self.one("Secret", "prefixd-engine-token"), "token")
        hashes = textproto_strings(self.principals_text, "token_sha256")
        self.assertIn(hashlib.sha256(tok.encode()).hexdigest(), hashes,
                      "the engine token's SHA-256 is a configured principal")

    def test_daemon_loads_config(self):
        if not ARGS.prefixd:
            print("note  --prefixd not given: the rendered config is not loaded")
            return
        # As the init container joins them; the fixture's flags replace the
        # pod's listeners and snapshot path with free ports and a temp dir.
        text = self.config_text + "\n" + self.principals_text
        err = common.serve_config(ARGS.prefixd, text)
        if err and "not supported by this build" in err:
            print("note  this prefixd build cannot load the pod's config: %s"
                  % err.strip().splitlines()[-1])
            print("note  retrying with auth NONE and no principals (the rest of the config)")
            text = re.sub(r"^auth\s*\{[^}]*\}", "auth { mode: NONE }", self.config_text,
                          flags=re.M)
            err = common.serve_config(ARGS.prefixd, text)
        self.assertIsNone(err, "prefixd serves with the rendered config, exits 0 on SIGTERM")


# ---- the fleet index component (deploy/k8s/index) ----

EVENTS_ENDPOINT = r"tcp://([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)"


class IndexTest(Rendered, unittest.TestCase):
    """The base plus deploy/k8s/index, rendered by render_index()."""

    ROUTER = {"app.kubernetes.io/name": "my-router", "app.kubernetes.io/component": "router"}
    PROMETHEUS = {"app.kubernetes.io/name": "prometheus", "prometheus": "k8s"}
    OTHER = {"app": "anything-else"}

    @classmethod
    def setUpClass(cls):
        cls.load(render_index(ARGS.repo))
        cls.deployment = cls.named("Deployment", "prefixd-index")
        cls.engine_deployment = cls.named("Deployment", "llm-engine")
        template = (cls.deployment or {}).get("spec", {}).get("template", {})
        cls.pod = template.get("spec", {})
        cls.index_labels = template.get("metadata", {}).get("labels", {})
        template = (cls.engine_deployment or {}).get("spec", {}).get("template", {})
        cls.engine_pod = template.get("spec", {})
        cls.engine_labels = template.get("metadata", {}).get("labels", {})
        cls.engine = {c["name"]: c for c in cls.engine_pod.get("containers", [])}.get("engine")
        cls.prefixd = {c["name"]: c for c in cls.pod.get("containers", [])}.get("prefixd")
        cm = cls.named("ConfigMap", "prefixd-index-config")
        cls.config_text = (cm or {}).get("data", {}).get("prefixd-index.textproto", "")
        cls.principals_text = decode_secret(cls.named("Secret", "prefixd-index-principals"),
                                            "principals.textproto")
        cls.config, cls.principals, cls.parse_error = {}, {}, None
        try:
            cls.config = parse_textproto(cls.config_text)
            cls.principals = parse_textproto(cls.principals_text)
        except ValueError as e:
            cls.parse_error = e
        index = (cls.config.get("index") or [{}])[0]
        source = (index.get("sources") or [{}])[0]
        m = re.fullmatch(EVENTS_ENDPOINT, (source.get("endpoint") or [""])[0])
        cls.events_service_name = m.group(1) if m else None

    def require_index(self):
        self.assertIsNotNone(self.deployment, "index overlay: Deployment prefixd-index")
        self.assertIsNotNone(self.engine_deployment, "index overlay: Deployment llm-engine")
        self.assertIsNone(self.parse_error, "index config and principals parse")
        self.assertIsNotNone(self.engine, "index overlay: the engine container")
        self.assertIsNotNone(self.prefixd, "index Deployment: a prefixd container")
        self.assertTrue(self.config_text,
                        "ConfigMap prefixd-index-config holds prefixd-index.textproto")

    def test_index_pod(self):
        self.require_index()

    def test_index_kinds(self):
        base = {(d["kind"], re.sub(r"-[a-z0-9]{10}$", "", d["metadata"]["name"]))
                for d in render(ARGS.repo)}
        have = {(d["kind"], re.sub(r"-[a-z0-9]{10}$", "", d["metadata"]["name"]))
                for d in self.docs}
        want = {("Deployment", "prefixd-index"), ("PodDisruptionBudget", "prefixd-index"),
                ("Service", "vllm-events"), ("Service", "prefixd-index"),
                ("Service", "prefixd-index-metrics"), ("ServiceMonitor", "prefixd-index"),
                ("NetworkPolicy", "prefixd-index"), ("NetworkPolicy", "llm-engine"),
                ("ConfigMap", "prefixd-index-config"), ("Secret", "prefixd-index-principals"),
                ("Secret", "prefixd-router-token")}
        self.assertTrue(have == base | want and len(self.docs) == len(have),
                        "index overlay: the base's objects plus %d of the component's: "
                        "missing %s, unexpected %s" % (len(want), sorted((base | want) - have),
                                                       sorted(have - base - want)))
        for d in self.docs:
            what = ("index overlay: %s/%s labelled part-of prefixd"
                    % (d["kind"], d["metadata"]["name"]))
            with self.subTest(what):
                self.assertEqual(d["metadata"].get("labels", {}).get("app.kubernetes.io/part-of"),
                                 "prefixd", what)

    def test_index_deployment(self):
        self.require_index()
        dep = self.deployment
        self.assertEqual(dep["spec"].get("replicas"), 2, "index Deployment: 2 replicas")
        self.assertTrue(selects(dep["spec"]["selector"], self.index_labels)
                        and not selects(dep["spec"]["selector"], self.engine_labels),
                        "index Deployment: its selector matches its pods, not the engines'")
        pdb = self.named("PodDisruptionBudget", "prefixd-index")
        self.assertTrue(pdb is not None and selects(pdb["spec"]["selector"], self.index_labels)
                        and pdb["spec"].get("maxUnavailable") == 1,
                        "PodDisruptionBudget: one index replica at a time: %s"
                        % (pdb and pdb["spec"]))
        # The config file: --config, written by an init container from both sources.
        c = self.prefixd
        args = c.get("args", []) + c.get("command", [])
        configs = [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
        self.assertEqual(len(configs), 1, "index prefixd gets --config=FILE: %s" % args)
        writers = [x for x in self.pod.get("initContainers", [])
                   if configs[0] in " ".join(x.get("command", []))]
        self.assertTrue(len(writers) == 1 and "prefixd-index.textproto" in
                        " ".join(writers[0]["command"]) and "principals.textproto" in
                        " ".join(writers[0]["command"]),
                        "an init container joins the config and the principals into %s"
                        % configs[0])
        m = volume_for_path(c, configs[0])
        self.assertTrue(m is not None and writers and
                        (volume_for_path(writers[0], configs[0]) or {}).get("name") == m["name"],
                        "the config file is on a volume both containers mount: %s" % m)
        names = {(d["kind"], d["metadata"]["name"]) for d in self.docs}
        for v in self.pod.get("volumes", []):
            ref = (("ConfigMap", v["configMap"]["name"]) if "configMap" in v else
                   ("Secret", v["secret"]["secretName"]) if "secret" in v else None)
            if ref:
                with self.subTest(ref=ref):
                    self.assertIn(ref, names, "index pod: %s %s is rendered" % ref)

    def test_index_probes(self):
        """The kubelet's gRPC probes, on the port the config listens on."""
        self.require_index()
        c = self.prefixd
        ports = {p["containerPort"]: p for p in c.get("ports", [])}
        listen = self.config.get("listen", [])
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            with self.subTest(kind):
                g = (c.get(kind) or {}).get("grpc")
                self.assertIsNotNone(g, "index %s is a native gRPC probe: %s" % (kind, c.get(kind)))
                self.assertTrue(g.get("port") == 50051 and 50051 in ports
                                and "0.0.0.0:50051" in listen,
                                "index %s on 50051, a container port prefixd listens on (pod "
                                "IP): %s" % (kind, (g, listen)))
                want = None if kind == "livenessProbe" else "prefixd.v1.PrefixIndex"
                self.assertTrue(g.get("service") == want or (want is None and not g.get("service")),
                                "index %s asks for %s: %s" % (kind, want or "the whole server", g))

    def test_index_security(self):
        self.require_index()
        self.check_security()

    def test_index_config(self):
        self.require_index()
        self.assertTrue(self.principals_text and not re.search(
            r"^\s*(principals\s*\{|token_sha256)", self.config_text, re.M),
            "no principals (token hashes) in the index ConfigMap")
        cfg = self.config
        self.assertEqual(cfg.get("metrics_listen"), ["0.0.0.0:9464"],
                         "index metrics_listen 0.0.0.0:9464")
        auth = (cfg.get("auth") or [{}])[0]
        self.assertEqual(auth.get("mode"), ["TOKEN"],
                         "index auth TOKEN (a non-loopback listener needs auth)")
        index = cfg.get("index") or []
        self.assertEqual(len(index), 1, "the config has one index { }: %s" % index)
        index = index[0]
        self.assertEqual(index.get("block_size"), ["16"], "index block_size 16")
        sources = index.get("sources", [])
        self.assertTrue(len(sources) == 1 and not index.get("listen"),
                        "index: one source, no listen socket: %s" % index)
        src = sources[0]
        endpoint = (src.get("endpoint") or [""])[0]
        m = re.fullmatch(EVENTS_ENDPOINT, endpoint)
        self.assertTrue(m is not None and m.group(3) == "5557",
                        "pool source endpoint tcp://<service>.<namespace>.svc.cluster.local:5557: "
                        "%s" % endpoint)
        self.assertTrue(src.get("replay_port") == ["5558"] and not src.get("replay_endpoint"),
                        "pool source replay_port 5558 (one replay endpoint per address): %s" % src)
        self.assertEqual(src.get("resolve_interval"), ["10s"], "pool source resolve_interval 10s")

    def test_router_token(self):
        """The routers' principal: the example token's hash, a role that may Route."""
        tok = decode_secret(self.named("Secret", "prefixd-router-token"), "token")
        digest = hashlib.sha256(tok.encode()).hexdigest()
        routers = [p for p in self.principals.get("principals", [])
                   if p.get("token_sha256") == [digest]]
        self.assertTrue(tok and len(routers) == 1 and routers[0].get("role")[0]
                        in ("ENGINE", "ADMIN"),
                        "the router token's SHA-256 is an ENGINE or ADMIN principal (Route, "
                        "ListWorkers): %s" % routers)

    def test_events_service(self):
        self.require_index()
        ev = self.named("Service", "vllm-events")
        self.assertTrue(ev is not None and ev["metadata"]["name"] == self.events_service_name,
                        "the pool source's host names the Service vllm-events: %s"
                        % self.events_service_name)
        spec = ev["spec"]
        self.assertEqual(spec.get("clusterIP"), "None", "vllm-events is headless (clusterIP None)")
        self.assertTrue(selects(spec.get("selector", {}), self.engine_labels)
                        and not selects(spec.get("selector", {}), self.index_labels),
                        "vllm-events selects the engine pods (not the index's): %s"
                        % spec.get("selector"))
        self.assertIs(spec.get("publishNotReadyAddresses"), True,
                      "vllm-events publishes engines that are not ready (no retire on a "
                      "readiness blip)")
        cports = {p.get("name"): p["containerPort"] for p in self.engine.get("ports", [])}
        got = sorted((p["port"], cports.get(p.get("targetPort"), p.get("targetPort")))
                     for p in spec.get("ports", []))
        self.assertEqual(got, [(5557, 5557), (5558, 5558)],
                         "vllm-events ports 5557 and 5558 reach the engine's container ports")

    def test_route_service(self):
        self.require_index()
        route = self.named("Service", "prefixd-index")
        self.assertIsNotNone(route, "Service prefixd-index (Route)")
        spec = route["spec"]
        cports = {p.get("name"): p["containerPort"] for p in self.prefixd.get("ports", [])}
        got = [(p["port"], cports.get(p.get("targetPort"), p.get("targetPort")))
               for p in spec.get("ports", [])]
        self.assertTrue(selects(spec.get("selector", {}), self.index_labels)
                        and not selects(spec.get("selector", {}), self.engine_labels)
                        and got == [(50051, 50051)],
                        "prefixd-index selects the index pods, port 50051 -> gRPC: %s"
                        % ((spec, got),))

    def test_index_metrics_service(self):
        self.require_index()
        metrics = self.named("Service", "prefixd-index-metrics")
        monitors = self.by_kind.get("ServiceMonitor", [])
        mine = self.named("ServiceMonitor", "prefixd-index")
        self.assertTrue(metrics is not None and mine is not None,
                        "Service prefixd-index-metrics and ServiceMonitor prefixd-index")
        cports = {p.get("name"): p["containerPort"] for p in self.prefixd.get("ports", [])}
        mp = metrics["spec"]["ports"]
        self.assertTrue(selects(metrics["spec"]["selector"], self.index_labels)
                        and [cports.get(p.get("targetPort")) for p in mp] == [9464],
                        "prefixd-index-metrics selects the index pods' metrics port: %s" % mp)
        svc_labels = {s["metadata"]["name"]: s["metadata"].get("labels", {})
                      for s in self.by_kind.get("Service", [])}
        scraped = {sm["metadata"]["name"]: sorted(n for n, l in svc_labels.items()
                                                  if selects(sm["spec"]["selector"], l))
                   for sm in monitors}
        self.assertTrue(scraped.get("prefixd-index") == ["prefixd-index-metrics"]
                        and all("prefixd-index-metrics" not in v for k, v in scraped.items()
                                if k != "prefixd-index"),
                        "ServiceMonitor prefixd-index scrapes prefixd-index-metrics, no other "
                        "monitor does: %s" % scraped)
        job = svc_labels["prefixd-index-metrics"].get(mine["spec"].get("jobLabel", ""))
        self.assertEqual(job, "prefixd", "index scraped as job=\"prefixd\" (what the alerts "
                         "expect)")
        self.assertEqual([e.get("port") for e in mine["spec"].get("endpoints", [])],
                         [mp[0].get("name")], "ServiceMonitor prefixd-index scrapes port metrics")

    def test_index_alerts(self):
        rule = self.one("PrometheusRule")
        alerts = {r.get("alert") for g in (rule or {}).get("spec", {}).get("groups", [])
                  for r in g.get("rules", [])}
        self.assertTrue({"PrefixdIndexWorkerNotLive", "PrefixdIndexEventLag", "PrefixdDown"}
                        <= alerts, "PrometheusRule holds PrefixdDown and the index alerts: %s"
                        % sorted(alerts))

    def test_index_network_policy(self):
        self.require_index()
        pols = {p["metadata"]["name"]: p for p in self.by_kind.get("NetworkPolicy", [])}
        idx = [p for p in pols.values() if selects(p["spec"]["podSelector"], self.index_labels)]
        eng = [p for p in pols.values() if selects(p["spec"]["podSelector"], self.engine_labels)]
        self.assertTrue(len(idx) == 1 and len(eng) == 1,
                        "one NetworkPolicy selects the index pods, one the engine pods: %s"
                        % sorted(pols))
        idx, eng = idx[0], eng[0]
        self.assertTrue(set(idx["spec"].get("policyTypes", [])) == {"Ingress", "Egress"}
                        and set(eng["spec"].get("policyTypes", [])) >= {"Ingress"},
                        "index pods isolated both ways, engine pods for ingress")
        expect = [
            (idx, "ingress", self.ROUTER, 50051, True, "router pods reach the index's gRPC port"),
            (idx, "ingress", self.OTHER, 50051, False, "other pods do not reach the index's gRPC"),
            (idx, "ingress", self.engine_labels, 50051, False,
             "engine pods do not reach the index's gRPC"),
            (idx, "ingress", self.PROMETHEUS, 9464, True, "Prometheus scrapes the index"),
            (idx, "ingress", self.ROUTER, 9464, False, "routers do not reach the index's metrics"),
            (idx, "egress", self.engine_labels, 5557, True, "the index reaches the engines' 5557"),
            (idx, "egress", self.engine_labels, 5558, True, "the index reaches the engines' 5558"),
            (idx, "egress", self.engine_labels, 8000, False, "the index reaches no other engine "
             "port"),
            (idx, "egress", self.OTHER, 5557, False, "the index reaches no other pod"),
            (eng, "ingress", self.index_labels, 5557, True, "engines admit the index on 5557"),
            (eng, "ingress", self.index_labels, 5558, True, "engines admit the index on 5558"),
            (eng, "ingress", self.ROUTER, 5557, False, "engines' 5557: not from routers"),
            (eng, "ingress", self.OTHER, 5558, False, "engines' 5558: not from other pods"),
            (eng, "ingress", self.ROUTER, 8000, True, "engines still serve HTTP to the routers"),
            (eng, "ingress", self.PROMETHEUS, 9464, True, "Prometheus still scrapes the "
             "sidecars"),
        ]
        for pol, direction, labels, port, want, what in expect:
            with self.subTest(what):
                self.assertEqual(policy_admits(pol, direction, labels, port), want,
                                 "NetworkPolicy %s: %s" % (pol["metadata"]["name"], what))
        self.assertFalse(policy_admits(idx, "ingress", self.ROUTER, 50051, same_namespace=False),
                         "NetworkPolicy prefixd-index: routers of another namespace are not "
                         "admitted unless named")
        dns = [policy_admits(idx, "egress", {"k8s-app": "kube-dns"}, 53, same_namespace=False,
                             protocol=proto) for proto in ("UDP", "TCP")]
        self.assertEqual(dns, [True, True], "NetworkPolicy prefixd-index: DNS (53, UDP and TCP) "
                         "to kube-dns in another namespace: the pool resolves vllm-events")

    def test_engine_kv_events(self):
        self.require_index()
        args = self.engine.get("args", []) + self.engine.get("command", [])
        kv = [a.split("=", 1)[1] for a in args if a.startswith("--kv-events-config=")]
        self.assertEqual(len(kv), 1, "engine: one --kv-events-config=JSON: %s" % args)
        try:
            cfg = json.loads(kv[0])
        except ValueError as e:
            self.fail("engine: --kv-events-config is valid JSON: %s" % e)
        self.assertTrue(cfg.get("enable_kv_cache_events") is True and cfg.get("publisher") == "zmq"
                        and cfg.get("endpoint") == "tcp://*:5557"
                        and cfg.get("replay_endpoint") == "tcp://*:5558",
                        "engine: KV events on, zmq, PUB bound on tcp://*:5557, replay on "
                        "tcp://*:5558: %s" % cfg)
        topic = cfg.get("topic", "")
        self.assertIsNotNone(re.fullmatch(r"kv@\$\(POD_NAME\)@[^@]+", topic),
                             "engine: topic kv@$(POD_NAME)@<model>: %s" % topic)
        env = {e["name"]: e for e in self.engine.get("env", [])}
        self.assertEqual(env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {})
                         .get("fieldPath"), "metadata.name",
                         "engine: POD_NAME from the downward API (metadata.name)")
        sizes = [a.split("=", 1)[1] for a in args if a.startswith("--block-size=")]
        self.assertEqual(sizes, (self.config.get("index", [{}])[0].get("block_size") or ["16"]),
                         "engine --block-size == index block_size")
        ports = sorted(p["containerPort"] for p in self.engine.get("ports", []))
        self.assertTrue({5557, 5558} <= set(ports),
                        "engine: container ports 5557 and 5558: %s" % ports)
        image = self.engine.get("image", "")
        m = re.search(r":v?(\d+)\.(\d+)", image)
        self.assertTrue(m is not None and (int(m.group(1)), int(m.group(2))) >= (0, 10),
                        "engine: a vLLM image with --kv-events-config (0.10 or later): %s" % image)

    def test_index_daemon(self):
        """The rendered config, as the init container joins it, served by the
        real daemon: PrefixIndex SERVING (what the probes ask), exit 0."""
        if not ARGS.prefixd:
            print("note  --prefixd not given: the rendered index config is not loaded")
            return
        import prefixd_fixture
        text = self.config_text + "\n" + self.principals_text
        d = prefixd_fixture.Daemon(ARGS.prefixd, text)
        try:
            d.start()
            status = prefixd_fixture.health_status(d.tcp, "prefixd.v1.PrefixIndex")
            rc = d.stop()
            self.assertTrue(status == 1 and rc == 0,
                            "prefixd serves the index config: prefixd.v1.PrefixIndex SERVING, "
                            "exits 0 on SIGTERM: status %s, exit %s:\n%s" % (status, rc, d.logs()))
        except prefixd_fixture.DaemonFailed as e:
            self.fail("prefixd serves the rendered index config: %s" % e)
        finally:
            d.close()


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=REPO)
    ap.add_argument("--prefixd", help="the daemon binary, to load the rendered config")
    ARGS, rest = ap.parse_known_args()
    common.unittest_main(argv=[sys.argv[0]] + rest)


if __name__ == "__main__":
    main()
