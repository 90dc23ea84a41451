#!/usr/bin/env python3
"""The Grafana dashboards query only metrics that agora exports.

    dashboards_test.py AGORA DATA_DIR ARTIFACTS_DIR     a short real run supplies the metrics
    dashboards_test.py - - ARTIFACTS_DIR                use ARTIFACTS_DIR/metrics/*.txt as saved

Grafana is not installable here, so this stands in for opening the dashboards:

1. every dashboard under deploy/grafana/ is well formed: unique ids and uids, each panel has a
   data source and targets, each target an expression, grid positions inside 24 columns, every
   $variable used is defined, links point at dashboards that exist;
2. every expression parses as PromQL (promtool check rules, Grafana's variables substituted),
   and deploy/prometheus.yml passes promtool check config;
3. a short real run (a coordinator with --http, two peers with --metrics) is scraped, the texts
   are saved to ARTIFACTS_DIR/metrics/ (coordinator.txt, peer.txt, peer-1.txt), and every metric
   an expression or template variable names (histograms' _bucket/_sum/_count map to the
   histogram) must be in them, as must every label the expression filters, groups or labels its
   legend by. The few metrics that exist only after an event a short run does not have (see
   ONLY_AFTER_AN_EVENT) must at least be declared in src/agora/obs/metrics_catalogue.h.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GRAFANA = os.path.join(ROOT, "deploy", "grafana")
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

# Labels Prometheus adds to every series (or deploy/prometheus.yml adds), not agora.
TARGET_LABELS = {"instance", "job", "peer", "role"}
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                   "offset", "and", "or", "unless", "inf", "nan", "atan2"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
CATALOGUE = os.path.join(ROOT, "src", "agora", "obs", "metrics_catalogue.h")

# Metrics that a short healthy run cannot show, because agora exports them only once something
# happened. A dashboard may query them if they are declared in the catalogue (so a typo still
# fails); everything else must be in the real scrape.
ONLY_AFTER_AN_EVENT = {
    "agora_network_messages_dropped_total": "one series per reason, once a message is dropped",
}

problems = []


def problem(message):
    problems.append(message)
    print("PROBLEM: " + message)


# ------------------------------------------------------------------------------ structure

def all_panels(panels):
    """Panels in order, the panels of collapsed rows included."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def check_structure(name, board, uids):
    for field in ("uid", "title", "panels", "templating", "schemaVersion"):
        if field not in board:
            problem(f"{name}: no '{field}'")
    if not isinstance(board.get("schemaVersion"), int) or not 30 <= board["schemaVersion"] <= 41:
        problem(f"{name}: schemaVersion {board.get('schemaVersion')!r} is not a Grafana 9-11 schema")
    variables = {v.get("name"): v for v in board.get("templating", {}).get("list", [])}
    ds = variables.get("DS_PROMETHEUS")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problem(f"{name}: no DS_PROMETHEUS data source variable")
    for link in board.get("links", []):
        m = re.match(r"/d/([\w-]+)", link.get("url", ""))
        if m and m.group(1) not in uids:
            problem(f"{name}: link to dashboard {m.group(1)}, which is not under deploy/grafana/")

    ids = set()
    for panel in all_panels(board.get("panels", [])):
        title = f"{name}: panel {panel.get('id')} '{panel.get('title')}'"
        if not isinstance(panel.get("id"), int) or panel["id"] in ids:
            problem(f"{title}: id missing or not unique")
        ids.add(panel.get("id"))
        pos = panel.get("gridPos", {})
        if not all(isinstance(pos.get(k), int) for k in "xywh") or pos["x"] < 0 or \
                pos["w"] < 1 or pos["x"] + pos["w"] > 24 or pos["h"] < 1:
            problem(f"{title}: gridPos {pos} is not inside 24 columns")
        if panel.get("type") == "row":
            continue
        if panel.get("datasource") != DATASOURCE:
            problem(f"{title}: datasource {panel.get('datasource')} is not {DATASOURCE}")
        targets = panel.get("targets") or []
        if not targets:
            problem(f"{title}: no targets")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or not all(refs):
            problem(f"{title}: refIds missing or repeated: {refs}")
        for target in targets:
            if target.get("datasource") != DATASOURCE:
                problem(f"{title}: target {target.get('refId')} has datasource {target.get('datasource')}")
            expr = target.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                problem(f"{title}: target {target.get('refId')} has no expr")
                continue
            for var in re.findall(r"\$\{?(\w+)\}?", expr + " " + panel.get("title", "")):
                if not var.startswith("__") and var not in variables:
                    problem(f"{title}: uses ${var}, which the dashboard does not define")
            yield panel, target


# ------------------------------------------------------------------------------ PromQL

