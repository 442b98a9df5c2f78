//! `hark key …`: keys that belong to a person, made, listed and revoked over the gRPC API.
//! With an operator's token (one of `control.api_tokens`) for anyone; with a person's own key,
//! for that person.

use anyhow::Context as _;
use clap::{Args, Subcommand};
use hark_core::{config::Config, domain::HumanDuration};
use hark_proto::v1 as pb;
use serde_json::json;

use crate::task::{ApiArgs, client, explain, time_of};

#[derive(Debug, Args)]
pub struct KeyArgs {
    #[command(flatten)]
    args: ApiArgs,
    #[command(subcommand)]
    command: KeyCommand,
}

#[derive(Debug, Subcommand)]
enum KeyCommand {
    /// Make a key for a person and print it, once: whoever holds it acts as that person.
    Create {
        /// Whose key it is, as platform:user_id [default: the person whose key --token is]
        #[arg(long)]
        owner: Option<String>,
        /// What they call it, e.g. laptop.
        #[arg(long)]
        name: String,
        /// guest, user or admin, never above the owner's role [default: the owner's role]
        #[arg(long)]
        role: Option<String>,
        /// How long it works, e.g. 90d, or `never` [default: 90d]
        #[arg(long, default_value = "90d")]
        expires: String,
    },
    /// List the keys (without the keys themselves).
    List,
    /// Revoke a key by its id or a prefix of it: it stops working at once.
    Revoke { id: String },
}

pub async fn run(config: &Config, KeyArgs { args, command }: KeyArgs) -> anyhow::Result<()> {
    let mut api = client(config, &args).await?;
    match command {
        KeyCommand::Create {
            owner,
            name,
            role,
            expires,
        } => {
            let expires_in = match expires.trim() {
                "never" => None,
                given => {
                    let d: HumanDuration = given.parse().map_err(|e| {
                        anyhow::anyhow!(crate::said!(
                            zh: "--expires `{given}`：{e}（例如 90d，或 never）",
                            en: "--expires `{given}`: {e} (e.g. 90d, or never)",
                        ))
                    })?;
                    Some(prost_types::Duration::try_from(d.0).context("--expires is too long")?)
                }
            };
            let made = api
                .create_key(pb::CreateKeyRequest {
                    owner: owner.unwrap_or_default(),
                    name,
                    role: role.unwrap_or_default(),
                    expires_in,
                })
                .await
                .map_err(explain)?
                .into_inner();
            let key = made.key.unwrap_or_default();
            if args.json {
                let mut value = key_json(&key);
                value["secret"] = json!(made.secret);
                crate::out!("{value}");
            } else {
                crate::out!("{}", made.secret);
                let expires = match time_of(&key.expires_at) {
                    e if e.is_empty() => "never".to_owned(),
                    e => e,
                };
                eprintln!(
                    "{}",
                    crate::said!(
                        zh: "{} 的密钥 {}（{}，{}，到期 {}）。它只显示这一次：请现在保存。",
                        en: "key {1} of {0} ({2}, {3}, expires {4}). It is shown only this once: keep it now.",
                        key.owner, short(&key.id), key.name, key.role, expires
                    )
                );
            }
        }
        KeyCommand::List => {
            let keys = api
                .list_keys(pb::ListKeysRequest {})
                .await
                .map_err(explain)?
                .into_inner()
                .keys;
            for key in &keys {
                if args.json {
                    crate::out!("{}", key_json(key));
                } else {
                    let state = if key.revoked_at.is_some() {
                        "revoked"
                    } else {
                        "active"
                    };
                    crate::out!(
                        "{}  {:<16} {:<20} {:<6} {:<8} last used {}",
                        short(&key.id),
                        key.owner,
                        key.name,
                        key.role,
                        state,
                        match time_of(&key.last_used_at) {
                            t if t.is_empty() => "never".to_owned(),
                            t => t,
                        }
                    );
                }
            }
            if keys.is_empty() && !args.json {
                eprintln!("{}", crate::said!(zh: "没有密钥", en: "no keys"));
            }
        }
        KeyCommand::Revoke { id } => {
            let key = api
                .revoke_key(pb::RevokeKeyRequest { key_id: id })
                .await
                .map_err(explain)?
                .into_inner()
                .key
                .unwrap_or_default();
            if args.json {
                crate::out!("{}", key_json(&key));
            } else {
                crate::out!(
                    "{}",
                    crate::said!(
                        zh: "已吊销 {} 的密钥 {}（{}）",
                        en: "revoked key {1} of {0} ({2})",
                        key.owner, short(&key.id), key.name
                    )
                );
            }
        }
    }
    Ok(())
}

fn short(id: &str) -> String {
    id.replace('-', "").chars().take(8).collect()
}

fn key_json(key: &pb::PersonKey) -> serde_json::Value {
    json!({
        "id": key.id,
        "owner": key.owner,
        "name": key.name,
        "role": key.role,
        "created_by": key.created_by,
        "created_at": time_of(&key.created_at),
        "expires_at": time_of(&key.expires_at),
        "revoked_at": time_of(&key.revoked_at),
        "last_used_at": time_of(&key.last_used_at),
    })
}
