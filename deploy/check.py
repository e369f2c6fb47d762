"""Validates deploy/ without Docker or a cluster; run it through `deploy/check` (which sets up its venv).

What it checks, each printed as it runs:
  - docker-compose.yml against the official compose-spec JSON schema (the copy that check-jsonschema
    vendors from compose-spec/compose-spec), before and after ${VAR:-default} interpolation, plus what
    the schema cannot see: depends_on targets and conditions, named volumes, healthchecks, pinned image
    tags, unique host ports, Kafka's KRaft single-broker settings, ScyllaDB's sizing;
  - every Kubernetes manifest in k8s/ against the Kubernetes OpenAPI schemas (kubernetes-validate,
    strict: unknown fields fail), plus references between objects (ConfigMap, Secret, fieldRef, Service
    selectors of Deployment and StatefulSet pods, a StatefulSet's governing Service, named ports, $(VAR)
    in args), probes, resources, replicas 1 and Recreate for the ingesting paisa serve;
  - the `paisa` command of every compose service and Kubernetes container against the CLI contract
    (`admin init`, `serve`, `serve --no-ingest`, `wallet-sim` with their flags and values; boolean flags
    take no value) and against each other (brokers, partitions, the statement provider's address);
    exactly one ingesting `serve`, any number of `serve --no-ingest`;
  - the serves sharing the stage partitions: when a `--no-ingest` serve exists, every serve has a
    `--group-member` and the ids are distinct (per pod in Kubernetes: `$(POD_NAME)` from a StatefulSet's
    fieldRef metadata.name), each `--no-ingest` serve has the ingesting serve's brokers, partitions,
    ScyllaDB and Schema Registry, waits for init (compose), has PAISA_ADMIN_KEY, is probed on /readyz
    (and /healthz in Kubernetes) on its --listen port, and no Service routes to both kinds of serve;
  - the Dockerfile's essentials and that README.md documents every setting, flag and container env var;
  - then a self-test: it breaks copies of the files in known ways and fails unless each break is caught.
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.resources
import ipaddress
import json
import re
import shlex
import sys
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import yaml

HERE = Path(__file__).resolve().parent
COMPOSE_FILE = HERE / "docker-compose.yml"
K8S_DIR = HERE / "k8s"
README = HERE / "README.md"
DOCKERFILE = HERE / "Dockerfile"
DOCKERIGNORE = HERE / "Dockerfile.dockerignore"

# The Kubernetes version the manifests are validated for (kubernetes-validate uses the newest schema set
# it ships that is not newer).
K8S_VERSION = "1.31"
NAMESPACE = "paisa"

# ---------------------------------------------------------------------------------------------------
# The paisa CLI contract this directory deploys.


def _int_at_least_1(value: str) -> str | None:
    return None if re.fullmatch(r"[1-9][0-9]*", value) else "a positive integer"


def _host_port(value: str) -> str | None:
    m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9.-]*):([0-9]{1,5})", value)
    return None if m and 0 < int(m.group(2)) < 65536 else "HOST:PORT"


def _host_ports(value: str) -> str | None:
    parts = value.split(",")
    return None if all(_host_port(p) is None for p in parts) else "HOST:PORT[,HOST:PORT…]"


def _listen(value: str) -> str | None:
    m = re.fullmatch(r"([0-9.]+):([0-9]{1,5})", value)
    if not m:
        return "IP:PORT"
    try:
        ipaddress.IPv4Address(m.group(1))
    except ValueError:
        return "IP:PORT"
    if m.group(1) != "0.0.0.0":
        return "0.0.0.0:PORT (in a container, listen on every interface)"
    return None


def _url(value: str) -> str | None:
    parts = urlsplit(value)
    return None if parts.scheme in ("http", "https") and parts.hostname and parts.port else "http://HOST:PORT"


def _one_of(*allowed: str):
    return lambda value: None if value in allowed else " or ".join(allowed)


def _keyspace(value: str) -> str | None:
    return None if re.fullmatch(r"[a-z][a-z0-9_]{0,47}", value) else "a CQL identifier"


def _member_id(value: str) -> str | None:
    # It becomes the transactional id paisa-stages-ID (Kafka's legal characters).
    return None if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}", value) else "an id of [A-Za-z0-9._-]"


def _session_timeout_ms(value: str) -> str | None:
    # The broker's default group.min.session.timeout.ms and group.max.session.timeout.ms.
    ok = re.fullmatch(r"[1-9][0-9]*", value) and 6000 <= int(value) <= 1800000
    return None if ok else "milliseconds in 6000..1800000 (the broker's default session bounds)"


def _switch(value: str) -> str | None:
    return None


# Flags that take no value: present or absent.
BOOLEAN_FLAGS = {"--no-ingest"}
# A `serve` with --no-ingest is its own contract entry: it shares the partitions, refuses inputs.
NO_INGEST = "serve --no-ingest"
# Exactly one of each of these per deployment; any number of NO_INGEST.
SINGLE = ("admin init", "serve", "wallet-sim")

# What every `serve` of the Kafka profile is started with, ingesting or not.
SERVE_ON_KAFKA = {
    "--profile": _one_of("kafka"),
    "--kafka-brokers": _host_ports,
    "--listen": _listen,
    "--partitions": _int_at_least_1,
    "--clock": _one_of("system"),
}

CONTRACT = {
    "admin init": {
        "required": {"--kafka-brokers": _host_ports},
        "optional": {
            "--partitions": _int_at_least_1,
            "--replication-factor": _int_at_least_1,
            "--scylla-uri": _host_port,
            "--keyspace": _keyspace,
        },
    },
    "serve": {
        "required": {**SERVE_ON_KAFKA, "--statement-provider": _url},
        "optional": {
            "--scylla-uri": _host_port,
            "--schema-registry": _url,
            "--group-member": _member_id,
            "--group-session-timeout-ms": _session_timeout_ms,
        },
        "requires": {"--group-session-timeout-ms": "--group-member"},
    },
    NO_INGEST: {
        "required": {**SERVE_ON_KAFKA, "--group-member": _member_id, "--no-ingest": _switch},
        "optional": {
            "--scylla-uri": _host_port,
            "--schema-registry": _url,
            "--group-session-timeout-ms": _session_timeout_ms,
            "--ingest-url": _url,
        },
        "forbidden": {
            "--statement-provider": "--no-ingest runs no statement connector (the binary refuses both): it belongs to the ingesting serve",
        },
    },
    "wallet-sim": {
        "required": {"--listen": _listen, "--clock": _one_of("system")},
        "optional": {},
    },
}


def parse_cli(args: list[str]) -> tuple[str | None, dict[str, str], list[str]]:
    """Splits a `paisa` command line into its contract entry and flags (a boolean flag's value is ""),
    checked against CONTRACT. A `serve` with --no-ingest is the entry NO_INGEST."""
    errors: list[str] = []
    if args[:2] == ["admin", "init"]:
        sub, rest = "admin init", args[2:]
    elif args[:1] == ["serve"]:
        rest = args[1:]
        sub = NO_INGEST if any(w.split("=", 1)[0] == "--no-ingest" for w in rest) else "serve"
    elif args[:1] == ["wallet-sim"]:
        sub, rest = args[0], args[1:]
    else:
        return None, {}, [f"command {args[:2]} does not start with `admin init`, `serve` or `wallet-sim`"]
    spec = CONTRACT[sub]
    known = {**spec["required"], **spec["optional"]}
    forbidden = spec.get("forbidden", {})
    flags: dict[str, str] = {}
    i = 0
    while i < len(rest):
        word = rest[i]
        if not word.startswith("--"):
            errors.append(f"`paisa {sub}`: unexpected argument {word!r}")
            i += 1
            continue
        if word.split("=", 1)[0] in BOOLEAN_FLAGS:
            name, value = word.split("=", 1)[0], ""
            if "=" in word:
                errors.append(f"`paisa {sub}`: {name} takes no value ({word!r})")
            i += 1
        elif "=" in word:
            name, value = word.split("=", 1)
            i += 1
        elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            name, value = word, rest[i + 1]
            i += 2
        else:
            errors.append(f"`paisa {sub}`: {word} has no value")
            i += 1
            continue
        if name in forbidden:
            errors.append(f"`paisa {sub}`: {name} is not allowed: {forbidden[name]}")
        elif name not in known:
            errors.append(f"`paisa {sub}`: unknown flag {name} (the contract has {', '.join(sorted(known))})")
        elif name in flags:
            errors.append(f"`paisa {sub}`: {name} given twice")
        else:
            flags[name] = value
            if "$(" in value or "${" in value:
                errors.append(f"`paisa {sub}`: {name} {value!r} is not resolved")
            else:
                expected = known[name](value)
                if expected:
                    errors.append(f"`paisa {sub}`: {name} {value!r} is not {expected}")
    for name in spec["required"]:
        if name not in flags:
            errors.append(f"`paisa {sub}`: missing {name}")
    for name, needed in spec.get("requires", {}).items():
        if name in flags and needed not in flags:
            errors.append(f"`paisa {sub}`: {name} requires {needed}")
    return sub, flags, errors


def _port_of(listen: str) -> int:
    return int(listen.rsplit(":", 1)[1])


# ---------------------------------------------------------------------------------------------------
# Compose interpolation (the subset compose supports: $$, $VAR, ${VAR}, ${VAR:-d}, ${VAR-d}, ${VAR:?e},
# ${VAR?e}, ${VAR:+a}, ${VAR+a}), with every variable unset: the defaults are what `docker compose up`
# uses with no .env file.

_VAR = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value, found: dict[str, str | None], errors: list[str], where: str = ""):
    if isinstance(value, dict):
        return {k: interpolate(v, found, errors, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, found, errors, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def one(m: re.Match) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        op, arg = m.group(3), m.group(4)
        if op in (":-", "-"):
            found[name] = arg
            return arg
        found.setdefault(name, None)
        if op in (":+", "+"):
            return ""
        errors.append(f"{where.lstrip('.')}: ${{{name}}} has no default (`docker compose up` would need it set)")
        return ""

    return _VAR.sub(one, value)


# ---------------------------------------------------------------------------------------------------
# Results.


class Report:
    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.passed = 0
        self.failed = 0
        self.failures: list[tuple[str, str]] = []

    def check(self, name: str, errors: list[str]) -> None:
        if errors:
            self.failed += 1
            for e in errors:
                self.failures.append((name, e))
            if not self.quiet:
                print(f"FAIL {name}")
                for e in errors:
                    print(f"       - {e}")
        else:
            self.passed += 1
            if not self.quiet:
                print(f"ok   {name}")


# ---------------------------------------------------------------------------------------------------
# Compose.


def compose_schema() -> dict:
    path = importlib.resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    return json.loads(path.read_text(encoding="utf-8"))


def schema_errors(schema: dict, document) -> list[str]:
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator = validator_class(schema)
    out = []
    for error in sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.absolute_path))):
        path = "/".join(map(str, error.absolute_path)) or "(top)"
        out.append(f"{path}: {error.message[:300]}")
    return out


def _command_list(service: dict) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment", {}) or {}
    if isinstance(env, list):
        return dict(e.split("=", 1) if "=" in e else (e, "") for e in env)
    return {k: ("" if v is None else str(v)) for k, v in env.items()}


def _depends(service: dict) -> dict[str, str]:
    deps = service.get("depends_on", {}) or {}
    if isinstance(deps, list):
        return {d: "service_started" for d in deps}
    return {k: (v or {}).get("condition", "service_started") for k, v in deps.items()}


def _role(name: str, service: dict) -> str:
    image = str(service.get("image", ""))
    if "build" in service:
        return "paisa"
    for prefix, role in (
        ("apache/kafka", "kafka"),
        ("bitnami/kafka", "kafka"),
        ("confluentinc/cp-kafka", "kafka"),
        ("confluentinc/cp-schema-registry", "schema-registry"),
        ("scylladb/scylla", "scylla"),
    ):
        if image.startswith(prefix + ":") or image.startswith(prefix + "@"):
            return role
    return "other"


def check_compose(raw: dict, report: Report, schema: dict, schema_version: str) -> None:
    report.check(
        f"compose: {COMPOSE_FILE.name} valid against compose-spec.json as written "
        f"(check-jsonschema {schema_version}'s copy)",
        schema_errors(schema, raw),
    )
    variables: dict[str, str | None] = {}
    interp_errors: list[str] = []
    doc = interpolate(copy.deepcopy(raw), variables, interp_errors)
    report.check("compose: every ${VAR} has a default", interp_errors)
    report.check("compose: valid against compose-spec.json after interpolation (defaults)", schema_errors(schema, doc))
    services: dict = doc.get("services") or {}
    if not isinstance(services, dict):
        report.check("compose: services", ["no services mapping"])
        return
    roles = {name: _role(name, s) for name, s in services.items() if isinstance(s, dict)}
    services = {n: s for n, s in services.items() if isinstance(s, dict)}

    # Roles present.
    errs = []
    for role in ("kafka", "schema-registry", "scylla"):
        if list(roles.values()).count(role) != 1:
            errs.append(f"expected exactly one {role} service, found {list(roles.values()).count(role)}")
    other = [n for n, r in roles.items() if r == "other"]
    if other:
        errs.append(f"services of no known role (not built from deploy/Dockerfile nor a known image): {other}")
    report.check("compose: one Kafka, one Schema Registry, one ScyllaDB; every other service runs paisa", errs)

    # Pinned images.
    errs = []
    for name, s in services.items():
        image = str(s.get("image", ""))
        if roles[name] == "paisa":
            if "build" not in s:
                errs.append(f"{name}: a paisa service must build deploy/Dockerfile")
            elif (s["build"] or {}).get("dockerfile") != "deploy/Dockerfile":
                errs.append(f"{name}: build.dockerfile is not deploy/Dockerfile")
            continue
        if "@sha256:" in image:
            continue
        tag = image.rsplit(":", 1)[1] if ":" in image.split("/")[-1] else ""
        if not re.fullmatch(r"v?[0-9]+\.[0-9]+(\.[0-9]+)?([.-][A-Za-z0-9.-]+)?", tag):
            errs.append(f"{name}: image {image!r} is not pinned to a MAJOR.MINOR[.PATCH] tag or a digest")
    report.check("compose: third-party images pinned (no `latest`, no bare major)", errs)

    # depends_on.
    errs = []
    for name, s in services.items():
        for dep, cond in _depends(s).items():
            if dep not in services:
                errs.append(f"{name}: depends_on unknown service {dep!r}")
                continue
            if cond == "service_healthy" and "healthcheck" not in services[dep]:
                errs.append(f"{name}: waits for {dep} healthy but {dep} has no healthcheck")
            if cond == "service_completed_successfully" and services[dep].get("restart", "no") != "no":
                errs.append(f"{name}: waits for {dep} to complete but {dep} restarts")
    report.check("compose: depends_on targets exist and their conditions can be met", errs)

    # Healthchecks on long-running services.
    errs = []
    for name, s in services.items():
        if s.get("restart", "no") != "no" and not (s.get("healthcheck") or {}).get("test"):
            errs.append(f"{name}: long-running service without a healthcheck")
        if (s.get("healthcheck") or {}).get("disable"):
            errs.append(f"{name}: healthcheck disabled")
    report.check("compose: every long-running service has a healthcheck", errs)

    # Volumes.
    errs = []
    declared = set((doc.get("volumes") or {}).keys())
    used = set()
    for name, s in services.items():
        for v in s.get("volumes", []) or []:
            if isinstance(v, str):
                source = v.split(":", 1)[0] if ":" in v else None
                kind = "bind" if source and (source.startswith((".", "/", "~"))) else "volume"
            else:
                source, kind = v.get("source"), v.get("type")
            if kind == "volume" and source:
                used.add(source)
                if source not in declared:
                    errs.append(f"{name}: volume {source!r} is not declared under top-level volumes")
            elif kind == "bind":
                errs.append(f"{name}: bind mount {source!r} (use a named volume)")
    for v in sorted(declared - used):
        errs.append(f"volume {v!r} is declared but no service uses it")
    for name, s in services.items():
        if roles[name] in ("kafka", "scylla") and not s.get("volumes"):
            errs.append(f"{name}: its data is not on a named volume")
    report.check("compose: named volumes declared, used, and holding Kafka's and ScyllaDB's data", errs)

    # Host ports.
    errs, seen = [], {}
    for name, s in services.items():
        for p in s.get("ports", []) or []:
            spec = p if isinstance(p, str) else f"{p.get('host_ip', '')}:{p.get('published', '')}:{p.get('target', '')}"
            parts = str(spec).split(":")
            host = ":".join(parts[:-1])
            if not host:
                continue
            if host in seen:
                errs.append(f"{name} and {seen[host]} both publish {host}")
            seen[host] = name
            if not host.startswith("127.0.0.1:"):
                errs.append(f"{name}: publishes {host} on every interface (bind 127.0.0.1)")
    report.check("compose: host ports unique and bound to 127.0.0.1", errs)

    # Kafka: KRaft, single broker, transactions.
    kafka_name = next((n for n, r in roles.items() if r == "kafka"), None)
    errs = []
    kafka_port = None
    if kafka_name:
        env = _env(services[kafka_name])
        roles_env = set(env.get("KAFKA_PROCESS_ROLES", "").split(","))
        if roles_env != {"broker", "controller"}:
            errs.append("KAFKA_PROCESS_ROLES is not broker,controller (KRaft combined mode)")
        for key in ("KAFKA_NODE_ID", "KAFKA_CONTROLLER_QUORUM_VOTERS", "KAFKA_CONTROLLER_LISTENER_NAMES", "CLUSTER_ID"):
            if not env.get(key):
                errs.append(f"{key} is not set")
        if "zookeeper" in json.dumps(env).lower():
            errs.append("a ZooKeeper setting is present (KRaft needs none)")
        for key in (
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        ):
            if env.get(key) != "1":
                errs.append(f"{key} must be 1 on a single broker (is {env.get(key)!r})")
        if env.get("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "true") != "false":
            errs.append("KAFKA_AUTO_CREATE_TOPICS_ENABLE must be false (paisa admin init creates the topics)")
        internal = env.get("KAFKA_INTER_BROKER_LISTENER_NAME", "PLAINTEXT")
        m = re.search(rf"(?:^|,){internal}://{re.escape(kafka_name)}:([0-9]+)", env.get("KAFKA_ADVERTISED_LISTENERS", ""))
        if not m:
            errs.append(f"KAFKA_ADVERTISED_LISTENERS does not advertise {internal}://{kafka_name}:PORT to the other containers")
        else:
            kafka_port = int(m.group(1))
        log_dir = env.get("KAFKA_LOG_DIRS")
        targets = [str(v).split(":")[1] if isinstance(v, str) else v.get("target") for v in services[kafka_name].get("volumes", [])]
        if log_dir not in targets:
            errs.append(f"KAFKA_LOG_DIRS {log_dir!r} is not on a volume")
    report.check("compose: Kafka in KRaft mode, single-broker replication and transaction-log settings", errs)

    # Schema Registry.
    sr_name = next((n for n, r in roles.items() if r == "schema-registry"), None)
    errs = []
    sr_port = None
    if sr_name:
        env = _env(services[sr_name])
        boot = env.get("SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS", "")
        if kafka_name and kafka_port and f"{kafka_name}:{kafka_port}" not in boot:
            errs.append(f"SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS {boot!r} is not {kafka_name}:{kafka_port}")
        m = re.search(r"https?://[^:]+:([0-9]+)", env.get("SCHEMA_REGISTRY_LISTENERS", ""))
        sr_port = int(m.group(1)) if m else None
        if not sr_port:
            errs.append("SCHEMA_REGISTRY_LISTENERS has no http://HOST:PORT")
    report.check("compose: Schema Registry stores its schemas on this Kafka", errs)

    # ScyllaDB sizing.
    sc_name = next((n for n, r in roles.items() if r == "scylla"), None)
    errs = []
    if sc_name:
        cmd = _command_list(services[sc_name])
        for flag, value in (("--smp", "1"), ("--memory", "750M"), ("--overprovisioned", "1")):
            if flag not in cmd or cmd.index(flag) + 1 >= len(cmd) or cmd[cmd.index(flag) + 1] != value:
                errs.append(f"scylla command lacks `{flag} {value}`")
    report.check("compose: ScyllaDB sized for one machine (--smp 1 --memory 750M --overprovisioned 1)", errs)

    # The paisa services against the CLI contract and each other.
    errs = []
    by_sub: dict[str, list[tuple[str, dict]]] = {}
    for name, s in services.items():
        if roles[name] != "paisa":
            continue
        if s.get("entrypoint") not in (None, "paisa", ["paisa"]):
            errs.append(f"{name}: entrypoint overridden ({s.get('entrypoint')!r}): the image's is `paisa`")
        sub, flags, e = parse_cli(_command_list(s))
        errs += [f"{name}: {x}" for x in e]
        if sub:
            by_sub.setdefault(sub, []).append((name, flags))
    for sub in SINGLE:
        n = len(by_sub.get(sub, []))
        if n != 1:
            errs.append(f"expected exactly one service running `paisa {sub}`, found {n}")
    report.check("compose: every paisa command follows the CLI contract (admin init | serve [--no-ingest] | wallet-sim)", errs)

    errs = []
    if all(len(by_sub.get(s, [])) == 1 for s in SINGLE):
        (init_name, init), (serve_name, serve), (sim_name, sim) = (by_sub[s][0] for s in ("admin init", "serve", "wallet-sim"))
        for who, flags in ((init_name, init), (serve_name, serve)):
            for broker in flags.get("--kafka-brokers", "").split(","):
                if kafka_name and broker != f"{kafka_name}:{kafka_port}":
                    errs.append(f"{who}: --kafka-brokers {broker} is not the broker's internal listener {kafka_name}:{kafka_port}")
            if sc_name and "--scylla-uri" in flags and flags["--scylla-uri"] != f"{sc_name}:9042":
                errs.append(f"{who}: --scylla-uri {flags['--scylla-uri']} is not {sc_name}:9042")
        if init.get("--partitions", "2") != serve.get("--partitions"):
            errs.append(f"--partitions differ: {init_name} {init.get('--partitions', '2')}, {serve_name} {serve.get('--partitions')}")
        if int(init.get("--replication-factor", "1")) > 1:
            errs.append(f"{init_name}: --replication-factor {init['--replication-factor']} > 1 broker")
        if init.get("--keyspace", "paisa") != "paisa":
            errs.append(f"{init_name}: --keyspace must be paisa (serve has no --keyspace and uses paisa)")
        sp = urlsplit(serve.get("--statement-provider", ""))
        if sp.hostname != sim_name or sp.port != _port_of(sim.get("--listen", "0:0")):
            errs.append(f"{serve_name}: --statement-provider {serve.get('--statement-provider')} is not http://{sim_name}:{_port_of(sim.get('--listen', '0:0'))}")
        if "--schema-registry" in serve and sr_name:
            sr = urlsplit(serve["--schema-registry"])
            if sr.hostname != sr_name or sr.port != sr_port:
                errs.append(f"{serve_name}: --schema-registry {serve['--schema-registry']} is not http://{sr_name}:{sr_port}")
        # Dependencies and lifecycle.
        deps_init = _depends(services[init_name])
        for need in (kafka_name, sc_name):
            if need and deps_init.get(need) != "service_healthy":
                errs.append(f"{init_name}: does not wait for {need} to be healthy")
        if services[init_name].get("restart", "no") != "no":
            errs.append(f"{init_name}: a one-shot service must have restart: \"no\"")
        needs = (kafka_name, sr_name, sc_name)
        errs += _serve_service_errors(serve_name, services[serve_name], serve, init_name, needs, "the one instance that ingests")
        errs += _listen_errors(sim_name, services[sim_name], sim, "/healthz")
    else:
        errs.append("skipped: the paisa services are not one of each")
    report.check("compose: paisa services agree with each other and with Kafka, Schema Registry, ScyllaDB", errs)

    # The --no-ingest serves sharing the stage partitions with the ingesting one.
    errs = []
    sharing = by_sub.get(NO_INGEST, [])
    if sharing and len(by_sub.get("serve", [])) == 1 and len(by_sub.get("admin init", [])) == 1:
        serve_name, serve = by_sub["serve"][0]
        init_name = by_sub["admin init"][0][0]
        errs += _member_errors([(who, [flags.get("--group-member")]) for who, flags in [(serve_name, serve)] + sharing])
        for who, flags in sharing:
            errs += _shared_flag_errors(who, flags, serve_name, serve)
            if "--ingest-url" in flags:
                forward = urlsplit(flags["--ingest-url"])
                if forward.hostname != serve_name or forward.port != _port_of(serve.get("--listen", "0:0")):
                    errs.append(f"{who}: --ingest-url {flags['--ingest-url']} is not the ingesting serve http://{serve_name}:{_port_of(serve.get('--listen', '0:0'))}")
            needs = (kafka_name, sr_name, sc_name)
            errs += _serve_service_errors(who, services[who], flags, init_name, needs, "each replica needs its own --group-member")
    elif sharing:
        errs.append("skipped: no single ingesting serve and init to share with")
    report.check(
        "compose: --no-ingest serves share the partitions (distinct --group-member; the ingesting serve's "
        "brokers, partitions, ScyllaDB, Schema Registry; wait for init; /readyz)",
        errs,
    )
    return variables


def _serve_service_errors(who: str, service: dict, flags: dict, init_name: str, needs: tuple, why_one: str) -> list[str]:
    """A compose `paisa serve`: waits for init and for Kafka, Schema Registry and ScyllaDB, runs one
    replica (`why_one`), has the admin key, and is checked on /readyz at its --listen port."""
    errs = []
    deps = _depends(service)
    if deps.get(init_name) != "service_completed_successfully":
        errs.append(f"{who}: does not wait for {init_name} with condition service_completed_successfully")
    for need in needs:
        if need and deps.get(need) != "service_healthy":
            errs.append(f"{who}: does not wait for {need} to be healthy")
    if not _one_replica(service):
        errs.append(f"{who}: must run exactly one replica ({why_one})")
    if "PAISA_ADMIN_KEY" not in _env(service):
        errs.append(f"{who}: PAISA_ADMIN_KEY is not in its environment")
    return errs + _listen_errors(who, service, flags, "/readyz")


def _listen_errors(who: str, service: dict, flags: dict, path: str) -> list[str]:
    """The healthcheck GETs `path` on the --listen port, and published ports include it."""
    errs = []
    port = _port_of(flags.get("--listen", "0:0"))
    test = " ".join(map(str, (service.get("healthcheck") or {}).get("test", [])))
    if f"localhost:{port}{path}" not in test and f"127.0.0.1:{port}{path}" not in test:
        errs.append(f"{who}: healthcheck does not GET {path} on its --listen port {port}")
    targets = [str(p).rsplit(":", 1)[-1] if isinstance(p, (str, int)) else str(p.get("target")) for p in service.get("ports", []) or []]
    if targets and str(port) not in targets:
        errs.append(f"{who}: ports {targets} do not include its --listen port {port}")
    return errs


def _one_replica(service: dict) -> bool:
    replicas = (service.get("deploy") or {}).get("replicas", 1)
    return str(replicas) == "1" and str(service.get("scale", 1)) == "1"


def _member_errors(members: list[tuple[str, list[str | None]]]) -> list[str]:
    """Every serve has a --group-member (one per instance; None: none given) and no id is used twice:
    a shared id is a shared transactional id paisa-stages-ID, and the instances fence each other."""
    errs, seen = [], {}
    for who, ids in members:
        for member in ids:
            if member is None:
                errs.append(f"{who}: no --group-member (every serve needs one when a --no-ingest serve shares the partitions)")
            elif member in seen:
                errs.append(f"{who} and {seen[member]}: same --group-member {member!r} (transactional id paisa-stages-{member}: they fence each other)")
            else:
                seen[member] = who
    return errs


def _shared_flag_errors(who: str, flags: dict[str, str], serve_name: str, serve: dict[str, str]) -> list[str]:
    """A --no-ingest serve reads and writes what the ingesting serve does."""
    errs = []
    for key in ("--kafka-brokers", "--partitions", "--scylla-uri", "--schema-registry"):
        if flags.get(key) != serve.get(key):
            errs.append(f"{who}: {key} {flags.get(key, '(none)')} is not the ingesting serve's ({serve_name}: {serve.get(key, '(none)')})")
    for name, f in ((who, flags), (serve_name, serve)):
        if "--scylla-uri" not in f:
            errs.append(f"{name}: no --scylla-uri (without the shared read model an instance's API sees only its own partitions)")
    return errs


# ---------------------------------------------------------------------------------------------------
# Kubernetes.

NAMESPACED = {"ConfigMap", "Secret", "Job", "Deployment", "Service", "StatefulSet", "CronJob", "ServiceAccount"}


def load_k8s(directory: Path) -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def _pod_spec(doc: dict) -> dict | None:
    if doc.get("kind") in ("Deployment", "Job", "StatefulSet"):
        return ((doc.get("spec") or {}).get("template") or {}).get("spec")
    return None


def _pod_labels(doc: dict) -> dict:
    return (((doc.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}


def _selects(service: dict, doc: dict) -> bool:
    """Whether a Service's selector matches a Deployment's or StatefulSet's pods."""
    selector = (service.get("spec") or {}).get("selector") or {}
    labels = _pod_labels(doc)
    return doc.get("kind") in ("Deployment", "StatefulSet") and bool(selector) and all(labels.get(a) == b for a, b in selector.items())


# The value $(NAME) stands for when NAME comes from the downward API (env valueFrom.fieldRef): known per
# pod only. FIELD_REF + "metadata.name" is the pod's name.
FIELD_REF = "fieldRef."
POD_NAME_REF = FIELD_REF + "metadata.name"
_ENV_FIELDS = re.compile(
    r"metadata\.(name|namespace|uid|labels\['[^']+'\]|annotations\['[^']+'\])|spec\.(nodeName|serviceAccountName)"
    r"|status\.(hostIP|hostIPs|podIP|podIPs)"
)


def _secret_env_names(c: dict, configmaps: dict[str, dict], secrets: dict[str, dict]) -> set[str]:
    """The container's environment variables whose value comes from a Secret (a later envFrom source
    overrides an earlier one, env overrides envFrom)."""
    names: set[str] = set()
    for src in c.get("envFrom", []) or []:
        prefix = src.get("prefix", "")
        if "secretRef" in src:
            names |= {prefix + k for k in secrets.get(src["secretRef"].get("name"), {})}
        if "configMapRef" in src:
            names -= {prefix + k for k in configmaps.get(src["configMapRef"].get("name"), {})}
    for e in c.get("env", []) or []:
        if "secretKeyRef" in (e.get("valueFrom") or {}):
            names.add(e.get("name"))
        else:
            names.discard(e.get("name"))
    return names


def _pod_member_ids(owner: str, doc: dict, member: str | None) -> tuple[list[str | None], list[str]]:
    """The --group-member of each pod of a workload, and what is wrong with them: a literal id is every
    replica's; $(POD_NAME) from a fieldRef metadata.name is each pod's own name, stable and distinct in a
    StatefulSet only (a Deployment's pod names change at every restart, and so would the transactional id)."""
    if member is None:
        return [None], []
    spec = doc.get("spec") or {}
    replicas = spec.get("replicas", 1)
    replicas = 1 if replicas is None else replicas
    if FIELD_REF not in member:
        if replicas != 1:
            return [member], [f"{owner}: its {replicas} replicas share --group-member {member!r} (give each pod its own: a StatefulSet and $(POD_NAME))"]
        return [member], []
    fields = ", ".join(re.findall(re.escape(FIELD_REF) + r"([A-Za-z.]+)", member))
    if doc.get("kind") != "StatefulSet":
        return [], [f"{owner}: --group-member comes from the pod's {fields} (a fieldRef): a {doc.get('kind')}'s pods change names at every restart, use a StatefulSet"]
    if member.count(FIELD_REF) != member.count(POD_NAME_REF):
        return [], [f"{owner}: --group-member comes from the pod's {fields}: only metadata.name is a stable, distinct id per pod"]
    start = (spec.get("ordinals") or {}).get("start", 0)
    name = (doc.get("metadata") or {}).get("name")
    return [member.replace(POD_NAME_REF, f"{name}-{i}") for i in range(start, start + replicas)], []


def _probe_path(c: dict, kind: str) -> str | None:
    return ((c.get(kind) or {}).get("httpGet") or {}).get("path")


def _probe_port_ok(c: dict, kind: str, port: int) -> bool:
    p = ((c.get(kind) or {}).get("httpGet") or {}).get("port")
    named = {cp.get("name"): cp.get("containerPort") for cp in c.get("ports", []) or []}
    return named.get(p, p) == port


def _probe_errors(owner: str, c: dict, flags: dict[str, str], wants: dict[str, str]) -> list[str]:
    """The container exposes its --listen port and each probe GETs its path there."""
    errs = []
    port = _port_of(flags["--listen"])
    if port not in [cp.get("containerPort") for cp in c.get("ports", []) or []]:
        errs.append(f"{owner}: containerPort does not include its --listen port {port}")
    for kind, path in wants.items():
        if _probe_path(c, kind) != path:
            errs.append(f"{owner}: {kind} must GET {path} (has {_probe_path(c, kind)!r})")
        elif not _probe_port_ok(c, kind, port):
            errs.append(f"{owner}: {kind} does not probe the --listen port {port}")
    return errs


def check_k8s(docs: list[tuple[str, dict]], report: Report) -> tuple[dict[str, str], set[str]]:
    errs = []
    for f, d in docs:
        if not isinstance(d, dict):
            errs.append(f"{f}: a document is not a mapping")
            continue
        for key in ("apiVersion", "kind"):
            if not d.get(key):
                errs.append(f"{f}: missing {key}")
        name = (d.get("metadata") or {}).get("name")
        if not name:
            errs.append(f"{f}: {d.get('kind')} without metadata.name")
        if d.get("kind") in NAMESPACED and (d.get("metadata") or {}).get("namespace") != NAMESPACE:
            errs.append(f"{f}: {d.get('kind')}/{name} is not in namespace {NAMESPACE}")
    report.check(f"k8s: {len(docs)} documents have apiVersion, kind, metadata.name, namespace {NAMESPACE}", errs)
    docs = [(f, d) for f, d in docs if isinstance(d, dict) and d.get("kind") and d.get("apiVersion")]

    errs = []
    for f, d in docs:
        try:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            errs.append(f"{f}: {d['kind']}/{(d.get('metadata') or {}).get('name')}: {'/'.join(map(str, e.path))}: {e.message[:300]}")
        except kubernetes_validate.utils.SchemaNotFoundError as e:
            errs.append(f"{f}: {e.message}")
        except Exception as e:  # noqa: BLE001 - any other failure is a failed check, not a crash
            errs.append(f"{f}: {d.get('kind')}: {type(e).__name__}: {e}")
    version = importlib.metadata.version("kubernetes-validate")
    report.check(f"k8s: every object valid against the Kubernetes {K8S_VERSION} schemas, strict (kubernetes-validate {version})", errs)

    objects = {(d["kind"], (d.get("metadata") or {}).get("name")): (f, d) for f, d in docs}
    errs = []
    seen = set()
    for f, d in docs:
        key = (d["kind"], (d.get("metadata") or {}).get("name"))
        if key in seen:
            errs.append(f"{f}: {key[0]}/{key[1]} defined twice")
        seen.add(key)
    if ("Namespace", NAMESPACE) not in objects:
        errs.append(f"no Namespace {NAMESPACE}")
    report.check("k8s: object names unique, the namespace defined", errs)

    configmaps = {n: (d.get("data") or {}) for (k, n), (f, d) in objects.items() if k == "ConfigMap"}
    secrets = {n: {**(d.get("data") or {}), **(d.get("stringData") or {})} for (k, n), (f, d) in objects.items() if k == "Secret"}

    # Containers: references, env resolution, contract, resources, probes, images.
    ref_errs, contract_errs, res_errs, img_errs = [], [], [], []
    by_sub: dict[str, list[tuple[str, dict, dict, dict]]] = {}
    env_names: set[str] = set()
    services = {n: d for (k, n), (f, d) in objects.items() if k == "Service"}
    for f, d in docs:
        spec = _pod_spec(d)
        if spec is None:
            continue
        owner = f"{d['kind']}/{d['metadata']['name']}"
        volumes = {v.get("name") for v in spec.get("volumes", []) or []}
        for c in spec.get("containers", []) or []:
            who = f"{f}: {owner} container {c.get('name')}"
            env: dict[str, str | None] = {}
            for src in c.get("envFrom", []) or []:
                prefix = src.get("prefix", "")
                if "configMapRef" in src:
                    name = src["configMapRef"].get("name")
                    if name not in configmaps:
                        ref_errs.append(f"{who}: envFrom ConfigMap {name!r} does not exist")
                    env.update({prefix + k: v for k, v in configmaps.get(name, {}).items()})
                if "secretRef" in src:
                    name = src["secretRef"].get("name")
                    if name not in secrets:
                        ref_errs.append(f"{who}: envFrom Secret {name!r} does not exist")
                    env.update({prefix + k: None for k in secrets.get(name, {})})
            for e in c.get("env", []) or []:
                env_names.add(e.get("name"))
                ref = (e.get("valueFrom") or {})
                if "configMapKeyRef" in ref:
                    name, key = ref["configMapKeyRef"].get("name"), ref["configMapKeyRef"].get("key")
                    if key not in configmaps.get(name, {}):
                        ref_errs.append(f"{who}: env {e.get('name')} refers to missing ConfigMap key {name}/{key}")
                    env[e["name"]] = configmaps.get(name, {}).get(key)
                elif "secretKeyRef" in ref:
                    name, key = ref["secretKeyRef"].get("name"), ref["secretKeyRef"].get("key")
                    if key not in secrets.get(name, {}):
                        ref_errs.append(f"{who}: env {e.get('name')} refers to missing Secret key {name}/{key}")
                    env[e["name"]] = None
                elif "fieldRef" in ref:
                    path = ref["fieldRef"].get("fieldPath", "")
                    if not _ENV_FIELDS.fullmatch(path):
                        ref_errs.append(f"{who}: env {e.get('name')} refers to fieldPath {path!r}, not a pod field the downward API gives env")
                    env[e["name"]] = FIELD_REF + path
                elif ref:
                    env[e["name"]] = FIELD_REF + next(iter(ref))
                else:
                    env[e["name"]] = e.get("value")
            for m in c.get("volumeMounts", []) or []:
                if m.get("name") not in volumes:
                    ref_errs.append(f"{who}: mounts undefined volume {m.get('name')!r}")

            def resolve(arg: str) -> str:
                def one(m):
                    if m.group(1) not in env:
                        ref_errs.append(f"{who}: $({m.group(1)}) is not in the container's environment")
                        return m.group(0)
                    if env[m.group(1)] is None:
                        ref_errs.append(f"{who}: $({m.group(1)}) comes from a Secret: do not pass secrets as arguments")
                        return m.group(0)
                    return env[m.group(1)]

                return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, arg)

            if c.get("command") not in (None, ["paisa"]):
                contract_errs.append(f"{who}: command overridden ({c.get('command')!r}): the image's entrypoint is `paisa`")
            args = [resolve(str(a)) for a in c.get("args", []) or []]
            sub, flags, e = parse_cli(args)
            contract_errs += [f"{who}: {x}" for x in e]
            if sub:
                by_sub.setdefault(sub, []).append((owner, d, c, flags))
            resources = c.get("resources") or {}
            for kind in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    if r not in (resources.get(kind) or {}):
                        res_errs.append(f"{who}: no resources.{kind}.{r}")
            image = str(c.get("image", ""))
            tag = image.rsplit(":", 1)[1] if ":" in image.split("/")[-1] else ""
            if "@sha256:" not in image and (not tag or tag == "latest"):
                img_errs.append(f"{who}: image {image!r} has no pinned tag")
        if d["kind"] in ("Deployment", "StatefulSet"):
            selector = ((d["spec"].get("selector") or {}).get("matchLabels") or {})
            labels = _pod_labels(d)
            if not selector or any(labels.get(k) != v for k, v in selector.items()):
                ref_errs.append(f"{f}: {owner}: selector {selector} does not match the pod labels {labels}")
        if d["kind"] == "StatefulSet" and d["spec"].get("serviceName"):
            governing = services.get(d["spec"]["serviceName"])
            if governing is None:
                ref_errs.append(f"{f}: {owner}: serviceName {d['spec']['serviceName']!r} is no Service")
            elif (governing.get("spec") or {}).get("clusterIP") != "None" or not _selects(governing, d):
                ref_errs.append(f"{f}: {owner}: serviceName {d['spec']['serviceName']!r} is not a headless Service (clusterIP: None) selecting its pods")
    report.check("k8s: ConfigMap, Secret, fieldRef, volume, $(VAR) and serviceName references resolve", ref_errs)
    counts = {sub: len(by_sub.get(sub, [])) for sub in SINGLE}
    for sub, n in counts.items():
        if n != 1:
            contract_errs.append(f"expected exactly one workload running `paisa {sub}`, found {n}")
    report.check("k8s: every container's args follow the paisa CLI contract (after $(VAR) substitution)", contract_errs)
    report.check("k8s: every container has cpu and memory requests and limits", res_errs)
    report.check("k8s: images have a pinned tag", img_errs)

    # Workload kinds, replicas, probes, services.
    errs = []
    if all(n == 1 for n in counts.values()):
        (init_owner, init_doc, init_c, init), (serve_owner, serve_doc, serve_c, serve), (sim_owner, sim_doc, sim_c, sim) = (
            by_sub[s][0] for s in ("admin init", "serve", "wallet-sim")
        )
        if init_doc["kind"] != "Job":
            errs.append(f"{init_owner}: `paisa admin init` must run as a Job")
        for owner, doc in ((serve_owner, serve_doc), (sim_owner, sim_doc)):
            if doc["kind"] != "Deployment":
                errs.append(f"{owner}: must be a Deployment")
        if serve_doc["spec"].get("replicas") != 1:
            errs.append(f"{serve_owner}: replicas must be 1 (one instance runs every stage)")
        if (serve_doc["spec"].get("strategy") or {}).get("type") != "Recreate":
            errs.append(f"{serve_owner}: strategy must be Recreate (a rolling update runs two ingesting instances at once)")
        if init.get("--partitions", "2") != serve.get("--partitions"):
            errs.append(f"--partitions differ: init {init.get('--partitions', '2')}, serve {serve.get('--partitions')}")
        for key in ("--kafka-brokers", "--scylla-uri"):
            if init.get(key) != serve.get(key):
                errs.append(f"{key} differ: init {init.get(key)}, serve {serve.get(key)}")
        if init.get("--keyspace", "paisa") != "paisa":
            errs.append(f"{init_owner}: --keyspace must be paisa (serve has no --keyspace and uses paisa)")
        if "PAISA_ADMIN_KEY" not in _secret_env_names(serve_c, configmaps, secrets):
            errs.append(f"{serve_owner}: PAISA_ADMIN_KEY does not come from a Secret")
        errs += _probe_errors(serve_owner, serve_c, serve, {"readinessProbe": "/readyz", "livenessProbe": "/healthz"})
        errs += _probe_errors(sim_owner, sim_c, sim, {"readinessProbe": "/healthz", "livenessProbe": "/healthz"})
        # Services select pods (of Deployments and StatefulSets) and the statement provider URL reaches wallet-sim.
        for name, svc in services.items():
            selector = (svc.get("spec") or {}).get("selector") or {}
            pods = [
                (doc, c)
                for (k, n), (f, doc) in objects.items()
                if _selects(svc, doc)
                for c in _pod_spec(doc).get("containers", [])
            ]
            if not pods:
                errs.append(f"Service/{name}: selector {selector} matches no Deployment's or StatefulSet's pods")
            for p in (svc.get("spec") or {}).get("ports", []) or []:
                target = p.get("targetPort", p.get("port"))
                if pods and not any(cp.get("name") == target or cp.get("containerPort") == target for _, c in pods for cp in c.get("ports", []) or []):
                    errs.append(f"Service/{name}: targetPort {target!r} is no port of its pods")
        sp = urlsplit(serve["--statement-provider"])
        sim_services = [n for n, svc in services.items() if ((svc.get("spec") or {}).get("selector") or {}).items() <= (((sim_doc["spec"]["template"].get("metadata") or {}).get("labels") or {}).items())]
        ok = False
        for n in sim_services:
            hosts = {n, f"{n}.{NAMESPACE}", f"{n}.{NAMESPACE}.svc", f"{n}.{NAMESPACE}.svc.cluster.local"}
            ports = {p.get("port") for p in services[n]["spec"].get("ports", [])}
            ok = ok or (sp.hostname in hosts and sp.port in ports)
        if not ok:
            errs.append(f"{serve_owner}: --statement-provider {serve['--statement-provider']} is not the wallet-sim Service ({sim_services})")
    else:
        errs.append("skipped: the paisa workloads are not one of each")
    report.check("k8s: init is a Job; the ingesting serve is 1 replica, Recreate, probed on /readyz and /healthz; Services route to their pods", errs)

    # The --no-ingest serves sharing the stage partitions with the ingesting one.
    errs = []
    sharing = by_sub.get(NO_INGEST, [])
    if sharing and counts.get("serve") == 1:
        serve_owner, serve_doc, serve_c, serve = by_sub["serve"][0]
        members = []
        for owner, doc, c, flags in [by_sub["serve"][0]] + sharing:
            ids, e = _pod_member_ids(owner, doc, flags.get("--group-member"))
            errs += e
            members.append((owner, ids))
        errs += _member_errors(members)
        for owner, doc, c, flags in sharing:
            errs += _shared_flag_errors(owner, flags, serve_owner, serve)
            if "--ingest-url" in flags:
                forward = urlsplit(flags["--ingest-url"])
                reaching = [
                    n for n, svc in services.items()
                    if _selects(svc, serve_doc) and not any(_selects(svc, d) for _, d, _, _ in sharing)
                    and forward.hostname in {n, f"{n}.{NAMESPACE}", f"{n}.{NAMESPACE}.svc", f"{n}.{NAMESPACE}.svc.cluster.local"}
                    and forward.port in {p.get("port") for p in (svc.get("spec") or {}).get("ports", []) or []}
                ]
                if not reaching:
                    errs.append(f"{owner}: --ingest-url {flags['--ingest-url']} is not a Service of the ingesting serve {serve_owner} only")
            if doc["kind"] not in ("Deployment", "StatefulSet"):
                errs.append(f"{owner}: must be a Deployment or a StatefulSet")
            if doc["kind"] == "Deployment" and (doc["spec"].get("strategy") or {}).get("type") != "Recreate":
                errs.append(f"{owner}: strategy must be Recreate (a rolling update runs two pods with one --group-member at once)")
            if "PAISA_ADMIN_KEY" not in _secret_env_names(c, configmaps, secrets):
                errs.append(f"{owner}: PAISA_ADMIN_KEY does not come from a Secret")
            errs += _probe_errors(owner, c, flags, {"readinessProbe": "/readyz", "livenessProbe": "/healthz"})
        # Writes must reach the ingesting serve only: the others answer them 503.
        for name, svc in services.items():
            routed = [owner for owner, doc, c, flags in [by_sub["serve"][0]] + sharing if _selects(svc, doc)]
            if serve_owner in routed and len(routed) > 1:
                errs.append(f"Service/{name}: routes to {serve_owner} and to {', '.join(sorted(set(routed) - {serve_owner}))} (writes reaching a --no-ingest pod get 503)")
    elif sharing:
        errs.append("skipped: no single ingesting serve to share with")
    report.check(
        "k8s: --no-ingest serves share the partitions (a distinct --group-member per pod; the ingesting serve's "
        "brokers, partitions, ScyllaDB, Schema Registry; probed on /readyz and /healthz; admin key from a Secret)",
        errs,
    )
    return {k: v for cm in configmaps.values() for k, v in cm.items()}, env_names