def substitute(expr):
    """Grafana's variables as Prometheus would see them: intervals become 1m, the rest match all."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: "1m" if m.group(1).startswith("__") else ".*", expr)


def check_promql(exprs):
    promtool = shutil.which("promtool")
    if not promtool:
        # Not a reason to pass: scripts/setup.sh installs it, and without it no query is parsed.
        problem("promtool is not installed (Debian package prometheus; scripts/setup.sh installs "
                "it): the dashboards' PromQL cannot be checked")
        return
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        rules = [{"record": f"agora_dashboard_check:expr_{i}", "expr": substitute(e)}
                 for i, e in enumerate(exprs)]
        json.dump({"groups": [{"name": "dashboards", "rules": rules}]}, f)  # JSON is YAML
    out = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True)
    os.unlink(f.name)
    if out.returncode != 0:
        problem("promtool rejects dashboard expressions:\n" + out.stdout + out.stderr +
                "\n".join(f"  expr_{i}: {e}" for i, e in enumerate(exprs)))
    else:
        print(f"promtool: all {len(exprs)} expressions parse")


def check_prometheus_config():
    """deploy/prometheus.yml is a configuration Prometheus accepts."""
    promtool = shutil.which("promtool")
    if not promtool:
        return  # check_promql() already counted a missing promtool as a problem
    config = os.path.join(ROOT, "deploy", "prometheus.yml")
    out = subprocess.run([promtool, "check", "config", config], capture_output=True, text=True)
    if out.returncode != 0:
        problem(f"promtool rejects {config}:\n{out.stdout}{out.stderr}")
    else:
        print("promtool: deploy/prometheus.yml is valid")


def strip_strings(expr):
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_names(expr):
    """Metric names an expression selects: identifiers that are not functions, keywords,
    label names (in {...} or by/without/on/ignoring/group_x lists), numbers or durations."""
    e = strip_strings(substitute(expr))
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # 1e3, 5m
        if e[m.end():].lstrip().startswith("("):
            continue  # a function or an aggregation
        if m.group(0).lower() in PROMQL_KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def selector_labels(expr):
    """(metric, label name) pairs from selectors' matchers: name{label="x", ...}."""
    e = substitute(expr)
    pairs = []
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{((?:[^\"}]|\"(?:[^\"\\]|\\.)*\")*)\}", e):
        for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", strip_strings(m.group(2))):
            pairs.append((m.group(1), label))
    return pairs


def grouping_labels(expr):
    labels = set()
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", strip_strings(expr)):
        labels.update(x.strip() for x in group.split(",") if x.strip())
    return labels


# ------------------------------------------------------------------------------ exposition

class Exported:
    """Metric families and their label names, from Prometheus text exposition."""

    def __init__(self):
        self.types = {}    # family -> counter/gauge/histogram/...
        self.labels = {}   # family -> label names seen on its samples ('le' excluded)

    def add(self, text):
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(None, 3)
                self.types[name] = kind.strip()
                self.labels.setdefault(name, set())
                continue
            if not line.strip() or line.startswith("#"):
                continue
            m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{((?:[^\"}]|\"(?:[^\"\\]|\\.)*\")*)\})?\s", line)
            if not m:
                problem(f"unparsable exposition line: {line}")
                continue
            family = self.family(m.group(1))
            names = set(re.findall(r'(\w+)="', strip_strings(m.group(2) or "")))
            self.labels.setdefault(family, set()).update(names - {"le"})

    def family(self, name):
        """The family a sample or a query's name belongs to (a histogram's series -> it)."""
        for suffix in HISTOGRAM_SUFFIXES:
            base = name[: -len(suffix)]
            if name.endswith(suffix) and self.types.get(base) in ("histogram", "summary"):
                return base
        return name

    def has(self, name):
        return self.family(name) in self.labels


def catalogued_names():
    """Metric names declared in src/agora/obs/metrics_catalogue.h (MetricDef{"name", ...})."""
    if not os.path.exists(CATALOGUE):
        problem(f"{CATALOGUE} is missing: the metrics a short run cannot show are unchecked")
        return set()
    names = set(re.findall(r'MetricDef\s*\w*\s*\{\s*"([a-z_:][a-z0-9_:]*)"', open(CATALOGUE).read()))
    if not names:
        problem(f"no MetricDef found in {CATALOGUE}: has its form changed?")
    return names


# ------------------------------------------------------------------------------ the real run

def scrape_real_run(agora, data, artifacts):
    from observed_run import ObservedRun
    run = ObservedRun(agora, data, "dashboards", peers=2, steps=200,
                      sets=["network.min_peers=2", "train.checkpoint_interval=3",
                            "train.eval_interval=3", "train.eval_windows=2"])
    run.start_coordinator()
    run.wait_http(run.url + "/metrics")
    for i in range(2):
        run.start_peer(i)
    run.wait_final(8)
    texts = {"coordinator": run.coordinator_metrics(), "peer": run.peer_metrics(0),
             "peer-1": run.peer_metrics(1)}
    run.cleanup()
    folder = os.path.join(artifacts, "metrics")
    os.makedirs(folder, exist_ok=True)
    for name, text in texts.items():
        with open(os.path.join(folder, name + ".txt"), "w") as f:
            f.write(text)
    print(f"scraped the coordinator and 2 peers; saved to {folder}/")
    return texts


def saved_scrapes(artifacts):
    files = sorted(glob.glob(os.path.join(artifacts, "metrics", "*.txt")))
    if not files:
        print(f"FAIL: no agora binary given and no scrapes in {artifacts}/metrics/")
        sys.exit(1)
    print("using saved scrapes: " + ", ".join(files))
    return {os.path.basename(f): open(f).read() for f in files}


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        sys.exit(2)
    agora, data, artifacts = sys.argv[1:]

    boards = {}
    for path in sorted(glob.glob(os.path.join(GRAFANA, "*.json"))):
        with open(path) as f:
            boards[os.path.basename(path)] = json.load(f)
    if len(boards) < 2:
        print(f"FAIL: expected the run overview and peers dashboards in {GRAFANA}, found {list(boards)}")
        sys.exit(1)
    uids = [b.get("uid") for b in boards.values()]
    if len(set(uids)) != len(uids):
        problem(f"dashboard uids repeat: {uids}")

    targets = []  # (dashboard, panel, target)
    for name, board in boards.items():
        targets += [(name, p, t) for p, t in check_structure(name, board, set(uids))]
    exprs = [t["expr"] for _, _, t in targets]
    print(f"{len(boards)} dashboards, {len(targets)} queries")
    check_promql(exprs)
    check_prometheus_config()

    texts = scrape_real_run(agora, data, artifacts) if agora != "-" else saved_scrapes(artifacts)
    exported = Exported()
    for text in texts.values():
        exported.add(text)

    catalogue = catalogued_names()
    for metric, why in ONLY_AFTER_AN_EVENT.items():
        if exported.has(metric):
            continue
        if metric not in catalogue:
            problem(f"{metric} is neither in the scrape nor in {CATALOGUE}")
            continue
        print(f"note: {metric} is not in this run's scrape ({why}); accepted from the catalogue")
        exported.labels.setdefault(metric, set())

    used = set()
    for name, panel, target in targets:
        where = f"{name}: '{panel.get('title')}' {target['refId']}"
        metrics = metric_names(target["expr"])
        if not metrics:
            problem(f"{where}: names no metric: {target['expr']}")
        labels = set()
        for metric in metrics:
            used.add(exported.family(metric))
            if not exported.has(metric):
                problem(f"{where}: {metric} is not exported by agora")
            else:
                labels |= exported.labels[exported.family(metric)]
        known = labels | TARGET_LABELS | {"le"}
        for metric, label in selector_labels(target["expr"]):
            family = exported.family(metric)
            # A family seen only as HELP/TYPE (no samples yet) has no labels to compare with.
            if exported.labels.get(family) and label not in exported.labels[family] | TARGET_LABELS:
                problem(f"{where}: {metric} has no label '{label}' (it has {sorted(exported.labels[family])})")
        for label in grouping_labels(target["expr"]) | set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", ""))):
            if labels and label not in known:
                problem(f"{where}: groups or labels by '{label}', which none of {sorted(metrics)} has")

    # Template variables list label values of a metric: label_values(metric, label).
    for name, board in boards.items():
        for var in board.get("templating", {}).get("list", []):
            query = var.get("query")
            query = query.get("query", "") if isinstance(query, dict) else str(query or "")
            for metric, label in re.findall(r"label_values\(\s*([A-Za-z_:][\w:]*)[^,]*,\s*(\w+)\s*\)", query):
                used.add(exported.family(metric))
                if not exported.has(metric):
                    problem(f"{name}: variable ${var.get('name')} lists {metric}, which agora does not export")
                elif label not in exported.labels[exported.family(metric)] | TARGET_LABELS:
                    problem(f"{name}: variable ${var.get('name')} lists label {label}, which {metric} lacks")

    agora_families = {f for f in exported.labels if f.startswith("agora_")}
    unused = sorted(agora_families - used)
    print(f"{len(used)} metrics queried; exported but on no dashboard: {', '.join(unused) or 'none'}")
    if problems:
        print(f"FAIL: {len(problems)} problems")
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
