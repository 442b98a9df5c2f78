//! A private Postgres and nats-server the test processes share, for a machine where nothing
//! serves at the configured URLs (or what does cannot: a Postgres that asks for a password, a
//! nats-server without JetStream).
//!
//! They live in one directory per user (`$TMPDIR/hark-test-servers-<uid>`). The first test
//! process that needs them starts them, under a lock, and writes their URLs there; later ones
//! read the URLs. Every process that uses them registers its pid there, and a watcher started
//! with them stops both once no registered process has been alive for [`IDLE`], so a test run
//! leaves nothing running behind it.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

/// How long the servers outlive the last process that used them.
pub const IDLE: Duration = Duration::from_secs(20);

/// Where the servers are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Servers {
    /// The Postgres, as a URL without a database.
    pub postgres: String,
    /// The nats-server.
    pub nats: String,
}

/// The directory this user's test processes share.
pub fn shared_dir() -> PathBuf {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    std::env::temp_dir().join(format!("hark-test-servers-{uid}"))
}

/// `configured`, or for each of them that is on this host and cannot serve the tests (nothing
/// answers, a Postgres that refuses its user, a nats-server without JetStream), the private one in
/// `dir` ([`servers_in`]), saying so once on stderr.
pub fn serving(configured: &Servers, dir: &Path, idle: Duration) -> Result<Servers, String> {
    let postgres_serves =
        !on_this_host(&configured.postgres) || postgres_serves(&configured.postgres);
    let nats_serves = !on_this_host(&configured.nats) || nats_serves(&configured.nats);
    if postgres_serves && nats_serves {
        return Ok(configured.clone());
    }
    let not_serving: Vec<&str> = [
        (!postgres_serves).then_some(configured.postgres.as_str()),
        (!nats_serves).then_some(configured.nats.as_str()),
    ]
    .into_iter()
    .flatten()
    .collect();
    let own = servers_in(dir, idle).map_err(|e| {
        format!(
            "nothing on this host serves the tests at {}, and private servers could not start: {e}",
            not_serving.join(" and ")
        )
    })?;
    eprintln!(
        "hark-testkit: nothing serves the tests at {}; they use a private {} (in {}, stopped {}s \
         after the last test process)",
        not_serving.join(" and "),
        match (postgres_serves, nats_serves) {
            (false, false) => "Postgres and nats-server",
            (false, true) => "Postgres",
            _ => "nats-server",
        },
        dir.display(),
        idle.as_secs()
    );
    Ok(Servers {
        postgres: if postgres_serves {
            configured.postgres.clone()
        } else {
            own.postgres
        },
        nats: if nats_serves {
            configured.nats.clone()
        } else {
            own.nats
        },
    })
}

/// Whether a server URL names this host (`127.0.0.1`, `::1`, `localhost`).
pub fn on_this_host(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let host = match host_port.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host_port.split(':').next().unwrap_or_default(),
    };
    host == "localhost" || host == "::1" || host.starts_with("127.")
}