# ---------------------------------------------------------------------------------------------------
# Dockerfile and README.


def check_dockerfile(text: str, ignore: str, report: Report) -> None:
    errs = []
    lines = [l.strip() for l in re.sub(r"\\\n", " ", text).splitlines() if l.strip() and not l.strip().startswith("#")]
    args = dict(re.findall(r"^ARG\s+([A-Z_]+)=(\S+)", "\n".join(lines), re.M))
    froms = [re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), l.split()[1]) for l in lines if l.startswith("FROM ")]
    if len(froms) < 2 or not froms[0].startswith("rust:") or not froms[0].endswith("-bookworm"):
        errs.append(f"the first stage is not a rust:*-bookworm builder ({froms[:1]})")
    if not froms or froms[-1] != "debian:bookworm-slim":
        errs.append(f"the runtime stage is not debian:bookworm-slim ({froms[-1:]})")
    joined = "\n".join(lines)
    if not re.search(r"cargo build --release\b.*-p paisa\b", joined):
        errs.append("no `cargo build --release -p paisa`")
    builder = joined.split("FROM ")[1] if "FROM " in joined else ""
    for pkg in ("build-essential", "perl", "zlib1g-dev", "pkg-config"):
        if not re.search(rf"apt-get install[^\n]*\b{re.escape(pkg)}\b", builder):
            errs.append(f"the builder does not install {pkg} (librdkafka builds from source)")
    runtime = joined.rsplit("FROM ", 1)[-1]
    if "ca-certificates" not in runtime:
        errs.append("the runtime does not install ca-certificates")
    users = re.findall(r"^USER\s+(\S+)", runtime, re.M)
    if not users or users[-1].split(":")[0] in ("root", "0"):
        errs.append("the runtime does not switch to a non-root USER")
    entry = re.findall(r"^ENTRYPOINT\s+(.+)$", runtime, re.M)
    if not entry or json.loads(entry[-1]) != ["paisa"]:
        errs.append(f"ENTRYPOINT is not [\"paisa\"] ({entry})")
    if not re.search(r"^target/?$", ignore, re.M):
        errs.append("Dockerfile.dockerignore does not exclude target/ (gigabytes of build output)")
    report.check("Dockerfile: rust bookworm builder with librdkafka's build deps, bookworm-slim runtime, non-root, ENTRYPOINT paisa", errs)


