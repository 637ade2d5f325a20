#!/usr/bin/env python3
"""Static checks for the container and monitoring files.

Checks, without Docker or network access:
  * docker/compose.yaml parses; every bind-mounted host path, build context,
    Dockerfile and env_file exists in the repository; services that others wait
    on with `condition: service_healthy` have a healthcheck;
  * docker/prometheus.yml parses and scrapes compose services;
  * grafana/provisioning/**/*.yaml parse; file providers load from a directory
    that compose mounts into the Grafana container;
  * docker/Dockerfile has a HEALTHCHECK, EXPOSE 9464 and a non-root USER in its
    final stage;
  * the dashboard JSON parses, and every panel query has an expression.

Usage:
  check_compose.py                       run the checks, print "compose: ok"
  check_compose.py --dashboard-metrics   print the metric names the dashboard
                                         queries, one per line, and exit

Only the standard library is required. PyYAML is used when installed; without
it the YAML files are only checked for being non-empty.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

try:
    import yaml  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - depends on the machine
    yaml = None

DEFAULT_ROOT = Path(__file__).resolve().parents[2]
COMPOSE = Path("docker/compose.yaml")
DOCKERFILE = Path("docker/Dockerfile")
PROMETHEUS = Path("docker/prometheus.yml")
PROVISIONING = Path("grafana/provisioning")
DASHBOARD = Path("grafana/dashboards/delay-bridge.json")
METRICS_PORT = "9464"

METRIC_RE = re.compile(r"delay_bridge_[a-z_]+")
HISTOGRAM_SUFFIX_RE = re.compile(r"_(bucket|sum|count)$")


class Checker:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.errors: list[str] = []
        self.notes: list[str] = []

    def fail(self, msg: str) -> None:
        self.errors.append(msg)

    def rel(self, path: Path) -> str:
        try:
            return str(path.resolve().relative_to(self.root.resolve()))
        except ValueError:
            return str(path)

    # ---- loading -----------------------------------------------------------

    def read_text(self, rel: Path) -> str | None:
        path = self.root / rel
        if not path.is_file():
            self.fail(f"{rel}: file not found")
            return None
        text = path.read_text(encoding="utf-8")
        if not text.strip():
            self.fail(f"{rel}: file is empty")
            return None
        return text

    def load_yaml(self, rel: Path):
        """Parsed document, or None when missing, invalid or PyYAML is absent."""
        text = self.read_text(rel)
        if text is None or yaml is None:
            return None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            self.fail(f"{rel}: invalid YAML: {err}")
            return None
        if not isinstance(data, dict):
            self.fail(f"{rel}: expected a mapping at the top level")
            return None
        return data

    def load_dashboard(self) -> dict | None:
        text = self.read_text(DASHBOARD)
        if text is None:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            self.fail(f"{DASHBOARD}: invalid JSON: {err}")
            return None
        if not isinstance(data, dict):
            self.fail(f"{DASHBOARD}: expected a JSON object")
            return None
        return data

    # ---- compose -----------------------------------------------------------

    def check_compose(self, compose: dict | None, dockerfile_healthcheck: bool) -> dict:
        """Returns {service name: list of (host path, container path)} bind mounts."""
        mounts: dict[str, list[tuple[Path, str]]] = {}
        if compose is None:
            return mounts
        base = (self.root / COMPOSE).parent
        services = compose.get("services")
        if not isinstance(services, dict) or not services:
            self.fail(f"{COMPOSE}: no services defined")
            return mounts
        named_volumes = compose.get("volumes") or {}

        for name, svc in services.items():
            where = f"{COMPOSE}: service {name}"
            if not isinstance(svc, dict):
                self.fail(f"{where}: expected a mapping")
                continue
            if "image" not in svc and "build" not in svc:
                self.fail(f"{where}: needs an image or a build")
            mounts[name] = []
            for vol in svc.get("volumes") or []:
                source, target = self._parse_volume(where, vol)
                if source is None:
                    continue
                if not source.startswith((".", "/", "~")):
                    if source not in named_volumes:
                        self.fail(f"{where}: named volume {source!r} is not declared under top-level volumes")
                    continue
                host = (base / source).resolve()
                if not self._inside_repo(host):
                    self.fail(f"{where}: bind mount {source!r} is outside the repository")
                elif not host.exists():
                    self.fail(f"{where}: bind mount {source!r} -> {self.rel(host)} does not exist")
                mounts[name].append((host, target))
            for env_file in self._as_list(svc.get("env_file")):
                path = env_file.get("path") if isinstance(env_file, dict) else env_file
                if not (base / str(path)).is_file():
                    self.fail(f"{where}: env_file {path!r} does not exist")
            build = svc.get("build")
            if build is not None:
                self._check_build(where, base, build)

        # `condition: service_healthy` on a service without a healthcheck never
        # becomes true and blocks `docker compose up`.
        for name, svc in services.items():
            if not isinstance(svc, dict):
                continue
            depends = svc.get("depends_on") or {}
            if not isinstance(depends, dict):
                depends = {dep: {} for dep in depends}
            for dep, cond in depends.items():
                if dep not in services:
                    self.fail(f"{COMPOSE}: service {name} depends on unknown service {dep!r}")
                    continue
                if (cond or {}).get("condition") != "service_healthy":
                    continue
                target = services[dep]
                has_check = "healthcheck" in target and not (target["healthcheck"] or {}).get("disable")
                if not has_check and "build" in target and dockerfile_healthcheck:
                    has_check = True
                if not has_check:
                    self.fail(f"{COMPOSE}: service {name} waits for {dep} to be healthy, "
                              f"but {dep} has no healthcheck")
        return mounts

    def _parse_volume(self, where: str, vol) -> tuple[str | None, str]:
        if isinstance(vol, dict):
            if vol.get("type", "volume") == "bind" or vol.get("type") == "volume":
                source = vol.get("source")
                if not source:
                    return None, ""
                return str(source), str(vol.get("target", ""))
            return None, ""
        vol = str(vol)
        if ":" not in vol:
            # Anonymous volume: container path only, nothing on the host.
            return None, ""
        parts = vol.split(":")
        if len(parts) < 2 or not parts[0] or not parts[1]:
            self.fail(f"{where}: cannot parse volume {vol!r}")
            return None, ""
        return parts[0], parts[1]

    def _check_build(self, where: str, base: Path, build) -> None:
        if isinstance(build, str):
            context, dockerfile = build, "Dockerfile"
        elif isinstance(build, dict):
            context = build.get("context", ".")
            dockerfile = build.get("dockerfile", "Dockerfile")
        else:
            self.fail(f"{where}: cannot parse build {build!r}")
            return
        ctx = (base / context).resolve()
        if not ctx.is_dir():
            self.fail(f"{where}: build context {context!r} -> {self.rel(ctx)} is not a directory")
            return
        if not self._inside_repo(ctx):
            self.fail(f"{where}: build context {context!r} is outside the repository")
        if not (ctx / dockerfile).is_file():
            self.fail(f"{where}: Dockerfile {dockerfile!r} not found in build context {self.rel(ctx)}")

    def _inside_repo(self, path: Path) -> bool:
        try:
            path.relative_to(self.root.resolve())
            return True
        except ValueError:
            return False

    @staticmethod
    def _as_list(value) -> list:
        if value is None:
            return []
        return value if isinstance(value, list) else [value]

    # ---- prometheus --------------------------------------------------------

    def check_prometheus(self, prom: dict | None, compose: dict | None) -> None:
        if prom is None:
            return
        jobs = prom.get("scrape_configs") or []
        if not jobs:
            self.fail(f"{PROMETHEUS}: no scrape_configs")
            return
        services = set((compose or {}).get("services") or {})
        for job in jobs:
            for static in job.get("static_configs") or []:
                for target in static.get("targets") or []:
                    host = str(target).rsplit(":", 1)[0]
                    if services and host not in services and host not in ("localhost", "127.0.0.1"):
                        self.fail(f"{PROMETHEUS}: job {job.get('job_name')}: target {target!r} "
                                  f"is not a service of {COMPOSE}")

    # ---- grafana provisioning ----------------------------------------------

    def check_provisioning(self, mounts: dict) -> None:
        base = self.root / PROVISIONING
        files = sorted(base.rglob("*.yaml")) + sorted(base.rglob("*.yml"))
        if not files:
            self.fail(f"{PROVISIONING}: no provisioning files")
            return
        grafana_mounts = mounts.get("grafana", [])
        saw_datasource = saw_provider = False
        for path in files:
            rel = path.relative_to(self.root)
            data = self.load_yaml(rel)
            if data is None:
                continue
            if "apiVersion" not in data:
                self.fail(f"{rel}: missing apiVersion")
            for ds in data.get("datasources") or []:
                saw_datasource = True
                if not ds.get("name") or not ds.get("type") or not ds.get("url"):
                    self.fail(f"{rel}: datasource needs name, type and url: {ds!r}")
            for provider in data.get("providers") or []:
                saw_provider = True
                if provider.get("type", "file") != "file":
                    continue
                path_in_container = ((provider.get("options") or {}).get("path") or "").rstrip("/")
                if not path_in_container:
                    self.fail(f"{rel}: provider {provider.get('name')!r} has no options.path")
                    continue
                if mounts:
                    host = next((h for h, t in grafana_mounts if t.rstrip("/") == path_in_container), None)
                    if host is None:
                        self.fail(f"{rel}: provider path {path_in_container} is not mounted into "
                                  f"the grafana service of {COMPOSE}")
                    elif not any(host.glob("*.json")):
                        self.fail(f"{rel}: {self.rel(host)} (mounted at {path_in_container}) "
                                  f"holds no dashboard JSON")
        if yaml is not None:
            if not saw_datasource:
                self.fail(f"{PROVISIONING}: no datasource is provisioned")
            if not saw_provider:
                self.fail(f"{PROVISIONING}: no dashboard provider is provisioned")

    # ---- Dockerfile --------------------------------------------------------

    def check_dockerfile(self) -> bool:
        """Returns whether the final stage has a HEALTHCHECK."""
        text = self.read_text(DOCKERFILE)
        if text is None:
            return False
        instructions = self._dockerfile_instructions(text)
        stages = [i for i, (op, _) in enumerate(instructions) if op == "FROM"]
        if not stages:
            self.fail(f"{DOCKERFILE}: no FROM instruction")
            return False
        final = instructions[stages[-1]:]

        health = [arg for op, arg in final if op == "HEALTHCHECK"]
        has_health = bool(health) and health[-1].split()[0].upper() != "NONE"
        if not has_health:
            self.fail(f"{DOCKERFILE}: the final stage has no HEALTHCHECK")

        ports = {p.split("/")[0] for op, arg in final if op == "EXPOSE" for p in arg.split()}
        if METRICS_PORT not in ports:
            self.fail(f"{DOCKERFILE}: the final stage does not EXPOSE {METRICS_PORT}")

        users = [arg.split()[0] for op, arg in final if op == "USER" and arg.split()]
        if not users:
            self.fail(f"{DOCKERFILE}: the final stage has no USER (the container would run as root)")
        else:
            user = users[-1].split(":")[0]
            if user in ("root", "0"):
                self.fail(f"{DOCKERFILE}: the final stage runs as {users[-1]!r}; use a non-root USER")
        return has_health

    @staticmethod
    def _dockerfile_instructions(text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        pending = ""
        for raw in text.splitlines():
            line = raw.strip()
            if not pending and (not line or line.startswith("#")):
                continue
            if pending and line.startswith("#"):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            full = (pending + line).strip()
            pending = ""
            if full:
                op, _, arg = full.partition(" ")
                out.append((op.upper(), arg.strip()))
        if pending.strip():
            op, _, arg = pending.strip().partition(" ")
            out.append((op.upper(), arg.strip()))
        return out

    # ---- dashboard ---------------------------------------------------------

    def dashboard_queries(self, dash: dict) -> list[str]:
        """Every PromQL string: panel target expressions and variable queries."""
        queries: list[str] = []

        def walk_panels(panels) -> None:
            for panel in panels or []:
                walk_panels(panel.get("panels"))
                for target in panel.get("targets") or []:
                    expr = target.get("expr")
                    if isinstance(expr, str) and expr.strip():
                        queries.append(expr)
                    else:
                        self.fail(f"{DASHBOARD}: panel {panel.get('title')!r} target "
                                  f"{target.get('refId')} has no expr")

        walk_panels(dash.get("panels"))
        for var in (dash.get("templating") or {}).get("list") or []:
            query = var.get("query")
            if isinstance(query, dict):
                query = query.get("query")
            if var.get("type") == "query" and isinstance(query, str):
                queries.append(query)
        return queries

    def dashboard_metrics(self, dash: dict) -> list[str]:
        names = set()
        for query in self.dashboard_queries(dash):
            for match in METRIC_RE.findall(query):
                names.add(HISTOGRAM_SUFFIX_RE.sub("", match))
        return sorted(names)

    def check_dashboard(self, dash: dict | None) -> None:
        if dash is None:
            return
        for key in ("uid", "title", "panels"):
            if not dash.get(key):
                self.fail(f"{DASHBOARD}: missing {key}")
        if not self.dashboard_metrics(dash):
            self.fail(f"{DASHBOARD}: no delay_bridge_ metric is queried")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dashboard-metrics", action="store_true",
                        help="print the metric names the dashboard queries, one per line")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT,
                        help="repository root (default: two levels above this script)")
    args = parser.parse_args(argv)
    checker = Checker(args.root)

    if args.dashboard_metrics:
        dash = checker.load_dashboard()
        names = checker.dashboard_metrics(dash) if dash is not None else []
        if not checker.errors and not names:
            checker.fail(f"{DASHBOARD}: no delay_bridge_ metric is queried")
        if checker.errors:
            for err in checker.errors:
                print(f"error: {err}", file=sys.stderr)
            return 1
        print("\n".join(names))
        return 0

    if yaml is None:
        print("note: PyYAML is not installed: skipping the YAML parse; the YAML files "
              "are only checked for being non-empty", file=sys.stderr)

    has_health = checker.check_dockerfile()
    compose = checker.load_yaml(COMPOSE)
    mounts = checker.check_compose(compose, has_health)
    checker.check_prometheus(checker.load_yaml(PROMETHEUS), compose)
    checker.check_provisioning(mounts)
    checker.check_dashboard(checker.load_dashboard())

    if checker.errors:
        for err in checker.errors:
            print(f"error: {err}", file=sys.stderr)
        print(f"compose: {len(checker.errors)} problem(s)", file=sys.stderr)
        return 1
    print("compose: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
