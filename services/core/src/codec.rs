//! Encoding and decoding of the protobuf payloads on the bus, with their wire version checked.

use hark_proto::{WIRE_VERSION, v1 as pb};
use prost::Message;

/// Why a payload could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("malformed {kind} payload: {source}")]
    Malformed {
        kind: &'static str,
        source: prost::DecodeError,
    },
    #[error(
        "{kind} payload has wire version {version}, newer than this build understands ({WIRE_VERSION}); upgrade this service"
    )]
    TooNew { kind: &'static str, version: u32 },
}

/// A bus message that carries a wire version.
pub trait Versioned: Message + Default {
    const KIND: &'static str;
    fn version(&self) -> u32;
    fn set_version(&mut self, version: u32);
}

macro_rules! versioned {
    ($($ty:ident),* $(,)?) => {$(
        impl Versioned for pb::$ty {
            const KIND: &'static str = stringify!($ty);
            fn version(&self) -> u32 {
                self.version
            }
            fn set_version(&mut self, version: u32) {
                self.version = version;
            }
        }
    )*};
}

versioned!(
    ChatMessage,
    OutboundMessage,
    DeliveryReceipt,
    RunJob,
    TaskEvent,
    ClaimRequest,
    PollRequest,
    HeartbeatRequest,
    CheckpointRequest,
    AskRequest,
    CompleteRequest,
    FailRequest,
    ReleaseRequest,
    HistoryRequest,
    SendRequest,
    TasksRequest,
    SubtaskRequest,
);

/// Encodes `message`, stamping the current wire version.
pub fn encode<M: Versioned>(mut message: M) -> bytes::Bytes {
    message.set_version(WIRE_VERSION);
    message.encode_to_vec().into()
}

/// Decodes a payload, refusing one from a newer producer.
pub fn decode<M: Versioned>(payload: &[u8]) -> Result<M, Error> {
    let message = M::decode(payload).map_err(|source| Error::Malformed {
        kind: M::KIND,
        source,
    })?;
    if message.version() > WIRE_VERSION {
        return Err(Error::TooNew {
            kind: M::KIND,
            version: message.version(),
        });
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_job_round_trips_with_its_version() {
        let job = pb::RunJob {
            task_id: "t".into(),
            generation: 7,
            reason: pb::RunReason::ResumeReply as i32,
            ..Default::default()
        };
        let bytes = encode(job.clone());
        let back: pb::RunJob = decode(&bytes).expect("decodes");
        assert_eq!(back.version, WIRE_VERSION);
        assert_eq!((back.task_id.as_str(), back.generation), ("t", 7));
    }

    #[test]
    fn garbage_and_newer_payloads_are_refused() {
        assert!(matches!(
            decode::<pb::RunJob>(&[0xff, 0xff, 0xff]),
            Err(Error::Malformed { .. })
        ));
        let newer = pb::RunJob {
            version: WIRE_VERSION + 1,
            ..Default::default()
        };
        assert!(matches!(
            decode::<pb::RunJob>(&newer.encode_to_vec()),
            Err(Error::TooNew { .. })
        ));
    }
}
