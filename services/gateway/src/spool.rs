//! The inbound spool: every chat message the gateway reads from a bot is written to disk, and
//! synced, before it counts as received; it is forgotten once JetStream has acknowledged it. A
//! gateway that dies while NATS is away loses nothing: at its next start it sends what the
//! spool holds, with the same `Nats-Msg-Id`, so JetStream drops a copy it already has.
//!
//! The spool is a directory of segment files, `<number>.spool`, each a sequence of records:
//!
//! ```text
//! [u32 length][u32 crc32 of the rest][u8 kind][u64 sequence][payload]   (little endian)
//! ```
//!
//! A `MESSAGE` record carries a message to publish; an `ACK` record (no payload) says that the
//! message with its sequence reached JetStream. Appends are synced in groups: one `fdatasync`
//! makes every record written before it durable. A torn record at the end of a segment (a crash
//! in the middle of a write) is ignored. Segments are deleted oldest first, once they and every
//! older one hold no unacknowledged message, so that an acknowledgement is never deleted before
//! the message it refers to. A lock file keeps two gateways off one spool.

use std::{
    collections::{BTreeMap, HashMap},
    fs::{File, OpenOptions},
    io::{Read, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use bytes::Bytes;

const MESSAGE: u8 = 1;
const ACK: u8 = 2;
/// Length, crc, kind and sequence.
const HEADER: usize = 4 + 4 + 1 + 8;
/// A segment is closed and a new one started past this size.
const SEGMENT_BYTES: u64 = 8 << 20;

/// Why the spool could not do something.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the inbound spool at gateway.spool_dir = {dir} cannot be used: {source}")]
    Io { dir: String, source: std::io::Error },
    #[error(
        "another gateway uses the inbound spool at gateway.spool_dir = {0}; give each gateway a spool directory of its own"
    )]
    Locked(String),
    #[error(
        "the inbound spool is full ({pending} bytes wait for NATS, gateway.spool_max_bytes = {max})"
    )]
    Full { pending: u64, max: u64 },
}

/// A message waiting in the spool for JetStream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spooled {
    pub seq: u64,
    pub subject: String,
    pub msg_id: String,
    /// The W3C trace context to publish it with, if any.
    pub trace: Option<String>,
    pub payload: Bytes,
}

impl Spooled {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.payload.len() + 128);
        for field in [
            self.subject.as_bytes(),
            self.msg_id.as_bytes(),
            self.trace.as_deref().unwrap_or("").as_bytes(),
        ] {
            out.extend_from_slice(&(field.len() as u32).to_le_bytes());
            out.extend_from_slice(field);
        }
        out.extend_from_slice(&self.payload);
        out
    }

    fn decode(seq: u64, mut bytes: &[u8]) -> Option<Self> {
        let mut field = || -> Option<String> {
            let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
            let value = std::str::from_utf8(bytes.get(4..4 + len)?).ok()?.to_owned();
            bytes = &bytes[4 + len..];
            Some(value)
        };
        let subject = field()?;
        let msg_id = field()?;
        let trace = Some(field()?).filter(|t| !t.is_empty());
        Some(Self {
            seq,
            subject,
            msg_id,
            trace,
            payload: Bytes::copy_from_slice(bytes),
        })
    }

    /// What it takes in the spool's bound.
    fn size(&self) -> u64 {
        (self.payload.len() + self.subject.len() + self.msg_id.len()) as u64
    }
}

/// The spool of one gateway.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    state: Mutex<State>,
    /// Held while a sync runs, so that appends made meanwhile share the next one.
    syncing: tokio::sync::Mutex<()>,
    /// Keeps the directory's lock.
    _lock: File,
}

#[derive(Debug)]
struct State {
    file: File,
    segment: u64,
    segment_bytes: u64,
    next_seq: u64,
    /// The last sequence written, and the last one known durable.
    written: u64,
    synced: u64,
    /// Bytes of messages not yet acknowledged.
    pending_bytes: u64,
    /// Per segment, how many of its messages are not yet acknowledged.
    live: BTreeMap<u64, usize>,
    /// The segment files there are, oldest first.
    segments: std::collections::BTreeSet<u64>,
    /// Each unacknowledged message's segment and size.
    unacked: HashMap<u64, (u64, u64)>,
}

fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("{segment:012}.spool"))
}

impl Spool {
    /// Opens the spool in `dir` (creating it), and returns it with the messages a previous run
    /// left unacknowledged, oldest first.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<(Arc<Self>, Vec<Spooled>), Error> {
        let io = |source| Error::Io {
            dir: dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .map_err(io)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Locked(dir.display().to_string()));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }

        let mut segments: Vec<u64> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".spool")?.parse().ok())
            .collect();
        segments.sort_unstable();
        let mut messages: BTreeMap<u64, (u64, Spooled)> = BTreeMap::new();
        let mut next_seq = 1;
        for &segment in &segments {
            let mut bytes = Vec::new();
            File::open(segment_path(dir, segment))
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .map_err(io)?;
            for (kind, seq, payload) in records(&bytes) {
                next_seq = next_seq.max(seq + 1);
                match kind {
                    MESSAGE => {
                        if let Some(message) = Spooled::decode(seq, payload) {
                            messages.insert(seq, (segment, message));
                        }
                    }
                    ACK => {
                        messages.remove(&seq);
                    }
                    _ => {}
                }
            }
        }
        let mut live: BTreeMap<u64, usize> = BTreeMap::new();
        let mut unacked = HashMap::new();
        let mut pending_bytes = 0;
        for (seq, (segment, message)) in &messages {
            *live.entry(*segment).or_default() += 1;
            unacked.insert(*seq, (*segment, message.size()));
            pending_bytes += message.size();
        }
        let segment = segments.last().map_or(1, |s| s + 1);
        let file = open_segment(dir, segment).map_err(io)?;
        let mut segments: std::collections::BTreeSet<u64> = segments.into_iter().collect();
        segments.insert(segment);
        delete_done(dir, &mut segments, &live, segment);
        let spool = Arc::new(Self {
            dir: dir.to_owned(),
            max_bytes,
            state: Mutex::new(State {
                file,
                segment,
                segment_bytes: 0,
                next_seq,
                written: next_seq - 1,
                synced: next_seq - 1,
                pending_bytes,
                live,
                segments,
                unacked,
            }),
            syncing: tokio::sync::Mutex::new(()),
            _lock: lock,
        });
        Ok((spool, messages.into_values().map(|(_, m)| m).collect()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            dir: self.dir.display().to_string(),
            source,
        }
    }

    /// Bytes of messages waiting for JetStream.
    pub fn pending_bytes(&self) -> u64 {
        self.lock().pending_bytes
    }

    /// How many messages wait for JetStream.
    pub fn pending(&self) -> usize {
        self.lock().unacked.len()
    }

    /// Writes a message and returns once it is durable, with its sequence set; refuses it when
    /// the spool is full.
    pub async fn append(&self, mut message: Spooled) -> Result<Spooled, Error> {
        let seq = {
            let mut state = self.lock();
            if state.pending_bytes + message.size() > self.max_bytes {
                return Err(Error::Full {
                    pending: state.pending_bytes,
                    max: self.max_bytes,
                });
            }
            let seq = state.next_seq;
            message.seq = seq;
            let record = record(MESSAGE, seq, &message.encode());
            self.rotate_if_full(&mut state).map_err(|e| self.io(e))?;
            state.file.write_all(&record).map_err(|e| self.io(e))?;
            state.next_seq += 1;
            state.written = seq;
            state.segment_bytes += record.len() as u64;
            state.pending_bytes += message.size();
            let segment = state.segment;
            *state.live.entry(segment).or_default() += 1;
            state.unacked.insert(seq, (segment, message.size()));
            seq
        };
        self.sync_to(seq).await?;
        Ok(message)
    }

    /// Makes every record up to `seq` durable, sharing one sync with appends made meanwhile.
    async fn sync_to(&self, seq: u64) -> Result<(), Error> {
        let _syncing = self.syncing.lock().await;
        let (file, target) = {
            let state = self.lock();
            if state.synced >= seq {
                return Ok(());
            }
            (
                state.file.try_clone().map_err(|e| self.io(e))?,
                state.written,
            )
        };
        tokio::task::spawn_blocking(move || file.sync_data())
            .await
            .map_err(|e| self.io(std::io::Error::other(e)))?
            .map_err(|e| self.io(e))?;
        let mut state = self.lock();
        state.synced = state.synced.max(target);
        Ok(())
    }

    /// Forgets a message JetStream acknowledged. The record of it is not synced: should it be
    /// lost in a crash, the message is sent again and JetStream drops the copy.
    pub fn ack(&self, seq: u64) -> Result<(), Error> {
        let mut state = self.lock();
        let Some((segment, size)) = state.unacked.remove(&seq) else {
            return Ok(());
        };
        state.pending_bytes = state.pending_bytes.saturating_sub(size);
        let record = record(ACK, seq, &[]);
        self.rotate_if_full(&mut state).map_err(|e| self.io(e))?;
        state.file.write_all(&record).map_err(|e| self.io(e))?;
        state.segment_bytes += record.len() as u64;
        let emptied = match state.live.get_mut(&segment) {
            Some(count) => {
                *count -= 1;
                *count == 0
            }
            None => false,
        };
        if emptied {
            state.live.remove(&segment);
            let current = state.segment;
            let State { segments, live, .. } = &mut *state;
            delete_done(&self.dir, segments, live, current);
        }
        Ok(())
    }

    fn rotate_if_full(&self, state: &mut State) -> std::io::Result<()> {
        if state.segment_bytes < SEGMENT_BYTES {
            return Ok(());
        }
        // What was written to the old segment must be durable before it stops being the one
        // syncs look at.
        state.file.sync_data()?;
        state.synced = state.written;
        state.segment += 1;
        state.file = open_segment(&self.dir, state.segment)?;
        state.segment_bytes = 0;
        let current = state.segment;
        let State { segments, live, .. } = &mut *state;
        segments.insert(current);
        delete_done(&self.dir, segments, live, current);
        Ok(())
    }
}

