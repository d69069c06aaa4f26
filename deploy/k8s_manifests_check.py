#!/usr/bin/env python3
"""Structural checks of deploy/k8s/*.yaml: they parse, and the DaemonSet and
the trainer pod agree on what zccd needs (socket directory, shared /dev/shm,
probe and metrics ports matching zccd.conf, GPU node placement, security
settings). Usage: k8s_manifests_check.py DAEMONSET_YAML TRAINER_POD_YAML"""

import re
import sys

try:
    import yaml
except ImportError:
    print("FAIL: the Python yaml module is missing: install python3-yaml "
          "(tools/setup.sh should)")
    sys.exit(1)

failures = []


def check(ok, message):
    if not ok:
        failures.append(message)
    return ok


def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    for d in docs:
        check(isinstance(d, dict), f"{path}: a document is not a mapping")
        for key in ("apiVersion", "kind", "metadata"):
            check(key in d, f"{path}: {d.get('kind')} lacks {key}")
        check("name" in d.get("metadata", {}), f"{path}: {d.get('kind')} lacks metadata.name")
    return docs


def one(docs, kind):
    found = [d for d in docs if d.get("kind") == kind]
    check(len(found) == 1, f"expected one {kind}, found {len(found)}")
    return found[0] if found else {}


def host_path_mounts(pod_spec, container):
    """mountPath -> hostPath path for the container's hostPath volumes."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    out = {}
    for m in container.get("volumeMounts", []):
        check(m["name"] in volumes, f"volumeMount {m['name']} has no volume")
        v = volumes.get(m["name"], {})
        if "hostPath" in v:
            out[m["mountPath"]] = v["hostPath"]["path"]
    return out


def conf_value(conf, field):
    m = re.search(rf'^\s*{field}:\s*"([^"]*)"', conf, re.M)
    return m.group(1) if m else None


def main(daemonset_path, trainer_path):
    docs = load(daemonset_path)
    ns = one(docs, "Namespace")
    ds = one(docs, "DaemonSet")
    cm = one(docs, "ConfigMap")
    namespace = ns.get("metadata", {}).get("name")
    for d in (ds, cm):
        check(d.get("metadata", {}).get("namespace") == namespace,
              f"{d.get('kind')} is not in namespace {namespace}")
    check(ds.get("apiVersion") == "apps/v1", "DaemonSet apiVersion must be apps/v1")

    spec = ds.get("spec", {})
    template = spec.get("template", {})
    labels = template.get("metadata", {}).get("labels", {})
    for k, v in spec.get("selector", {}).get("matchLabels", {}).items():
        check(labels.get(k) == v, f"selector {k}={v} does not match the pod labels")
    pod = template.get("spec", {})

    # GPU nodes.
    check(any("nvidia" in k for k in pod.get("nodeSelector", {})),
          "DaemonSet nodeSelector names no nvidia GPU label")
    check(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])),
          "DaemonSet does not tolerate the nvidia.com/gpu taint")
    check(not pod.get("hostPID", False), "hostPID on the daemon alone mismatches trainer pids")

    containers = pod.get("containers", [])
    check(len(containers) == 1, "expected one zccd container")
    c = containers[0] if containers else {}
    check("--config=/etc/zcc/zccd.conf" in c.get("args", []), "zccd is not given --config")

    # zccd.conf from the ConfigMap, mounted at /etc/zcc.
    conf = cm.get("data", {}).get("zccd.conf", "")
    check(conf, "ConfigMap has no zccd.conf")
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    conf_mounts = [m for m in c.get("volumeMounts", []) if m.get("mountPath") == "/etc/zcc"]
    check(len(conf_mounts) == 1 and
          volumes.get(conf_mounts[0]["name"], {}).get("configMap", {}).get("name") ==
          cm.get("metadata", {}).get("name"),
          "the ConfigMap is not mounted at /etc/zcc")

    # Probes use gRPC on the status TCP port; metrics on the metrics port.
    ports = {p["containerPort"]: p for p in c.get("ports", [])}
    status_addr = conf_value(conf, "status_tcp_listen") or ""
    metrics_addr = conf_value(conf, "metrics_http_listen") or ""
    check(status_addr.startswith("0.0.0.0:"),
          "status_tcp_listen must listen on the pod IP (0.0.0.0:PORT) for the kubelet's probe")
    status_port = int(status_addr.rsplit(":", 1)[-1] or 0) if status_addr else 0
    metrics_port = int(metrics_addr.rsplit(":", 1)[-1] or 0) if metrics_addr else 0
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        p = c.get(probe)
        if p is None:
            check(probe != "livenessProbe", "no livenessProbe")
            continue
        check(p.get("grpc", {}).get("port") == status_port,
              f"{probe} is not a grpc probe on status_tcp_listen's port {status_port}")
    check(status_port in ports, f"containerPort {status_port} (status) not declared")
    check(metrics_port in ports, f"containerPort {metrics_port} (metrics) not declared")
    annotations = template.get("metadata", {}).get("annotations", {})
    check(annotations.get("prometheus.io/port") == str(metrics_port),
          "prometheus.io/port annotation does not match metrics_http_listen")

    # Resources and security.
    res = c.get("resources", {})
    check("requests" in res and "limits" in res, "resources need requests and limits")
    sc = c.get("securityContext", {})
    check(sc.get("privileged") is False, "container must not be privileged")
    check(sc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation must be false")
    check("ALL" in sc.get("capabilities", {}).get("drop", []), "capabilities must drop ALL")
    check("IPC_LOCK" in sc.get("capabilities", {}).get("add", []),
          "IPC_LOCK is needed for pinned staging memory")
    for cap in ("SETUID", "SETGID"):
        check(cap in sc.get("capabilities", {}).get("add", []),
              cap + " is needed to write job directories with their owner's identity")

    # Socket directory and shared memory come from the host.
    socket_path = conf_value(conf, "socket_path") or ""
    socket_dir = socket_path.rsplit("/", 1)[0]
    ds_mounts = host_path_mounts(pod, c)
    check(ds_mounts.get(socket_dir) == socket_dir,
          f"the socket directory {socket_dir} is not a hostPath mount")
    check(ds_mounts.get("/dev/shm") == "/dev/shm" or pod.get("hostIPC") is True,
          "the daemon does not share the host's /dev/shm (hostPath or hostIPC)")
    root = conf_value(conf, "default_root")
    check(root in ds_mounts, f"the checkpoint root {root} is not mounted")

    # The trainer pod meets the daemon in the same places.
    trainer_docs = load(trainer_path)
    check(len(trainer_docs) == 1, "trainer example must be one Pod")
    trainer = trainer_docs[0] if trainer_docs else {}
    check(trainer.get("kind") == "Pod", "trainer example must be a Pod")
    tspec = trainer.get("spec", {})
    tcont = tspec.get("containers", [{}])[0]
    t_mounts = host_path_mounts(tspec, tcont)
    check(t_mounts.get(socket_dir) == ds_mounts.get(socket_dir),
          "the trainer does not mount the daemon's socket directory")
    check(t_mounts.get("/dev/shm") == "/dev/shm" or tspec.get("hostIPC") is True,
          "the trainer does not share the host's /dev/shm")
    check(tspec.get("nodeSelector") == pod.get("nodeSelector"),
          "the trainer's nodeSelector differs from the daemon's: it may land on a node "
          "without zccd")
    env = {e["name"]: e.get("value") for e in tcont.get("env", [])}
    check(env.get("ZCC_SOCKET") == socket_path, "the trainer is not told the socket path")

    if failures:
        for f in failures:
            print("FAIL:", f)
        return 1
    print("PASS: Kubernetes manifests are consistent")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