/// Whether the Postgres at `server` (a URL without a database) lets the tests in: `psql` runs a
/// query there.
pub fn postgres_serves(server: &str) -> bool {
    Command::new("psql")
        .args([&format!("{server}/postgres"), "-qAtc", "SELECT 1"])
        .env("PGCONNECT_TIMEOUT", "5")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether the nats-server at `server` takes a client and has JetStream.
pub fn nats_serves(server: &str) -> bool {
    let server = server.to_owned();
    crate::on_the_side(async move {
        let check = async {
            let client = async_nats::ConnectOptions::new()
                .connection_timeout(Duration::from_secs(3))
                .connect(&server)
                .await
                .ok()?;
            // The account's JetStream info, read raw: a server without JetStream has no one
            // answering there, or answers with an error.
            let served = client
                .request("$JS.API.INFO", bytes::Bytes::new())
                .await
                .is_ok_and(|reply| !String::from_utf8_lossy(&reply.payload).contains("\"error\""));
            let _ = client.drain().await;
            Some(served)
        };
        tokio::time::timeout(Duration::from_secs(5), check)
            .await
            .ok()
            .flatten()
            .unwrap_or(false)
    })
    .unwrap_or(false)
}

/// The servers in `dir`, started when they are not running, with this process registered as
/// one that uses them; they stop [`IDLE`] after the last registered process is gone.
pub fn servers_in(dir: &Path, idle: Duration) -> Result<Servers, String> {
    let users = dir.join("users");
    std::fs::create_dir_all(&users)
        .map_err(|e| format!("cannot create {}: {e}", users.display()))?;
    let lock = File::options()
        .create(true)
        .append(true)
        .open(dir.join("lock"))
        .map_err(|e| format!("cannot open {}: {e}", dir.join("lock").display()))?;
    lock.lock()
        .map_err(|e| format!("cannot lock {}: {e}", dir.join("lock").display()))?;
    // Registered under the lock: the watcher stops nothing while a registered process lives.
    let me = users.join(std::process::id().to_string());
    std::fs::write(&me, "").map_err(|e| format!("cannot write {}: {e}", me.display()))?;
    if let Some(running) = read(dir) {
        let (pg, nats) = (port_of(&running.postgres), port_of(&running.nats));
        if pg.zip(nats).is_some_and(|(pg, nats)| {
            hark_servers::answers("127.0.0.1", pg) && hark_servers::answers("127.0.0.1", nats)
        }) {
            return Ok(running);
        }
    }
    start(dir, idle)
}

/// Takes this process off the users of the servers in `dir`.
pub fn release(dir: &Path) {
    let _ = std::fs::remove_file(dir.join("users").join(std::process::id().to_string()));
}

fn read(dir: &Path) -> Option<Servers> {
    let text = std::fs::read_to_string(dir.join("urls")).ok()?;
    let mut lines = text.lines();
    Some(Servers {
        postgres: lines.next()?.to_owned(),
        nats: lines.next()?.to_owned(),
    })
}

fn port_of(url: &str) -> Option<u16> {
    url.rsplit(':').next()?.parse().ok()
}

/// A port on 127.0.0.1 nothing listens on, at a random place from `from` up (below the
/// kernel's ephemeral range, where outgoing connections take theirs), so that processes looking
/// at once seldom pick the same one.
fn free_port(from: u16) -> Result<u16, String> {
    let start = uuid::Uuid::new_v4().as_bytes()[0] as u16 * 2;
    (0..512)
        .map(|i| from + (start + i) % 512)
        .find(|port| {
            std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok()
                && !hark_servers::answers("127.0.0.1", *port)
        })
        .ok_or_else(|| format!("no free port on 127.0.0.1 from {from}"))
}

/// Tries `start` on up to three free ports from `from`: another process may take the one picked
/// before the server binds it.
fn on_a_free_port<T>(
    from: u16,
    mut start: impl FnMut(u16) -> Result<T, hark_servers::Error>,
) -> Result<(T, u16), String> {
    let mut last = String::new();
    for _ in 0..3 {
        let port = free_port(from)?;
        match start(port) {
            Ok(started) => return Ok((started, port)),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// Stops the watcher's servers and itself once no process in `users` has lived for `idle`
/// seconds, or once `dir` is gone, holding the lock while it decides and stops.
const WATCHER: &str = r#"
dir=$1; idle=$2; nats=$3; shift 3
quiet=0
while :; do
  sleep 1
  if [ ! -d "$dir/users" ]; then
    kill "$nats" 2>/dev/null
    "$@" >/dev/null 2>&1
    exit 0
  fi
  exec 9>>"$dir/lock"
  flock 9
  alive=
  for f in "$dir"/users/*; do
    [ -e "$f" ] || continue
    if kill -0 "${f##*/}" 2>/dev/null; then alive=1; else rm -f "$f"; fi
  done
  if [ -n "$alive" ]; then quiet=0; else quiet=$((quiet + 1)); fi
  if [ "$quiet" -ge "$idle" ]; then
    rm -f "$dir/urls"
    kill "$nats" 2>/dev/null
    "$@" >/dev/null 2>&1
    exit 0
  fi
  exec 9>&-
done
"#;

fn start(dir: &Path, idle: Duration) -> Result<Servers, String> {
    let (postgres, pg_port) = on_a_free_port(15432, |port| {
        hark_servers::Postgres::start(&dir.join("postgres"), &dir.join("postgres.log"), port)
    })
    .map_err(|e| format!("a private Postgres for the tests: {e}"))?;
    let (nats, nats_port) = match on_a_free_port(14222, |port| {
        hark_servers::start_nats(&dir.join("nats"), &dir.join("nats.log"), "127.0.0.1", port)
    }) {
        Ok(started) => started,
        Err(e) => {
            let _ = postgres.stop();
            return Err(format!("a private nats-server for the tests: {e}"));
        }
    };
    let stop = postgres.stop_command();
    let mut watcher = Command::new("sh");
    watcher
        .args(["-c", WATCHER, "hark-test-servers"])
        .arg(dir)
        .arg(idle.as_secs().max(1).to_string())
        .arg(nats.id().to_string())
        .arg(stop.get_program())
        .args(stop.get_args())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // Its own process group, so that what stops a test's group leaves the shared servers be.
    std::os::unix::process::CommandExt::process_group(&mut watcher, 0);
    if let Err(e) = watcher.spawn() {
        let _ = postgres.stop();
        let mut nats = nats;
        let _ = nats.kill();
        return Err(format!(
            "cannot start the watcher of the tests' servers: {e}"
        ));
    }
    let servers = Servers {
        postgres: format!("postgres://postgres@127.0.0.1:{pg_port}"),
        nats: format!("nats://127.0.0.1:{nats_port}"),
    };
    std::fs::write(
        dir.join("urls"),
        format!("{}\n{}\n", servers.postgres, servers.nats),
    )
    .map_err(|e| format!("cannot write {}: {e}", dir.join("urls").display()))?;
    Ok(servers)
}
