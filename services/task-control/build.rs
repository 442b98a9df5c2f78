//! Builds again when a migration is added: `sqlx::migrate!` embeds the directory, which Cargo
//! does not watch by itself.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
