//! The private servers the tests fall back on: started from the installed programs, shared by
//! the processes that use them, and stopped once the last of them is gone.

use std::{path::PathBuf, process::Stdio, time::Duration};

use hark_testkit::private::{self, Servers};

const WAIT: Duration = Duration::from_secs(120);

/// A directory of this test's own, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "hark-kit-{name}-{}",
            hark_testkit::unique_namespace()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        Self(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port")
}

fn query(server: &str, sql: &str) -> String {
    let out = std::process::Command::new("psql")
        .args([&format!("{server}/postgres"), "-qAtc", sql])
        .stdin(Stdio::null())
        .output()
        .expect("psql runs");
    assert!(
        out.status.success(),
        "psql at {server}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Waits until nothing answers at `urls` and the servers' URLs are gone from `dir`.
async fn stopped(urls: &[&str], dir: &std::path::Path) {
    let ports: Vec<u16> = urls.iter().map(|url| port_of(url)).collect();
    hark_testkit::eventually("the private servers to stop", WAIT, || async {
        let up = ports
            .iter()
            .any(|port| std::net::TcpStream::connect(("127.0.0.1", *port)).is_ok());
        (!up && !dir.join("urls").exists()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn private_servers_serve_are_shared_and_stop_after_the_last_process_that_used_them() {
    let dir = Dir::new("shared");
    let idle = Duration::from_secs(1);
    let first = {
        let dir = dir.0.clone();
        tokio::task::spawn_blocking(move || private::servers_in(&dir, idle))
            .await
            .expect("joined")
            .expect("private servers start")
    };
    assert_eq!(query(&first.postgres, "SELECT 40 + 2"), "42");
    let client = async_nats::connect(&first.nats)
        .await
        .expect("nats answers");
    let js = async_nats::jetstream::new(client.clone());
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "KIT_PRIVATE".into(),
        subjects: vec!["kit.private".into()],
        ..Default::default()
    })
    .await
    .expect("JetStream is on");
    js.publish("kit.private", "stored".into())
        .await
        .expect("published")
        .await
        .expect("stored");
    drop(client);
    assert!(private::postgres_serves(&first.postgres) && private::nats_serves(&first.nats));

    // A second user finds them running and is given the same ones.
    let again = {
        let dir = dir.0.clone();
        tokio::task::spawn_blocking(move || private::servers_in(&dir, idle))
            .await
            .expect("joined")
            .expect("the running servers are found")
    };
    assert_eq!(again, first);

    // While a user lives they keep running; once it is gone they stop.
    tokio::time::sleep(idle * 3).await;
    assert!(
        private::postgres_serves(&first.postgres),
        "stopped while used"
    );
    private::release(&dir.0);
    stopped(&[&first.postgres, &first.nats], &dir.0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_what_does_not_serve_is_replaced() {
    let dir = Dir::new("replace");
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let dead_port = dead.local_addr().expect("bound").port();
    drop(dead);
    let configured = Servers {
        postgres: hark_testkit::postgres_url(),
        nats: format!("nats://127.0.0.1:{dead_port}"),
    };
    let served = {
        let (configured, dir) = (configured.clone(), dir.0.clone());
        tokio::task::spawn_blocking(move || {
            private::serving(&configured, &dir, Duration::from_secs(1))
        })
        .await
        .expect("joined")
        .expect("a private nats-server starts")
    };
    assert_eq!(served.postgres, configured.postgres);
    assert_ne!(served.nats, configured.nats);
    assert!(private::nats_serves(&served.nats));

    // What is configured and serves is used as it is, and nothing is started for it.
    let other = Dir::new("kept");
    let real = Servers {
        postgres: hark_testkit::postgres_url(),
        nats: hark_testkit::nats_url(),
    };
    let kept = {
        let (real, dir) = (real.clone(), other.0.clone());
        tokio::task::spawn_blocking(move || private::serving(&real, &dir, Duration::from_secs(1)))
            .await
            .expect("joined")
            .expect("the configured servers serve")
    };
    assert_eq!(kept, real);
    assert!(!other.0.join("urls").exists());

    // A server elsewhere is never replaced: the tests use it as configured.
    assert!(!private::on_this_host(
        "postgres://postgres@db.example:5432"
    ));
    assert!(
        private::on_this_host("nats://[::1]:4222") && private::on_this_host("nats://localhost")
    );

    private::release(&dir.0);
    stopped(&[&served.nats], &dir.0).await;
}
