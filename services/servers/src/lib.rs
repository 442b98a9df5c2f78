//! A private Postgres and nats-server on this host, from their installed programs: what
//! `hark dev` starts when nothing serves it, and what the tests start when nothing serves them.
//!
//! - [`Postgres::start`] makes a cluster with the distribution's `initdb` (trust for the
//!   `postgres` user, UTF-8) the first time, and starts it with `pg_ctl` on 127.0.0.1 only.
//!   As root it runs as the `postgres` user, since Postgres refuses root.
//! - [`start_nats`] starts `nats-server` with JetStream on one address and waits until it answers.
//!
//! Everything here blocks: call it from a thread that may wait.

use std::{
    fmt,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// Why a private server did not start.
#[derive(Debug)]
pub enum Error {
    /// Its program is not installed where a distribution puts it.
    NotInstalled { program: &'static str },
    /// Postgres refuses root, and there is no `postgres` user to run it as.
    NoPostgresUser,
    /// A step failed: what, and what it said.
    Failed { what: String, said: String },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotInstalled { program } => write!(f, "{program} is not installed"),
            Self::NoPostgresUser => write!(
                f,
                "Postgres cannot run as root, and there is no `postgres` user to run it as"
            ),
            Self::Failed { what, said } => write!(f, "{what} failed: {said}"),
        }
    }
}

impl std::error::Error for Error {}

/// Where the distributions put Postgres's programs, besides the `PATH`.
const POSTGRES_BINS: [&str; 4] = [
    "/usr/lib/postgresql/*/bin",
    "/usr/pgsql-*/bin",
    "/opt/homebrew/opt/postgresql*/bin",
    "/usr/local/opt/postgresql*/bin",
];

/// Where the distributions put `nats-server`, besides the `PATH`.
const NATS_BINS: [&str; 3] = ["/usr/sbin", "/usr/local/bin", "/opt/homebrew/bin"];

/// `name` on the PATH or in one of `also` (globs of one `*` allowed), the newest version first.
pub fn find(name: &str, also: &[&str]) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        also.iter().find_map(|pattern| {
            let (head, tail) = pattern.split_once('*').unwrap_or((pattern, ""));
            if !pattern.contains('*') {
                let p = PathBuf::from(head).join(name);
                return p.is_file().then_some(p);
            }
            let parent = Path::new(head).parent()?;
            let prefix = Path::new(head).file_name()?.to_string_lossy().into_owned();
            let mut found: Vec<PathBuf> = std::fs::read_dir(parent)
                .ok()?
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path().join(tail.trim_start_matches('/')).join(name))
                .filter(|p| p.is_file())
                .collect();
            // The highest version: compare the numbers in the path, not the text.
            found.sort_by_key(|p| {
                p.to_string_lossy()
                    .split(|c: char| !c.is_ascii_digit())
                    .filter_map(|n| n.parse::<u32>().ok())
                    .collect::<Vec<_>>()
            });
            found.pop()
        })
    })
}

/// Whether something accepts a TCP connection at `host:port` within two seconds.
pub fn answers(host: &str, port: u16) -> bool {
    use std::net::ToSocketAddrs as _;
    let Ok(addrs) = (host, port).to_socket_addrs() else {
        return false;
    };
    addrs
        .into_iter()
        .any(|addr| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_ok())
}