/// Deletes the oldest segments while they hold no unacknowledged message (never the current
/// one): what they acknowledge refers only to messages in them or older segments.
fn delete_done(
    dir: &Path,
    segments: &mut std::collections::BTreeSet<u64>,
    live: &BTreeMap<u64, usize>,
    current: u64,
) {
    while let Some(&oldest) = segments.first() {
        if oldest == current || live.contains_key(&oldest) {
            break;
        }
        let _ = std::fs::remove_file(segment_path(dir, oldest));
        segments.remove(&oldest);
    }
}

fn open_segment(dir: &Path, segment: u64) -> std::io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(segment_path(dir, segment))?;
    // The new file's directory entry must survive a crash too.
    File::open(dir)?.sync_all()?;
    Ok(file)
}

fn record(kind: u8, seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(9 + payload.len());
    body.push(kind);
    body.extend_from_slice(&seq.to_le_bytes());
    body.extend_from_slice(payload);
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// The whole records of a segment, up to the first torn or corrupt one.
fn records(mut bytes: &[u8]) -> Vec<(u8, u64, &[u8])> {
    let mut out = Vec::new();
    while bytes.len() >= HEADER {
        let len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        let Some(body) = bytes.get(8..8 + len) else {
            break;
        };
        if len < 9 || crc32(body) != crc {
            break;
        }
        let seq = u64::from_le_bytes(body[1..9].try_into().unwrap_or_default());
        out.push((body[0], seq, &body[9..]));
        bytes = &bytes[8 + len..];
    }
    out
}

/// CRC-32 (IEEE 802.3), bit by bit: records are small and this runs once per write.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xedb8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("hark-spool-test-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        dir
    }

    fn message(n: usize) -> Spooled {
        Spooled {
            seq: 0,
            subject: "hark.chat.in.qq".into(),
            msg_id: format!("qq:42:{n}"),
            trace: n
                .is_multiple_of(2)
                .then(|| format!("00-{:032x}-{:016x}-01", n + 1, n + 1)),
            payload: Bytes::from(format!("payload {n}")),
        }
    }

    #[test]
    fn the_crc_is_the_standard_one() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[tokio::test]
    async fn what_was_not_acknowledged_comes_back_after_a_restart_in_order() {
        let dir = dir();
        {
            let (spool, left) = Spool::open(&dir, 1 << 20).expect("opens");
            assert!(left.is_empty());
            let mut seqs = Vec::new();
            for n in 0..10 {
                seqs.push(spool.append(message(n)).await.expect("appended").seq);
            }
            for seq in seqs.iter().step_by(2) {
                spool.ack(*seq).expect("acked");
            }
            assert_eq!(spool.pending(), 5);
            // A second gateway on the same directory is refused.
            assert!(matches!(Spool::open(&dir, 1 << 20), Err(Error::Locked(_))));
        }
        let (spool, left) = Spool::open(&dir, 1 << 20).expect("reopens");
        let ids: Vec<&str> = left.iter().map(|m| m.msg_id.as_str()).collect();
        assert_eq!(ids, ["qq:42:1", "qq:42:3", "qq:42:5", "qq:42:7", "qq:42:9"]);
        assert_eq!(left[0].payload, Bytes::from("payload 1"));
        assert_eq!(left[0].trace, None);
        // New messages continue the sequence after the old ones.
        let next = spool.append(message(10)).await.expect("appended");
        assert!(next.seq > left.last().expect("left").seq);
        for m in &left {
            spool.ack(m.seq).expect("acked");
        }
        spool.ack(next.seq).expect("acked");
        drop(spool);
        let (_, left) = Spool::open(&dir, 1 << 20).expect("reopens");
        assert!(left.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_torn_last_record_is_ignored_and_the_rest_is_kept() {
        let dir = dir();
        {
            let (spool, _) = Spool::open(&dir, 1 << 20).expect("opens");
            spool.append(message(1)).await.expect("appended");
            spool.append(message(2)).await.expect("appended");
        }
        // A crash in the middle of the next write leaves half a record.
        let segment = segment_path(&dir, 1);
        let mut file = OpenOptions::new()
            .append(true)
            .open(&segment)
            .expect("segment");
        let torn = record(MESSAGE, 3, &message(3).encode());
        file.write_all(&torn[..torn.len() / 2]).expect("torn write");
        drop(file);
        let (_, left) = Spool::open(&dir, 1 << 20).expect("reopens");
        let ids: Vec<&str> = left.iter().map(|m| m.msg_id.as_str()).collect();
        assert_eq!(ids, ["qq:42:1", "qq:42:2"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_full_spool_refuses_and_makes_room_as_messages_are_acknowledged() {
        let dir = dir();
        let one = message(1).size();
        let (spool, _) = Spool::open(&dir, one * 3).expect("opens");
        let mut seqs = Vec::new();
        for n in 0..3 {
            seqs.push(spool.append(message(n)).await.expect("room").seq);
        }
        assert!(matches!(
            spool.append(message(3)).await,
            Err(Error::Full { .. })
        ));
        spool.ack(seqs[0]).expect("acked");
        spool.append(message(4)).await.expect("room again");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn segments_whose_messages_all_went_out_are_deleted() {
        let dir = dir();
        let (spool, _) = Spool::open(&dir, u64::MAX).expect("opens");
        let big = Spooled {
            payload: Bytes::from(vec![b'x'; 1 << 20]),
            ..message(0)
        };
        let mut seqs = Vec::new();
        for _ in 0..20 {
            seqs.push(spool.append(big.clone()).await.expect("appended").seq);
        }
        let files = || {
            std::fs::read_dir(&dir)
                .expect("dir")
                .filter(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".spool"))
                })
                .count()
        };
        assert!(files() >= 3, "{} segments", files());
        for seq in seqs {
            spool.ack(seq).expect("acked");
        }
        assert_eq!(files(), 1, "only the current segment is left");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
