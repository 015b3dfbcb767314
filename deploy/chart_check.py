#!/usr/bin/env python3
"""Renders and checks the oscarkv Helm chart (deploy/helm/oscarkv).

  chart_check.py --render            rewrite deploy/k8s/oscarkv.yaml from the chart's defaults
  chart_check.py [--oscarkvd PATH]   check (CI): every rendered object against the Kubernetes
                                     API schemas, the committed manifests against a fresh render,
                                     and (with --oscarkvd) the rendered config and flags against
                                     the real daemon

Rendering uses Helm's own template engine (the Helm Go SDK, through the PyPI package
helm-python-sdk: no helm binary is installable from Debian or PyPI); validation uses
kubernetes-validate (the Kubernetes OpenAPI schemas as JSON schemas, strict: unknown fields are
errors). scripts/setup.sh installs both into <build>/deploy-venv.
"""
import argparse
import copy
import os
import pathlib
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

import helm_python as helm
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "oscarkv"
MANIFESTS = ROOT / "deploy" / "k8s" / "oscarkv.yaml"
# The oldest Kubernetes the chart supports (gRPC probes are GA from 1.27) and the newest schema set.
K8S_VERSIONS = ["1.27.0", kubernetes_validate.latest_version()]
HEADER = ("# Generated from deploy/helm/oscarkv with its default values by\n"
          "#   <build>/deploy-venv/bin/python deploy/chart_check.py --render\n"
          "# Do not edit: change the chart and re-render (CI fails when the two differ).\n"
          "# kubectl apply -f deploy/k8s/  (namespace default; release name oscarkv). mTLS by default:\n"
          "# create secret oscarkv-tls (tls.crt, tls.key, ca.crt) first (deploy/README.md).\n")

# Value sets the check renders besides the defaults: every optional part on, and every part off.
ALL_ON = {
    "tls": {"enabled": True, "secretName": "oscarkv-tls", "clientCA": True},
    "tenantsEnabled": True,
    "tenants": [{"name": "tenant-a", "quota": {"pool_mb": 1024, "pinned_pages": 4096,
                                               "leases": 1024, "handles": 256, "codecs": 8}},
                {"name": "admin", "role": "admin"}],
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "priorityClassName": "system-node-critical",
    "imagePullSecrets": [{"name": "registry"}],
    "podAnnotations": {"example.com/team": "inference"},
}
ALL_OFF = {
    "metrics": {"enabled": False},
    "podDisruptionBudget": {"enabled": False},
    "hostNetwork": False,
    "hostIPC": False,
    "listenHost": "0.0.0.0",
    "nodeSelector": {},
    "tolerations": [],
}


def render(values, name="oscarkv", namespace="default"):
    """The chart's objects, in template-file order, as (template, text) pairs."""
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values, name=name, namespace=namespace)
    return [(k, v) for k, v in sorted(out.items()) if v.strip() and not k.endswith("NOTES.txt")]


def manifest_text(rendered):
    parts = [HEADER]
    for template, text in rendered:
        body = "\n".join(line.rstrip() for line in text.strip("\n").splitlines())
        parts.append(f"---\n# Source: {template}\n{body}\n")
    return "".join(parts)


def documents(text):
    return [d for d in yaml.safe_load_all(text) if d is not None]


def structural_service_monitor(doc):
    """ServiceMonitor is a Prometheus Operator CRD: kubernetes-validate has no schema for it."""
    errors = []
    if doc.get("apiVersion") != "monitoring.coreos.com/v1":
        errors.append("apiVersion is not monitoring.coreos.com/v1")
    spec = doc.get("spec", {})
    if not spec.get("selector", {}).get("matchLabels"):
        errors.append("spec.selector.matchLabels is empty")
    eps = spec.get("endpoints") or []
    if not eps or any(set(e) - {"port", "path", "interval"} or "port" not in e for e in eps):
        errors.append("spec.endpoints must name a port (and only port/path/interval)")
    return errors


