//! The OneBot bots online now, by `(platform, self id)`: at most one connection each, a newer
//! one replacing the older.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
};

use super::conn::Bot;

#[derive(Debug)]
pub struct Bots {
    online: Mutex<HashMap<(String, String), Arc<Bot>>>,
    /// The number the next connection gets, so that a bot's old connection can tell it was
    /// replaced.
    connections: AtomicU64,
}

impl Default for Bots {
    fn default() -> Self {
        Self {
            online: Mutex::default(),
            connections: AtomicU64::new(1),
        }
    }
}

impl Bots {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<(String, String), Arc<Bot>>> {
        self.online.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn next_connection(&self) -> u64 {
        self.connections.fetch_add(1, Ordering::Relaxed)
    }

    /// The bots online now, as `(platform, self id)`.
    pub fn online(&self) -> Vec<(String, String)> {
        self.lock().keys().cloned().collect()
    }

    pub fn bot(&self, platform: &str, self_id: &str) -> Option<Arc<Bot>> {
        self.lock()
            .get(&(platform.to_owned(), self_id.to_owned()))
            .cloned()
    }
}
