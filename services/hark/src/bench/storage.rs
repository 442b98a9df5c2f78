//! What waiting tasks cost in Postgres: the rows and bytes of each table and index of hark's
//! schema, read before the tasks exist and while they all wait.

use serde_json::{Value, json};

use super::Bench;

/// One relation of hark's schema: a table (with its TOAST) or an index.
#[derive(Debug, Clone)]
pub struct Relation {
    pub name: String,
    pub index: bool,
    pub bytes: i64,
    /// Rows, for a table.
    pub rows: i64,
}

/// Every table and index of the schema hark runs in, with its size and (for a table) its rows.
pub async fn relations(bench: &Bench) -> anyhow::Result<Vec<Relation>> {
    let pool = sqlx::PgPool::connect(bench.config.database.url.expose()).await?;
    let listed: Vec<(String, bool, i64)> = sqlx::query_as(
        "SELECT c.relname::text, c.relkind = 'i', \
                CASE WHEN c.relkind = 'i' THEN pg_relation_size(c.oid) ELSE pg_table_size(c.oid) END \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'i') \
         ORDER BY 1",
    )
    .fetch_all(&pool)
    .await?;
    let mut out = Vec::with_capacity(listed.len());
    for (name, index, bytes) in listed {
        let rows = if index {
            0
        } else {
            let quoted = format!("\"{}\"", name.replace('"', "\"\""));
            // The name is the catalog's, quoted as an identifier.
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {quoted}"
            )))
            .fetch_one(&pool)
            .await?
        };
        out.push(Relation {
            name,
            index,
            bytes,
            rows,
        });
    }
    pool.close().await;
    Ok(out)
}

/// What `n` waiting tasks added between `before` and `after`: per relation that grew, its rows
/// and bytes per task; largest first.
pub fn growth(before: &[Relation], after: &[Relation], n: usize) -> Vec<(Relation, f64, f64)> {
    let mut grown: Vec<(Relation, f64, f64)> = after
        .iter()
        .map(|a| {
            let b = before.iter().find(|b| b.name == a.name);
            let bytes = a.bytes - b.map_or(0, |b| b.bytes);
            let rows = a.rows - b.map_or(0, |b| b.rows);
            (a.clone(), rows as f64 / n as f64, bytes as f64 / n as f64)
        })
        .filter(|(_, rows, bytes)| *rows > 0.0 || *bytes > 0.0)
        .collect();
    grown.sort_by(|a, b| b.2.total_cmp(&a.2));
    grown
}

/// The growth as JSON and as the table's rows.
pub fn report(grown: &[(Relation, f64, f64)], n: usize) -> (Value, Vec<(String, String, String)>) {
    let total_bytes: f64 = grown.iter().map(|g| g.2).sum();
    let index_bytes: f64 = grown.iter().filter(|g| g.0.index).map(|g| g.2).sum();
    let rows: f64 = grown.iter().filter(|g| !g.0.index).map(|g| g.1).sum();
    let json = json!({
        "pg_bytes_per_waiting_task": total_bytes.round(),
        "pg_index_bytes_per_waiting_task": index_bytes.round(),
        "pg_rows_per_waiting_task": (rows * 100.0).round() / 100.0,
        "pg_growth": grown.iter().map(|(r, rows, bytes)| json!({
            "relation": r.name,
            "index": r.index,
            "rows_per_task": (rows * 100.0).round() / 100.0,
            "bytes_per_task": bytes.round(),
            "bytes": r.bytes,
        })).collect::<Vec<_>>(),
    });
    let shown = |only_index: bool| {
        grown
            .iter()
            .filter(|g| g.0.index == only_index)
            .take(6)
            .map(|(r, rows, bytes)| {
                if only_index {
                    format!("{} {bytes:.0} B", r.name)
                } else {
                    format!("{} {rows:.2} rows {bytes:.0} B", r.name)
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let rows = vec![
        (
            "w2".to_owned(),
            format!("Postgres per waiting task ({n} waiting): rows / bytes (of which indexes)"),
            format!("{rows:.2} / {total_bytes:.0} B ({index_bytes:.0} B)"),
        ),
        (
            "w2".to_owned(),
            "tables grown per waiting task, largest first".to_owned(),
            shown(false),
        ),
        (
            "w2".to_owned(),
            "indexes grown per waiting task, largest first".to_owned(),
            shown(true),
        ),
    ];
    (json, rows)
}
