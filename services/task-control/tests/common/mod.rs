//! A fresh Postgres database per test, on the real server.

#![allow(dead_code)]

use hark_control::store::{self, Store};
use hark_core::bus::Names;

pub fn server_url() -> String {
    std::env::var("HARK_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

pub struct TestDb {
    pub store: Store,
    pub name: String,
}

impl TestDb {
    /// Creates a database of its own (through the same code production uses) and migrates it.
    pub async fn new() -> Self {
        let name = format!(
            "hark_test_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let url = format!("{}/{name}", server_url());
        let pool = store::connect(&url, 20)
            .await
            .expect("Postgres must answer on HARK_TEST_DATABASE_URL or 127.0.0.1:5432");
        store::migrate(&pool).await.expect("migrations run");
        let names = Names::new(format!("t{}", &name[10..]).parse().expect("namespace"));
        Self {
            store: Store::new(
                pool,
                names,
                hark_control::texts::Languages::new(&Default::default()),
            ),
            name,
        }
    }

    pub async fn drop(self) {
        self.store.pool().close().await;
        let admin = sqlx::PgPool::connect(&format!("{}/postgres", server_url()))
            .await
            .expect("admin connection");
        let sql = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&admin)
            .await
            .expect("test database dropped");
        admin.close().await;
    }
}

pub mod control;
pub mod tasks;
