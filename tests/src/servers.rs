//! Private servers a test may stop and start at will: a Postgres cluster and a nats-server, each
//! on a free port with its data in a directory of its own, both from the machine's packages.
//! Stopping the shared servers would break every other test; stopping these breaks only the
//! installation that uses them.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use crate::server_port;

/// A scratch directory removed on drop.
#[derive(Debug)]
struct Scratch(PathBuf);

impl Scratch {
    fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "{prefix}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..10]
        ));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The directory of Postgres's server programs (`initdb`, `pg_ctl`), the newest installed.
fn postgres_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("Postgres's server programs under /usr/lib/postgresql (apt install postgresql)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("pg_ctl").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("a Postgres version with pg_ctl under /usr/lib/postgresql")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Runs a Postgres program as the `postgres` user when this is root (Postgres refuses root).
fn postgres_command(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// A Postgres cluster of one test.
#[derive(Debug)]
pub struct PrivatePostgres {
    pub port: u16,
    data: PathBuf,
    bin: PathBuf,
    _scratch: Scratch,
}

impl PrivatePostgres {
    /// Creates a cluster (trust authentication, as the machine's) and starts it.
    pub fn start() -> Self {
        let scratch = Scratch::new("hark-pg");
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&scratch.0)
                .status()
                .expect("chown runs");
            assert!(
                status.success(),
                "cannot give the scratch directory to postgres"
            );
        }
        let bin = postgres_bin();
        let data = scratch.0.join("data");
        let status = postgres_command(&bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("initdb runs");
        assert!(status.success(), "initdb failed");
        let postgres = Self {
            port: server_port(),
            data,
            bin,
            _scratch: scratch,
        };
        postgres.start_again();
        postgres
    }

    /// The server's URL for database `name`.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Starts the stopped server on its port with its data, and waits until it accepts
    /// connections.
    pub fn start_again(&self) {
        let socket_dir = self.data.parent().expect("scratch");
        let status = postgres_command(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .arg("-o")
            .arg(format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
                self.port,
                socket_dir.display()
            ))
            .arg("-l")
            .arg(socket_dir.join("postgres.log"))
            .args(["-w", "-t", "60", "start"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("pg_ctl runs");
        assert!(status.success(), "the private Postgres did not start");
    }

    /// Stops the server as a crash would: `pg_ctl -m immediate stop`, no checkpoint, every
    /// connection cut.
    pub fn crash(&self) {
        let status = postgres_command(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("pg_ctl runs");
        assert!(status.success(), "the private Postgres did not stop");
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = postgres_command(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A nats-server with JetStream of one test.
#[derive(Debug)]
pub struct PrivateNats {
    pub port: u16,
    store: PathBuf,
    child: Option<std::process::Child>,
    _scratch: Scratch,
}

impl PrivateNats {
    pub fn start() -> Self {
        let scratch = Scratch::new("hark-nats");
        let mut nats = Self {
            port: server_port(),
            store: scratch.0.join("jetstream"),
            child: None,
            _scratch: scratch,
        };
        nats.start_again();
        nats
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the killed server on its port with its store, and waits until it answers.
    pub fn start_again(&mut self) {
        let bin = ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("nats-server");
        let child = Command::new(bin)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts (apt install nats-server)");
        self.child = Some(child);
        for _ in 0..600 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the private nats-server did not answer on {}", self.port);
    }

    /// Kills the server with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.kill();
    }
}