def check_readme(text: str, variables: dict, configmap_keys: dict, env_names: set[str], report: Report) -> None:
    errs = []
    if not re.search(r"^#+ .*Run on Kafka and ScyllaDB", text, re.M | re.I):
        errs.append("no 'Run on Kafka and ScyllaDB' section")
    documented = set(re.findall(r"`([^`\n]+)`", text))
    words = {w for d in documented for w in re.split(r"[\s=]+", d)}
    for name in sorted(variables):
        if name not in words:
            errs.append(f"compose variable {name} is not documented (in backticks)")
    for key in sorted(configmap_keys):
        if key not in words:
            errs.append(f"ConfigMap key {key} is not documented (in backticks)")
    for sub, spec in CONTRACT.items():
        for flag in list(spec["required"]) + list(spec["optional"]):
            if flag not in words:
                errs.append(f"flag {flag} of `paisa {sub}` is not documented (in backticks)")
    for env in ("PAISA_ADMIN_KEY", "RUST_LOG"):
        if env not in words:
            errs.append(f"{env} is not documented")
    for env in sorted(env_names - {"PAISA_ADMIN_KEY", "RUST_LOG"}):
        if env not in words:
            errs.append(f"container env {env} of k8s/ is not documented (in backticks)")
    report.check("README.md: a 'Run on Kafka and ScyllaDB' section; every variable, ConfigMap key, container env and flag documented", errs)