def validate(label, text):
    failures = 0
    docs = documents(text)
    kinds = [d.get("kind") for d in docs]
    for doc in docs:
        what = f"{label}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if doc.get("kind") == "ServiceMonitor":
            errs = structural_service_monitor(doc)
            for e in errs:
                print(f"FAIL {what}: {e}")
            failures += len(errs)
            if not errs:
                print(f"ok   {what} (CRD: structure checked, no API schema)")
            continue
        before = failures
        for v in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, v, strict=True)
            except kubernetes_validate.ValidationError as e:
                print(f"FAIL {what} (Kubernetes {v}): {e.message} at {list(e.path)}")
                failures += 1
            except kubernetes_validate.SchemaNotFoundError as e:
                print(f"FAIL {what} (Kubernetes {v}): no schema: {e}")
                failures += 1
        if failures == before:
            print(f"ok   {what} (Kubernetes {', '.join(K8S_VERSIONS)}, strict)")
    return failures, kinds


def consistency(label, text):
    """What the schemas cannot see: the pieces must refer to one another."""
    docs = {d["kind"]: d for d in documents(text)}
    errors = []
    ds = docs.get("DaemonSet")
    cm = docs.get("ConfigMap")
    svc = docs.get("Service")
    if ds is None or cm is None or svc is None:
        return [f"{label}: DaemonSet, ConfigMap and Service must all be rendered"]
    pod = ds["spec"]["template"]["spec"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    if any(labels.get(k) != v for k, v in ds["spec"]["selector"]["matchLabels"].items()):
        errors.append("the DaemonSet's selector does not match its pod labels")
    if any(labels.get(k) != v for k, v in svc["spec"]["selector"].items()):
        errors.append("the Service's selector does not match the pods")
    if svc["spec"].get("clusterIP") != "None":
        errors.append("the Service is not headless")
    vols = {v["name"]: v for v in pod["volumes"]}
    if vols.get("config", {}).get("configMap", {}).get("name") != cm["metadata"]["name"]:
        errors.append("the config volume does not mount the rendered ConfigMap")
    c = pod["containers"][0]
    port_names = {p["name"] for p in c.get("ports", [])}
    for p in svc["spec"]["ports"]:
        if p["targetPort"] not in port_names:
            errors.append(f"Service port {p['name']} targets no container port")
    sc = c.get("securityContext", {})
    psc = pod.get("securityContext", {})
    if not psc.get("runAsNonRoot") or psc.get("runAsUser", 0) == 0:
        errors.append("the pod may run as root")
    if sc.get("allowPrivilegeEscalation") is not False or "ALL" not in sc.get(
            "capabilities", {}).get("drop", []):
        errors.append("the container keeps privilege escalation or capabilities")
    if "PodDisruptionBudget" in docs and docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] != \
            ds["spec"]["selector"]["matchLabels"]:
        errors.append("the PodDisruptionBudget selects other pods")
    try:
        yaml.safe_load(cm["data"]["oscarkvd.yaml"])
    except yaml.YAMLError as e:
        errors.append(f"the ConfigMap's oscarkvd.yaml is not YAML: {e}")
    return [f"{label}: {e}" for e in errors]


