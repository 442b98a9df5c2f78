//! What every hark test suite shares.
//!
//! - [`postgres_url`] and [`nats_url`]: the real servers the tests use (`HARK_TEST_DATABASE_URL`,
//!   `HARK_TEST_NATS_URL`, by default the machine's on their usual ports). Where nothing on this
//!   host serves there, the test processes share a private Postgres and nats-server started from
//!   the installed programs, as `hark dev` does ([`private`]), stopped after the run.
//! - [`Database`] and [`Namespace`]: a Postgres database and a NATS namespace of one test's own.
//!   Each is removed when it is dropped, also when the test panics; and the first one a test
//!   process makes removes what earlier test processes left behind when they were killed (their
//!   names carry the process id that made them, so only a dead process's are touched).
//! - [`eventually`]: the one way a test waits for a condition, polling, with a bound.
//! - [`node`]: the Node.js the test peers run on (20 or newer).
//! - [`import_cycles`]: the circles in a crate's module graph, which its tests keep empty.

use std::{
    future::Future,
    process::Stdio,
    sync::{Once, OnceLock},
    time::Duration,
};

use futures_util::StreamExt as _;

pub mod private;

/// A small seeded random number generator (xorshift64*), so that a run can be repeated.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The Postgres server the tests use, as a URL without a database: `HARK_TEST_DATABASE_URL`, by
/// default the machine's on 5432. When nothing on this host serves there, a private one the test
/// processes share ([`private`]).
pub fn postgres_url() -> String {
    servers().postgres.clone()
}

/// The nats-server (with JetStream) the tests use: `HARK_TEST_NATS_URL`, by default the
/// machine's on 4222. When nothing on this host serves there, a private one the test processes
/// share ([`private`]).
pub fn nats_url() -> String {
    servers().nats.clone()
}

/// The configured servers, or private ones for those that cannot serve.
fn servers() -> &'static private::Servers {
    static SERVERS: OnceLock<private::Servers> = OnceLock::new();
    SERVERS.get_or_init(|| {
        let configured = private::Servers {
            postgres: std::env::var("HARK_TEST_DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into()),
            nats: std::env::var("HARK_TEST_NATS_URL")
                .unwrap_or_else(|_| "nats://127.0.0.1:4222".into()),
        };
        private::serving(&configured, &private::shared_dir(), private::IDLE).unwrap_or_else(|e| {
            panic!(
                "{e}. Set HARK_TEST_DATABASE_URL and HARK_TEST_NATS_URL to servers that answer, \
                 install postgresql and nats-server, or run `sudo .ci/run` once"
            )
        })
    })
}

/// The Node.js program the test peers (the MCP servers, playwright-core) run on: `HARK_TEST_NODE`
/// when set, else the one `.ci/run` installs from npm where the distribution's is older than 20
/// (`/opt/hark-ci/node`), else `node` on the `PATH`.
pub fn node() -> std::path::PathBuf {
    if let Some(set) = std::env::var_os("HARK_TEST_NODE") {
        return set.into();
    }
    let installed = std::path::Path::new("/opt/hark-ci/node/node_modules/.bin/node");
    if installed.is_file() {
        return installed.into();
    }
    "node".into()
}