# ---------------------------------------------------------------------------------------------------


def run_all(raw, k8s_docs, readme, dockerfile, ignore, schema, schema_version, report: Report) -> None:
    variables = check_compose(raw, report, schema, schema_version) or {}
    configmap, env_names = check_k8s(k8s_docs, report)
    check_dockerfile(dockerfile, ignore, report)
    check_readme(readme, variables, configmap, env_names, report)


def _svc(doc, name):
    return doc["services"][name]


def _k8s(docs, kind, name):
    return next(d for f, d in docs if d.get("kind") == kind and d["metadata"]["name"] == name)


def _container(docs, kind, name):
    return _k8s(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]


def _set_flag(args: list, flag: str, value: str) -> None:
    args[args.index(flag) + 1] = value


def _drop_flag(args: list, flag: str) -> None:
    """Removes a flag and its value (a boolean flag alone)."""
    i = args.index(flag)
    del args[i : i + (1 if flag in BOOLEAN_FLAGS else 2)]


# Each mutation breaks one thing and names the check that must catch it.
MUTATIONS = [
    ("compose: a misspelt service key", lambda c, k: _svc(c, "kafka").update(imagee="x"), "compose: ", "compose-spec.json as written"),
    ("compose: ports as a mapping", lambda c, k: _svc(c, "paisa").update(ports={"8080": 8080}), "compose: ", "compose-spec.json"),
    ("compose: depends_on condition misspelt", lambda c, k: _svc(c, "paisa")["depends_on"]["paisa-init"].update(condition="service_completed"), "compose: ", "compose-spec.json"),
    ("compose: `serve` renamed `server`", lambda c, k: _svc(c, "paisa")["command"].__setitem__(0, "server"), "compose: ", "CLI contract"),
    ("compose: init without --kafka-brokers", lambda c, k: _svc(c, "paisa-init").update(command=["admin", "init", "--partitions", "2"]), "compose: ", "CLI contract"),
    ("compose: an unknown flag on wallet-sim", lambda c, k: _svc(c, "wallet-sim")["command"].extend(["--port", "1"]), "compose: ", "CLI contract"),
    ("compose: serve on the event clock", lambda c, k: _svc(c, "paisa").update(command=[("event" if a == "system" else a) for a in _svc(c, "paisa")["command"]]), "compose: ", "CLI contract"),
    ("compose: serve no longer waits for init", lambda c, k: _svc(c, "paisa")["depends_on"].pop("paisa-init"), "compose: ", "agree with each other"),
    ("compose: statement provider points elsewhere", lambda c, k: _svc(c, "paisa").update(command=[("http://wallet:8081" if a.startswith("http://wallet-sim") else a) for a in _svc(c, "paisa")["command"]]), "compose: ", "agree with each other"),
    ("compose: kafka image :latest", lambda c, k: _svc(c, "kafka").update(image="apache/kafka:latest"), "compose: ", "pinned"),
    ("compose: transaction log min ISR 2", lambda c, k: _svc(c, "kafka")["environment"].update(KAFKA_TRANSACTION_STATE_LOG_MIN_ISR=2), "compose: ", "KRaft"),
    ("compose: an undeclared volume", lambda c, k: _svc(c, "scylla").update(volumes=["scylla-dat:/var/lib/scylla"]), "compose: ", "named volumes"),
    ("compose: a variable without default", lambda c, k: _svc(c, "paisa")["environment"].update(PAISA_ADMIN_KEY="${PAISA_ADMIN_KEY}"), "compose: ", "default"),
    ("k8s: a misspelt Deployment field", lambda c, k: _k8s(k, "Deployment", "paisa")["spec"].update(replica=1), "k8s: ", "strict"),
    ("k8s: a port as a string", lambda c, k: _container(k, "Deployment", "wallet-sim")["ports"][0].update(containerPort="8081"), "k8s: ", "strict"),
    ("k8s: serve with 2 replicas", lambda c, k: _k8s(k, "Deployment", "paisa")["spec"].update(replicas=2), "k8s: ", "1 replica"),
    ("k8s: readiness on /ready", lambda c, k: _container(k, "Deployment", "paisa")["readinessProbe"]["httpGet"].update(path="/ready"), "k8s: ", "1 replica"),
    ("k8s: a Service selecting nothing", lambda c, k: _k8s(k, "Service", "wallet-sim")["spec"].update(selector={"app": "nope"}), "k8s: ", "Services route"),
    ("k8s: an unknown ConfigMap key in args", lambda c, k: _container(k, "Job", "paisa-init")["args"].__setitem__(3, "$(KAFKA_BROKER)"), "k8s: ", "references resolve"),
    ("k8s: a misspelt flag", lambda c, k: _container(k, "Job", "paisa-init")["args"].__setitem__(2, "--kafka-broker"), "k8s: ", "CLI contract"),
    ("k8s: no memory limit", lambda c, k: _container(k, "Deployment", "paisa")["resources"]["limits"].pop("memory"), "k8s: ", "requests and limits"),
    # The serves sharing the stage partitions.
    ("compose: a --no-ingest serve with --statement-provider", lambda c, k: _svc(c, "paisa-stages")["command"].extend(["--statement-provider", "http://wallet-sim:8081"]), "compose: ", "CLI contract"),
    ("compose: --no-ingest given a value", lambda c, k: _svc(c, "paisa-stages")["command"].__setitem__(-1, "--no-ingest=true"), "compose: ", "CLI contract"),
    ("compose: --group-session-timeout-ms without --group-member", lambda c, k: (_drop_flag(_svc(c, "paisa")["command"], "--group-member"), _svc(c, "paisa")["command"].extend(["--group-session-timeout-ms", "10000"])), "compose: ", "CLI contract"),
    ("compose: two serves with the same --group-member", lambda c, k: _set_flag(_svc(c, "paisa-stages")["command"], "--group-member", "0"), "compose: ", "share the partitions"),
    ("compose: the ingesting serve without --group-member", lambda c, k: _drop_flag(_svc(c, "paisa")["command"], "--group-member"), "compose: ", "share the partitions"),
    ("compose: paisa-stages no longer waits for init", lambda c, k: _svc(c, "paisa-stages")["depends_on"].pop("paisa-init"), "compose: ", "share the partitions"),
    ("compose: a --no-ingest serve with other --partitions", lambda c, k: _set_flag(_svc(c, "paisa-stages")["command"], "--partitions", "4"), "compose: ", "share the partitions"),
    ("compose: a --no-ingest serve without ScyllaDB", lambda c, k: _drop_flag(_svc(c, "paisa-stages")["command"], "--scylla-uri"), "compose: ", "share the partitions"),
    ("compose: paisa-stages scaled to 2", lambda c, k: _svc(c, "paisa-stages").update(deploy={"replicas": 2}), "compose: ", "share the partitions"),
    ("compose: paisa-stages without the admin key", lambda c, k: _svc(c, "paisa-stages")["environment"].pop("PAISA_ADMIN_KEY"), "compose: ", "share the partitions"),
    ("compose: paisa-stages healthcheck on /healthz", lambda c, k: _svc(c, "paisa-stages")["healthcheck"].update(test=["CMD", "curl", "-fsS", "http://localhost:8080/healthz"]), "compose: ", "share the partitions"),
    ("k8s: the StatefulSet probing /ready", lambda c, k: _container(k, "StatefulSet", "paisa-stages")["readinessProbe"]["httpGet"].update(path="/ready"), "k8s: ", "share the partitions"),
    ("k8s: a --no-ingest serve with --statement-provider", lambda c, k: _container(k, "StatefulSet", "paisa-stages")["args"].extend(["--statement-provider", "$(STATEMENT_PROVIDER_URL)"]), "k8s: ", "CLI contract"),
    ("k8s: the StatefulSet with a fixed --group-member and 2 replicas", lambda c, k: (_set_flag(_container(k, "StatefulSet", "paisa-stages")["args"], "--group-member", "stages"), _k8s(k, "StatefulSet", "paisa-stages")["spec"].update(replicas=2)), "k8s: ", "share the partitions"),
    ("k8s: the StatefulSet's member id is the ingesting serve's", lambda c, k: _set_flag(_container(k, "StatefulSet", "paisa-stages")["args"], "--group-member", "ingest"), "k8s: ", "share the partitions"),
    ("k8s: the ingesting serve without --group-member", lambda c, k: _drop_flag(_container(k, "Deployment", "paisa")["args"], "--group-member"), "k8s: ", "share the partitions"),
    ("k8s: $(POD_NAME) in a Deployment", lambda c, k: (_container(k, "Deployment", "paisa").setdefault("env", []).append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}), _set_flag(_container(k, "Deployment", "paisa")["args"], "--group-member", "$(POD_NAME)")), "k8s: ", "share the partitions"),
    ("k8s: a --no-ingest serve with other --kafka-brokers", lambda c, k: _set_flag(_container(k, "StatefulSet", "paisa-stages")["args"], "--kafka-brokers", "kafka.example:9092"), "k8s: ", "share the partitions"),
    ("k8s: the StatefulSet without the admin Secret", lambda c, k: _container(k, "StatefulSet", "paisa-stages")["envFrom"].pop(1), "k8s: ", "share the partitions"),
    ("k8s: Service/paisa routes to the StatefulSet's pods too", lambda c, k: _k8s(k, "Service", "paisa")["spec"].update(selector={"app.kubernetes.io/part-of": "paisa"}), "k8s: ", "share the partitions"),
    ("k8s: POD_NAME from a Secret", lambda c, k: _container(k, "StatefulSet", "paisa-stages")["env"][0].update(valueFrom={"secretKeyRef": {"name": "paisa-admin", "key": "PAISA_ADMIN_KEY"}}), "k8s: ", "references resolve"),
    ("k8s: the StatefulSet's serviceName names no Service", lambda c, k: _k8s(k, "StatefulSet", "paisa-stages")["spec"].update(serviceName="paisa-stage-pods"), "k8s: ", "references resolve"),
    ("k8s: the StatefulSet's governing Service not headless", lambda c, k: _k8s(k, "Service", "paisa-stages-pods")["spec"].pop("clusterIP"), "k8s: ", "references resolve"),
    ("compose: --ingest-url pointing at paisa-stages itself", lambda c, k: _set_flag(_svc(c, "paisa-stages")["command"], "--ingest-url", "http://paisa-stages:8080"), "compose: ", "share the partitions"),
    ("k8s: --ingest-url pointing at the StatefulSet's Service", lambda c, k: _set_flag(_container(k, "StatefulSet", "paisa-stages")["args"], "--ingest-url", "http://paisa-stages.paisa.svc:8080"), "k8s: ", "share the partitions"),
    ("k8s: --group-member from the pod's IP", lambda c, k: _container(k, "StatefulSet", "paisa-stages")["env"][0]["valueFrom"]["fieldRef"].update(fieldPath="status.podIP"), "k8s: ", "share the partitions"),
]