def run_daemon(oscarkvd, values, label, tls_dir=None):
    """Starts the real daemon with the DaemonSet's args and the ConfigMap's config, as rendered
    for a loopback test node (ports 0, a small pool), and stops it with SIGTERM."""
    docs = {d["kind"]: d for d in documents(manifest_text(render(values)))}
    c = docs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = pathlib.Path(tmp) / "oscarkvd.yaml"
        text = docs["ConfigMap"]["data"]["oscarkvd.yaml"]
        if tls_dir:  # the secret's mount point, for the files made for this check
            text = text.replace("/etc/oscarkv/tls/", f"{tls_dir}/")
        cfg.write_text(text)
        env = {"NODE_NAME": "chart-check-node", "HOST_IP": "127.0.0.1"}
        args = []
        for a in c["args"]:
            a = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a)
            args.append(str(cfg) if a == "/etc/oscarkv/oscarkvd.yaml" else a)
        log = pathlib.Path(tmp) / "log"
        with open(log, "w") as err:
            p = subprocess.Popen([oscarkvd] + args, stdout=subprocess.PIPE, stderr=err, text=True)
            ready = ""
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and p.poll() is None:
                r, _, _ = select.select([p.stdout], [], [], 0.5)
                if r:
                    ready = p.stdout.readline()
                    break
            if not ready.startswith("oscarkvd ready"):
                p.kill()
                p.wait()
                print(f"FAIL {label}: oscarkvd {' '.join(args)} did not start:\n{log.read_text()}")
                return 1
            p.send_signal(signal.SIGTERM)
            try:
                code = p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                code = p.wait()
        if code != 0:
            print(f"FAIL {label}: oscarkvd exited {code} on SIGTERM:\n{log.read_text()}")
            return 1
    print(f"ok   {label}: oscarkvd accepts the rendered config and flags ({ready.strip()})")
    return 0


