//! There is no Docker engine or cluster here, so the deployment files are kept honest another
//! way: every hark command they run must exist in the `hark` CLI, every `HARK_…` variable they
//! set must be a config key, and the values they set must be accepted by the config loader.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use hark_core::config::Config;
use hark_e2e::hark_binary;
use yaml_rust2::{Yaml, YamlLoader};

/// HARK_ variables that are read by the CLI itself rather than the config.
const NON_CONFIG: &[&str] = &[
    "HARK_CONFIG",
    "HARK_WORKER_ID",
    "HARK_API",
    "HARK_API_TOKEN",
];

/// The image compose builds and the dev overlay runs: hark's name, tagged with its version.
const HARK_IMAGE: &str = concat!("hark:", env!("CARGO_PKG_VERSION"));

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned()
}

fn load(path: &str) -> Vec<Yaml> {
    let text = std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{path} is not valid YAML: {e}"))
}

fn strings(yaml: &Yaml) -> Vec<String> {
    yaml.as_vec()
        .map(|v| {
            v.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Applies YAML merge keys (`<<: *anchor`), which the parser leaves as plain keys.
fn merged(yaml: &Yaml) -> Yaml {
    let Some(hash) = yaml.as_hash() else {
        return yaml.clone();
    };
    let mut out = yaml_rust2::yaml::Hash::new();
    if let Some(base) = hash.get(&Yaml::String("<<".into()))
        && let Some(base) = merged(base).as_hash()
    {
        out.extend(base.clone());
    }
    for (k, v) in hash {
        if k.as_str() != Some("<<") {
            out.insert(k.clone(), merged(v));
        }
    }
    Yaml::Hash(out)
}

/// `hark <args…> --help` must succeed: the subcommand and its flags exist.
fn assert_command_exists(args: &[String], context: &str) {
    let mut with_help: Vec<&str> = args.iter().map(String::as_str).collect();
    with_help.push("--help");
    let status = Command::new(hark_binary())
        .args(&with_help)
        .env_remove("HARK_CONFIG")
        .output()
        .expect("hark runs");
    assert!(
        status.status.success(),
        "{context}: `hark {}` is not a hark command: {}",
        args.join(" "),
        String::from_utf8_lossy(&status.stderr)
    );
}

fn assert_config_keys(env: &BTreeMap<String, String>, context: &str) {
    let keys = Config::env_keys();
    for key in env.keys().filter(|k| k.starts_with("HARK_")) {
        assert!(
            keys.contains(key) || NON_CONFIG.contains(&key.as_str()),
            "{context}: {key} is not a hark config key"
        );
    }
    let config_env: BTreeMap<String, String> = env
        .iter()
        .filter(|(k, _)| k.starts_with("HARK_") && !NON_CONFIG.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Err(e) = Config::from_parts(None, context, &config_env) {
        panic!("{context}: the values it sets are refused: {e}");
    }
}

/// Resolves `${VAR}`, `${VAR:-default}` from the example environment file.
fn substitute(value: &str, vars: &BTreeMap<String, String>, used: &mut BTreeSet<String>) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').expect("closing brace") + start;
        let inner = &rest[start + 2..end];
        // `${VAR:?message}`: compose refuses to start while VAR is empty; the example file
        // must still name it, and the check goes on with a stand-in value.
        if let Some((name, message)) = inner.split_once(":?") {
            assert!(
                vars.contains_key(name),
                "${{{name}}} is required by docker-compose.yml but .env.example does not name it"
            );
            assert!(
                !message.trim().is_empty(),
                "${{{name}}} must say how to set it"
            );
            out.push_str(
                vars.get(name)
                    .filter(|v| !v.is_empty())
                    .map_or("a-token", String::as_str),
            );
            used.insert(name.to_owned());
            rest = &rest[end + 1..];
            continue;
        }
        let (name, default) = match inner.split_once(":-") {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        match (vars.get(name), default) {
            (Some(v), _) => out.push_str(v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => {
                panic!("${{{name}}} is used in docker-compose.yml but not set in .env.example")
            }
        }
        used.insert(name.to_owned());
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

fn env_example() -> BTreeMap<String, String> {
    std::fs::read_to_string(root().join(".env.example"))
        .expect(".env.example")
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

#[test]
fn the_image_exposes_the_ports_hark_listens_on_and_checks_its_own_health() {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).expect("the Dockerfile");
    let line = |word: &str| {
        dockerfile
            .lines()
            .find(|l| l.starts_with(word))
            .unwrap_or_else(|| panic!("the Dockerfile has {word}"))
            .to_owned()
    };
    let defaults = Config::default();
    let exposed: BTreeSet<u16> = line("EXPOSE ")
        .split_whitespace()
        .skip(1)
        .map(|p| p.parse().expect("a port"))
        .collect();
    for (what, port) in [
        ("gateway.listen", defaults.gateway.listen.port()),
        ("control.grpc_listen", defaults.control.grpc_listen.port()),
    ] {
        assert!(exposed.contains(&port), "EXPOSE {port} ({what})");
    }
    // HEALTHCHECK … CMD ["hark", "health"]: a command the binary has, with no role to name.
    let healthcheck = line("HEALTHCHECK ");
    let cmd = healthcheck
        .split_once("CMD ")
        .map(|(_, c)| c.trim())
        .expect("HEALTHCHECK has a CMD");
    let cmd: Vec<String> = serde_json::from_str(cmd).expect("CMD in exec form");
    assert_eq!(cmd[0], "hark");
    assert_command_exists(&cmd[1..], "HEALTHCHECK");
    // Run outside a container, it says which role to name instead of passing.
    let output = Command::new(hark_binary())
        .args(&cmd[1..])
        .env_remove("HARK_CONFIG")
        .output()
        .expect("hark runs");
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("hark health worker"), "{said}");
}

#[test]
fn every_compose_command_and_environment_key_exists_in_hark() {
    let docs = load("docker-compose.yml");
    let compose = &docs[0];
    let vars = env_example();
    let mut used = BTreeSet::new();
    let services = compose["services"].as_hash().expect("services");
    let mut hark_services = 0;
    for (name, service) in services {
        let name = name.as_str().expect("service name");
        let service = merged(service);
        if service["image"].as_str() != Some(HARK_IMAGE) {
            continue;
        }
        hark_services += 1;
        assert!(
            !service["build"].is_badvalue(),
            "{name}: hark services build from the Dockerfile"
        );
        let command = strings(&service["command"]);
        assert!(!command.is_empty(), "{name} has no command");
        assert_command_exists(&command, name);
        let health = strings(&service["healthcheck"]["test"]);
        if health.get(1).map(String::as_str) == Some("hark") {
            assert_command_exists(&health[2..], &format!("{name} healthcheck"));
        }
        let env: BTreeMap<String, String> = service["environment"]
            .as_hash()
            .expect("environment")
            .iter()
            .map(|(k, v)| {
                let value = v.as_str().map(str::to_owned).unwrap_or_default();
                (
                    k.as_str().expect("key").to_owned(),
                    substitute(&value, &vars, &mut used),
                )
            })
            .collect();
        assert_config_keys(&env, name);
        // What listens beyond loopback has its token.
        let config_env: BTreeMap<String, String> = env
            .iter()
            .filter(|(k, _)| k.starts_with("HARK_") && !NON_CONFIG.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let config = Config::from_parts(None, name, &config_env).expect("loads");
        config
            .check_gateway_exposure()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        config
            .check_control_exposure()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        config
            .metrics_listen()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert_eq!(hark_services, 4, "gateway, control and two workers");
    for required in ["nats", "postgres"] {
        assert!(
            services.contains_key(&Yaml::String(required.into())),
            "compose lacks {required}"
        );
    }
    let postgres_env = services[&Yaml::String("postgres".into())]["environment"]
        .as_hash()
        .expect("postgres environment")
        .values()
        .filter_map(Yaml::as_str)
        .map(str::to_owned)
        .collect::<Vec<_>>();
    for value in postgres_env {
        substitute(&value, &vars, &mut used);
    }
    for name in vars.keys() {
        assert!(
            used.contains(name),
            ".env.example sets {name}, which docker-compose.yml never uses"
        );
    }
}

#[test]
fn the_deps_profile_runs_only_the_servers_on_loopback_and_the_example_env_runs_the_demo_model() {
    let compose = &load("docker-compose.yml")[0];
    let services = compose["services"].as_hash().expect("services");
    let mut deps = Vec::new();
    for (name, service) in services {
        let service = merged(service);
        let profiles = strings(&service["profiles"]);
        let name = name.as_str().expect("service name").to_owned();
        assert!(
            !profiles.is_empty(),
            "{name} has no profile, so `--profile deps` would start it too"
        );
        if profiles.iter().any(|p| p == "deps") {
            for port in strings(&service["ports"]) {
                assert!(port.starts_with("127.0.0.1:"), "{name} publishes {port}");
            }
            deps.push((name, strings(&service["ports"])));
        }
    }
    let defaults = Config::default();
    let port_of = |url: &str| {
        url.rsplit(':')
            .next()
            .unwrap_or_default()
            .split('/')
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    let want = [
        format!("127.0.0.1:{0}:{0}", port_of(defaults.nats.url.expose())),
        format!("127.0.0.1:{0}:{0}", port_of(defaults.database.url.expose())),
    ];
    let published: Vec<String> = deps.iter().flat_map(|(_, p)| p.clone()).collect();
    assert_eq!(deps.len(), 2, "{deps:?}");
    for port in want {
        assert!(published.contains(&port), "{port} in {published:?}");
    }
    let vars = env_example();
    assert_eq!(
        vars.get("LLM_BASE_URL").map(String::as_str),
        Some(""),
        "the demo model"
    );
    for token in ["ONEBOT_ACCESS_TOKEN", "HARK_API_TOKEN", "METRICS_TOKEN"] {
        assert!(
            vars.get(token).is_some_and(|v| !v.is_empty()),
            "{token} is set"
        );
    }
}

#[test]
fn the_example_config_file_loads() {
    let text = std::fs::read_to_string(root().join("deploy/hark.example.toml")).expect("example");
    let config = Config::from_parts(Some(&text), "deploy/hark.example.toml", &BTreeMap::new())
        .expect("it loads");
    assert_eq!(config, Config::default(), "the example shows the defaults");
}

#[test]
fn prometheus_under_compose_scrapes_every_hark_service_where_it_serves_metrics() {
    let compose = &load("docker-compose.yml")[0];
    let services = compose["services"].as_hash().expect("services");
    // Where each hark service serves /metrics, as its environment says.
    let mut expected = BTreeSet::new();
    for (name, service) in services {
        let name = name.as_str().expect("service name");
        let service = merged(service);
        if service["image"].as_str() != Some(HARK_IMAGE) {
            continue;
        }
        let env = &service["environment"];
        let port_of = |key: &str| {
            env[key]
                .as_str()
                .and_then(|v| v.rsplit(':').next())
                .map(str::to_owned)
                .unwrap_or_else(|| panic!("{name} sets {key}"))
        };
        let command = strings(&service["command"]);
        let port = match command[0].as_str() {
            "gateway" => port_of("HARK_GATEWAY__LISTEN"),
            _ => port_of("HARK_METRICS__LISTEN"),
        };
        expected.insert(format!("{name}:{port}"));
    }
    let prometheus = &services[&Yaml::String("prometheus".into())];
    assert_eq!(strings(&prometheus["profiles"]), ["observability"]);
    let mounted = strings(&prometheus["volumes"]);
    assert!(
        mounted
            .iter()
            .any(|v| v.starts_with("./deploy/prometheus/prometheus.yml:")),
        "{mounted:?}"
    );
    let config = &load("deploy/prometheus/prometheus.yml")[0];
    let mut scraped = BTreeSet::new();
    for job in config["scrape_configs"].as_vec().expect("scrape configs") {
        let name = job["job_name"].as_str().expect("job name");
        assert_eq!(
            job["authorization"]["credentials_file"].as_str(),
            Some("/etc/prometheus/metrics-token"),
            "{name} sends metrics.token"
        );
        for target in job["static_configs"]
            .as_vec()
            .expect("static configs")
            .iter()
            .flat_map(|c| strings(&c["targets"]))
        {
            scraped.insert(target);
        }
    }
    assert_eq!(scraped, expected, "every hark service, at its metrics port");
    let entry = strings(&prometheus["entrypoint"]).join(" ");
    assert!(
        entry.contains("/etc/prometheus/metrics-token") && entry.contains("METRICS_TOKEN"),
        "{entry}"
    );
}

#[test]
fn the_grafana_dashboard_is_provisioned_and_each_panel_queries_something() {
    let text = std::fs::read_to_string(root().join("deploy/grafana/dashboards/hark.json"))
        .expect("dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "{} panels", panels.len());
    for panel in panels {
        let exprs: Vec<&str> = panel["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .filter_map(|t| t["expr"].as_str())
            .collect();
        assert!(!exprs.is_empty(), "{} queries nothing", panel["title"]);
    }
    let provider = &load("deploy/grafana/provisioning/dashboards/hark.yml")[0];
    let path = provider["providers"][0]["options"]["path"]
        .as_str()
        .expect("a path");
    let compose = &load("docker-compose.yml")[0];
    let grafana = &compose["services"]["grafana"];
    assert!(
        strings(&grafana["volumes"])
            .iter()
            .any(|v| v == &format!("./deploy/grafana/dashboards:{path}:ro")),
        "the dashboards directory is mounted where the provider reads"
    );
}

/// What is wrong with `value` against an OpenAPI v3 schema of a CRD: wrong types, missing
/// required fields, and fields the schema does not have.
fn schema_errors(value: &Yaml, schema: &Yaml, path: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if schema["x-kubernetes-int-or-string"].as_bool() == Some(true) {
        if value.as_i64().is_none() && value.as_str().is_none() {
            errors.push(format!("{path}: not an integer or a string"));
        }
        return errors;
    }
    match schema["type"].as_str() {
        Some("object") => {
            let Some(hash) = value.as_hash() else {
                return vec![format!("{path}: not an object")];
            };
            let properties = schema["properties"].as_hash();
            for required in strings(&schema["required"]) {
                if !hash.contains_key(&Yaml::String(required.clone())) {
                    errors.push(format!("{path}: `{required}` is required"));
                }
            }
            let open = schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
                || !schema["additionalProperties"].is_badvalue();
            for (key, field) in hash {
                let key = key.as_str().unwrap_or_default();
                match properties.and_then(|p| p.get(&Yaml::String(key.to_owned()))) {
                    Some(field_schema) => {
                        errors.extend(schema_errors(field, field_schema, &format!("{path}.{key}")))
                    }
                    None if open => {}
                    None => errors.push(format!("{path}: `{key}` is not a field of it")),
                }
            }
        }
        Some("array") => match value.as_vec() {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    errors.extend(schema_errors(
                        item,
                        &schema["items"],
                        &format!("{path}[{i}]"),
                    ));
                }
            }
            None => errors.push(format!("{path}: not an array")),
        },
        Some("string") if value.as_str().is_none() => errors.push(format!("{path}: not a string")),
        Some("integer") if value.as_i64().is_none() => {
            errors.push(format!("{path}: not an integer"))
        }
        Some("boolean") if value.as_bool().is_none() => {
            errors.push(format!("{path}: not a boolean"))
        }
        _ => {}
    }
    errors
}

/// The schema of `kind` at `apiVersion` from a CRD of `tests/crds/`.
fn crd_schema(file: &str, api_version: &str) -> Yaml {
    let crd = &load(&format!("tests/crds/{file}"))[0];
    let version = api_version.rsplit('/').next().expect("a version");
    crd["spec"]["versions"]
        .as_vec()
        .expect("versions")
        .iter()
        .find(|v| v["name"].as_str() == Some(version))
        .map(|v| v["schema"]["openAPIV3Schema"].clone())
        .unwrap_or_else(|| panic!("{file} has no version {version}"))
}

/// Where the Kubernetes tools are: `$variable`, else `name` on the PATH, else the venv `.ci/run`
/// installs them into.
fn tool(variable: &str, name: &str) -> String {
    if let Ok(path) = std::env::var(variable) {
        return path;
    }
    let on_path = Command::new(name).arg("--help").output().is_ok();
    if on_path {
        return name.to_owned();
    }
    let installed = format!("/opt/hark-ci/k8s-tools/bin/{name}");
    assert!(
        Path::new(&installed).exists(),
        "{name} is not installed: run .ci/run once (it installs the pinned one into \
         /opt/hark-ci/k8s-tools), or set {variable}"
    );
    installed
}

/// `kubectl kustomize` of an overlay, checked by `kubernetes-validate --strict` (which knows the
/// core kinds; the custom resources are checked against their CRDs below).
fn rendered(overlay: &str) -> Vec<Yaml> {
    let kubectl = tool("HARK_TEST_KUBECTL", "kubectl");
    let dir = root().join("deploy/kubernetes/overlays").join(overlay);
    let output = Command::new(&kubectl)
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("{kubectl} kustomize: {e}"));
    assert!(
        output.status.success(),
        "kubectl kustomize {overlay}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let file = std::env::temp_dir().join(format!(
        "hark-k8s-{overlay}-{}.yaml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&file, &text).expect("rendered manifests");
    let validate = tool("HARK_TEST_KUBERNETES_VALIDATE", "kubernetes-validate");
    let checked = Command::new(&validate)
        .args(["--strict", "--quiet"])
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("{validate}: {e}"));
    let _ = std::fs::remove_file(&file);
    assert!(
        checked.status.success(),
        "kubernetes-validate --strict refuses the {overlay} overlay: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{overlay} renders invalid YAML: {e}"))
}

fn of_kind<'a>(docs: &'a [Yaml], kind: &str) -> Vec<&'a Yaml> {
    docs.iter()
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect()
}

fn name(doc: &Yaml) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

/// The hark config a container runs with: the ConfigMap's hark.toml, then its `HARK_…`
/// variables (values of secrets stand in as placeholders).
fn container_config(docs: &[Yaml], container: &Yaml, context: &str) -> Config {
    let toml = of_kind(docs, "ConfigMap")
        .into_iter()
        .find_map(|c| c["data"]["hark.toml"].as_str())
        .expect("a ConfigMap with hark.toml");
    let mut env = BTreeMap::new();
    let keys = Config::env_keys();
    for e in container["env"].as_vec().into_iter().flatten() {
        let key = e["name"].as_str().expect("env name").to_owned();
        if key == "HARK_CONFIG" {
            assert_eq!(
                e["value"].as_str(),
                Some("/etc/hark/hark.toml"),
                "{context}"
            );
            continue;
        }
        if NON_CONFIG.contains(&key.as_str()) {
            continue;
        }
        assert!(
            keys.contains(&key),
            "{context}: {key} is not a hark config key"
        );
        let placeholder = if key == "HARK_DATABASE__URL" {
            "postgres://x@y/z"
        } else {
            "placeholder-of-a-secret-value-32"
        };
        let value = e["value"].as_str().unwrap_or(placeholder).to_owned();
        env.insert(key, value);
    }
    Config::from_parts(Some(toml), context, &env).unwrap_or_else(|e| panic!("{context}: {e}"))
}

#[test]
fn every_overlay_renders_and_runs_hark_commands_probes_and_ports_the_binary_has() {
    for overlay in ["dev", "production", "production-without-operators"] {
        let docs = rendered(overlay);
        let workloads: Vec<&Yaml> = of_kind(&docs, "Deployment")
            .into_iter()
            .chain(of_kind(&docs, "StatefulSet"))
            .filter(|d| name(d).starts_with("hark-"))
            .collect();
        assert_eq!(workloads.len(), 3, "{overlay}: control, gateway and worker");
        for workload in workloads {
            let pod = &workload["spec"]["template"]["spec"];
            let context = format!("{overlay}/{}", name(workload));
            assert_eq!(
                pod["automountServiceAccountToken"].as_bool(),
                Some(false),
                "{context}"
            );
            assert_eq!(
                pod["securityContext"]["runAsNonRoot"].as_bool(),
                Some(true),
                "{context}"
            );
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"].as_str(),
                Some("RuntimeDefault"),
                "{context}"
            );
            let containers: Vec<&Yaml> = pod["containers"]
                .as_vec()
                .into_iter()
                .flatten()
                .chain(pod["initContainers"].as_vec().into_iter().flatten())
                .collect();
            for c in containers {
                let context = format!("{context}/{}", c["name"].as_str().unwrap_or_default());
                let security = &c["securityContext"];
                assert_eq!(
                    security["readOnlyRootFilesystem"].as_bool(),
                    Some(true),
                    "{context}"
                );
                assert_eq!(
                    security["allowPrivilegeEscalation"].as_bool(),
                    Some(false),
                    "{context}"
                );
                assert_eq!(
                    strings(&security["capabilities"]["drop"]),
                    ["ALL"],
                    "{context}"
                );
                assert!(
                    !c["resources"]["requests"]["memory"].is_badvalue()
                        && !c["resources"]["limits"]["memory"].is_badvalue(),
                    "{context}: memory requests and limits"
                );
                // One image, tagged with hark's version: the one compose builds, or the
                // operator's registry's copy of it.
                let image = c["image"].as_str().unwrap_or_default();
                let expected = match overlay {
                    "dev" => HARK_IMAGE.to_owned(),
                    _ => format!("registry.example.com/{HARK_IMAGE}"),
                };
                assert_eq!(image, expected, "{context}");
                let args = strings(&c["args"]);
                assert_command_exists(&args, &context);
                let config = container_config(&docs, c, &context);
                let ports: BTreeMap<String, i64> = c["ports"]
                    .as_vec()
                    .into_iter()
                    .flatten()
                    .map(|p| {
                        (
                            p["name"].as_str().unwrap_or_default().to_owned(),
                            p["containerPort"].as_i64().expect("a port"),
                        )
                    })
                    .collect();
                // Where the role serves metrics (beyond loopback only with its token).
                let metrics_port = || {
                    config
                        .metrics_listen()
                        .unwrap_or_else(|e| panic!("{context}: {e}"))
                        .map(|a| i64::from(a.port()))
                };
                match args[0].as_str() {
                    "control" => {
                        config
                            .check_control_exposure()
                            .unwrap_or_else(|e| panic!("{context}: {e}"));
                        let grpc = i64::from(config.control.grpc_listen.port());
                        assert_eq!(ports.get("grpc"), Some(&grpc), "{context}");
                        assert_eq!(ports.get("metrics").copied(), metrics_port(), "{context}");
                        for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                            assert_eq!(
                                c[probe]["grpc"]["port"].as_i64(),
                                Some(grpc),
                                "{context} {probe}"
                            );
                        }
                    }
                    "gateway" => {
                        config
                            .check_gateway_exposure()
                            .unwrap_or_else(|e| panic!("{context}: {e}"));
                        let http = i64::from(config.gateway.listen.port());
                        assert_eq!(ports.get("http"), Some(&http), "{context}");
                        assert_eq!(
                            c["readinessProbe"]["httpGet"]["path"].as_str(),
                            Some("/readyz")
                        );
                        for probe in ["startupProbe", "livenessProbe"] {
                            assert_eq!(
                                c[probe]["httpGet"]["path"].as_str(),
                                Some("/healthz"),
                                "{context}"
                            );
                        }
                        let spool = config.gateway.spool_dir.clone();
                        assert!(
                            c["volumeMounts"]
                                .as_vec()
                                .into_iter()
                                .flatten()
                                .any(|m| m["mountPath"].as_str() == Some(spool.as_str())),
                            "{context}: the spool {spool} is a volume"
                        );
                    }
                    "worker" => {
                        assert_eq!(ports.get("metrics").copied(), metrics_port(), "{context}");
                        for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                            assert_eq!(
                                c[probe]["httpGet"]["path"].as_str(),
                                Some("/healthz"),
                                "{context}"
                            );
                            assert_eq!(
                                c[probe]["httpGet"]["port"].as_str(),
                                Some("metrics"),
                                "{context}"
                            );
                        }
                        // Longer than a worker's drain (one lease).
                        let grace = pod["terminationGracePeriodSeconds"]
                            .as_i64()
                            .expect("grace");
                        assert!(grace as u64 > config.task.lease.0.as_secs(), "{context}");
                    }
                    "migrate" => {}
                    other => panic!("{context}: unexpected role {other}"),
                }
            }
        }
    }
}

#[test]
fn the_overlay_without_operators_has_none_of_their_kinds_and_all_of_production_else() {
    let with = rendered("production");
    let without = rendered("production-without-operators");
    let kinds = |docs: &[Yaml]| -> BTreeSet<String> {
        docs.iter()
            .map(|d| format!("{}/{}", d["kind"].as_str().unwrap_or_default(), name(d)))
            .collect()
    };
    let operators = ["ScaledObject", "TriggerAuthentication", "ServiceMonitor"];
    assert!(
        kinds(&with)
            .iter()
            .any(|k| operators.iter().any(|o| k.starts_with(o))),
        "production has the operators' resources"
    );
    let expected: BTreeSet<String> = kinds(&with)
        .into_iter()
        .filter(|k| !operators.iter().any(|o| k.starts_with(&format!("{o}/"))))
        .collect();
    assert_eq!(kinds(&without), expected);
}

/// The `kubectl create secret generic hark-secrets …` command the README gives, its keys.
fn readme_secret_keys() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let start = readme
        .find("kubectl create secret generic hark-secrets")
        .expect("the README gives the kubectl create secret line");
    let command: String = readme[start..]
        .lines()
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("```"))
        .collect::<Vec<_>>()
        .join(" ");
    command
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("--from-literal="))
        .filter_map(|w| w.split_once('=').map(|(k, _)| k.to_owned()))
        .collect()
}