/// The circles among the top-level modules of the crate whose sources are in `src`: each is
/// the modules that reach one another through `crate::` paths, sorted. A module is a file or a
/// directory right under `src`; what follows its `#[cfg(test)]` and what is in comments is not
/// counted.
pub fn import_cycles(src: &std::path::Path) -> Vec<Vec<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    fn sources(path: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        if path.is_dir() {
            for entry in std::fs::read_dir(path)
                .expect("a source directory")
                .flatten()
            {
                sources(&entry.path(), out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_owned());
        }
    }
    fn code(text: &str) -> String {
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        text.lines()
            .map(|line| line.split("//").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
    /// The names `crate::` paths in `code` start with, `crate::{a, b::c}` giving `a` and `b`.
    fn named(code: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let rest = rest.trim_start();
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 0;
                let mut start = true;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => start = true,
                        c if start && (c.is_alphanumeric() || c == '_') => {
                            let word: String = group[i..]
                                .chars()
                                .take_while(|c| c.is_alphanumeric() || *c == '_')
                                .collect();
                            out.insert(word);
                            start = false;
                        }
                        c if c.is_whitespace() => {}
                        _ => start = false,
                    }
                }
            } else {
                out.insert(
                    rest.chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect(),
                );
            }
        }
        out
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("the crate's src").flatten() {
        let path = entry.path();
        let name = path
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if matches!(name.as_str(), "lib" | "main") {
            continue;
        }
        let mut files = Vec::new();
        sources(&path, &mut files);
        let used = edges.entry(name.clone()).or_default();
        for file in files {
            let text = std::fs::read_to_string(&file).expect("a source file");
            used.extend(named(&code(&text)).into_iter().filter(|n| *n != name));
        }
    }
    let modules: BTreeSet<String> = edges.keys().cloned().collect();
    for used in edges.values_mut() {
        used.retain(|n| modules.contains(n));
    }
    // Two modules are in one circle when each reaches the other.
    let reaches = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut next = vec![from.clone()];
        while let Some(m) = next.pop() {
            for n in &edges[&m] {
                if seen.insert(n.clone()) {
                    next.push(n.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> =
        modules.iter().map(|m| (m, reaches(m))).collect();
    let mut cycles: Vec<Vec<String>> = Vec::new();
    for m in &modules {
        if !reach[m].contains(m) || cycles.iter().any(|c| c.contains(m)) {
            continue;
        }
        cycles.push(
            modules
                .iter()
                .filter(|n| reach[m].contains(*n) && reach[*n].contains(m))
                .cloned()
                .collect(),
        );
    }
    cycles
}

/// Polls `check` until it gives a value, and returns it; panics naming `what` once `wait` has
/// passed without one. The pause between polls grows from 10 ms to 200 ms, so a quick condition
/// is seen at once and a slow one costs little.
pub async fn eventually<T, F, Fut>(what: &str, wait: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(10);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {wait:?} waiting until {what}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// A tag no other test shares: this process's id, then random hex (`4242x1a2b3c4d`).
fn tag() -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{}x{}", std::process::id(), &random[..8])
}

/// The process id a [`tag`] at the start of `name` (after `prefix`) carries.
fn maker_of(name: &str, prefix: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?;
    let (pid, random) = rest.split_once(['x', 'X'])?;
    (random.len() >= 8).then_some(())?;
    pid.parse().ok()
}

/// Whether the process that made a name has exited.
fn gone(pid: u32) -> bool {
    !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Runs `work` to its end on a runtime of its own, on a thread of its own: for cleaning from
/// `Drop`, which may run inside a test's runtime (where it must not block on that runtime).
/// What it gives, or `None` when no runtime could be made.
pub(crate) fn on_the_side<F, T>(work: F) -> Option<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        Some(runtime.block_on(work))
    });
    thread.join().ok().flatten()
}

/// `psql` against the maintenance database of `server`.
async fn psql(server: &str, sql: &str) -> Option<String> {
    let output = tokio::process::Command::new("psql")
        .args([&format!("{server}/postgres"), "-qAtc", sql])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .await
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

const DATABASE_PREFIX: &str = "hark_t";

/// A database of one test's own on a Postgres server; the test (or the code it runs) creates
/// it. Dropped with `DROP DATABASE … WITH (FORCE)` when this is dropped.
#[derive(Debug)]
pub struct Database {
    pub name: String,
    /// The server, as a URL without a database.
    server: String,
    dropped: bool,
}

impl Database {
    /// A name of its own on the tests' Postgres.
    pub fn new() -> Self {
        Self::on(postgres_url())
    }

    /// A name of its own on `server` (a URL without a database).
    pub fn on(server: String) -> Self {
        static SWEPT: Once = Once::new();
        let swept = server.clone();
        SWEPT.call_once(|| {
            on_the_side(sweep_databases(swept));
        });
        Self {
            name: format!("{DATABASE_PREFIX}{}", tag()),
            server,
            dropped: false,
        }
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("{}/{}", self.server, self.name)
    }

    /// Drops it now (and not again when this is dropped).
    pub async fn remove(mut self) {
        self.dropped = true;
        drop_database(&self.server, &self.name).await;
    }
}

impl Default for Database {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if !self.dropped {
            let (server, name) = (self.server.clone(), self.name.clone());
            on_the_side(async move { drop_database(&server, &name).await });
        }
    }
}

async fn drop_database(server: &str, name: &str) {
    psql(
        server,
        &format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
    )
    .await;
}

/// Drops the test databases whose process has exited.
async fn sweep_databases(server: String) {
    let Some(names) = psql(
        &server,
        &format!("SELECT datname FROM pg_database WHERE datname LIKE '{DATABASE_PREFIX}%'"),
    )
    .await
    else {
        return;
    };
    for name in names.lines() {
        if maker_of(name, DATABASE_PREFIX).is_some_and(gone) {
            drop_database(&server, name).await;
        }
    }
}

const NAMESPACE_PREFIX: &str = "k";

/// A namespace name no other test shares, that a later sweep knows for a test's.
pub fn unique_namespace() -> String {
    format!("{NAMESPACE_PREFIX}{}", tag())
}

/// A NATS namespace of one test's own: every stream named with its prefix is deleted when this
/// is dropped.
#[derive(Debug)]
pub struct Namespace {
    /// The namespace, as `nats.namespace` takes it.
    pub name: String,
    server: String,
    deleted: bool,
}

impl Namespace {
    /// A namespace of its own on the tests' nats-server.
    pub fn new() -> Self {
        Self::on(nats_url())
    }

    /// A namespace of its own on the nats-server at `server`.
    pub fn on(server: String) -> Self {
        Self::adopt(server, unique_namespace())
    }

    /// `name`, on the nats-server at `server`, cleaned as one of the kit's own.
    pub fn adopt(server: String, name: String) -> Self {
        static SWEPT: Once = Once::new();
        let swept = server.clone();
        SWEPT.call_once(|| {
            on_the_side(sweep_namespaces(swept));
        });
        Self {
            name,
            server,
            deleted: false,
        }
    }

    /// Deletes its streams now (and not again when this is dropped).
    pub async fn remove(mut self) {
        self.deleted = true;
        delete_streams(&self.server, |stream| {
            stream_namespace(stream).is_some_and(|ns| ns == self.name)
        })
        .await;
    }
}

impl Default for Namespace {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        if !self.deleted {
            let (server, name) = (self.server.clone(), self.name.clone());
            on_the_side(async move {
                delete_streams(&server, |stream| {
                    stream_namespace(stream).is_some_and(|ns| ns == name)
                })
                .await;
            });
        }
    }
}