def node_ip():
    """This host's first global IPv4 address ("" if none): a node IP that is not loopback."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    m = re.search(r"\binet (\d+\.\d+\.\d+\.\d+)/", out)
    return m.group(1) if m else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--render", action="store_true", help="rewrite deploy/k8s/oscarkv.yaml")
    ap.add_argument("--oscarkvd", help="the daemon binary: check it accepts what is rendered")
    a = ap.parse_args()
    if a.render:
        MANIFESTS.parent.mkdir(exist_ok=True)
        MANIFESTS.write_text(manifest_text(render({})))
        print(f"wrote {MANIFESTS.relative_to(ROOT)}")
        return 0

    failures = 0
    lint = helm.lint(str(CHART))
    print(f"helm lint: {lint}")
    # Helm's severities: 1 info, 2 warning, 4 error; warnings fail the check too.
    if lint.get("errors") or any(m.get("severity", 0) >= 2 for m in lint.get("messages", [])):
        print("FAIL helm lint")
        failures += 1
    variants = {"defaults": {}, "all optional parts on": ALL_ON, "optional parts off": ALL_OFF}
    all_kinds = set()
    for label, values in variants.items():
        text = manifest_text(render(values, namespace="oscarkv-test"))
        f, kinds = validate(label, text)
        failures += f
        all_kinds.update(kinds)
        for e in consistency(label, text):
            print(f"FAIL {e}")
            failures += 1
    want = {"ConfigMap", "DaemonSet", "Service", "PodDisruptionBudget", "ServiceMonitor"}
    if want - all_kinds:
        print(f"FAIL the chart never renders {sorted(want - all_kinds)}")
        failures += 1

    failures += secure_defaults()

    committed = MANIFESTS.read_text() if MANIFESTS.exists() else ""
    if committed != manifest_text(render({})):
        print(f"FAIL {MANIFESTS.relative_to(ROOT)} is not the chart's default render: run "
              "python3 deploy/chart_check.py --render")
        failures += 1
    else:
        print(f"ok   {MANIFESTS.relative_to(ROOT)} is the chart's default render")
    extra = sorted(p.name for p in MANIFESTS.parent.iterdir() if p != MANIFESTS)
    if extra:
        print(f"FAIL deploy/k8s/ holds other files ({extra}): kubectl apply -f deploy/k8s/ "
              "must apply the rendered manifests only")
        failures += 1

    if a.oscarkvd:
        failures += check_daemon(a.oscarkvd)
    print(f"{'FAILED' if failures else 'PASSED'}: {failures} failure(s)")
    return 1 if failures else 0


# Values the chart must refuse to render (each exposes every client's pages to the network
# unauthenticated), with a phrase of the refusal; and the opt-ins that render them.
REFUSED = [
    ({"tls": {"enabled": False}}, "oscarkvd would serve plaintext gRPC on the node network"),
    ({"tls": {"enabled": False}, "listenHost": "0.0.0.0"}, "plaintext gRPC"),
    ({"tls": {"clientCA": False}}, "TLS without a client CA authenticates no client"),
]
ALLOWED = [
    ({"tls": {"enabled": False}, "allowPlaintext": True}, "--allow-plaintext"),
    ({"tls": {"enabled": False}, "listenHost": "127.0.0.1"}, None),
    ({"tls": {"clientCA": False, "allowUnauthenticatedClients": True}},
     "allow_unauthenticated_clients: true"),
]


def secure_defaults():
    """The chart renders nothing that serves the node network unauthenticated unless asked."""
    failures = 0
    for values, phrase in REFUSED:
        try:
            render(values)
            print(f"FAIL {values}: rendered (should be refused: {phrase})")
            failures += 1
        except Exception as e:  # helm_python.errors.HelmRenderError
            if phrase not in str(e):
                print(f"FAIL {values}: refused, but not saying '{phrase}': {e}")
                failures += 1
            else:
                print(f"ok   {values}: refused ({phrase})")
    for values, phrase in ALLOWED:
        text = manifest_text(render(values))
        if phrase is not None and phrase not in text:
            print(f"FAIL {values}: the render lacks '{phrase}'")
            failures += 1
        elif "--allow-plaintext" in text and not values.get("allowPlaintext"):
            print(f"FAIL {values}: --allow-plaintext without allowPlaintext")
            failures += 1
        else:
            print(f"ok   {values}: rendered")
    defaults = manifest_text(render({}))
    if "--allow-plaintext" in defaults or "client_ca: /etc/oscarkv/tls/ca.crt" not in defaults:
        print("FAIL the default render is not mTLS")
        failures += 1
    return failures


def check_daemon(oscarkvd):
    """The real daemon with what the chart renders: the defaults (mTLS) on loopback and on a
    node IP, tenants, and plaintext on loopback."""
    failures = 0
    test_node = {"listenHost": "127.0.0.1", "ports": {"grpc": 0, "metrics": 0}}
    base = copy.deepcopy(helm_defaults())
    cfg = base["config"]
    cfg["pool"]["mb"] = 64
    cfg["pool"]["shm_name"] = f"oscarkv-chart-check-{os.getpid()}"
    with tempfile.TemporaryDirectory() as tls_dir:
        # A self-signed server certificate that is its own client CA: enough to start.
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
             "/CN=127.0.0.1", "-keyout", f"{tls_dir}/tls.key", "-out",
             f"{tls_dir}/tls.crt"], check=True, capture_output=True, timeout=60)
        pathlib.Path(f"{tls_dir}/ca.crt").write_bytes(
            pathlib.Path(f"{tls_dir}/tls.crt").read_bytes())
        failures += run_daemon(oscarkvd, {**test_node, "config": cfg}, "defaults (mTLS)",
                               tls_dir)
        # On a node IP that is not loopback, as in a cluster: the daemon refuses configs that
        # expose what a loopback address would not (plaintext gRPC, TLS without a client CA,
        # the pool's UCX data plane).
        ip = node_ip()
        if ip:
            failures += run_daemon(oscarkvd, {**test_node, "listenHost": ip, "config": cfg},
                                   f"defaults on a node IP ({ip})", tls_dir)
        else:
            print("skip defaults on a node IP: this host has no global IPv4 address")
        # The example tenants' quotas, with a pool_mb that fits the check's 64 MiB pool (the
        # daemon refuses pool_mb quotas that add up to more than the pool).
        small = copy.deepcopy(ALL_ON["tenants"])
        small[0]["quota"]["pool_mb"] = 16
        failures += run_daemon(oscarkvd, {**test_node, "config": cfg, "tenantsEnabled": True,
                                          "tenants": small}, "tenants", tls_dir)
    failures += run_daemon(oscarkvd, {**test_node, "config": cfg, "tls": {"enabled": False}},
                           "plaintext on loopback")
    return failures


def helm_defaults():
    with helm.Chart.load(str(CHART)) as chart:
        return chart.values


if __name__ == "__main__":
    sys.exit(main())