# Text mutations: (description, file, change, check prefix, words in the check's name).
TEXT_MUTATIONS = [
    ("README: a ConfigMap key undocumented", "readme", lambda t: t.replace("STATEMENT_PROVIDER_URL", "STATEMENT_URL"), "README.md", "documented"),
    ("README: --group-member undocumented", "readme", lambda t: t.replace("--group-member", "--group-membr"), "README.md", "documented"),
    ("README: POD_NAME undocumented", "readme", lambda t: t.replace("POD_NAME", "POD_NAM"), "README.md", "documented"),
    ("Dockerfile: runs as root", "dockerfile", lambda t: re.sub(r"^USER .*$", "USER root", t, flags=re.M), "Dockerfile", "non-root"),
]


def self_test(raw, k8s_docs, readme, dockerfile, ignore, schema, schema_version) -> list[str]:
    failures = []
    baseline = Report(quiet=True)
    run_all(copy.deepcopy(raw), copy.deepcopy(k8s_docs), readme, dockerfile, ignore, schema, schema_version, baseline)
    cases = [(d, None, m, p, w) for d, m, p, w in MUTATIONS] + [(d, f, m, p, w) for d, f, m, p, w in TEXT_MUTATIONS]
    for description, text_file, mutate, prefix, words in cases:
        c, k, r, df = copy.deepcopy(raw), copy.deepcopy(k8s_docs), readme, dockerfile
        if text_file == "readme":
            r = mutate(r)
        elif text_file == "dockerfile":
            df = mutate(df)
        else:
            mutate(c, k)
        report = Report(quiet=True)
        run_all(c, k, r, df, ignore, schema, schema_version, report)
        # Caught: the named check reports an error that the unbroken files do not have.
        hits = [n for n, e in report.failures if n.startswith(prefix) and words in n and (n, e) not in baseline.failures]
        if hits:
            print(f"ok   self-test: {description}: caught by \"{hits[0]}\"")
        else:
            seen = sorted({name for name, _ in report.failures})
            print(f"FAIL self-test: {description}: not caught by a check named like {prefix!r}…{words!r} (failed: {seen})")
            failures.append(description)
    return failures


def main() -> int:
    raw = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    k8s_docs = load_k8s(K8S_DIR)
    readme = README.read_text(encoding="utf-8")
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    ignore = DOCKERIGNORE.read_text(encoding="utf-8") if DOCKERIGNORE.exists() else ""
    schema = compose_schema()
    schema_version = importlib.metadata.version("check-jsonschema")
    print(f"== deploy/check: {COMPOSE_FILE.relative_to(HERE.parent)}, {K8S_DIR.relative_to(HERE.parent)}/*.yaml, Dockerfile, README.md")
    report = Report()
    run_all(raw, k8s_docs, readme, dockerfile, ignore, schema, schema_version, report)
    if report.failed:
        print("== self-test skipped: the files themselves fail (above); fix that first")
        passed, failed = report.passed, report.failed
    else:
        print("== self-test: each broken copy must fail a named check")
        missed = self_test(raw, k8s_docs, readme, dockerfile, ignore, schema, schema_version)
        passed = report.passed + len(MUTATIONS) + len(TEXT_MUTATIONS) - len(missed)
        failed = report.failed + len(missed)
    print(f"deploy: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
