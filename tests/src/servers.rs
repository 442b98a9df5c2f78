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

impl Scratch {
    /// A scratch directory the `postgres` user owns, when this runs as root.
    fn for_postgres(prefix: &str) -> Self {
        let scratch = Self::new(prefix);
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
        scratch
    }
}

/// Waits until a server answers on `port`.
fn wait_for_port(port: u16, what: &str) {
    for _ in 0..600 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} did not answer on {port}");
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
        let scratch = Scratch::for_postgres("hark-pg");
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

    /// A streaming standby of `primary`, on a port of its own: `pg_basebackup -R` of the running
    /// primary (trust authentication lets replication connections in from loopback), started
    /// and waited for until the primary sees it streaming.
    pub fn standby_of(primary: &PrivatePostgres) -> Self {
        let scratch = Scratch::for_postgres("hark-pg-standby");
        let bin = primary.bin.clone();
        let data = scratch.0.join("data");
        let status = postgres_command(&bin.join("pg_basebackup"))
            .arg("-D")
            .arg(&data)
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
            .args(["-U", "postgres", "-R", "-X", "stream", "-c", "fast"])
            .args(["-d", "application_name=standby"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("pg_basebackup runs");
        assert!(status.success(), "pg_basebackup of the primary failed");
        let standby = Self {
            port: server_port(),
            data,
            bin,
            _scratch: scratch,
        };
        standby.start_again();
        for _ in 0..1200 {
            if primary.query("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")
                == "1"
            {
                return standby;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the standby did not start streaming from the primary");
    }

    /// Makes every commit wait until the standby has it (`synchronous_standby_names = '*'`,
    /// `synchronous_commit = on`), and waits until the primary calls the standby synchronous.
    pub fn make_synchronous(&self) {
        self.query("ALTER SYSTEM SET synchronous_standby_names = '*'");
        self.query("ALTER SYSTEM SET synchronous_commit = 'on'");
        self.query("SELECT pg_reload_conf()");
        for _ in 0..1200 {
            if self.query("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
                == "1"
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the standby did not become synchronous");
    }

    /// Promotes this standby to a primary and waits until it takes writes.
    pub fn promote(&self) {
        let status = postgres_command(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-t", "60", "promote"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("pg_ctl runs");
        assert!(status.success(), "the standby was not promoted");
    }

    /// Whether the server is a standby now.
    pub fn in_recovery(&self) -> bool {
        self.query("SELECT pg_is_in_recovery()") == "t"
    }

    /// The first column of the first row `sql` returns, through `psql`, as text.
    pub fn query(&self, sql: &str) -> String {
        let output = postgres_command(&self.bin.join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-XAtc", sql])
            .stderr(Stdio::null())
            .output()
            .expect("psql runs");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
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
        let child = Command::new(nats_server_bin())
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
        wait_for_port(self.port, "the private nats-server");
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

/// The nats-server program of the machine's package.
fn nats_server_bin() -> &'static str {
    ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("nats-server")
}

/// One server of a [`NatsCluster`].
#[derive(Debug)]
struct Node {
    name: String,
    port: u16,
    config: PathBuf,
    store: PathBuf,
    child: Option<std::process::Child>,
}

/// A JetStream cluster of nats-servers on loopback, routed to each other, each with its own
/// store, named `n0`, `n1`, …: what the NATS Helm chart runs, on one machine.
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<Node>,
    _scratch: Scratch,
}

impl NatsCluster {
    /// Starts `size` servers and waits until each answers (JetStream elects its meta leader
    /// once a majority of them route to each other).
    pub fn start(size: usize) -> Self {
        let scratch = Scratch::new("hark-nats-cluster");
        let ports: Vec<(u16, u16)> = (0..size).map(|_| (server_port(), server_port())).collect();
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, route)| format!("nats-route://127.0.0.1:{route}"))
            .collect();
        let nodes = ports
            .iter()
            .enumerate()
            .map(|(i, (port, route))| {
                let name = format!("n{i}");
                let store = scratch.0.join(&name);
                let config = scratch.0.join(format!("{name}.conf"));
                std::fs::write(
                    &config,
                    format!(
                        "server_name: {name}\nlisten: 127.0.0.1:{port}\n\
                         jetstream {{ store_dir: \"{}\" }}\n\
                         cluster {{\n  name: hark\n  listen: 127.0.0.1:{route}\n  routes: [{}]\n}}\n",
                        store.display(),
                        routes.join(", ")
                    ),
                )
                .expect("nats-server configuration written");
                Node {
                    name,
                    port: *port,
                    config,
                    store,
                    child: None,
                }
            })
            .collect();
        let mut cluster = Self {
            nodes,
            _scratch: scratch,
        };
        for i in 0..size {
            cluster.start_again(i);
        }
        cluster
    }

    /// Every server's client URL, comma-separated, as `nats.url` takes them.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the server called `name` (`n1` → 1).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }

    /// Starts server `i` again with its store, and waits until it answers.
    pub fn start_again(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if node.child.is_some() {
            return;
        }
        let child = Command::new(nats_server_bin())
            .arg("-c")
            .arg(&node.config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts (apt install nats-server)");
        node.child = Some(child);
        wait_for_port(node.port, &format!("nats-server {}", node.name));
    }

    /// Kills server `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Deletes the store of the killed server `i`, as a lost disk would.
    pub fn wipe(&mut self, i: usize) {
        assert!(self.nodes[i].child.is_none(), "wipe a running nats-server");
        let _ = std::fs::remove_dir_all(&self.nodes[i].store);
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// A TCP forwarder on a port of its own to a server the test chooses, as a Kubernetes Service
/// moves to the pod that is the primary now: [`Forwarder::switch`] sends new connections to
/// another port and cuts those it carried.
#[derive(Debug)]
pub struct Forwarder {
    pub port: u16,
    target: std::sync::Arc<std::sync::atomic::AtomicU16>,
    carried: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Forwarder {
    pub async fn start(target: u16) -> Self {
        use std::sync::{Arc, atomic::AtomicU16};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("forwarder binds");
        let port = listener.local_addr().expect("address").port();
        let target = Arc::new(AtomicU16::new(target));
        let carried: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let accept = {
            let (target, carried) = (target.clone(), carried.clone());
            tokio::spawn(async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    let to = target.load(std::sync::atomic::Ordering::SeqCst);
                    let task = tokio::spawn(async move {
                        if let Ok(mut outbound) =
                            tokio::net::TcpStream::connect(("127.0.0.1", to)).await
                        {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    let mut carried = carried.lock().expect("carried");
                    carried.retain(|t| !t.is_finished());
                    carried.push(task.abort_handle());
                }
            })
        };
        Self {
            port,
            target,
            carried,
            accept,
        }
    }

    /// New connections go to `target` from now on, and the ones open now are cut.
    pub fn switch(&self, target: u16) {
        self.target
            .store(target, std::sync::atomic::Ordering::SeqCst);
        for task in self.carried.lock().expect("carried").drain(..) {
            task.abort();
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.accept.abort();
        self.switch(0);
    }
}