#[test]
fn the_readmes_secret_line_has_every_key_the_production_manifests_read() {
    let docs = rendered("production");
    let mut read = BTreeSet::new();
    fn walk(yaml: &Yaml, out: &mut BTreeSet<String>) {
        match yaml {
            Yaml::Hash(map) => {
                // A secretKeyRef, a ServiceMonitor's bearerTokenSecret, KEDA's secretTargetRef.
                let field = |f: &str| map.get(&Yaml::String(f.into())).and_then(Yaml::as_str);
                if field("name") == Some("hark-secrets")
                    && let Some(key) = field("key")
                {
                    out.insert(key.to_owned());
                }
                for value in map.values() {
                    walk(value, out);
                }
            }
            Yaml::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    for doc in &docs {
        walk(doc, &mut read);
    }
    assert!(read.contains("database-url"), "{read:?}");
    let given = readme_secret_keys();
    let missing: Vec<&String> = read.difference(&given).collect();
    assert!(
        missing.is_empty(),
        "the README's kubectl create secret line lacks {missing:?} (it has {given:?})"
    );
    let unknown: Vec<&String> = given.difference(&read).collect();
    assert!(
        unknown.is_empty(),
        "the README's line gives keys nothing reads: {unknown:?}"
    );
}

#[test]
fn the_custom_resources_are_valid_against_their_crds() {
    let docs = rendered("production");
    let check = |kind: &str, crd: &str| {
        let found = of_kind(&docs, kind);
        assert!(!found.is_empty(), "production has a {kind}");
        for doc in found {
            let schema = crd_schema(crd, doc["apiVersion"].as_str().expect("apiVersion"));
            let errors = schema_errors(&doc["spec"], &schema["properties"]["spec"], "spec");
            assert!(errors.is_empty(), "{kind} {}: {errors:#?}", name(doc));
            // The validator sees what is wrong with a wrong one.
            let mut broken = doc["spec"].clone();
            if let Yaml::Hash(h) = &mut broken {
                h.insert(Yaml::String("nonsense".into()), Yaml::Boolean(true));
            }
            assert!(!schema_errors(&broken, &schema["properties"]["spec"], "spec").is_empty());
        }
    };
    check(
        "ServiceMonitor",
        "monitoring.coreos.com_servicemonitors.yaml",
    );
    check("ScaledObject", "keda.sh_scaledobjects.yaml");
    check(
        "TriggerAuthentication",
        "keda.sh_triggerauthentications.yaml",
    );

    // KEDA scales the workers on the run queue's lag: their consumer of the run job stream.
    let scaled = of_kind(&docs, "ScaledObject")[0];
    assert_eq!(
        scaled["spec"]["scaleTargetRef"]["name"].as_str(),
        Some("hark-worker")
    );
    let trigger = &scaled["spec"]["triggers"][0];
    assert_eq!(trigger["type"].as_str(), Some("nats-jetstream"));
    let names = hark_core::bus::Names::new("hark".parse().expect("namespace"));
    assert_eq!(
        trigger["metadata"]["stream"].as_str(),
        Some(names.task_run_stream().as_str())
    );
    assert_eq!(
        trigger["metadata"]["consumer"].as_str(),
        Some(hark_core::bus::Names::WORKER_CONSUMER)
    );
    for key in ["account", "lagThreshold"] {
        assert!(trigger["metadata"][key].as_str().is_some(), "{key}");
    }
    // The monitoring endpoint comes from a key of hark-secrets, through the TriggerAuthentication
    // the trigger names.
    let auth = trigger["authenticationRef"]["name"]
        .as_str()
        .expect("the trigger names its TriggerAuthentication");
    let auth = of_kind(&docs, "TriggerAuthentication")
        .into_iter()
        .find(|a| name(a) == auth)
        .unwrap_or_else(|| panic!("no TriggerAuthentication {auth}"));
    let endpoint = auth["spec"]["secretTargetRef"]
        .as_vec()
        .expect("secretTargetRef")
        .iter()
        .find(|r| r["parameter"].as_str() == Some("natsServerMonitoringEndpoint"))
        .expect("the monitoring endpoint from a secret");
    assert_eq!(endpoint["name"].as_str(), Some("hark-secrets"));
    assert_eq!(endpoint["key"].as_str(), Some("nats-monitoring-endpoint"));

    // The ServiceMonitor scrapes a metrics port of every role's Service, with the token.
    let monitor = of_kind(&docs, "ServiceMonitor")[0];
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_hash()
        .expect("labels");
    let endpoints: Vec<&Yaml> = monitor["spec"]["endpoints"]
        .as_vec()
        .expect("endpoints")
        .iter()
        .collect();
    for endpoint in &endpoints {
        assert_eq!(
            endpoint["bearerTokenSecret"]["key"].as_str(),
            Some("metrics-token")
        );
    }
    let ports: Vec<&str> = endpoints
        .iter()
        .filter_map(|e| e["port"].as_str())
        .collect();
    let mut scraped = BTreeSet::new();
    for service in of_kind(&docs, "Service") {
        let labels = service["metadata"]["labels"].as_hash();
        if !selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        {
            continue;
        }
        let named: Vec<&str> = service["spec"]["ports"]
            .as_vec()
            .expect("ports")
            .iter()
            .filter_map(|p| p["name"].as_str())
            .collect();
        if ports.iter().any(|p| named.contains(p)) {
            scraped.insert(name(service).to_owned());
        }
    }
    assert_eq!(
        scraped,
        BTreeSet::from(["hark-control", "hark-gateway", "hark-worker"].map(str::to_owned)),
        "each role is scraped once"
    );
    // Each role has a disruption budget.
    let budgets: BTreeSet<String> = of_kind(&docs, "PodDisruptionBudget")
        .iter()
        .map(|b| name(b).to_owned())
        .collect();
    assert_eq!(budgets.len(), 3, "{budgets:?}");
}