/// The namespace a stream belongs to, lower-cased: streams are named `<NAMESPACE>_<NAME>`.
fn stream_namespace(stream: &str) -> Option<String> {
    let (prefix, _) = stream.split_once('_')?;
    Some(prefix.to_ascii_lowercase())
}

/// Deletes the streams on `server` whose name `doomed` picks.
async fn delete_streams(server: &str, doomed: impl Fn(&str) -> bool) {
    let connected = tokio::time::timeout(
        Duration::from_secs(5),
        async_nats::ConnectOptions::new().connect(server),
    )
    .await;
    let Ok(Ok(client)) = connected else { return };
    let js = async_nats::jetstream::new(client.clone());
    let names: Vec<String> = js
        .stream_names()
        .filter_map(|name| async move { name.ok() })
        .collect()
        .await;
    for name in names.iter().filter(|n| doomed(n)) {
        let _ = js.delete_stream(name).await;
    }
    let _ = client.drain().await;
}

/// Deletes the streams of test namespaces whose process has exited.
async fn sweep_namespaces(server: String) {
    delete_streams(&server, |stream| {
        stream_namespace(stream)
            .and_then(|ns| maker_of(&ns, NAMESPACE_PREFIX))
            .is_some_and(gone)
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_circle_of_modules_is_found_and_a_tree_is_not() {
        let dir = std::env::temp_dir().join(format!("hark-imports-{}", tag()));
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
            std::fs::write(path, text).expect("written");
        };
        write("lib.rs", "pub mod a; pub mod b; pub mod c; pub mod d;");
        write("a.rs", "use crate::{b::X, d};");
        write("b/mod.rs", "pub struct X; // crate::c is only named here");
        write(
            "c.rs",
            "use crate::d;\n#[cfg(test)]\nmod tests { use crate::a; }",
        );
        write("d.rs", "");
        assert!(import_cycles(&dir).is_empty());
        write("b/inner.rs", "fn f() { crate::c::g() }");
        write("d.rs", "use crate::{\n    a::Y,\n};");
        // a → b (its inner module) → c → d → a.
        assert_eq!(import_cycles(&dir), vec![vec!["a", "b", "c", "d"]]);
        std::fs::remove_dir_all(&dir).expect("removed");
    }

    #[test]
    fn a_name_says_which_process_made_it() {
        let name = format!("{DATABASE_PREFIX}{}", tag());
        assert_eq!(maker_of(&name, DATABASE_PREFIX), Some(std::process::id()));
        assert!(!gone(std::process::id()));
        let stream = format!(
            "{}_CHAT_IN",
            format!("{NAMESPACE_PREFIX}{}", tag()).to_ascii_uppercase()
        );
        let ns = stream_namespace(&stream).expect("a namespace");
        assert_eq!(maker_of(&ns, NAMESPACE_PREFIX), Some(std::process::id()));
        assert_eq!(maker_of("hark_test_abc", DATABASE_PREFIX), None);
        assert_eq!(maker_of("hark", NAMESPACE_PREFIX), None);
    }

    async fn exists(name: &str) -> bool {
        psql(
            &postgres_url(),
            &format!("SELECT count(*) FROM pg_database WHERE datname = '{name}'"),
        )
        .await
        .expect("Postgres answers on HARK_TEST_DATABASE_URL or 127.0.0.1:5432")
        .trim()
            == "1"
    }

    async fn create(name: &str) {
        psql(&postgres_url(), &format!("CREATE DATABASE \"{name}\""))
            .await
            .expect("database created");
    }

    #[tokio::test]
    async fn a_database_is_dropped_when_its_test_panics() {
        let database = Database::new();
        let name = database.name.clone();
        create(&name).await;
        assert!(exists(&name).await);
        let panicked = std::thread::spawn(move || {
            let _held = database;
            panic!("the test failed");
        })
        .join();
        assert!(panicked.is_err());
        assert!(!exists(&name).await, "{name} is left behind");
    }

    #[tokio::test]
    async fn a_sweep_drops_what_an_exited_process_left_and_nothing_else() {
        // Process ids never go this high on Linux (pid_max is at most 2^22).
        let left = format!("{DATABASE_PREFIX}999999999x{}", &tag()[tag().len() - 8..]);
        let live = Database::new();
        create(&left).await;
        create(&live.name).await;
        sweep_databases(postgres_url()).await;
        assert!(!exists(&left).await, "{left} was not swept");
        assert!(
            exists(&live.name).await,
            "a live process's database was swept"
        );
        live.remove().await;
    }

    #[tokio::test]
    async fn eventually_returns_what_the_check_found() {
        let mut calls = 0;
        let found = eventually("the third call", Duration::from_secs(5), || {
            calls += 1;
            let now = calls;
            async move { (now == 3).then_some(now) }
        })
        .await;
        assert_eq!(found, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "waiting until nothing ever holds")]
    async fn eventually_gives_up_naming_what_it_waited_for() {
        eventually("nothing ever holds", Duration::from_millis(50), || async {
            None::<()>
        })
        .await;
    }
}
