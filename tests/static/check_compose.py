#!/usr/bin/env python3
"""Static checks for the container and monitoring files.

Checks, without Docker or network access:
  * docker/compose.yaml parses; every bind-mounted host path, build context,
    Dockerfile and env_file exists in the repository; services that others wait
    on with `condition: service_healthy` have a healthcheck;
  * docker/prometheus.yml parses and scrapes compose services;
  * grafana/provisioning/**/*.yaml parse; file providers load from a directory
    that compose mounts into the Grafana container;
  * docker/Dockerfile has a HEALTHCHECK (`delay-bridge health`, exec form, or a
    poll of :9464/healthz), EXPOSE 9464 and a numeric non-root USER in its final
    stage;
  * compose secrets have existing files, and services use only declared ones;
  * the stack's images are on the expected major versions (IMAGE_MAJORS);
  * the dashboard JSON parses, and every panel query has an expression;
  * the pieces agree with each other: the bridge service mounts the config
    file its command (or the image's CMD) names; that config listens on all
    interfaces on the port the image EXPOSEs, health-checks and Prometheus
    scrapes; its shutdown timeout fits in the service's stop_grace_period;
    the admin API, when the config enables it, listens on all interfaces on an
    EXPOSEd port with its token_file a mounted compose secret;
    Redis runs with appendonly and noeviction; Kafka's KRaft settings are
    complete; Prometheus rule files exist and are mounted next to its config;
  * docker/sentinel.compose.yaml passes the same per-service checks; every
    Redis server in it runs with appendonly, noeviction and Kz notifications;
    the bridge's config there is in sentinel mode, its sentinels are services
    of that file and its master_name is the one sentinel.conf monitors.

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
import shlex
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # pragma: no cover - Python < 3.11
    tomllib = None

try:
    import yaml  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - depends on the machine
    yaml = None

from report import verdict

DEFAULT_ROOT = Path(__file__).resolve().parents[2]
COMPOSE = Path("docker/compose.yaml")
SENTINEL_COMPOSE = Path("docker/sentinel.compose.yaml")
SENTINEL_CONF = Path("docker/sentinel.conf")
DOCKERFILE = Path("docker/Dockerfile")
PROMETHEUS = Path("docker/prometheus.yml")
PROVISIONING = Path("grafana/provisioning")
DASHBOARD = Path("grafana/dashboards/delay-bridge.json")
METRICS_PORT = "9464"

BRIDGE_SERVICE = "bridge"
# The major version each third-party image of the stack is expected on.
IMAGE_MAJORS = {
    "rabbitmq": 4,
    "apache/kafka": 4,
    "prom/prometheus": 3,
    "grafana/grafana": 12,
}
# Where compose mounts a service's secrets.
SECRETS_DIR = "/run/secrets"
PROMETHEUS_CONFIG_IN_CONTAINER = "/etc/prometheus/prometheus.yml"
# Docker's default when a service sets no stop_grace_period.
DEFAULT_GRACE_SECONDS = 10.0
# The bridge needs a little longer than [shutdown] timeout: it settles aborted
# batches (up to 5 s) and flushes sinks after the deadline.
SHUTDOWN_MARGIN_SECONDS = 7.0

METRIC_RE = re.compile(r"delay_bridge_[a-z_]+")
DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|us|h|m|s)")

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
        parse = None if yaml is None else yaml.safe_load
        errors = () if yaml is None else yaml.YAMLError
        return self.load_mapping(
            rel, parse, errors, "invalid YAML", "a mapping at the top level"
        )

    def load_dashboard(self) -> dict | None:
        return self.load_mapping(
            DASHBOARD, json.loads, json.JSONDecodeError, "invalid JSON", "a JSON object"
        )

    def load_mapping(self, rel: Path, parse, errors, invalid: str, expected: str) -> dict | None:
        """`rel` read and parsed by `parse`, or None with the problem noted (None, too, when
        there is no parser); `errors` are the exceptions `parse` raises on bad input."""
        text = self.read_text(rel)
        if text is None or parse is None:
            return None
        try:
            data = parse(text)
        except errors as err:
            self.fail(f"{rel}: {invalid}: {err}")
            return None
        if not isinstance(data, dict):
            self.fail(f"{rel}: expected {expected}")
            return None
        return data

    # ---- compose -----------------------------------------------------------

    def check_compose(self, compose: dict | None, dockerfile_healthcheck: bool,
                      path: Path = COMPOSE) -> dict:
        """Returns {service name: list of (host path, container path)} bind mounts."""
        mounts: dict[str, list[tuple[Path, str]]] = {}
        if compose is None:
            return mounts
        base = (self.root / path).parent
        services = compose.get("services")
        if not isinstance(services, dict) or not services:
            self.fail(f"{path}: no services defined")
            return mounts
        named_volumes = compose.get("volumes") or {}

        for name, svc in services.items():
            where = f"{path}: service {name}"
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
            self._check_image(where, svc.get("image"))
            for secret in svc.get("secrets") or []:
                name = secret.get("source") if isinstance(secret, dict) else secret
                if name not in (compose.get("secrets") or {}):
                    self.fail(f"{where}: secret {name!r} is not declared under top-level secrets")
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
                    self.fail(f"{path}: service {name} depends on unknown service {dep!r}")
                    continue
                if (cond or {}).get("condition") != "service_healthy":
                    continue
                target = services[dep]
                has_check = "healthcheck" in target and not (target["healthcheck"] or {}).get("disable")
                if not has_check and "build" in target and dockerfile_healthcheck:
                    has_check = True
                if not has_check:
                    self.fail(f"{path}: service {name} waits for {dep} to be healthy, "
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

    def check_secrets(self, compose: dict | None) -> None:
        if compose is None:
            return
        base = (self.root / COMPOSE).parent
        for name, secret in (compose.get("secrets") or {}).items():
            if not isinstance(secret, dict):
                self.fail(f"{COMPOSE}: secret {name}: expected a mapping")
                continue
            if "file" in secret and not (base / str(secret["file"])).is_file():
                self.fail(f"{COMPOSE}: secret {name}: file {secret['file']!r} does not exist")

    def _check_image(self, where: str, image) -> None:
        if not isinstance(image, str):
            return
        name, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "")
        expected = IMAGE_MAJORS.get(name)
        if expected is None:
            return
        match = re.match(r"v?(\d+)", tag)
        if not match:
            self.fail(f"{where}: image {image!r} names no version; pin major {expected}")
        elif int(match.group(1)) != expected:
            self.fail(f"{where}: image {image!r} is on major {match.group(1)}, expected {expected}")

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
            elif not all(part.isdigit() for part in users[-1].split(":")):
                self.fail(f"{DOCKERFILE}: USER {users[-1]!r} is not numeric (uid or uid:gid), so "
                          f"runAsNonRoot cannot verify it")
        if has_health and not self._health_command_ok(health[-1]):
            self.fail(f"{DOCKERFILE}: HEALTHCHECK neither runs `delay-bridge health` (exec form) "
                      f"nor polls :{METRICS_PORT}/healthz")
        return has_health

    @staticmethod
    def _health_command(arg: str) -> str:
        """The command of a HEALTHCHECK instruction, its options left out."""
        words = arg.split()
        while words and words[0].startswith("--"):
            words.pop(0)
        if words and words[0].upper() == "CMD":
            words.pop(0)
        return " ".join(words)

    def _health_command_ok(self, arg: str) -> bool:
        command = self._health_command(arg)
        if command.startswith("["):
            exec_form = self._exec_form(command)
            if exec_form[:2] == ["delay-bridge", "health"]:
                return True
        return f":{METRICS_PORT}/healthz" in command

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

    # ---- consistency between the files ------------------------------------

    def check_stack(self, compose: dict | None, mounts: dict, prom: dict | None) -> None:
        if compose is None:
            return
        services = compose.get("services") or {}
        bridge = services.get(BRIDGE_SERVICE)
        if not isinstance(bridge, dict):
            self.fail(f"{COMPOSE}: no {BRIDGE_SERVICE!r} service")
            return
        where = f"{COMPOSE}: service {BRIDGE_SERVICE}"
        dockerfile = self._dockerfile_instructions((self.root / DOCKERFILE).read_text(encoding="utf-8")) \
            if (self.root / DOCKERFILE).is_file() else []

        command = bridge.get("command")
        if command is None:
            cmds = [arg for op, arg in dockerfile if op == "CMD"]
            command = self._exec_form(cmds[-1]) if cmds else []
        elif isinstance(command, str):
            command = shlex.split(command)
        config_path = self._flag_value([str(c) for c in command], ("--config", "-c"))
        if config_path is None:
            self.fail(f"{where}: the command names no --config file")
            return
        host = next((h for h, t in mounts.get(BRIDGE_SERVICE, []) if t.split(":")[0] == config_path), None)
        if host is None:
            self.fail(f"{where}: nothing is mounted at {config_path}, the config the command reads")
            return
        if tomllib is None or not host.is_file():
            return
        try:
            config = tomllib.loads(host.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as err:
            self.fail(f"{self.rel(host)}: invalid TOML: {err}")
            return
        env = bridge.get("environment") or {}
        if isinstance(env, list):
            env = dict(str(e).split("=", 1) for e in env if "=" in str(e))
        listen = str(env.get("DELAY_BRIDGE_METRICS__LISTEN")
                     or (config.get("metrics") or {}).get("listen") or "127.0.0.1:9464")
        listen_host, _, port = listen.rpartition(":")
        if listen_host.strip("[]") in ("127.0.0.1", "localhost", "::1"):
            self.fail(f"{self.rel(host)}: metrics.listen = {listen!r} is loopback: neither Prometheus "
                      f"nor the published port can reach it; use 0.0.0.0:{port}")
        if port != METRICS_PORT:
            self.fail(f"{self.rel(host)}: metrics.listen port {port} is not {METRICS_PORT}, the port "
                      f"{DOCKERFILE} exposes and health-checks")
        self._check_admin(where, config, host, env, bridge, dockerfile)
        if prom is not None:
            targets = [str(t) for job in prom.get("scrape_configs") or []
                       for sc in job.get("static_configs") or [] for t in sc.get("targets") or []]
            if f"{BRIDGE_SERVICE}:{port}" not in targets:
                self.fail(f"{PROMETHEUS}: no job scrapes {BRIDGE_SERVICE}:{port}")

        timeout = self._seconds(str((config.get("shutdown") or {}).get("timeout", "30s")))
        grace_raw = bridge.get("stop_grace_period")
        grace = self._seconds(str(grace_raw)) if grace_raw is not None else DEFAULT_GRACE_SECONDS
        if timeout is not None and grace is not None and timeout + SHUTDOWN_MARGIN_SECONDS > grace:
            self.fail(f"{where}: stop_grace_period ({grace:g}s) leaves no room for the bridge's drain: "
                      f"[shutdown] timeout is {timeout:g}s plus up to {SHUTDOWN_MARGIN_SECONDS:g}s to "
                      f"settle; Docker would SIGKILL it mid-drain")

        self._check_redis(services.get("redis"))
        self._check_kafka(services.get("kafka"))

    def _check_admin(self, where: str, config: dict, host: Path, env: dict, bridge: dict,
                     dockerfile: list) -> None:
        admin = config.get("admin") or {}
        listen = str(env.get("DELAY_BRIDGE_ADMIN__LISTEN") or admin.get("listen") or "")
        if not listen:
            return
        listen_host, _, port = listen.rpartition(":")
        if listen_host.strip("[]") in ("127.0.0.1", "localhost", "::1"):
            self.fail(f"{self.rel(host)}: admin.listen = {listen!r} is loopback: the published port "
                      f"cannot reach it")
        exposed = {p.split("/")[0] for op, arg in dockerfile if op == "EXPOSE" for p in arg.split()}
        if port not in exposed:
            self.fail(f"{DOCKERFILE}: does not EXPOSE the admin port {port}")
        published = [str(p) for p in bridge.get("ports") or []]
        if not any(p.endswith(f":{port}") for p in published):
            self.fail(f"{where}: the admin port {port} is not published")
        token_file = str(env.get("DELAY_BRIDGE_ADMIN__TOKEN_FILE") or admin.get("token_file") or "")
        if not token_file:
            if not admin.get("read_only"):
                self.fail(f"{self.rel(host)}: the admin API has no token_file")
            return
        secrets = [s.get("target") or s.get("source") if isinstance(s, dict) else s
                   for s in bridge.get("secrets") or []]
        mounted = {t if str(t).startswith("/") else f"{SECRETS_DIR}/{t}" for t in secrets}
        if token_file not in mounted:
            self.fail(f"{where}: admin.token_file {token_file} is not a secret of the service "
                      f"(mounted: {sorted(mounted)})")

    def check_sentinel_stack(self, dockerfile_healthcheck: bool) -> None:
        compose = self.load_yaml(SENTINEL_COMPOSE)
        mounts = self.check_compose(compose, dockerfile_healthcheck, SENTINEL_COMPOSE)
        if not isinstance(compose, dict):
            return
        services = compose.get("services") or {}
        for name, svc in services.items():
            command = (svc or {}).get("command") or []
            args = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
            if not args or args[0] != "redis-server":
                continue
            where = f"{SENTINEL_COMPOSE}: service {name}"
            for flag, value in (("--appendonly", "yes"), ("--maxmemory-policy", "noeviction"),
                                ("--notify-keyspace-events", "Kz")):
                if self._flag_value(args, (flag,)) != value:
                    self.fail(f"{where}: needs {flag} {value} (the sentinels may promote it)")
        conf = self.read_text(SENTINEL_CONF) or ""
        monitored = re.findall(r"^sentinel monitor (\S+) ", conf, re.M)
        config_files = [host for host, target in mounts.get(BRIDGE_SERVICE, [])
                        if target.split(":")[0].endswith(".toml")]
        if not config_files or tomllib is None:
            return
        where = f"{SENTINEL_COMPOSE}: service {BRIDGE_SERVICE}"
        try:
            redis = tomllib.loads(config_files[0].read_text()).get("redis", {})
        except (OSError, tomllib.TOMLDecodeError) as e:
            self.fail(f"{where}: {self.rel(config_files[0])}: {e}")
            return
        if redis.get("mode") != "sentinel":
            self.fail(f"{where}: its config is not in sentinel mode")
        for url in redis.get("sentinels", []):
            host = re.sub(r"^rediss?://", "", url).split(":")[0]
            if host not in services:
                self.fail(f"{where}: sentinel {url!r} is not a service")
        if redis.get("master_name") not in monitored:
            self.fail(f"{where}: master_name {redis.get('master_name')!r} is not what "
                      f"{SENTINEL_CONF} monitors ({monitored})")

    def _check_redis(self, redis) -> None:
        if not isinstance(redis, dict):
            return
        command = redis.get("command") or []
        args = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        if self._flag_value(args, ("--appendonly",)) != "yes":
            self.fail(f"{COMPOSE}: service redis: needs --appendonly yes (scheduled messages must survive a restart)")
        if self._flag_value(args, ("--maxmemory-policy",)) != "noeviction":
            self.fail(f"{COMPOSE}: service redis: needs --maxmemory-policy noeviction "
                      f"(an evicted key is a lost message)")

    def _check_kafka(self, kafka) -> None:
        if not isinstance(kafka, dict):
            return
        where = f"{COMPOSE}: service kafka"
        env = kafka.get("environment") or {}
        if isinstance(env, list):
            env = dict(str(e).split("=", 1) for e in env if "=" in str(e))
        env = {k: str(v) for k, v in env.items()}
        required = ["KAFKA_NODE_ID", "KAFKA_PROCESS_ROLES", "KAFKA_LISTENERS", "KAFKA_ADVERTISED_LISTENERS",
                    "KAFKA_CONTROLLER_LISTENER_NAMES", "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
                    "KAFKA_CONTROLLER_QUORUM_VOTERS"]
        missing = [k for k in required if not env.get(k)]
        if missing:
            self.fail(f"{where}: KRaft mode needs {', '.join(missing)}")
            return
        roles = {r.strip() for r in env["KAFKA_PROCESS_ROLES"].split(",")}
        if roles != {"broker", "controller"}:
            self.fail(f"{where}: a single node needs KAFKA_PROCESS_ROLES=broker,controller")

        def names(value: str) -> list[str]:
            return [item.split("://", 1)[0].split(":", 1)[0].strip() for item in value.split(",") if item.strip()]

        listeners = names(env["KAFKA_LISTENERS"])
        protocol_map = names(env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"])
        for name in listeners:
            if name not in protocol_map:
                self.fail(f"{where}: listener {name} has no entry in KAFKA_LISTENER_SECURITY_PROTOCOL_MAP")
        controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"].split(",")[0].strip()
        if controller not in listeners:
            self.fail(f"{where}: controller listener {controller} is not in KAFKA_LISTENERS")
        for name in names(env["KAFKA_ADVERTISED_LISTENERS"]):
            if name not in listeners:
                self.fail(f"{where}: advertised listener {name} is not in KAFKA_LISTENERS")
            if name == controller:
                self.fail(f"{where}: the controller listener must not be advertised to clients")
        voters = [v.split("@", 1)[0] for v in env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")]
        if env["KAFKA_NODE_ID"] not in voters:
            self.fail(f"{where}: KAFKA_NODE_ID {env['KAFKA_NODE_ID']} is not among the quorum voters")
        for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):
            if env.get(key) != "1":
                self.fail(f"{where}: a single broker needs {key}=1")

    def check_rule_files(self, prom: dict | None, mounts: dict) -> None:
        if prom is None:
            return
        config_dir = PROMETHEUS_CONFIG_IN_CONTAINER.rsplit("/", 1)[0]
        targets = {t.split(":")[0] for _, t in mounts.get("prometheus", [])}
        for rule_file in prom.get("rule_files") or []:
            local = (self.root / PROMETHEUS).parent / rule_file
            if not local.is_file():
                self.fail(f"{PROMETHEUS}: rule file {rule_file!r} -> {self.rel(local)} does not exist")
            in_container = rule_file if rule_file.startswith("/") else f"{config_dir}/{rule_file}"
            if mounts and in_container not in targets:
                self.fail(f"{PROMETHEUS}: rule file {rule_file!r} is not mounted at {in_container} "
                          f"in the prometheus service of {COMPOSE}")

    @staticmethod
    def _exec_form(arg: str) -> list[str]:
        try:
            value = json.loads(arg)
            return [str(v) for v in value] if isinstance(value, list) else []
        except json.JSONDecodeError:
            return shlex.split(arg)

    @staticmethod
    def _flag_value(args: list[str], flags: tuple[str, ...]) -> str | None:
        for i, arg in enumerate(args):
            if arg in flags and i + 1 < len(args):
                return args[i + 1]
            for flag in flags:
                if arg.startswith(flag + "="):
                    return arg.split("=", 1)[1]
        return None

    @staticmethod
    def _seconds(text: str) -> float | None:
        """Seconds in a compose or humantime duration such as 30s, 1m30s or 500ms."""
        parts = DURATION_PART_RE.findall(text)
        if not parts or DURATION_PART_RE.sub("", text).strip():
            return None
        scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
        return sum(float(n) * scale[unit] for n, unit in parts)

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
    prom = checker.load_yaml(PROMETHEUS)
    checker.check_prometheus(prom, compose)
    checker.check_rule_files(prom, mounts)
    checker.check_secrets(compose)
    checker.check_stack(compose, mounts, prom)
    checker.check_provisioning(mounts)
    checker.check_dashboard(checker.load_dashboard())
    checker.check_sentinel_stack(has_health)

    return verdict("compose", checker.errors)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
