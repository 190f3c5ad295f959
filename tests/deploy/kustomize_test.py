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

With --prefixd, the rendered config (ConfigMap + principals Secret, joined as
the pod's init container joins them) is also loaded by the real daemon.

Exit 0 pass, 1 fail, 77 skip (kubectl absent).
Usage: kustomize_test.py [--repo DIR] [--prefixd PATH]
"""

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys

SKIP = 77
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import common  # noqa: E402  (tests/python/common.py)

try:
    import yaml
except ImportError:
    print("FAIL: python3 yaml module missing: apt-get install python3-yaml")
    sys.exit(1)


def render(repo):
    r = subprocess.run(["kubectl", "kustomize", os.path.join(repo, "deploy", "k8s")],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        print("FAIL  kubectl kustomize deploy/k8s: exit %d\n%s" % (r.returncode, r.stderr))
        sys.exit(1)
    return [d for d in yaml.safe_load_all(r.stdout) if d]


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


class KustomizeTest(common.Checker):
    def __init__(self, repo, docs):
        super().__init__()
        self.repo = repo
        self.docs = docs
        self.by_kind = {}
        for d in docs:
            self.by_kind.setdefault(d["kind"], []).append(d)

    def one(self, kind, name_prefix=""):
        objs = [o for o in self.by_kind.get(kind, [])
                if o["metadata"]["name"].startswith(name_prefix)]
        return objs[0] if len(objs) == 1 else None

    def test_kinds(self):
        kinds = sorted(d["kind"] for d in self.docs)
        want = ["ConfigMap", "Deployment", "PrometheusRule", "Secret", "Secret", "Service",
                "ServiceMonitor"]
        if os.path.exists(os.path.join(self.repo, "deploy", "grafana", "prefixd.json")):
            want = sorted(want + ["ConfigMap"])
        self.check(kinds == want, "kinds: %s" % ", ".join(want), "rendered %s" % kinds)
        for d in self.docs:
            self.check(d["metadata"].get("labels", {}).get("app.kubernetes.io/part-of")
                       == "prefixd", "%s/%s labelled part-of prefixd"
                       % (d["kind"], d["metadata"]["name"]))

    def load_pod(self):
        dep = self.one("Deployment")
        if not self.check(dep is not None, "one Deployment"):
            return False
        self.deployment = dep
        self.pod = dep["spec"]["template"]["spec"]
        named = {c["name"]: c for c in all_containers(self.pod)}
        self.prefixd = named.get("prefixd")
        self.engine = named.get("engine")
        return (self.check(self.prefixd is not None, "a prefixd container") and
                self.check(self.engine is not None, "an engine container"))

    def load_config(self):
        cm = self.one("ConfigMap", "prefixd-config")
        self.check(cm is not None, "ConfigMap prefixd-config")
        self.config_text = (cm or {}).get("data", {}).get("prefixd.textproto", "")
        self.check("listen" in self.config_text, "ConfigMap holds prefixd.textproto")
        sec = self.one("Secret", "prefixd-principals")
        self.check(sec is not None, "Secret prefixd-principals")
        self.principals_text = decode_secret(sec, "principals.textproto")
        self.check("principals" in self.principals_text, "Secret holds the principals")
        self.check(not re.search(r"^\s*(principals\s*\{|token_sha256)", self.config_text, re.M),
                   "no principals (token hashes) in the ConfigMap")

    def test_sidecar(self):
        c = self.prefixd
        in_init = c in self.pod.get("initContainers", [])
        self.check(not in_init or c.get("restartPolicy") == "Always",
                   "prefixd is a native sidecar (init container, restartPolicy Always)"
                   if in_init else "prefixd runs beside the engine")
        if in_init:
            order = [x["name"] for x in self.pod["initContainers"]]
            writer = [x for x in self.pod["initContainers"] if x["name"] == "prefixd-config"]
            self.check(bool(writer) and order.index("prefixd-config") < order.index("prefixd"),
                       "the config is assembled before prefixd starts", order)
        args = c.get("args", []) + c.get("command", [])
        configs = [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
        self.check(len(configs) == 1, "prefixd gets --config=FILE", args)
        if configs:
            m = volume_for_path(c, configs[0])
            self.check(m is not None, "the config file %s is on a volume" % configs[0])
            if m:
                writers = [x for x in self.pod.get("initContainers", [])
                           if x is not c and (volume_for_path(x, configs[0]) or {}).get("name")
                           == m["name"]]
                self.check(any(configs[0] in " ".join(w.get("command", [])) for w in writers),
                           "an init container writes %s" % configs[0])

    def test_probes(self):
        c = self.prefixd
        ports = {p["containerPort"]: p for p in c.get("ports", [])}
        tcp = [a for a in textproto_strings(self.config_text, "listen")
               if not a.startswith("unix:")]
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            probe = c.get(kind)
            if kind == "startupProbe" and probe is None:
                continue
            if not self.check(probe is not None and "grpc" in probe,
                              "prefixd %s is a native gRPC probe" % kind, probe):
                continue
            port = probe["grpc"].get("port")
            self.check(port == 50051, "%s on port 50051" % kind, port)
            self.check(port in ports, "%s port is a container port" % kind, ports)
            self.check(any(a.endswith(":%s" % port) and a.split(":")[0] in ("0.0.0.0", "[::]")
                           for a in tcp),
                       "%s: prefixd listens on the pod IP at %s (the kubelet dials it)"
                       % (kind, port), tcp)
        rp = (c.get("readinessProbe") or {}).get("grpc", {})
        self.check(rp.get("service") in (None, "", "prefixd.v1.PrefixCache"),
                   "readiness asks a service prefixd reports", rp)

    def test_socket(self):
        unix = [a for a in textproto_strings(self.config_text, "listen") if a.startswith("unix:")]
        if not self.check(len(unix) == 1, "the config has one unix:// listener", unix):
            return
        path = unix[0][len("unix://"):]
        sock_dir = os.path.dirname(path)
        pm = volume_for_path(self.prefixd, path)
        em = volume_for_path(self.engine, path)
        self.check(pm is not None and pm["mountPath"] == sock_dir,
                   "prefixd mounts a volume at %s" % sock_dir, pm)
        self.check(em is not None and em["mountPath"] == sock_dir,
                   "the engine mounts a volume at %s" % sock_dir, em)
        if pm and em:
            self.check(pm["name"] == em["name"], "both mount the same volume (%s)" % pm["name"])
            self.check(not pm.get("readOnly") and not em.get("readOnly"),
                       "the socket volume is writable in both (connect needs write)")
            vol = [v for v in self.pod["volumes"] if v["name"] == pm["name"]]
            self.check(len(vol) == 1 and "emptyDir" in vol[0], "the socket volume is an emptyDir",
                       vol)
        env = {e["name"]: e for e in self.engine.get("env", [])}
        self.check(env.get("PREFIXD_ADDR", {}).get("value") == unix[0],
                   "engine PREFIXD_ADDR = %s" % unix[0], env.get("PREFIXD_ADDR"))
        ref = env.get("PREFIXD_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
        self.check(ref.get("name", "").startswith("prefixd-engine-token"),
                   "engine PREFIXD_TOKEN comes from a Secret", ref)

    def test_writable_paths(self):
        snap = textproto_strings(self.config_text, "snapshot_path")
        if self.check(len(snap) == 1, "the config sets snapshot_path", snap):
            m = volume_for_path(self.prefixd, snap[0])
            self.check(m is not None and not m.get("readOnly"),
                       "snapshot %s is on a writable volume (root fs is read-only)" % snap[0], m)

    def test_security(self):
        pod_sc = self.pod.get("securityContext", {})
        self.check(pod_sc.get("runAsNonRoot") is True, "pod runAsNonRoot")
        self.check(pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
                   "pod seccompProfile RuntimeDefault")
        self.check(self.pod.get("automountServiceAccountToken") is False,
                   "no service account token mounted")
        for c in all_containers(self.pod):
            name = c["name"]
            sc = c.get("securityContext", {})
            self.check(effective(self.pod, c, "runAsNonRoot") is True, "%s: non-root" % name)
            uid = effective(self.pod, c, "runAsUser")
            self.check(isinstance(uid, int) and uid > 0, "%s: runAsUser %s > 0" % (name, uid))
            self.check(sc.get("readOnlyRootFilesystem") is True,
                       "%s: readOnlyRootFilesystem" % name)
            self.check(sc.get("allowPrivilegeEscalation") is False,
                       "%s: allowPrivilegeEscalation false" % name)
            self.check(sc.get("capabilities", {}).get("drop") == ["ALL"],
                       "%s: capabilities drop ALL" % name, sc.get("capabilities"))
            self.check(not sc.get("privileged"), "%s: not privileged" % name)
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                self.check(all(k in res.get(part, {}) for k in ("cpu", "memory")),
                           "%s: cpu and memory %s" % (name, part), res)

    def test_references(self):
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
        self.check(len(refs) >= 3, "the pod names its ConfigMap and Secrets", refs)
        for ref in refs:
            self.check(ref in names, "%s %s is rendered" % ref, sorted(names))
        mounted = {v["name"] for v in self.pod.get("volumes", [])}
        for c in all_containers(self.pod):
            for m in c.get("volumeMounts", []):
                self.check(m["name"] in mounted, "%s mounts defined volume %s"
                           % (c["name"], m["name"]))

    def test_metrics(self):
        ml = textproto_strings(self.config_text, "metrics_listen")
        self.check(ml == ["0.0.0.0:9464"], "metrics_listen 0.0.0.0:9464 (reachable in the pod)",
                   ml)
        svc = self.one("Service")
        if not self.check(svc is not None, "one Service"):
            return
        port = [p for p in svc["spec"]["ports"] if p.get("port") == 9464]
        self.check(len(port) == 1, "Service port 9464", svc["spec"]["ports"])
        named = {p.get("name"): p["containerPort"] for p in self.prefixd.get("ports", [])}
        if port:
            target = port[0].get("targetPort", 9464)
            self.check(named.get(target) == 9464 or target == 9464,
                       "Service targets prefixd's metrics port", (target, named))
        labels = self.deployment["spec"]["template"]["metadata"]["labels"]
        sel = svc["spec"]["selector"]
        self.check(all(labels.get(k) == v for k, v in sel.items()),
                   "Service selects the engine pods", (sel, labels))
        sm = self.one("ServiceMonitor")
        if self.check(sm is not None, "one ServiceMonitor"):
            want = sm["spec"]["selector"]["matchLabels"]
            have = svc["metadata"].get("labels", {})
            self.check(all(have.get(k) == v for k, v in want.items()),
                       "ServiceMonitor selects the Service", (want, have))
            job = have.get(sm["spec"].get("jobLabel", ""), svc["metadata"]["name"])
            self.check(job == "prefixd", "scraped as job=\"prefixd\" (what the alerts expect)",
                       job)
            eps = sm["spec"].get("endpoints", [])
            self.check(any(e.get("port") == port[0].get("name") for e in eps) if port else False,
                       "ServiceMonitor scrapes the Service's metrics port", eps)

    def test_prometheus_rule(self):
        rule = self.one("PrometheusRule")
        if not self.check(rule is not None, "one PrometheusRule"):
            return
        groups = rule["spec"].get("groups", [])
        rules = [r for g in groups for r in g.get("rules", [])]
        self.check(len(rules) >= 5 and all(r.get("expr") for r in rules),
                   "PrometheusRule has %d rules, each with an expr" % len(rules))
        alerts = os.path.join(self.repo, "deploy", "prometheus", "alerts.yml")
        if os.path.exists(alerts):
            with open(alerts) as f:
                self.check(yaml.safe_load(f) == rule["spec"],
                           "PrometheusRule spec == deploy/prometheus/alerts.yml")
        else:
            print("note  deploy/prometheus/alerts.yml absent: the rule is the interim one")
        promtool = shutil.which("promtool")
        if promtool:
            r = subprocess.run([promtool, "check", "rules", "/dev/stdin"],
                               input=yaml.safe_dump(rule["spec"]), capture_output=True,
                               text=True, timeout=60)
            self.check(r.returncode == 0, "promtool check rules on the PrometheusRule",
                       r.stdout + r.stderr)
        else:
            print("note  promtool absent: rule syntax not checked")

    def test_dashboard(self):
        src = os.path.join(self.repo, "deploy", "grafana", "prefixd.json")
        if not os.path.exists(src):
            print("note  deploy/grafana/prefixd.json absent: no dashboard ConfigMap expected")
            return
        cm = self.one("ConfigMap", "prefixd-grafana-dashboard")
        if self.check(cm is not None, "ConfigMap prefixd-grafana-dashboard"):
            self.check(cm["metadata"].get("labels", {}).get("grafana_dashboard") == "1",
                       "dashboard ConfigMap labelled grafana_dashboard=1")
            with open(src) as f:
                self.check(cm.get("data", {}).get("prefixd.json") == f.read(),
                           "dashboard ConfigMap == deploy/grafana/prefixd.json")

    def test_sync(self):
        r = subprocess.run([sys.executable, os.path.join(self.repo, "deploy", "k8s",
                                                         "sync-monitoring.py"), "--check"],
                           capture_output=True, text=True, timeout=60)
        self.check(r.returncode == 0, "deploy/k8s/monitoring is in step with its sources",
                   r.stdout + r.stderr)

    def test_example_token(self):
        tok = decode_secret(self.one("Secret", "prefixd-engine-token"), "token")
        hashes = textproto_strings(self.principals_text, "token_sha256")
        self.check(hashlib.sha256(tok.encode()).hexdigest() in hashes,
                   "the engine token's SHA-256 is a configured principal", hashes)

    def test_daemon_loads_config(self, prefixd):
        # As the init container joins them; the fixture's flags replace the
        # pod's listeners and snapshot path with free ports and a temp dir.
        text = self.config_text + "\n" + self.principals_text
        err = common.serve_config(prefixd, text)
        if err and "not supported by this build" in err:
            print("note  this prefixd build cannot load the pod's config: %s"
                  % err.strip().splitlines()[-1])
            print("note  retrying with auth NONE and no principals (the rest of the config)")
            text = re.sub(r"^auth\s*\{[^}]*\}", "auth { mode: NONE }", self.config_text,
                          flags=re.M)
            err = common.serve_config(prefixd, text)
        self.check(err is None, "prefixd serves with the rendered config, exits 0 on SIGTERM",
                   err)


def decode_secret(secret, key):
    import base64
    if not secret:
        return ""
    if key in secret.get("stringData", {}):
        return secret["stringData"][key]
    return base64.b64decode(secret.get("data", {}).get(key, "")).decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=REPO)
    ap.add_argument("--prefixd", help="the daemon binary, to load the rendered config")
    args = ap.parse_args()
    if shutil.which("kubectl") is None:
        print("SKIP: kubectl not found (apt-get install kubernetes-client)")
        return SKIP
    t = KustomizeTest(args.repo, render(args.repo))
    t.test_kinds()
    if t.load_pod():
        t.load_config()
        t.test_sidecar()
        t.test_probes()
        t.test_socket()
        t.test_writable_paths()
        t.test_security()
        t.test_references()
        t.test_metrics()
        t.test_example_token()
        if args.prefixd:
            t.test_daemon_loads_config(args.prefixd)
    t.test_prometheus_rule()
    t.test_dashboard()
    t.test_sync()
    return t.exit_code()


if __name__ == "__main__":
    sys.exit(main())