/// Waits until something answers at `host:port`, for at most `wait`.
pub fn wait_until_answers(host: &str, port: u16, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(10);
    loop {
        if answers(host, port) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Whether this process runs as root.
pub fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A private Postgres cluster, started.
#[derive(Debug, Clone)]
pub struct Postgres {
    pg_ctl: PathBuf,
    /// Its data directory.
    pub data: PathBuf,
    /// The user it runs as, when this process is root.
    user: Option<&'static str>,
}

impl Postgres {
    /// Starts the cluster in `data` on 127.0.0.1:`port` (its socket in `data` too), logging to
    /// `log`; makes it first when `data` holds none. Returns once it takes connections.
    pub fn start(data: &Path, log: &Path, port: u16) -> Result<Self, Error> {
        let (Some(pg_ctl), Some(initdb)) = (
            find("pg_ctl", &POSTGRES_BINS),
            find("initdb", &POSTGRES_BINS),
        ) else {
            return Err(Error::NotInstalled {
                program: "Postgres",
            });
        };
        let user = if running_as_root() {
            let exists = Command::new("id")
                .arg("postgres")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !exists {
                return Err(Error::NoPostgresUser);
            }
            Some("postgres")
        } else {
            None
        };
        let made = |e: std::io::Error, what: &Path| Error::Failed {
            what: format!("creating {}", what.display()),
            said: e.to_string(),
        };
        std::fs::create_dir_all(data).map_err(|e| made(e, data))?;
        if !log.exists() {
            std::fs::write(log, "").map_err(|e| made(e, log))?;
        }
        if let Some(user) = user {
            // The cluster, its log and the directory that holds them become its user's.
            let mut chown = Command::new("chown");
            chown.arg(format!("{user}:")).arg(data).arg(log);
            if let Some(parent) = data.parent() {
                chown.arg(parent);
            }
            run(&mut chown, "chown")?;
        }
        if !data.join("PG_VERSION").exists() {
            run(
                as_user(user, &initdb).arg("-D").arg(data).args([
                    "-U",
                    "postgres",
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-instructions",
                ]),
                "initdb",
            )?;
        }
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k '{}'",
            data.display()
        );
        let mut start = as_user(user, &pg_ctl);
        start
            .arg("-D")
            .arg(data)
            .arg("-l")
            .arg(log)
            .args(["-w", "-t", "60", "-o", &options, "start"]);
        // A group of its own: a Ctrl-C meant for the process that started it does not reach it.
        start.process_group(0);
        run(&mut start, "pg_ctl start").map_err(|e| match e {
            Error::Failed { what, said } => Error::Failed {
                what,
                said: format!("{said} (its log is {})", log.display()),
            },
            other => other,
        })?;
        Ok(Self {
            pg_ctl,
            data: data.to_owned(),
            user,
        })
    }

    /// The command that stops it (`pg_ctl stop -m fast`), for a process that outlives this one.
    pub fn stop_command(&self) -> Command {
        let mut command = as_user(self.user, &self.pg_ctl);
        command
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "stop"]);
        command
    }

    /// Stops it, the data kept.
    pub fn stop(&self) -> Result<(), Error> {
        run(&mut self.stop_command(), "pg_ctl stop")
    }
}

/// Starts `nats-server` with JetStream on `host:port`, its store in `store`, logging to `log`,
/// and waits until it answers. It runs in a process group of its own, so a Ctrl-C meant for this
/// process does not reach it: the child is this process's to stop.
pub fn start_nats(store: &Path, log: &Path, host: &str, port: u16) -> Result<Child, Error> {
    let server = find("nats-server", &NATS_BINS).ok_or(Error::NotInstalled {
        program: "nats-server",
    })?;
    std::fs::create_dir_all(store).map_err(|e| Error::Failed {
        what: format!("creating {}", store.display()),
        said: e.to_string(),
    })?;
    let mut child = Command::new(&server)
        .args(["-a", host, "-p", &port.to_string(), "-js", "-sd"])
        .arg(store)
        .arg("-l")
        .arg(log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| Error::Failed {
            what: format!("starting {}", server.display()),
            said: e.to_string(),
        })?;
    if wait_until_answers(host, port, Duration::from_secs(10)) {
        return Ok(child);
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(Error::Failed {
        what: "nats-server".into(),
        said: format!(
            "it did not answer on {host}:{port} within 10s; see {}",
            log.display()
        ),
    })
}

fn as_user(user: Option<&str>, program: &Path) -> Command {
    match user {
        Some(user) => {
            let mut command = Command::new("runuser");
            command.args(["-u", user, "--"]).arg(program);
            command
        }
        None => Command::new(program),
    }
}

fn run(command: &mut Command, what: &str) -> Result<(), Error> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Failed {
            what: what.into(),
            said: e.to_string(),
        })?;
    if output.status.success() {
        return Ok(());
    }
    Err(Error::Failed {
        what: what.into(),
        said: format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ),
    })
}
